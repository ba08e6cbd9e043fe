"""The timed run: epochs of averaged-gradient steps from run_start to run_stop, evaluated
every train.eval_every epochs, until the target, the last epoch, a stop request or a failure.

Every rank runs the same loop and calls the same collectives in the same order: the
epoch's batch-norm averaging, evaluation, the agreement every train.stop_check_steps
steps (common.run.termination.agree) and mid-epoch saves (common.checkpoints.save_policy).
"""

import time

import numpy as np
import tensorflow as tf

from common.parallel.sync_batchnorm import average_batchnorm_statistics
from common.reporting.events import EpochTrain, StepInfo, TrainLog
from common.run import termination
from common.run.evaluate_mode import evaluate
from common.run.failures import Failure, RunFailed, fail_on_input, fail_on_loss, naming_bad_files
from common.run.result import RunResult, staging_dict

# How many steps behind the newest one launched a step must be before its values are read: by then
# it has finished, so the read does not wait for it (on a GPU, it would empty the launch queue).
READ_LAG = 2


class TrainingRun:
    """Trains `ctx` (a common.run.context.RunContext) from its resume point.

    Args:
      ctx: the bound run.
      start: the common.checkpoints.checkpointer.ResumePoint (its position, and the epoch's losses so far).
    """

    def __init__(self, ctx, start):
        self.ctx = ctx
        self.start = start
        # This rank's losses of the epoch in progress (a mid-epoch checkpoint's, resumed).
        self.epoch_losses = (
            [tf.constant(v) for v in start.rank_state.losses] if start.rank_state else []
        )
        # What a failed run still reports: the epochs done and the last evaluation.
        self.history = []  # one record per epoch (RunResult.history)
        self.metric = float("nan")
        self.completed = False  # ended at the target or the last epoch: neither stopped nor failed
        self.timed_epochs = 0  # epochs whose steps were each timed (the first this process runs)

    def run(self, train_ds, valid_ds) -> RunResult:
        """Every rank: the timed run, to its run_stop; what it found."""
        self.ctx.events.on_run_start()
        self.ctx.state.started = True
        run_start = time.perf_counter()
        train_iter = iter(train_ds)
        try:
            return self._epochs(train_iter, valid_ds, run_start)
        except RunFailed as e:
            return self._end_failed(e.failure, run_start)

    def _epochs(self, train_iter, valid_ds, run_start) -> RunResult:
        ctx = self.ctx
        events, state, saver, t = ctx.events, ctx.state, ctx.saver, ctx.cfg.train
        status, checkpoint = "aborted", None
        epoch = state.epoch = self.start.position.epoch - 1  # the last epoch done
        stopped = False
        for epoch in range(self.start.position.epoch, t.n_epochs + 1):
            state.epoch = epoch
            events.on_epoch_start(epoch, state.global_step)
            train = self._epoch(train_iter, epoch)
            if train is None:  # stopped on request mid-epoch, checkpoint written
                stopped = True
                epoch -= 1  # the last epoch done
                break
            # As the MLCommons DeepCAM reference: after every epoch's training,
            # evaluated or not, each rank's batch-norm running statistics (from
            # its own shard) become their mean over all ranks, so evaluation,
            # checkpoints (rank 0's) and the final model use the same statistics
            # on every rank. A collective: every rank calls it, here.
            average_batchnorm_statistics(ctx.model, ctx.dist)
            events.on_epoch_stop(epoch, train)
            record = {
                "epoch": epoch,
                "loss": train.loss,
                "samples_per_s": train.samples_per_s,
                "lr": train.lr,
            }
            if train.first_step_s is not None:
                record.update(
                    first_step_s=train.first_step_s,
                    median_step_s=train.median_step_s,
                    p90_step_s=train.p90_step_s,
                    first_input_wait_s=train.first_input_wait_s,
                )
            self.history.append(record)
            if epoch % t.eval_every == 0 or epoch == t.n_epochs:
                events.on_eval_start(epoch)
                value, eval_loss = evaluate(ctx, valid_ds, epoch)
                events.on_eval_stop(epoch, state.global_step, value, eval_loss)
                self.metric = record["metric"] = value
                record["eval_loss"] = eval_loss
            record["time_s"] = time.perf_counter() - run_start
            if "metric" in record and t.stop_at_target and ctx.reached(record["metric"]):
                status = "success"
                break
            # A request at the last epoch's end leaves nothing to resume: the run just ends.
            stopped = epoch < t.n_epochs and termination.agree_to_stop(ctx.dist)
            if stopped or saver.due_after_epoch(epoch, state.global_step):
                saver.save(epoch, ctx.steps_per_epoch, state.global_step, wait=stopped)
            if stopped:
                break
        if saver.enabled and not stopped:
            saver.save(
                epoch, ctx.steps_per_epoch, state.global_step
            )  # the final state, unless just saved
        saver.wait()
        checkpoint_save = saver.figures()
        if stopped:
            status = "preempted"
            checkpoint = saver.folder(state.global_step)
        elif not t.stop_at_target and ctx.reached(self.metric):
            status = "success"
        time_to_train_s = time.perf_counter() - run_start
        # A stopped run's log says aborted, and where it can go on from.
        events.on_run_stop("aborted" if stopped else status, state.epoch, checkpoint)
        self.completed = not stopped
        return RunResult(
            status=status,
            epochs=epoch,
            metric=self.metric,
            time_to_train_s=time_to_train_s,
            history=self.history,
            checkpoint=checkpoint,
            checkpoint_save=checkpoint_save,
        )

    def _epoch(self, train_iter, epoch) -> EpochTrain | None:
        """The rest of `epoch`'s steps; None if the ranks agreed to stop (checkpoint written).

        The loop launches steps and reads none of their values while they may still run: a step's
        loss and input flag are read (for the agreement and the log line) once it is READ_LAG steps
        behind the newest one launched, so that on a GPU the read finds it done and the queue the
        steps are launched into never drains. Only the epoch's end (_end_epoch) reads the last ones,
        where batch-norm averaging and evaluation wait for them anyway.

        Raises RunFailed on every rank once they agree that a step's input or loss was not finite.
        """
        ctx = self.ctx
        t, state, saver, per_epoch = ctx.cfg.train, ctx.state, ctx.saver, ctx.steps_per_epoch
        start = time.perf_counter()
        losses = self.epoch_losses  # the steps a resumed run did before, if any
        first = len(losses)
        flags = []  # each step's StepResult.inputs_finite, from step first + 1
        checked = first  # losses[:checked] went through an agreement
        log_from, log_launched, log_start = first, first, start  # what the last TrainLog covered
        # runtime.step_timing (a measurement, off by default): the first epoch's steps each waited
        # for and timed, their wait for input apart, for the [timing] line.
        timed = ctx.cfg.runtime.step_timing and self.timed_epochs == 0
        batches = _TimedBatches(train_iter) if timed else train_iter
        step_times, input_waits = [], []
        self.timed_epochs += 1
        with naming_bad_files(ctx.task, ctx.shards.train_files):
            for step in range(first + 1, per_epoch + 1):
                step_start = time.perf_counter()
                result = ctx.train_step(batches)
                if timed:
                    result.loss.numpy()  # waits for the step: the measurement's cost, opted into
                    waited = batches.take_wait()
                    step_times.append(time.perf_counter() - step_start - waited)
                    input_waits.append(waited)
                losses.append(result.loss)
                flags.append(result.inputs_finite)
                state.global_step += 1
                ctx.events.on_step(StepInfo(epoch, step, per_epoch, state.global_step))
                if step == per_epoch:
                    break  # the epoch's end checks and saves after its statistics are averaged
                finished = max(len(losses) - READ_LAG, checked)  # losses[:finished] are done
                if (
                    t.log_every_steps
                    and state.global_step % t.log_every_steps == 0
                    and finished > log_from
                ):
                    now = time.perf_counter()
                    ctx.events.on_train_log(
                        self._train_log(
                            epoch,
                            losses[log_from:finished],
                            state.global_step - (len(losses) - finished),
                            len(losses) - log_launched,
                            now - log_start,
                        )
                    )
                    log_from, log_launched, log_start = finished, len(losses), now
                stop = False
                if state.global_step % t.stop_check_steps == 0:
                    stop = self._agree(
                        epoch,
                        step,
                        losses[checked:finished],
                        flags[checked - first : finished - first],
                        first_step=state.global_step - (len(losses) - checked) + 1,
                    )
                    checked = finished
                if saver.due_mid_epoch(state.global_step):
                    saver.save(epoch, step, state.global_step, losses)
                if stop:
                    saver.save(epoch, step, state.global_step, losses, wait=True)
                    return None
            loss = self._end_epoch(epoch, losses[checked:], flags[checked - first :], losses)
        self.epoch_losses = []
        seconds = time.perf_counter() - start
        steps = per_epoch - first
        return EpochTrain(
            global_step=ctx.state.global_step,
            loss=loss,
            seconds=seconds,
            lr=ctx.schedule.at_step((epoch - 1) * per_epoch),
            samples_per_s=ctx.samples_per_epoch * steps / per_epoch / seconds,
            first_step_s=step_times[0] if step_times else None,
            median_step_s=float(np.median(step_times)) if step_times else None,
            p90_step_s=float(np.percentile(step_times, 90)) if step_times else None,
            first_input_wait_s=input_waits[0] if input_waits else None,
        )

    def _end_epoch(self, epoch, unchecked, flags, losses) -> float:
        """After the epoch's last step: the agreement over the steps not yet agreed on (a stop request
        waits for the epoch's end checks), then the epoch's mean loss over all ranks."""
        global_step = self.ctx.state.global_step
        self._agree(
            epoch,
            self.ctx.steps_per_epoch,
            unchecked,
            flags,
            first_step=global_step - len(unchecked) + 1,
        )
        return float(self.ctx.dist.allreduce_mean([_mean(losses)])[0])

    def _agree(self, epoch, step, losses, flags, first_step: int) -> bool:
        """The agreement of the steps since the last one (`losses`, `flags`: this rank's, done steps
        from global step `first_step` on): True on every rank once any rank got a stop request;
        RunFailed on every rank when a batch or a loss was not finite on any rank."""
        ctx, global_step, first = self.ctx, self.ctx.state.global_step, first_step
        values = tf.stack(losses).numpy() if losses else np.zeros(0)
        finite = tf.stack(flags).numpy() if flags else np.ones(0, bool)
        verdict = termination.agree(ctx.dist, first, values, finite)
        if verdict.bad_input_rank is not None:
            fail_on_input(
                ctx.dist,
                ctx.task,
                verdict.bad_input_rank,
                ctx.shards.train_files,
                epoch,
                verdict.bad_input_step,
                "training",
                global_step,
            )
        if verdict.bad_loss_step is not None:

            def save_now():
                ctx.saver.save(epoch, step, global_step, self.epoch_losses, wait=True)
                return ctx.saver.folder(global_step)

            fail_on_loss(
                ctx.dist,
                ctx.model.variables + ctx.optimizer.variables,
                save_now,
                ctx.saver.checkpointer.latest,
                epoch,
                verdict.bad_loss_step,
                values[verdict.bad_loss_step - first],
            )
        return verdict.stop

    def _end_failed(self, failure: Failure, run_start: float) -> RunResult:
        """Every rank: ends a run that could not go on, in order (no rank leaves another in a collective)."""
        ctx = self.ctx
        ctx.saver.wait()  # the last finite state is on disk before anyone exits
        time_to_train_s = time.perf_counter() - run_start
        ctx.events.on_run_stop("aborted", ctx.state.epoch, failure.checkpoint, failure)
        return RunResult(
            status="aborted",
            epochs=ctx.state.epoch - 1,
            metric=self.metric,
            time_to_train_s=time_to_train_s,
            history=self.history,
            checkpoint=failure.checkpoint,
            failure=failure,
        )

    def _train_log(self, epoch, losses, global_step, launched, seconds) -> TrainLog:
        """This rank's mean loss over `losses` (done steps, the last of them `global_step`) and its LR;
        samples/s of the `launched` steps of the last `seconds`."""
        ctx = self.ctx
        loss = float(np.mean(tf.stack(losses).numpy(), dtype=np.float64))
        samples = launched * ctx.samples_per_epoch / ctx.steps_per_epoch
        return TrainLog(
            epoch=epoch,
            global_step=global_step,
            loss=loss,
            lr=float(ctx.schedule.at_step(global_step - 1)),
            samples_per_s=samples / seconds if seconds > 0 else 0.0,
        )

    def characterize(self, train_ds, staging) -> dict:
        """Every rank, after run_stop and the weights check: FLOPs, input pipeline, memory and allreduce
        of this run (offline.characterize); {} unless runtime.characterize is on and the run completed.

        Args:
          train_ds: the training dataset the run read.
          staging: the StageStats of data preparation, None when nothing was staged.
        """
        ctx = self.ctx
        if not (ctx.cfg.runtime.characterize and self.completed):
            return {}
        ctx.events.on_characterization_start()
        from common.run.characterization import characterize_run  # runtime.characterize only

        return characterize_run(
            model=ctx.model,
            dist=ctx.dist,
            sample_shape=train_ds.element_spec[0].shape[1:],
            history=self.history,
            staging=staging_dict(staging),
            global_batch_size=ctx.info.global_batch_size,
            compression=ctx.cfg.runtime.gradient_compression,
            make_train_dataset=lambda: ctx.task.build_inputs(
                ctx.shards, ctx.mesh.group, ctx.dist.local_size
            )[0],
            local_batch_size=ctx.shards.local_batch_size,
            files_read=ctx.shards.train_files,
            samples_read=len(ctx.shards.train_files),
        )


class _TimedBatches:
    """The training iterator, counting the seconds its callers wait in next() (for input), so that
    a step's own time can be told apart."""

    def __init__(self, iterator):
        self._iterator = iterator
        self._waited = 0.0

    def __iter__(self):
        return self

    def __next__(self):
        start = time.perf_counter()
        try:
            return next(self._iterator)
        finally:
            self._waited += time.perf_counter() - start

    def take_wait(self) -> float:
        """The seconds waited since the last call."""
        taken, self._waited = self._waited, 0.0
        return taken


def _mean(losses) -> float:
    """The mean of a list of scalar loss tensors, in float64 (reading it waits for the last step)."""
    return float(tf.reduce_mean(tf.cast(tf.stack(losses), tf.float64)).numpy())
