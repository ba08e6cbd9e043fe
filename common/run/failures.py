"""Ending a run that cannot go on, with the same message on every rank.

Bad input names its file: a read or parse error (`naming_bad_files`) on the rank that hit
it, a batch with NaN or Inf (`fail_on_input`) on every rank. A non-finite loss with every
input finite (`fail_on_loss`) keeps a checkpoint of the last finite state. Both raise
RunFailed on every rank at the same point, so no rank is left waiting in a collective.
"""

import contextlib
import dataclasses
from pathlib import Path

import numpy as np
import tensorflow as tf

from common.errors import ExitCode, InputError

NON_FINITE_INPUT = "non-finite input"
NON_FINITE_LOSS = "non-finite loss"

# summary.json's "failure" has, in this order, the keys of its reason (None values kept): an input
# failure names no loss or checkpoint, a loss failure no input file.
_SUMMARY_KEYS = {
    NON_FINITE_INPUT: ("reason", "exit_code", "input_file", "step_num", "message"),
    NON_FINITE_LOSS: ("reason", "exit_code", "step_num", "loss", "checkpoint", "message"),
}


@dataclasses.dataclass(frozen=True)
class Failure:
    """Why a run could not go on, the same on every rank (the MLPerf log's run_stop, the console, summary.json)."""

    reason: str  # NON_FINITE_INPUT or NON_FINITE_LOSS
    exit_code: int  # common.errors: the process's exit code
    message: str  # the launcher's `error:` line
    step_num: int  # the global step of the bad batch or loss (for validation: the run's step)
    loss: str | None = None  # non-finite loss: the global loss of that step, as text ("nan", "inf")
    input_file: str | None = (
        None  # non-finite input: the file (its source when staged); None if none was found
    )
    checkpoint: str | None = (
        None  # non-finite loss: the last finite state; None if none was written
    )

    def as_dict(self) -> dict:
        """What summary.json says of it: the keys of its reason."""
        return {key: getattr(self, key) for key in _SUMMARY_KEYS[self.reason]}


class RunFailed(Exception):
    """Every rank agreed that the run cannot go on (a non-finite input or loss); `failure` says why.

    Raised inside the loop, on every rank at the same point (the functions below); the training
    loop ends the run in order (log closed as aborted, summary written) and common.run.trainer.main exits
    with failure.exit_code.
    """

    def __init__(self, failure: Failure):
        super().__init__(failure.message)
        self.failure = failure


@contextlib.contextmanager
def naming_bad_files(task, files):
    """Turns a TensorFlow read/parse error into an InputError naming the bad file of `files`."""
    try:
        yield
    except tf.errors.OpError:
        found = task.find_bad_file(files)
        if found:
            raise InputError(found) from None
        raise


def fail_on_input(
    dist, task, culprit: int, files, epoch: int, global_step, what: str, current_step: int
):
    """Every rank: rank `culprit` (which read a `what` batch with NaN or Inf, "training" or
    "validation") looks for the file in `files`; raises RunFailed naming it, on every rank.

    global_step: the culprit's step of that batch (None: not known, as for validation);
    current_step: the run's global step now (the log's step_num when global_step is None).
    """
    message = None
    if dist.rank == culprit:
        found = task.find_bad_file(files)  # 'PATH: reason'
        path = found.split(": ", 1)[0] if found else None
        from common.inputs.staging_manifest import source_of  # an error path: imported here

        source = source_of(path) if path else None
        staged = f" (staged from {source})" if source else ""
        where = f"{what} step {global_step}" if global_step is not None else what
        message = {
            "input_file": source or path,
            "text": (
                f"{found}{staged} (non-finite input, found after the {where} of epoch {epoch} "
                f"on rank {culprit})"
                if found
                else f"rank {culprit} read a {what} batch with NaN or Inf after preprocessing (epoch "
                f"{epoch}, {where}), but no file of its shard holds one: the preprocessing "
                f"overflowed (values beyond float32 after normalization?)"
            ),
        }
    message = dist.broadcast_object(message, root_rank=culprit)
    raise RunFailed(
        Failure(
            reason=NON_FINITE_INPUT,
            exit_code=ExitCode.INPUT_ERROR,
            input_file=message["input_file"],
            step_num=global_step if global_step is not None else current_step,
            message=message["text"] + "; MLPerf log closed as aborted",
        )
    )


def fail_on_loss(
    dist, variables, save_now, latest_checkpoint, epoch: int, bad_step: int, local_loss
) -> None:
    """Every rank: the loss of `bad_step` was not finite on some rank, with every input batch
    finite. Keeps a checkpoint of the last finite state; raises RunFailed on every rank.

    Args:
      variables: the training state (model and optimizer variables).
      save_now: every rank: checkpoints the state now, waits for the write, returns its folder.
      latest_checkpoint: rank 0: the newest checkpoint folder on disk, or None.
      local_loss: this rank's loss of `bad_step`.
    """
    loss = float(np.mean(dist.allgather([local_loss])))  # the global loss of that step
    checkpoint, kept = _keep_finite_state(dist, variables, save_now, latest_checkpoint)
    message = (
        f"the training loss was {loss} at step {bad_step} (epoch {epoch}): the model diverged (a "
        f"learning rate too high?); no input file was found bad (every batch of every rank was finite, "
        f"checked in the step); {kept}; MLPerf log closed as aborted"
    )
    raise RunFailed(
        Failure(
            reason=NON_FINITE_LOSS,
            exit_code=ExitCode.NON_FINITE_LOSS,
            step_num=bad_step,
            loss=str(loss),
            checkpoint=checkpoint,
            message=message,
        )
    )


def _keep_finite_state(dist, variables, save_now, latest_checkpoint) -> tuple:
    """Every rank: (checkpoint path or None, what the message says about it).

    Updates with non-finite gradients were skipped (common.run.steps.TrainStep), so the
    variables usually hold the last finite state: they are saved. If they are not finite
    all the same (a finite gradient times the LR overflowed, a batch-norm statistic of a
    diverged forward pass), the newest checkpoint written before is the last finite state.
    """
    broken = float(
        not all(bool(tf.reduce_all(tf.math.is_finite(v))) for v in variables if v.dtype.is_floating)
    )
    if not dist.allreduce_max([broken])[0]:
        path = save_now()
        return (
            path,
            f"checkpoint of the last finite state (its updates with non-finite gradients skipped): {path}",
        )
    latest = latest_checkpoint() if dist.is_root else None
    latest = dist.broadcast_object(None if latest is None else str(Path(latest).resolve()))
    if latest is None:
        return (
            None,
            "the weights are no longer finite and no checkpoint was written before (train.checkpoint_steps)",
        )
    return (
        latest,
        f"the weights are no longer finite; the last finite state is the newest checkpoint {latest}",
    )
