"""Trainer events and the listeners that act on them (MLPerf log, rank 0's console, TensorBoard).

Every event is declared once, as a method of `Listener`; `Events` hands each call to every
listener, one frame between the trainer's call and the listener (the MLPerf log's file:line counts
on it). The run's global step is counted by the trainer only and travels in the events.
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
    # What rank 0's console says of init:
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
    samples_per_s: float  # all ranks, over the steps this process ran
    lr: float  # the LR of the epoch's first step
    # runtime.step_timing, the first epoch this process runs only (else None): step times, each
    # waited for, without their wait for input; and the first step's wait for its batch.
    first_step_s: float | None = None
    median_step_s: float | None = None
    p90_step_s: float | None = None
    first_input_wait_s: float | None = None


class Listener:
    """The events, declared once: a no-op base, override what you need. Epochs are numbered from 1."""

    def on_init_start(self): ...
    # job: ranks, nodes, controller; runtime: common.runtime.configure's figures.
    def on_runtime_configured(self, job: str, runtime: dict): ...
    def on_init_stop(self, info: RunInfo): ...
    def on_staging_start(self): ...
    # Rank 0's count of files staged so far, of one split's `total` (train, then validation).
    def on_staging_progress(self, done: int, total: int, nbytes: int): ...
    def on_staging_stop(self, stats: "StageStats"): ...
    def on_caches_cleared(self, cleared: bool, files: int): ...
    # Weak scaling: how this instance met the others before run_start.
    def on_instances_met(self, meeting: "Meeting"): ...
    def on_run_start(self): ...
    # global_step: the steps done in the whole run before the epoch's first.
    def on_epoch_start(self, epoch: int, global_step: int): ...
    def on_step(self, step: StepInfo): ...
    def on_train_log(self, log: TrainLog): ...
    def on_epoch_stop(self, epoch: int, train: EpochTrain): ...
    def on_eval_start(self, epoch: int): ...
    # loss: the per-sample mean validation loss, None where not computed.
    def on_eval_stop(
        self, epoch: int, global_step: int, value: float, loss: float | None = None
    ): ...
    # failure: why a run that could not go on stopped, else None.
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


def _dispatch(name: str):
    """The `Events` method of event `name`: its arguments, defaults filled in, to every listener."""
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
    """Hands each event to every listener, in order (its on_ methods are set below the class)."""

    def __init__(self, listeners):
        """Raises TypeError for a listener method named like an event that is none (a typo)."""
        self.listeners = list(listeners)
        for listener in self.listeners:
            for name in set(dir(listener)) - _EVENT_NAMES:
                if name.startswith("on_"):
                    raise TypeError(f"{type(listener).__name__}.{name}: no such event")

    def close(self):
        for listener in self.listeners:
            listener.close()


for _name in _EVENT_NAMES:
    setattr(Events, _name, _dispatch(_name))
