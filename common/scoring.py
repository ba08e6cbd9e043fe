"""Scores result sets by the MLPerf HPC rules, with the official mlperf_logging tools.

  python -m common.scoring PATH [--json] [--ruleset 3.0.0]

PATH is an MLPerf submission tree (<org>/results/<system>/<strong|weak>/<benchmark>/
result_*.txt), one such benchmark folder, or (when it holds no result_*.txt) a directory of
run directories each holding an `mlperf.log` (what train.py writes). For every (system, scaling, benchmark) set it prints
the runs found and passing the compliance checker, each run's minutes (run_stop - run_start)
and epochs to converge, and the score:
  strong scaling: the olympic mean (fastest and slowest run dropped; a run that failed
                  counts as the dropped slowest), computed by the official result summarizer;
                  closed division sets also go through the RCP checker;
  weak scaling:   number of models, instance scale (nodes x accelerators), time_to_train_all
                  (last run_stop - first run_start) and models per minute.
A set with fewer runs than the rules require (CosmoFlow 10, DeepCAM 5) is reported as
incomplete. Nothing here re-implements a rule: scores come from mlperf_logging's result
summarizer, checks from its compliance and RCP checkers.
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

USAGE = "hpc"
_LAYOUT = re.compile(r"(?P<org>[^/]+)/results/(?P<system>[^/]+)/(?P<scaling>strong|weak)/(?P<benchmark>[^/]+)$")


@dataclasses.dataclass
class Run:
    file: str
    passed_checker: bool
    status: str = "missing"          # run_stop status: success / aborted / missing
    minutes: float | None = None
    epochs: float | None = None      # epoch_num of the last evaluation before run_stop
    seed: int | None = None
    problem: str = ""                # why the run does not count, if it does not
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
    score_minutes: float | None = None       # strong scaling
    scaling_factor: float = 1.0
    rcp: str = "n/a"
    number_of_models: int | None = None      # weak scaling
    instance_scale: int | None = None
    time_to_train_all: float | None = None
    models_per_minute: float | None = None
    notes: list = dataclasses.field(default_factory=list)

    @property
    def passing(self) -> int:
        return sum(r.passed_checker for r in self.runs)

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


def read_run(path, ruleset: str) -> tuple[Run, dict]:
    """One log: the checker's verdict and its figures; also the set-level keys it logged."""
    with _quiet():
        checker = mlp_compliance.make_checker(USAGE, ruleset, quiet=True, werror=False)
        try:
            passed = bool(checker.check_file(str(path), f"{USAGE}_{ruleset}/common.yaml"))
        except Exception:   # a log the checker cannot even parse fails it
            passed = False
        lines, _ = parse_file(str(path), ruleset=ruleset)
    run = Run(file=str(path), passed_checker=passed)
    keys, start, stop, last_epoch = {}, None, None, None
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
        elif line.key in ("submission_benchmark", "submission_division", "submission_org",
                          "submission_platform", "seed", "number_of_nodes", "accelerators_per_node"):
            keys.setdefault(line.key, value)
    if start is not None and stop is not None:
        run.start_ms, run.stop_ms = float(start), float(stop)
        run.minutes = (run.stop_ms - run.start_ms) / 60 / 1000
    run.epochs = last_epoch if run.status == "success" else None
    run.seed = keys.get("seed")
    if not passed:
        run.problem = "fails the compliance checker" + (f" (run_stop status '{run.status}')"
                                                         if run.status != "success" else "")
    return run, keys


def _describe(folder: Path, keys: dict, default_system: str):
    match = _LAYOUT.search(folder.resolve().as_posix())
    if match:
        return match["org"], match["system"], match["scaling"], match["benchmark"]
    return (keys.get("submission_org") or "-", keys.get("submission_platform") or default_system,
            "strong", keys.get("submission_benchmark") or "unknown")


def _natural(path: Path):
    """result_2.txt before result_10.txt."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(path))]


def find_sets(path) -> list[tuple[Path, list[Path]]]:
    """(folder, log files) per result set under `path`."""
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(f"no such path: {root}")
    sets = {}
    for f in sorted(root.rglob("result_*.txt"), key=_natural):
        sets.setdefault(f.parent, []).append(f)
    if not sets:   # no submission layout here: directories of run directories
        for f in sorted(root.rglob("mlperf.log"), key=_natural):
            sets.setdefault(f.parent.parent, []).append(f)
    return sorted(sets.items())


def score_set(folder: Path, files: list[Path], ruleset: str = "3.0.0") -> ResultSet:
    runs, keys = [], {}
    for f in files:
        run, k = read_run(f, ruleset)
        runs.append(run)
        for key, value in k.items():
            keys.setdefault(key, value)
    org, system, scaling, benchmark = _describe(folder, keys, folder.name)
    required = get_result_file_counts(USAGE).get(benchmark, 0)
    rs = ResultSet(org=org, system=system, scaling=scaling, benchmark=benchmark,
                   division=keys.get("submission_division") or "-", folder=str(folder),
                   required_runs=required, runs=runs)
    if required == 0:
        rs.notes.append(f"unknown benchmark '{benchmark}': not scored")
        return rs
    # The official functions read <folder>/result_*.txt: give them that view of any set.
    with tempfile.TemporaryDirectory() as tmp:
        view = Path(tmp)
        for i, f in enumerate(files):
            os.symlink(Path(f).resolve(), view / f"result_{i}.txt")
        scaling_file = Path(folder) / "scaling.json"
        if scaling_file.exists():
            os.symlink(scaling_file.resolve(), view / "scaling.json")
        with _quiet():
            if scaling == "strong":
                score, _, rs.scaling_factor = summarizer._compute_strong_score_standalone(
                    benchmark, system, False, str(view), USAGE, ruleset)
                rs.score_minutes = score
                if rs.division == "closed":
                    # The pruned reference points, as the package checker uses them.
                    ok, message, _ = rcp_checker.check_directory(str(view), USAGE, ruleset, False, False,
                                                                 rcp_pass="pruned_rcps")
                    rs.rcp = f"{'pass' if ok else 'FAIL'} ({message})"
            else:
                weak, _ = summarizer._compute_weak_score_standalone(benchmark, system, False, str(view),
                                                                    USAGE, ruleset)
                if weak:
                    rs.time_to_train_all = weak[f"{benchmark}:time_to_train_all"]
                    rs.number_of_models = weak[f"{benchmark}:number_of_models"]
                    rs.instance_scale = weak[f"{benchmark}:instance_scale"]
                    rs.models_per_minute = rs.number_of_models / rs.time_to_train_all
    failed = [r for r in runs if r.problem]
    if not rs.complete:
        rs.notes.append(f"INCOMPLETE: {len(runs)} of the {required} runs the rules require")
    if failed:
        rs.notes.append(f"{len(failed)} run(s) do not count: " +
                        "; ".join(f"{Path(r.file).name}: {r.problem}" for r in failed))
    odd = [r for r in runs if not r.problem and r.status != "success"]
    if odd:
        rs.notes.append("counted although run_stop status is not 'success' (the log passes the checker): "
                        + ", ".join(Path(r.file).name for r in odd))
    if scaling == "strong" and rs.score_minutes is None:
        rs.notes.append("no score: too many failed runs (the olympic mean may drop only one)")
    if scaling == "weak" and rs.time_to_train_all is None:
        rs.notes.append(f"no score: fewer than {required} converged models")
        kept = [r for r in runs if not r.problem and r.start_ms is not None]
        if kept:
            # The same quantities over the models that did converge, for a smaller local test.
            span = (max(r.stop_ms for r in kept) - min(r.start_ms for r in kept)) / 60 / 1000
            rs.notes.append(f"informational, not a valid score: {len(kept)} model(s), time_to_train_all "
                            f"{span:.6f} min, {len(kept) / span:.4f} models/min")
    return rs


def score_path(path, ruleset: str = "3.0.0") -> list[ResultSet]:
    return [score_set(folder, files, ruleset) for folder, files in find_sets(path)]


def format_set(rs: ResultSet) -> str:
    out = [f"{rs.org} / {rs.system} / {rs.scaling} / {rs.benchmark}  ({rs.division} division)  [{rs.folder}]",
           f"  runs found {len(rs.runs)} (rules require {rs.required_runs}), passing the checker {rs.passing}"]
    out.append(f"  {'run':24s} {'minutes':>10s} {'epochs':>7s}  checker  status")
    for r in rs.runs:
        minutes = f"{r.minutes:10.4f}" if r.minutes is not None else f"{'-':>10s}"
        epochs = f"{r.epochs:7g}" if r.epochs is not None else f"{'-':>7s}"
        out.append(f"  {Path(r.file).name:24s} {minutes} {epochs}  {'PASS' if r.passed_checker else 'FAIL':7s}  "
                   f"{r.status}")
    if rs.scaling == "strong" and rs.score_minutes is not None:
        factor = f" x scaling factor {rs.scaling_factor:g}" if rs.scaling_factor != 1.0 else ""
        out.append(f"  score: {rs.score_minutes:.6f} min (olympic mean{factor})")
    if rs.scaling == "strong":
        out.append(f"  RCP: {rs.rcp}")
    if rs.time_to_train_all is not None:
        out.append(f"  models {rs.number_of_models}, instance scale {rs.instance_scale}, "
                   f"time_to_train_all {rs.time_to_train_all:.6f} min, "
                   f"{rs.models_per_minute:.4f} models/min")
    out += [f"  {note}" for note in rs.notes]
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", help="submission tree, benchmark folder, or directory of run directories")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--ruleset", default="3.0.0")
    args = parser.parse_args(argv)
    try:
        sets = score_path(args.path, args.ruleset)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not sets:
        print(f"error: no result_*.txt or mlperf.log under {args.path}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([dataclasses.asdict(s) | {"passing": s.passing, "complete": s.complete} for s in sets],
                         indent=2))
    else:
        print("\n\n".join(format_set(s) for s in sets))
    return 0


if __name__ == "__main__":
    sys.exit(main())
