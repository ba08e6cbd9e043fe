"""Trainer events and the listeners that act on them.

The trainer says what happens (init started, epoch 3 stopped, eval gave 0.11);
listeners decide what to do with it: the MLPerf logger writes mllog lines, rank
0's console (common.reporting.console) prints, TensorBoard writes scalars. Builders (models,
datasets, optimizers) emit nothing.

Every event is declared once, as a method of `Listener`; `Events` (a `Listener`)
hands each call to every listener, so "go to definition" on `events.on_step`
finds the declaration, and a listener method spelled wrong is an error at
construction instead of a method that never runs. The trainer's call of an
`Events` method is always the same number of frames above a listener's method
(one: the dispatch): the MLPerf logger names that call's file:line through a
constant stack offset (common.reporting.mlperf_logger).

The run's global step (optimizer steps done, resumes included) is counted once,
by the trainer (common.run.trainer.Trainer.global_step), and travels in the events that
stand at a step: `StepInfo` and `TrainLog`, `epoch_start`, `EpochTrain` and
`eval_stop`. No listener counts steps of its own.
"""

import dataclasses
import functools
import inspect
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the run's package imports this one: only the annotations name them
    from common.inputs.staging import StageStats
    from common.run.instance_start import Meeting
    from common.run.termination import Failure


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """Facts about a run, known once init is done."""

    benchmark: str
    seed: int
    num_nodes: int
    ranks: int
    accelerators_per_node: int
    global_batch_size: int
    train_samples: int
    eval_samples: int
    hyperparameters: dict
    target_name: str
    target: float
    steps_per_epoch: int = 0
    n_epochs: int = 0
    resumed_from: dict | None = None  # common.checkpoints.ResumePoint.resumed_from
    # What rank 0's console says of init (common.reporting.console):
    model_name: str = ""
    num_params: int = 0  # trainable
    spatial_ranks: int = 1  # ranks that split each sample
    spatial_plan: str = ""  # split runs: how a sample is cut and gathered (Task.describe_split)
    batchnorm_layers: int = 0  # their running statistics are averaged over the ranks every epoch
    samples_per_epoch: int = 0  # all ranks, in whole steps
    shard_samples: int = 0  # the training samples of the shards (n_train)
    resumed_source: str | None = None  # the checkpoint folder as named
    warmup_steps: int = 0  # synthetic steps run before run_start, the state put back after
    warmup_s: float = 0.0


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """One optimizer step done (every step: cheap, no tensor is read)."""

    epoch: int
    step: int  # steps done in this epoch, from 1
    steps_per_epoch: int
    global_step: int  # steps done in the whole run, resumes included


@dataclasses.dataclass(frozen=True)
class TrainLog:
    """Training figures every `train.log_every_steps` steps (the loss of steps already done: two behind)."""

    epoch: int
    global_step: int
    loss: float  # mean over the steps since the previous TrainLog, this rank
    lr: float
    samples_per_s: float  # all ranks, over the steps since the previous TrainLog


@dataclasses.dataclass(frozen=True)
class EpochTrain:
    """An epoch's training figures (common.run.trainer), at epoch_stop."""

    global_step: int  # steps done in the whole run at the epoch's end
    loss: float  # mean of the epoch's step losses over all ranks
    seconds: (
        float  # this rank's, for the steps of the epoch this process ran (a resume's: the rest)
    )
    lr: float  # the LR of the epoch's first step
    samples_per_s: float  # all ranks, over the steps this process ran
    # With runtime.step_timing, the first epoch this process runs only (None otherwise): its first step's time beside the median
    # of its steps, each waited for, without their wait for input (the first step pays what warm-up
    # did not); and the first step's wait for its batch (cold reads, a shuffle buffer filling).
    first_step_s: float | None = None
    median_step_s: float | None = None
    # The epoch's own spread (its 90th percentile): a first step within it is one more ordinary step.
    p90_step_s: float | None = None
    first_input_wait_s: float | None = None


class Listener:
    """The events, declared once: a no-op base, override what you need. Epochs are numbered from 1."""

    def on_init_start(self): ...
    # job: the ranks, nodes and controller (and the spatial mesh); runtime: common.runtime.configure's
    # figures (device, threads, CPU, precision), known before anything is built.
    def on_runtime_configured(self, job: str, runtime: dict): ...
    def on_init_stop(self, info: RunInfo): ...
    def on_staging_start(self): ...
    # Rank 0's count of files staged so far, of one split's `total` (train, then validation).
    def on_staging_progress(self, done: int, total: int, nbytes: int): ...
    def on_staging_stop(self, stats: "StageStats"): ...
    def on_caches_cleared(self, cleared: bool, files: int): ...
    # Weak scaling: how this instance met the others before run_start (common.run.instance_start).
    def on_instances_met(self, meeting: "Meeting"): ...
    def on_run_start(self): ...
    # global_step: the steps done in the whole run before the epoch's first.
    def on_epoch_start(self, epoch: int, global_step: int): ...
    def on_step(self, step: StepInfo): ...
    def on_train_log(self, log: TrainLog): ...
    def on_epoch_stop(self, epoch: int, train: EpochTrain): ...
    def on_eval_start(self, epoch: int): ...
    # global_step: the steps done when the model was evaluated; loss: the per-sample mean
    # validation loss (eval_loss), None where not computed.
    def on_eval_stop(
        self, epoch: int, global_step: int, value: float, loss: float | None = None
    ): ...
    # failure: why a run that could not go on stopped (non-finite input or loss: common.run.termination), else None.
    def on_run_stop(
        self,
        status: str,
        epoch: int,
        checkpoint: str | None = None,
        failure: "Failure | None" = None,
    ): ...
    # After run_stop, when runtime.characterize is on: the measurements start.
    def on_characterization_start(self): ...
    def close(self): ...


_EVENT_NAMES = frozenset(name for name in vars(Listener) if name.startswith("on_"))


def _check_listener(listener) -> None:
    """A method named like an event that is not one (a typo) would never run: refuse it."""
    for name in dir(type(listener)):
        if name.startswith("on_") and name not in _EVENT_NAMES:
            raise TypeError(
                f"{type(listener).__name__}.{name}: no such event (events: {sorted(_EVENT_NAMES)})"
            )


def _dispatch(name: str):
    """The `Events` method of event `name`: the arguments as `Listener` declares them (defaults
    filled in) to every listener, in order. One frame between the trainer's call and a listener."""
    declared = getattr(Listener, name)
    signature = inspect.signature(declared)

    @functools.wraps(declared)
    def dispatch(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        for listener in self.listeners:
            getattr(listener, name)(*bound.args[1:])

    return dispatch


class Events(Listener):
    """Hands each event to every listener, in order: its on_ methods are `_dispatch`'s, one per
    event `Listener` declares (set below the class)."""

    def __init__(self, listeners):
        self.listeners = list(listeners)
        for listener in self.listeners:
            _check_listener(listener)

    def close(self):
        for listener in self.listeners:
            listener.close()


for _name in _EVENT_NAMES:
    setattr(Events, _name, _dispatch(_name))
