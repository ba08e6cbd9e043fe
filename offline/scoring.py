"""Scores result sets by the MLPerf HPC rules, with the official mlperf_logging tools.

  python -m offline.scoring PATH [--json] [--ruleset 3.0.0]

PATH is an MLPerf submission tree (<org>/results/<system>/<strong|weak>/<benchmark>/
result_*.txt), one such benchmark folder, or (when it holds no result_*.txt) a directory of run
directories (what train.py writes). For every (system, scaling, benchmark) set it prints each
run's minutes (run_stop - run_start), epochs to converge and compliance checker verdict (PASS,
FAIL, or CRASH when the checker itself raised), every run that does not count and why, the
score and whether the set is a valid result.

A run fails, and is counted as failed (never dropped from the set, never replaced), when:
  - its log fails the checker: a run that did not reach the target fails it (run_stop status
    'aborted'), so does a log the checker cannot parse;
  - the checker crashes on it (the exception is reported: not a verdict on the log);
  - it left no complete log: its run directory holds mlperf.log.partial (killed, or still
    running), no mlperf.log, or a log without run_stop. An earlier run's mlperf.log.<n>, or an
    mlperf.log beside a .partial, is never taken for it (offline/run_logs.py);
  - its result_<i>.txt has a result_<i>.txt.failed marker: the result-set launchers write one
    for a run that crashed or was killed, with the reason (offline/run_logs.py).
The score:
  strong scaling: the olympic mean (fastest and slowest run dropped; a run that failed counts
                  as the dropped slowest), computed by the official result summarizer; closed
                  division sets also go through the RCP checker;
  weak scaling:   number of models, instance scale (nodes x accelerators), time_to_train_all
                  (last run_stop - first run_start) and models per minute.
A set is a valid result only with the runs the rules require (CosmoFlow 10, DeepCAM 5) and a
score: strong scaling allows one failed run (the olympic mean drops it as the slowest), weak
scaling needs that many converged models; a closed-division set must also pass the RCP check.
Otherwise it is reported as NOT A VALID RESULT, with why. Nothing here re-implements a rule:
scores come from mlperf_logging's result summarizer, checks from its compliance and RCP
checkers; a failed run is shown to them as a log that never stopped.
"""

import argparse
import contextlib
import dataclasses
import io
import json
import logging
import os
import re
import sys
import tempfile
from pathlib import Path

from mlperf_logging.benchmark_meta import get_result_file_counts
from mlperf_logging.compliance_checker import mlp_compliance
from mlperf_logging.compliance_checker.mlp_parser import parse_file
from mlperf_logging.rcp_checker import rcp_checker
from mlperf_logging.result_summarizer import result_summarizer as summarizer

from common.cli import tool_main
from common.reporting.mlperf_logger import RESUMED_KEY
from offline import run_logs

USAGE = "hpc"
_LAYOUT = re.compile(
    r"(?P<org>[^/]+)/results/(?P<system>[^/]+)/(?P<scaling>strong|weak)/(?P<benchmark>[^/]+)$"
)
_SET_KEYS = (
    "submission_benchmark",
    "submission_division",
    "submission_org",
    "submission_platform",
    "seed",
    "number_of_nodes",
    "accelerators_per_node",
    "global_batch_size",
)


class RulesetError(ValueError):
    """A ruleset mlperf_logging has no compliance rules for."""


@dataclasses.dataclass
class Run:
    name: str  # result_3.txt, or the run directory's name
    file: str  # the log read; '' when the run left none
    passed_checker: bool = False
    checker: str = "-"  # PASS, FAIL, CRASH (the checker raised), or - (no log)
    status: str = "missing"  # run_stop status: success / aborted / missing
    minutes: float | None = None
    epochs: float | None = None  # epoch_num of the last evaluation before run_stop
    seed: int | None = None
    problem: str = ""  # why the run does not count, if it does not
    start_ms: float | None = None
    stop_ms: float | None = None


@dataclasses.dataclass
class ResultSet:
    org: str
    system: str
    scaling: str
    benchmark: str
    division: str
    folder: str
    required_runs: int
    runs: list
    ruleset: str = "3.0.0"
    valid: bool = False  # a result by the rules (see the module docstring)
    score_minutes: float | None = None  # strong scaling
    averaged_runs: int | None = None  # how many runs the olympic mean is taken over
    scaling_factor: float = 1.0
    rcp: str = "n/a"
    number_of_models: int | None = None  # weak scaling
    instance_scale: int | None = None
    time_to_train_all: float | None = None
    models_per_minute: float | None = None
    notes: list = dataclasses.field(default_factory=list)

    @property
    def passing(self) -> int:
        return sum(r.passed_checker for r in self.runs)

    @property
    def failed(self) -> list:
        return [r for r in self.runs if r.problem]

    @property
    def complete(self) -> bool:
        return len(self.runs) >= self.required_runs


@contextlib.contextmanager
def _quiet():
    """The official tools print and log freely; keep their chatter out of our report."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.CRITICAL)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        root.setLevel(level)


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:300]}" if text else type(error).__name__


def check_ruleset(ruleset: str) -> None:
    """Raises RulesetError when mlperf_logging has no compliance rules for hpc `ruleset`.

    Checked once up front: with a wrong ruleset the checker raises on every log, which would
    read as a set where every run crashed.
    """
    rules = Path(mlp_compliance.__file__).parent
    if not (rules / f"{USAGE}_{ruleset}" / "common.yaml").exists():
        known = sorted(p.name.split("_", 1)[1] for p in rules.glob(f"{USAGE}_*") if p.is_dir())
        raise RulesetError(
            f"unknown ruleset '{ruleset}': mlperf_logging has {USAGE} rules for {', '.join(known)}"
        )


def _check(path: Path, ruleset: str) -> tuple[bool, list[str], list]:
    """The compliance checker's verdict on one log, its reasons, and the parsed log lines."""
    with _quiet():
        checker = mlp_compliance.make_checker(USAGE, ruleset, quiet=True, werror=False)
        passed = bool(checker.check_file(str(path), f"{USAGE}_{ruleset}/common.yaml"))
        lines, _ = parse_file(str(path), ruleset=ruleset)
    # What the checker prints when a log fails (its log_messages()), kept here for the report.
    reasons = [*checker.overwritable.values(), *checker.not_overwritable]
    return passed, [m.strip().splitlines()[0] for m in reasons if m.strip()], lines


def read_run(entry: run_logs.RunLog, ruleset: str) -> tuple[Run, dict]:
    """One run: the checker's verdict, its figures and why it does not count; also the set-level keys it logged."""
    run = Run(name=entry.name, file=str(entry.path or ""))
    if entry.path is None:
        run.problem = entry.failure or "no MLPerf log"
        return run, {}
    try:
        passed, reasons, lines = _check(entry.path, ruleset)
    except Exception as e:  # the checker broke, which says nothing about the log: report it as such
        run.checker = "CRASH"
        run.problem = "; ".join(
            filter(None, [entry.failure, f"compliance checker crashed: {_one_line(e)}"])
        )
        return run, {}
    run.passed_checker, run.checker = passed, "PASS" if passed else "FAIL"
    keys, start, stop, last_epoch, resumed = {}, None, None, None, None
    for line in lines:
        value = line.value.get("value") if isinstance(line.value, dict) else None
        meta = line.value.get("metadata", {}) if isinstance(line.value, dict) else {}
        if line.key == "run_start":
            start = line.timestamp
        elif line.key == "run_stop":
            stop = line.timestamp
            run.status = meta.get("status", "missing")
        elif line.key in ("eval_accuracy", "eval_error") and stop is None:
            last_epoch = meta.get("epoch_num", last_epoch)
        elif line.key == RESUMED_KEY:
            resumed = value
        elif line.key in _SET_KEYS:
            keys.setdefault(line.key, value)
    if start is not None and stop is not None:
        run.start_ms, run.stop_ms = float(start), float(stop)
        run.minutes = (run.stop_ms - run.start_ms) / 60 / 1000
    run.epochs = last_epoch if run.status == "success" else None
    run.seed = keys.get("seed")
    if entry.failure:
        run.problem = entry.failure
    elif resumed is not None:
        # Its time to train leaves out the training before the checkpoint.
        run.problem = f"resumed from a checkpoint ({resumed}): not a valid benchmark result"
    elif not passed:
        why = reasons[0] if reasons else "no reason given"
        if run.status == "aborted":
            run.problem = f"did not reach the target (run_stop status 'aborted'; checker: {why})"
        else:
            status = f" (run_stop status '{run.status}')" if run.status != "success" else ""
            run.problem = f"fails the compliance checker{status}: {why}"
    return run, keys


def _describe(folder: Path, keys: dict, default_system: str):
    match = _LAYOUT.search(folder.resolve().as_posix())
    if match:
        return match["org"], match["system"], match["scaling"], match["benchmark"]
    return (
        keys.get("submission_org") or "-",
        keys.get("submission_platform") or default_system,
        "strong",
        keys.get("submission_benchmark") or "unknown",
    )


def _natural(path: Path):
    """result_2.txt before result_10.txt."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(path))]


def find_sets(path) -> list[tuple[Path, list[run_logs.RunLog]]]:
    """(folder, runs) per result set under `path`.

    In a submission tree a run is a result_<i>.txt (with its .failed marker, if any); otherwise
    it is a run directory, found by its mlperf.log or mlperf.log.partial, so that a run killed
    before it stopped is counted as failed rather than missed.
    """
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(f"no such path: {root}")
    results = {
        f.with_name(f.name.removesuffix(run_logs.FAILED_SUFFIX))
        for pattern in ("result_*.txt", "result_*.txt" + run_logs.FAILED_SUFFIX)
        for f in root.rglob(pattern)
    }
    sets = {}
    for f in sorted(results, key=_natural):
        sets.setdefault(f.parent, []).append(run_logs.from_result_file(f))
    if not sets:  # no submission layout here: directories of run directories
        run_dirs = {
            f.parent
            for name in (run_logs.LOG_NAME, run_logs.PARTIAL_NAME)
            for f in root.rglob(name)
        }
        for run_dir in sorted(run_dirs, key=_natural):
            sets.setdefault(run_dir.parent, []).append(run_logs.from_run_dir(run_dir))
    return sorted(sets.items())


def _failed_run_log(keys: dict) -> str:
    """What the official tools are shown for a failed run: a log of this set that never stopped.

    The result summarizer counts it as a failed run (it fails the checker) and the RCP checker
    as one that did not converge. It carries the set's benchmark and global batch size because
    the RCP checker gives up on a folder whose files disagree on them.
    """
    lines = [
        ":::MLLOG "
        + json.dumps(
            {
                "namespace": "",
                "time_ms": 0,
                "event_type": "POINT_IN_TIME",
                "key": key,
                "value": keys[key],
                "metadata": {},
            }
        )
        for key in ("submission_benchmark", "global_batch_size")
        if keys.get(key) is not None
    ]
    return "".join(line + "\n" for line in lines)


def _official_scores(rs: ResultSet, keys: dict) -> None:
    """Fills in the score from the official summarizer (and the RCP checker for closed division)."""
    # They read <folder>/result_*.txt: give them that view of any set, a failed run's log replaced
    # by one that never stopped (a stale or crashed run's log may pass the checker on its own).
    with tempfile.TemporaryDirectory() as tmp:
        view = Path(tmp)
        for i, run in enumerate(rs.runs):
            if run.problem:
                (view / f"result_{i}.txt").write_text(_failed_run_log(keys))
            else:
                os.symlink(Path(run.file).resolve(), view / f"result_{i}.txt")
        scaling_file = Path(rs.folder) / "scaling.json"
        if scaling_file.exists():
            os.symlink(scaling_file.resolve(), view / "scaling.json")
        with _quiet():
            if rs.scaling == "strong":
                rs.score_minutes, _, rs.scaling_factor = (
                    summarizer._compute_strong_score_standalone(
                        rs.benchmark, rs.system, False, str(view), USAGE, rs.ruleset
                    )
                )
                if rs.division == "closed":
                    # The pruned reference points, as the package checker uses them.
                    ok, message, _ = rcp_checker.check_directory(
                        str(view), USAGE, rs.ruleset, False, False, rcp_pass="pruned_rcps"
                    )
                    rs.rcp = f"{'pass' if ok else 'FAIL'} ({message})"
            else:
                weak, _ = summarizer._compute_weak_score_standalone(
                    rs.benchmark, rs.system, False, str(view), USAGE, rs.ruleset
                )
                if weak:
                    rs.time_to_train_all = weak[f"{rs.benchmark}:time_to_train_all"]
                    rs.number_of_models = weak[f"{rs.benchmark}:number_of_models"]
                    rs.instance_scale = weak[f"{rs.benchmark}:instance_scale"]
                    rs.models_per_minute = rs.number_of_models / rs.time_to_train_all
    if rs.score_minutes is not None:
        # The summarizer drops the fastest and the slowest run, a failed run being the slowest.
        rs.averaged_runs = len(rs.runs) - 2


def _why_not_valid(rs: ResultSet) -> list[str]:
    failed, counted = len(rs.failed), len(rs.runs) - len(rs.failed)
    why = (
        []
        if rs.complete
        else [f"incomplete: {len(rs.runs)} of the {rs.required_runs} runs the rules require"]
    )
    if rs.scaling == "strong":
        if failed > 1:
            why.append(f"{failed} failed runs: the olympic mean may drop only one")
        elif rs.score_minutes is None:
            why.append("no olympic mean")
        if rs.division == "closed" and not rs.rcp.startswith("pass"):
            why.append("the RCP check does not pass")
    elif rs.time_to_train_all is None:
        why.append(f"{counted} converged model(s), the rules require {rs.required_runs}")
    return why


def score_set(folder: Path, entries: list[run_logs.RunLog], ruleset: str = "3.0.0") -> ResultSet:
    runs, keys = [], {}
    for entry in entries:
        run, k = read_run(entry, ruleset)
        runs.append(run)
        for key, value in k.items():
            keys.setdefault(key, value)
    org, system, scaling, benchmark = _describe(folder, keys, folder.name)
    required = get_result_file_counts(USAGE).get(benchmark, 0)
    rs = ResultSet(
        org=org,
        system=system,
        scaling=scaling,
        benchmark=benchmark,
        division=keys.get("submission_division") or "-",
        folder=str(folder),
        required_runs=required,
        runs=runs,
        ruleset=ruleset,
    )
    if required == 0:
        rs.notes.append(f"NOT A VALID RESULT: unknown benchmark '{benchmark}', not scored")
        return rs
    try:
        _official_scores(rs, keys)
    except Exception as e:  # reported, with the set's runs still listed
        rs.notes.append(f"no score: mlperf_logging's scoring crashed: {_one_line(e)}")
    odd = [r for r in runs if not r.problem and r.status != "success"]
    if odd:
        rs.notes.append(
            "counted although run_stop status is not 'success' (the log passes the checker): "
            + ", ".join(r.name for r in odd)
        )
    why = _why_not_valid(rs)
    rs.valid = not why
    if why:
        rs.notes.append("NOT A VALID RESULT: " + "; ".join(why))
    kept = [r for r in runs if not r.problem and r.start_ms is not None]
    if scaling == "weak" and rs.time_to_train_all is None and kept:
        # The same quantities over the models that did converge, for a smaller local test.
        span = (max(r.stop_ms for r in kept) - min(r.start_ms for r in kept)) / 60 / 1000
        rs.notes.append(
            f"informational, not a valid score: {len(kept)} model(s), time_to_train_all "
            f"{span:.6f} min, {len(kept) / span:.4f} models/min"
        )
    return rs


def score_path(path, ruleset: str = "3.0.0") -> list[ResultSet]:
    check_ruleset(ruleset)
    return [score_set(folder, entries, ruleset) for folder, entries in find_sets(path)]


def format_set(rs: ResultSet) -> str:
    out = [
        f"{rs.org} / {rs.system} / {rs.scaling} / {rs.benchmark}  ({rs.division} division)  [{rs.folder}]",
        f"  runs found {len(rs.runs)} (rules require {rs.required_runs}): {len(rs.runs) - len(rs.failed)} "
        f"counted, {len(rs.failed)} failed; passing the checker {rs.passing}",
    ]
    width = max([24] + [len(r.name) for r in rs.runs])
    out.append(f"  {'run':{width}s} {'minutes':>10s} {'epochs':>7s}  checker  status")
    for r in rs.runs:
        minutes = f"{r.minutes:10.4f}" if r.minutes is not None else f"{'-':>10s}"
        epochs = f"{r.epochs:7g}" if r.epochs is not None else f"{'-':>7s}"
        out.append(f"  {r.name:{width}s} {minutes} {epochs}  {r.checker:7s}  {r.status}")
    if rs.scaling == "strong" and rs.score_minutes is not None:
        factor = f" x scaling factor {rs.scaling_factor:g}" if rs.scaling_factor != 1.0 else ""
        out.append(
            f"  score: {rs.score_minutes:.6f} min (olympic mean over {rs.averaged_runs} of {len(rs.runs)} "
            f"runs: the fastest and the slowest dropped, a failed run counting as the slowest{factor})"
        )
    if rs.scaling == "strong":
        out.append(f"  RCP: {rs.rcp}")
    if rs.time_to_train_all is not None:
        out.append(
            f"  models {rs.number_of_models}, instance scale {rs.instance_scale}, "
            f"time_to_train_all {rs.time_to_train_all:.6f} min, "
            f"{rs.models_per_minute:.4f} models/min"
        )
    if rs.failed:
        out.append("  failed runs:")
        out += [f"    {r.name}: {r.problem}" for r in rs.failed]
    out += [f"  {note}" for note in rs.notes]
    if rs.valid:
        out.append(f"  a valid result by the MLPerf HPC {rs.ruleset} rules")
    return "\n".join(out)


@tool_main(FileNotFoundError, RulesetError)
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "path", help="submission tree, benchmark folder, or directory of run directories"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--ruleset", default="3.0.0")
    args = parser.parse_args(argv)
    sets = score_path(args.path, args.ruleset)
    if not sets:
        raise FileNotFoundError(
            f"no result_*.txt, mlperf.log or mlperf.log.partial under {args.path}"
        )
    if args.json:
        print(
            json.dumps(
                [
                    dataclasses.asdict(s) | {"passing": s.passing, "complete": s.complete}
                    for s in sets
                ],
                indent=2,
            )
        )
    else:
        print("\n\n".join(format_set(s) for s in sets))
    return 0


if __name__ == "__main__":
    sys.exit(main())
