"""The end of a run on rank 0: its training curve plotted, its MLPerf log checked, the facts of the report.

`finish` does the work and prints nothing; common.reporting.console turns the `Report` into the
`[done]` lines, and common.run.launch writes `log_check` into summary.json.
"""

import dataclasses
from pathlib import Path

from common.reporting.compliance import check_log
from common.reporting.mlperf_logger import LOG_NAME
from common.run.result import RunResult


@dataclasses.dataclass(frozen=True)
class Report:
    """What rank 0 says of a finished run."""

    benchmark: str
    metric_name: str
    target: float
    result: RunResult
    run_dir: Path
    log: Path  # the MLPerf log (absent in benchmark and evaluation modes)
    log_check: str  # "passed", "failed", or why the log was not checked
    checker_output: str = ""  # the compliance checker's output when it failed
    ruleset: str = ""
    exit_preempted: int = 0  # the exit code of a run stopped on request


def finish(task, result: RunResult, run_dir, exit_preempted: int) -> Report:
    """Rank 0: plots the training curve of a run that trained, checks its log (runtime.check_log)."""
    cfg, run_dir = task.cfg, Path(run_dir)
    facts = dict(
        benchmark=task.name,
        metric_name=task.metric_name,
        target=task.target,
        result=result,
        run_dir=run_dir.resolve(),
        log=(run_dir / LOG_NAME).resolve(),
        ruleset=cfg.mlperf.ruleset,
        exit_preempted=exit_preempted,
    )
    if result.status == "benchmarked":
        return Report(**facts, log_check="no log (benchmark mode)")
    if result.status == "evaluated":
        return Report(**facts, log_check="no log (evaluation only)")
    if result.failure:
        return Report(**facts, log_check="not checked (the run could not go on)")
    if result.history:
        from common.reporting.plots import plot_training_curve  # matplotlib: after the run only

        plot_training_curve(
            result.history,
            task.metric_name,
            task.target,
            f"{task.name}: {result.status} after {result.epochs} epoch(s), "
            f"{result.time_to_train_s / 60:.2f} min",
            run_dir / "training_curve.png",
        )
    if result.status == "preempted":
        return Report(**facts, log_check="not checked (stopped on request)")
    if not cfg.runtime.check_log:
        return Report(**facts, log_check="not checked")
    passed, output = check_log(facts["log"], cfg.mlperf.ruleset)
    return Report(
        **facts, log_check="passed" if passed else "failed", checker_output="" if passed else output
    )
