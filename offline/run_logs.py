"""Which MLPerf log is a run's, and how a run's log joins a result set, failed runs included.

  python -m offline.run_logs prepare RUN_DIR...                    # before the runs start
  python -m offline.run_logs collect RUN_DIR RESULTS INDEX EXIT_CODE   # after run INDEX ended
  python -m offline.run_logs folder OUTPUT CONFIG BENCH --system S --scaling strong   # prints RESULTS

train.py writes <run_dir>/mlperf.log.partial and renames it to mlperf.log when the run stops
(common/reporting/mlperf_logger.py); a log already there is kept as mlperf.log.1, .2... So in a run
directory:
  - mlperf.log.partial means the latest run there never stopped (the launcher killed it, or it
    is still running): the run failed, and an mlperf.log beside it is an earlier run's;
  - an mlperf.log without a run_stop line is a run that failed before training began;
  - mlperf.log.<n> is an earlier run's log: never taken for the run's own.

Stale logs: `prepare` moves a run directory that already holds files to
<parent>.previous/<name>.<time>/ before the run starts (e.g. runs/run_3 to
runs.previous/run_3.20240101T120000), so that whatever is in the directory afterwards was written
by this run. Nothing is deleted, and no clock has to agree with another: comparing the log's
run_start with the launch time would depend on the batch host's and rank 0's clocks agreeing.

`collect` copies the run's log to RESULTS/result_<INDEX>.txt, failed or not, so that the official
tools see every run of the set (a log without run_stop fails the compliance checker, and the
result summarizer counts it as a failed run). A run that failed (an exit code other than 0 or 3,
or no complete log) also gets RESULTS/result_<INDEX>.txt.failed, one line saying why; a run that
left no log at all gets an empty result_<INDEX>.txt beside it. offline.scoring reads both.
"""

import argparse
import dataclasses
import json
import os
import socket
import sys
import time
from pathlib import Path

import yaml

from common import benchmarks
from common.config import MLPerfConfig
from common.errors import ExitCode
from common.reporting.mlperf_logger import LOG_NAME

PARTIAL_NAME = LOG_NAME + ".partial"
FAILED_SUFFIX = (
    ".failed"  # result_3.txt.failed: the result_*.txt glob of the official tools skips it
)
# train.py's exit status for a run that stopped without reaching the target (common/run/trainer.py):
# the log is complete and is scored as a run that did not converge; any other non-zero status
# is a run that failed.
_MLLOG = ":::MLLOG"


@dataclasses.dataclass(frozen=True)
class RunLog:
    """One run of a set, as its files tell it.

    Attributes:
      name: what reports call the run (result_3.txt, or the run directory's name).
      path: the log to check; None when the run left none.
      failure: why the run failed whatever its log says; '' when nothing outside the log does.
    """

    name: str
    path: Path | None
    failure: str = ""


def has_run_stop(log: Path) -> bool:
    """Whether the log has a well-formed run_stop line (a log cut mid-line has not)."""
    with open(log, encoding="utf-8", errors="replace") as f:
        for line in f:
            if _MLLOG not in line or '"run_stop"' not in line:
                continue
            try:
                if json.loads(line.split(_MLLOG, 1)[1]).get("key") == "run_stop":
                    return True
            except json.JSONDecodeError:
                continue
    return False


def from_run_dir(run_dir) -> RunLog:
    """The run that last used `run_dir`: its log, or why it has none that counts."""
    run_dir = Path(run_dir)
    final, partial = run_dir / LOG_NAME, run_dir / PARTIAL_NAME
    if partial.exists():
        earlier = f"; the {LOG_NAME} beside it is an earlier run's" if final.exists() else ""
        return RunLog(
            run_dir.name,
            partial,
            f"no run_stop: killed or still running (only {PARTIAL_NAME}{earlier})",
        )
    if not final.exists():
        return RunLog(run_dir.name, None, f"no {LOG_NAME} in {run_dir}")
    if not has_run_stop(final):
        return RunLog(
            run_dir.name, final, f"{LOG_NAME} has no run_stop: the run failed before it ended"
        )
    return RunLog(run_dir.name, final)


def from_result_file(result: Path) -> RunLog:
    """A result_<i>.txt of a set, with the reason its .failed marker gives, if it has one."""
    marker = result.with_name(result.name + FAILED_SUFFIX)
    failure = marker.read_text().strip() if marker.exists() else ""
    return RunLog(result.name, result if result.exists() else None, failure)


def set_aside(run_dir) -> Path | None:
    """Moves a non-empty `run_dir` to <parent>.previous/<name>.<time>; returns where, or None."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir() or not any(run_dir.iterdir()):
        return None
    attic = run_dir.parent.with_name(run_dir.parent.name + ".previous")
    attic.mkdir(parents=True, exist_ok=True)
    stem = f"{run_dir.name}.{time.strftime('%Y%m%dT%H%M%S')}"
    dest, n = attic / stem, 1
    while dest.exists():
        dest, n = attic / f"{stem}-{n}", n + 1
    run_dir.rename(dest)
    return dest


def collect(run_dir, results, index: int, exit_code: int) -> RunLog:
    """Copies run `index`'s log into `results` as result_<index>.txt, marking a failed run.

    Returns the run as a set will see it: RunLog(result_<index>.txt, its path, failure).
    """
    log = from_run_dir(run_dir)
    reasons = [f"exit code {exit_code}"] if exit_code not in (0, ExitCode.NOT_CONVERGED) else []
    reasons += [log.failure] if log.failure else []
    results = Path(results)
    results.mkdir(parents=True, exist_ok=True)
    dest = results / f"result_{index}.txt"
    marker = dest.with_name(dest.name + FAILED_SUFFIX)
    # Temporary name, then rename: a set scored meanwhile never sees half a file.
    tmp = results / f".{dest.name}.tmp"
    tmp.write_bytes(log.path.read_bytes() if log.path else b"")
    os.replace(tmp, dest)
    if reasons:
        marker.write_text("; ".join(reasons) + "\n")
    else:
        marker.unlink(missing_ok=True)  # a run redone into the same set
    return RunLog(dest.name, dest, "; ".join(reasons))


def submission_folder(
    output: Path,
    config: Path,
    bench: str,
    system: str | None,
    ranks: int,
    scaling: str = "strong",
    org: str | None = None,
) -> Path:
    """A set's folder in the submission layout: OUTPUT/<org>/results/<system>/<scaling>/<benchmark>.

    Args:
      output: the set's output directory.
      config: the runs' YAML config; its mlperf.org and mlperf.platform name the folder.
      bench: the benchmark's name in common/benchmarks.py (its submission name is used).
      system: the system's name; None: mlperf.platform, or <host>_<ranks>ranks when that is unknown.
      ranks: ranks of the whole set (for the default system name).
      scaling: "strong" (a result set) or "weak" (instances trained at once).
      org: overrides mlperf.org.
    """
    mlperf = (yaml.safe_load(Path(config).read_text()) or {}).get("mlperf", {}) or {}
    org = org or mlperf.get("org", MLPerfConfig.org)
    platform = mlperf.get("platform", MLPerfConfig.platform)
    system = system or (
        platform if platform != MLPerfConfig.platform else f"{socket.gethostname()}_{ranks}ranks"
    )
    return Path(output) / org / "results" / system / scaling / benchmarks.get(bench).submission_name


def exit_status(codes) -> int:
    """A set's exit status: 0 all converged, 3 some did not converge, 1 some failed."""
    codes = list(codes)
    if any(c not in (0, ExitCode.NOT_CONVERGED) for c in codes):
        return 1
    return ExitCode.NOT_CONVERGED if ExitCode.NOT_CONVERGED in codes else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    prepare = sub.add_parser(
        "prepare", help="move run directories that hold an earlier run's files aside"
    )
    prepare.add_argument("run_dirs", nargs="+")
    gather = sub.add_parser("collect", help="copy a run's log into the set as result_<index>.txt")
    gather.add_argument("run_dir")
    gather.add_argument(
        "results", help="the set's folder (<org>/results/<system>/<scaling>/<benchmark>)"
    )
    gather.add_argument("index", type=int)
    gather.add_argument("exit_code", type=int, help="the run's exit status")
    folder = sub.add_parser("folder", help="print a set's folder in the submission layout")
    folder.add_argument("output", help="the set's output directory")
    folder.add_argument("config", help="the runs' config (mlperf.org, mlperf.platform)")
    folder.add_argument("bench", choices=benchmarks.names())
    folder.add_argument(
        "--system", help="system name (default: mlperf.platform, else <host>_<ranks>ranks)"
    )
    folder.add_argument(
        "--ranks", type=int, default=1, help="ranks of the whole set, for the default system name"
    )
    folder.add_argument("--scaling", choices=("strong", "weak"), default="strong")
    folder.add_argument("--org", help="overrides the config's mlperf.org")
    args = parser.parse_args(argv)
    if args.command == "folder":
        print(
            submission_folder(
                Path(args.output),
                Path(args.config),
                args.bench,
                args.system,
                args.ranks,
                args.scaling,
                args.org,
            )
        )
        return 0
    if args.command == "prepare":
        for run_dir in args.run_dirs:
            moved = set_aside(run_dir)
            if moved:
                print(
                    f"[run-logs] {run_dir} held an earlier run's files: moved to {moved}",
                    flush=True,
                )
        return 0
    run = collect(args.run_dir, args.results, args.index, args.exit_code)
    print(
        f"[run-logs] run {args.index}: {run.path}"
        + (f" FAILED: {run.failure}" if run.failure else ""),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
