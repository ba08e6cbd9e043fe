"""Ending a run that cannot go on, on every rank alike: a batch with NaN or Inf names its file
(`fail_on_input`); a non-finite loss with every input finite keeps a checkpoint of the last finite
state (`fail_on_loss`). Both raise common.run.termination.RunFailed on every rank at the same point,
so no rank is left waiting in a collective; `end_failed` ends the run. Imported by a failing run
only; the functions taking `trainer` read a common.run.trainer.Trainer's run.
"""

import time
from pathlib import Path

import numpy as np
import tensorflow as tf

from common.errors import ExitCode
from common.run.report import RunResult
from common.run.termination import NON_FINITE_INPUT, NON_FINITE_LOSS, Failure, RunFailed


def fail_on_verdict(trainer, verdict, epoch: int, step: int, losses, first_step: int) -> None:
    """Every rank, when the agreement over the training steps from global step `first_step` on
    (this rank's `losses`) found a non-finite batch or loss: raises RunFailed naming it."""
    t = trainer
    if verdict.bad_input_rank is not None:
        fail_on_input(
            t.dist,
            t.task,
            verdict.bad_input_rank,
            t.shards.train_files,
            epoch,
            verdict.bad_input_step,
            "training",
            t.global_step,
        )

    def save_now():
        t.saver.save(epoch, step, t.global_step, t.epoch_losses, wait=True)
        return t.saver.folder(t.global_step)

    fail_on_loss(
        t.dist,
        t.model.variables + t.optimizer.variables,
        save_now,
        t.saver.checkpointer.latest,
        epoch,
        verdict.bad_loss_step,
        losses[verdict.bad_loss_step - first_step],
    )


def fail_on_validation_input(trainer, epoch: int, mine: bool) -> None:
    """Every rank, when a validation batch held NaN or Inf on some rank (`mine`: on this one):
    raises RunFailed naming the file."""
    t = trainer
    culprit = t.dist.allreduce_max([t.dist.rank + 1.0 if mine else 0.0])[0]
    fail_on_input(
        t.dist,
        t.task,
        int(culprit) - 1,
        t.shards.valid_files,
        epoch,
        None,
        "validation",
        t.global_step,
    )


def end_failed(trainer, failure: Failure, run_start: float) -> RunResult:
    """Every rank: ends a run that could not go on, in order (no rank leaves another in a collective)."""
    trainer.saver.wait()  # the last finite state is on disk before anyone exits
    time_to_train_s = time.perf_counter() - run_start
    trainer.events.on_run_stop("aborted", trainer.epoch, failure.checkpoint, failure)
    return RunResult(
        status="aborted",
        epochs=trainer.epoch - 1,
        metric=trainer.last_metric,
        time_to_train_s=time_to_train_s,
        history=trainer.history,
        checkpoint=failure.checkpoint,
        failure=failure,
    )


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
    """Every rank: the loss of `bad_step` was not finite on some rank (`local_loss`: this rank's),
    every input finite. Keeps the last finite state of `variables` (`save_now()` checkpoints and
    returns the folder; rank 0's `latest_checkpoint()` the newest on disk); raises RunFailed."""
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
    """Every rank: (checkpoint path or None, what the message says about it). The variables, whose
    non-finite updates the step skipped, are saved if finite; else the newest checkpoint is it."""
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
