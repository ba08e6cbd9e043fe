"""What init built, as the run modes (common.run.train_mode, evaluate_mode, benchmark_mode) get it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # names for the annotations only: importing them here would import the whole run
    import tf_keras

    from common.base_config import BaseConfig
    from common.checkpoints.save_policy import CheckpointSaver
    from common.lr_schedules import EpochWarmupStepDecay, StepWarmupSchedule
    from common.parallel.distribution import DataParallel, Distribution
    from common.parallel.spatial_mesh import SpatialMesh
    from common.reporting.events import Events, RunInfo
    from common.run.steps import TrainStep
    from common.task import EvalMetric, Shards, Task


@dataclasses.dataclass
class RunState:
    """Where the run stands now: the training loop advances it, common.run.launch reads it on a crash."""

    epoch: int = 0  # the epoch in progress (the last one started); 0 before the first
    # Optimizer steps done, over the whole run (resumes included): the run's one count of steps;
    # listeners read it from the events that carry it (common.reporting.events).
    global_step: int = 0
    started: bool = False  # run_start was logged: a crash must close the log as aborted


@dataclasses.dataclass
class RunContext:
    """The bound run: config, ranks, data, model, steps and where results go.

    Attributes:
      cfg, task, dist, events: the config, the benchmark's Task, the Distribution, the Events.
      mesh: the data-parallel groups (DataParallel: each rank whole samples; a SpatialMesh splits them).
      shards: this rank's (its group's) files, staged paths once data preparation ran.
      model, optimizer, schedule, metric: as the task built them (optimizer wrapped for the precision).
      train_step, eval_step: traced at init (common.run.steps).
      saver: the run's checkpoints (common.checkpoints.save_policy).
      info: the RunInfo of init_stop (steps_per_epoch and samples_per_epoch are read from it).
      precision: the compute precision the runtime settled on (common.runtime.configure's "precision").
      state: the RunState.

    Each mode returns what it found as a RunResult; the trainer adds what init found.
    """

    cfg: BaseConfig
    task: Task
    dist: Distribution
    events: Events
    mesh: DataParallel | SpatialMesh
    shards: Shards
    model: tf_keras.Model
    optimizer: tf_keras.optimizers.Optimizer
    schedule: EpochWarmupStepDecay | StepWarmupSchedule
    metric: EvalMetric
    train_step: TrainStep
    eval_step: Callable  # (x, y, n) -> the batch's vector (common.run.steps.make_eval_step; EvalSums names it)
    saver: CheckpointSaver
    info: RunInfo
    precision: str
    state: RunState

    @property
    def steps_per_epoch(self) -> int:
        return self.info.steps_per_epoch

    @property
    def samples_per_epoch(self) -> int:
        """One epoch's samples over all ranks, in whole steps."""
        return self.info.samples_per_epoch

    def reached(self, value: float) -> bool:
        """Whether a metric value meets the task's target."""
        return (
            value <= self.task.target if self.metric.lower_is_better else value >= self.task.target
        )
