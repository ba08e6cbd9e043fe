"""What a run returns (`RunResult`, written as summary.json) and its end on rank 0: its training
curve plotted, its MLPerf log checked, the facts of the report.

`finish` does the work and prints nothing; common.reporting.console turns the `Report` into the
`[done]` lines, and common.run.trainer.main writes `log_check` into summary.json.
"""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from common.errors import write_text_atomic
from common.reporting.mlperf_logger import LOG_NAME
from common.run.termination import Failure

if TYPE_CHECKING:  # staging is imported by a run that stages only
    from common.inputs.staging import StageStats


# Runs the official MLPerf compliance checker on a log.


def check_log(path, ruleset: str = "3.0.0", usage: str = "hpc") -> tuple[bool, str]:
    """Runs `python -m mlperf_logging.compliance_checker`; returns (passed, its output)."""
    cmd = [
        sys.executable,
        "-m",
        "mlperf_logging.compliance_checker",
        "--usage",
        usage,
        "--ruleset",
        ruleset,
        "--log_output",
        "/dev/null",
        str(path),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    out = (proc.stdout + proc.stderr).strip()
    return proc.returncode == 0 and "SUCCESS" in out, out


@dataclasses.dataclass
class RunResult:
    status: str = "aborted"
    epochs: int = 0
    metric: float = float("nan")
    time_to_train_s: float = float("nan")
    num_params: int = 0
    # One entry per epoch: epoch, seconds since run_start, train loss, samples/s, lr, metric (if evaluated).
    history: list = dataclasses.field(default_factory=list)
    # All ranks' staging figures (common.inputs.staging.stage_shards); None when nothing was staged.
    staging: "StageStats | None" = None
    weights_in_sync: bool = True
    # Values the weights_in_sync fingerprint covered: every model variable,
    # batch-norm running statistics included (more than num_params when the model has any).
    weights_compared: int = 0
    # Where a run that did not start from scratch started: common.checkpoints.ResumePoint.resumed_from.
    resumed_from: dict | None = None
    # The checkpoint a run stopped on request (status "preempted") can go on from.
    checkpoint: str | None = None
    # Checkpoint figures (rank 0): the last save's path, bytes and seconds to disk
    # ("seconds") and blocked ("blocked_s"); over all saves of this run, how many
    # and the most and mean seconds a save held the step up; the steps between saves.
    checkpoint_save: dict = dataclasses.field(default_factory=dict)
    runtime: dict = dataclasses.field(default_factory=dict)
    # Benchmark mode (train.benchmark_steps): steps timed, samples/s per rank and in total.
    throughput: dict = dataclasses.field(default_factory=dict)
    characterization: dict = dataclasses.field(default_factory=dict)
    # Why a run that could not go on stopped (status "aborted"); None otherwise.
    failure: Failure | None = None


def write_summary(result: RunResult, path, extra: dict) -> None:
    """rank 0: the run's figures as JSON (temporary name, then rename)."""
    data = dataclasses.asdict(result) | extra
    data["staging"] = staging_dict(result.staging)
    if result.failure is not None:
        data["failure"] = result.failure.as_dict()  # the keys of its reason, not all of Failure's
    write_text_atomic(path, json.dumps(data, indent=2, default=float))


def staging_dict(stats: "StageStats | None") -> dict:
    """What summary.json says of staging: its figures, {} when nothing was staged."""
    return stats.as_dict() if stats is not None else {}


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
