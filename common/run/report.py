"""What a run returns (`RunResult`, written as summary.json) and its end on rank 0: the training
curve plotted, the MLPerf log checked, and the `[done]` lines that the console prints.
"""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from common.errors import write_text_atomic
from common.reporting.mlperf_logger import LOG_NAME
from common.run.termination import Failure

if TYPE_CHECKING:  # staging is imported by a run that stages only
    from common.inputs.staging import StageStats


def check_log(path, ruleset: str = "3.0.0") -> tuple[bool, str]:
    """Runs the MLPerf HPC compliance checker on the log at `path`; returns (passed, its output)."""
    cmd = [sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "hpc"]
    cmd += ["--ruleset", ruleset, "--log_output", "/dev/null", str(path)]
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
    # Per epoch: epoch, seconds since run_start, train loss, samples/s, lr, metric (if evaluated).
    history: list = dataclasses.field(default_factory=list)
    # All ranks' staging figures; None when nothing was staged.
    staging: "StageStats | None" = None
    weights_in_sync: bool = True
    # Values the weights_in_sync fingerprint covered (every variable, batch-norm statistics too).
    weights_compared: int = 0
    # common.checkpoints.ResumePoint.resumed_from of a run that did not start from scratch.
    resumed_from: dict | None = None
    # The checkpoint a run stopped on request (status "preempted") can go on from.
    checkpoint: str | None = None
    # Rank 0's checkpoint figures: the last save's path, bytes, seconds and blocked_s; the count,
    # most and mean seconds a save held the step up; the steps between saves.
    checkpoint_save: dict = dataclasses.field(default_factory=dict)
    runtime: dict = dataclasses.field(default_factory=dict)
    # Benchmark mode (train.benchmark_steps): steps timed, samples/s per rank and in total.
    throughput: dict = dataclasses.field(default_factory=dict)
    characterization: dict = dataclasses.field(default_factory=dict)
    # Why a run that could not go on stopped (status "aborted"); None otherwise.
    failure: Failure | None = None


def write_summary(result: RunResult, path, extra: dict) -> None:
    """Rank 0: the run's figures and `extra` as JSON at `path`, written atomically."""
    data = dataclasses.asdict(result) | extra
    data["staging"] = result.staging.as_dict() if result.staging else {}
    if result.failure is not None:
        data["failure"] = result.failure.as_dict()
    write_text_atomic(path, json.dumps(data, indent=2, default=float))


@dataclasses.dataclass(frozen=True)
class Report:
    """What rank 0 says of a finished run (common.reporting.console prints the lines)."""

    log_check: str  # "passed", "failed", or why the log was not checked
    lines: list[str]  # the `[benchmark]` and `[done]` lines


def finish(task, r: RunResult, run_dir, exit_preempted: int) -> Report:
    """Rank 0: plots the curve of a run that trained, checks its log (runtime.check_log), says so."""
    cfg, run_dir, name = task.cfg, Path(run_dir).resolve(), task.name
    where = f"[done] run directory: {run_dir}"
    if r.status == "benchmarked":
        from common.run.benchmark_mode import benchmark_line

        return Report("no log (benchmark mode)", [benchmark_line(name, r.throughput), where])
    if r.status == "evaluated":
        said = f"evaluated the model of epoch {r.epochs}: {task.metric_name} {r.metric:.4f}"
        return Report(
            "no log (evaluation only)", [f"[done] {name}: {said} (target {task.target})", where]
        )
    if r.failure:
        f = r.failure
        saved = f"; checkpoint of the last finite state {f.checkpoint}" if f.checkpoint else ""
        said = f"aborted ({f.reason} at step {f.step_num}), exit code {f.exit_code}{saved}"
        return Report("not checked (the run could not go on)", [f"[done] {name}: {said}", where])
    if r.history:
        plot_training_curve(task, r, run_dir / "training_curve.png")
    lines = [
        f"[done] {name}: {r.status}, {r.epochs} epoch(s), {task.metric_name} {r.metric:.4f}, "
        f"time to train {r.time_to_train_s / 60:.3f} min",
        where,
    ]
    if r.status == "preempted":
        lines.append(
            f"[done] stopped on request (SIGUSR1 or SIGTERM on a rank): checkpoint {r.checkpoint}; "
            f"go on with --resume (exit code {exit_preempted}); the log says aborted"
        )
        return Report("not checked (stopped on request)", lines)
    if not cfg.runtime.check_log:
        return Report("not checked", lines)
    log, ruleset = run_dir / LOG_NAME, cfg.mlperf.ruleset
    passed, output = check_log(log, ruleset)
    verdict = "passed" if passed else "failed"
    lines.append(
        f"[done] MLPerf log {log} {verdict.upper()} the compliance checker (hpc {ruleset})"
    )
    if not passed:
        lines[-1] += ":"
        lines += ["    " + line for line in output.splitlines()[-15:]]
    return Report(verdict, lines)


def plot_training_curve(task, r: RunResult, path) -> None:
    """Writes a PNG of the validation metric and train loss per epoch (target as a line) beside
    the samples/s per epoch."""
    import matplotlib  # after the run only

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    history = r.history
    epochs = [h["epoch"] for h in history]
    evaluated = [h for h in history if "metric" in h]
    fig, (ax_metric, ax_speed) = plt.subplots(1, 2, figsize=(11, 4))
    ax_metric.plot(
        [h["epoch"] for h in evaluated],
        [h["metric"] for h in evaluated],
        "o-",
        label=task.metric_name,
    )
    ax_metric.plot(epochs, [h["loss"] for h in history], "s--", alpha=0.7, label="train loss")
    ax_metric.axhline(task.target, color="red", linestyle=":", label=f"target {task.target}")
    ax_metric.set_xlabel("epoch")
    ax_metric.set_yscale("log")
    ax_metric.legend()
    ax_metric.grid(alpha=0.3)
    ax_speed.bar(epochs, [h["samples_per_s"] for h in history], color="tab:green")
    ax_speed.set_xlabel("epoch")
    ax_speed.set_ylabel("training samples/s (all ranks)")
    ax_speed.grid(alpha=0.3, axis="y")
    minutes = r.time_to_train_s / 60
    fig.suptitle(f"{task.name}: {r.status} after {r.epochs} epoch(s), {minutes:.2f} min")
    fig.tight_layout()
    fig.savefig(f"{path}.tmp.png", dpi=100)  # renamed: a reader never sees half a file
    plt.close(fig)
    os.replace(f"{path}.tmp.png", path)
