"""What a run returns: its result (`RunResult`), written as summary.json."""

import dataclasses
import json
from typing import TYPE_CHECKING

from common.files import write_text_atomic
from common.run.failures import Failure

if TYPE_CHECKING:  # staging is imported by a run that stages only (common.run.data_preparation)
    from common.inputs.staging import StageStats


@dataclasses.dataclass
class RunResult:
    status: str = "aborted"
    epochs: int = 0
    metric: float = float("nan")
    time_to_train_s: float = float("nan")
    num_params: int = 0
    # One entry per epoch: epoch, seconds since run_start, train loss, samples/s, lr, metric (if evaluated).
    history: list = dataclasses.field(default_factory=list)
    # All ranks' staging figures (common.run.data_preparation); None when nothing was staged.
    staging: "StageStats | None" = None
    weights_in_sync: bool = True
    # Values the weights_in_sync fingerprint covered: every model variable,
    # batch-norm running statistics included (more than num_params when the model has any).
    weights_compared: int = 0
    # Where a run that did not start from scratch started: common.checkpoints.checkpointer.ResumePoint.resumed_from.
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
