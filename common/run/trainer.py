"""The run every benchmark's train.py starts, top to bottom.

  python <bench>/train.py [CONFIG] [--flag value ...] [--set key.sub=value ...]

`main` reads the command line, starts Horovod and reports. `Trainer.run` builds the run in
Horovod's order (seed, model, LR scaled for the global batch, optimizer, rank 0's state broadcast,
steps traced and warmed up), prepares the data and runs one mode. `Trainer.train` is the timed run:
epochs of `common.run.steps.TrainStep`, evaluated every train.eval_every epochs, until the target,
the last epoch, a stop request or a failure. Every rank calls the same collectives in the same
order; the trainer prints nothing: listeners (rank 0's console, the MLPerf log) act on its events.
Without CONFIG, the closed config of the job's global batch is used. A bad input ends the run with
one `error:` line and a non-zero exit at once (no Horovod shutdown), so the launcher tears the other
ranks down instead of leaving them in a collective.
"""

import dataclasses
import json
import os
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import tensorflow as tf
import tf_keras

from common import runtime as runtime_lib
from common.checkpoints import CheckpointSaver, ResumePoint
from common.config import dump_config, load_run_config, parse_overrides, peek, yaml_text
from common.errors import ExitCode, InputError, write_text_atomic
from common.inputs.pipeline import (
    batches_per_epoch,
    drop_from_page_cache,
    host_options,
    prefetch_to,
)
from common.parallel.distribution import (
    Distribution,
    average_batchnorm_statistics,
    batchnorm_statistics,
    launcher_env,
    variables_in_sync,
)
from common.reporting.console import Console
from common.reporting.events import EpochTrain, Events, RunInfo, StepInfo, TrainLog
from common.reporting.mlperf_logger import MLPerfLogger
from common.run import report as run_report
from common.run import termination
from common.run.report import RunResult, write_summary
from common.run.steps import EvalSums, TrainStep, eval_step_specs, make_eval_step
from common.run.termination import RunFailed, naming_bad_files
from common.run.warmup import state_variables, warm_up

# How many steps behind the newest one launched a step must be before its values are read: by then
# it has finished, so the read does not wait for it (on a GPU, it would empty the launch queue).
READ_LAG = 2


def main(task, argv=None) -> int:
    """Parses flags, trains the Task class `task`, reports; returns the process exit code."""
    rank_prefix = ""
    events = None
    trainer = None

    def terminated():
        _abort(events, trainer)
        _error(
            rank_prefix,
            "terminated (SIGTERM): log closed as aborted; stopping at the next step with a "
            "checkpoint if every rank gets there in time",
        )

    # A launcher ends the other ranks with SIGTERM when one dies (horovodrun, mpirun,
    # srun --kill-on-bad-exit): the log is closed as aborted before SIGKILL follows.
    # Until the config is read, SIGTERM ends the process at once.
    termination.on_signals(terminated)
    try:
        config_path, overrides = parse_overrides(task, argv)
        # Horovod reads its cycle time during init: shorter when batch-norm groups chain collectives.
        bn_group = task.requested_batchnorm_group_size(config_path, overrides)
        if bn_group > 1:
            from common.parallel import cycle_time  # runs with batch-norm groups only

            cycle_time.set_for_batchnorm_groups(bn_group)
        spatial = peek(task.config_class, config_path, overrides, "parallel.spatial_ranks") or 1
        # Horovod's init, with the static process sets of the run's groups of ranks (spatial groups;
        # batch-norm groups, whose requested size counts a split's ranks in) for the job's size as
        # its launcher tells it; then the device pinned by local rank.
        dist = Distribution(group_sizes=(spatial, bn_group))
        rank_prefix = f" [rank {dist.rank}]" if dist.size > 1 else ""
        cfg, note = load_run_config(task, config_path, overrides, dist.size)
        termination.on_signals(terminated, cfg.runtime.sigterm_grace_s)
        # Threads and precision, before the first TensorFlow op: the collective below is one.
        runtime = runtime_lib.configure(cfg.runtime, dist)
        # Collective (checks the nodes of the groups when samples are split): every rank, here.
        mesh = dist.spatial_mesh(cfg.parallel.spatial_ranks)
        bound = task(cfg, mesh if mesh.is_split else None)
        run_dir = Path(cfg.run_dir)
        listeners, console = [], None
        if dist.is_root:
            console = Console()  # rank 0's console: every line a person reads, in order
            if note:  # which config, what runtime.tiny did
                console.print(f"[init] {note}")
            run_dir.mkdir(parents=True, exist_ok=True)
            dump_config(cfg, run_dir / "config.yaml")
            listeners = _listeners(bound, cfg, run_dir, console)
        events = Events(listeners)
        trainer = Trainer(bound, dist, events, run_dir, runtime)
        result = trainer.run()
        events.close()
        if dist.is_root:
            report = run_report.finish(bound, result, run_dir, ExitCode.PREEMPTED)
            console.report(report)
            write_summary(
                result,
                run_dir / "summary.json",
                {
                    "benchmark": task.name,
                    "ranks": dist.size,
                    "nodes": dist.num_nodes,
                    "controller": dist.controller(),
                    "launcher": launcher_env(),
                    "metric_name": bound.metric_name,
                    "target": bound.target,
                    "log_check": report.log_check,
                },
            )
        # Every rank waits for rank 0's report: a rank that exits first with a
        # non-zero status would make the launcher kill rank 0 mid-write.
        dist.barrier()
        if result.failure:  # every rank agreed on it and says it, as on any bad input
            _error(rank_prefix, result.failure.message)
            return result.failure.exit_code
        if result.status == "preempted":
            termination.stopped()  # in order: the SIGTERM deadline no longer applies
            return ExitCode.PREEMPTED
        return (
            ExitCode.OK
            if result.status in ("success", "evaluated", "benchmarked")
            else ExitCode.NOT_CONVERGED
        )
    except InputError as e:
        _abort(events, trainer)
        _fail(rank_prefix, str(e), ExitCode.INPUT_ERROR)
    except KeyboardInterrupt:
        _abort(events, trainer)
        _fail(rank_prefix, "interrupted", ExitCode.INTERRUPTED)
    except Exception:
        traceback.print_exc()
        _abort(events, trainer)
        _fail(rank_prefix, "crashed (traceback above)", ExitCode.CRASH)
    return ExitCode.CRASH


class Trainer:
    """Runs a bound Task (common.task) on every rank: `dist` the Distribution, `events` what the
    listeners get, `runtime` what common.runtime.configure set (device, threads, precision). `run`
    sets what the modes read: mesh, shards, model, optimizer, schedule, metric, saver, the traced
    train_step and eval_step, info (the RunInfo of init_stop)."""

    def __init__(self, task, dist, events, run_dir, runtime: dict):
        self.task, self.cfg, self.dist, self.events = task, task.cfg, dist, events
        self.runtime = runtime
        self.precision = runtime["precision"]
        self.output_dir = Path(run_dir)
        # Where the run stands (main reads it on a crash): the epoch in progress (0 before the
        # first); optimizer steps done over the whole run, resumes included (the run's one count,
        # carried by the events that stand at a step); whether run_start was logged.
        self.epoch, self.global_step, self.started = 0, 0, False
        self.optimizer_shard = None  # a ShardedUpdate when parallel.shard_optimizer (set by _build)
        # The timed run's record, what a failed run still reports: one entry per epoch
        # (RunResult.history), the last evaluation, and whether it ended at the target or the last
        # epoch (neither stopped nor failed).
        self.history, self.last_metric, self.completed = [], float("nan"), False
        self.timed_epochs = 0  # epochs whose steps were each timed (the first this process runs)

    @property
    def steps_per_epoch(self) -> int:
        return self.info.steps_per_epoch

    @property
    def samples_per_epoch(self) -> int:
        """One epoch's samples over all ranks, in whole steps."""
        return self.info.samples_per_epoch

    def reached(self, value: float) -> bool:
        """Whether a metric value meets the task's target."""
        target = self.task.target
        return value <= target if self.metric.lower_is_better else value >= target

    def run(self) -> RunResult:
        """init -> (staging) -> one run mode: the order every Horovod program follows, a line a step."""
        cfg, dist, task, events = self.cfg, self.dist, self.task, self.events
        events.on_init_start()
        # Horovod is initialized and the device pinned (common.parallel.distribution), threads and
        # precision set (common.runtime.configure), all before the first op.
        runtime = self.runtime
        tf_keras.utils.set_random_seed(cfg.train.seed)
        # Data parallelism is over groups: one rank each, or the K ranks that split each sample.
        mesh = self.mesh = task.mesh or dist.spatial_mesh(1)
        split = f"; {mesh.describe()}" if mesh.is_split else ""
        if cfg.parallel.shard_optimizer:
            split += ", the optimizer's state sharded over each group"
        events.on_runtime_configured(dist.describe() + split, runtime)
        shards = task.shard(mesh.group, mesh.groups)  # this rank's (its group's) files
        plan = _plan_epochs(shards, mesh.groups, cfg.train.gradient_accumulation_frequency)
        # The LR scaled for the global batch:
        model, optimizer, schedule, loss_fn, metric = self._build(plan, mesh)
        self.model, self.optimizer, self.schedule, self.metric = model, optimizer, schedule, metric
        saver = self.saver = CheckpointSaver(
            self.output_dir / "checkpoints",
            model,
            optimizer,
            dist,
            cfg.train,
            plan.steps_per_epoch,
            task.name,
            optimizer_shard=self.optimizer_shard,
        )
        saver.prepare()
        start = self._restore_or_start(saver, model, plan)  # rank 0 picks the checkpoint, if any
        self.global_step = start.global_step
        # All start from rank 0's state. A sharded optimizer's differs by rank: zeros from scratch,
        # and each rank's own part of a checkpoint, read by every rank.
        dist.broadcast_variables(
            model.variables + (optimizer.variables if self.optimizer_shard is None else [])
        )
        if start.rank_state is not None:
            # Mid-epoch, each rank's running statistics are its own (averaged at the epoch's end).
            start.rank_state.restore_batchnorm(model, start.source)
        # Gradients allreduced inside:
        self.train_step, self.eval_step = self._build_steps(model, optimizer, loss_fn, metric)
        # Compile and autotune on synthetic batches, the state put back: not in the timed region.
        warmup = warm_up(
            self.train_step,
            self.eval_step,
            task.input_specs(),
            state_variables(model, optimizer, self.train_step),
            0 if cfg.train.evaluate_only else cfg.train.warmup_steps,
            # On a GPU: an op of the steps left on the CPU ends the run (exit 2) unless allowed.
            cfg.runtime.allow_cpu_ops if runtime["device"] == "gpu" else None,
        )
        self.info = self._run_info(shards, plan, start, warmup)
        events.on_init_stop(self.info)

        # Outside the timed region: stage the shard node-locally, build the input pipeline once.
        staging = None
        if cfg.staging.stage_dir:
            from common.inputs.staging import stage_shards  # a run that stages only

            events.on_staging_start()
            layout = task.staged_layout() if cfg.staging.convert else None
            shards, staging = stage_shards(cfg, dist, shards, events.on_staging_progress, layout)
            events.on_staging_stop(staging)
        if cfg.runtime.record_shards:
            self._record_shards(shards)  # the paths actually read, staged or not
        self.shards = shards
        train_ds, valid_ds = task.build_inputs(shards, mesh.group, dist.local_size, start.position)
        valid_ds = padded_batches(valid_ds, shards.local_batch_size)  # the traced shape, always
        # The last stage, the same for every task: tf.data on a thread pool of the rank's cores, then
        # batches copied to the device while the step before runs.
        train_ds, valid_ds = (
            prefetch_to(
                ds.with_options(host_options(runtime["input_threads"])),
                runtime["prefetch_to_device"],
            )
            for ds in (train_ds, valid_ds)
        )
        self._check_specs(train_ds, valid_ds)
        if cfg.train.evaluate_only:  # --evaluate: the model as restored, one validation pass
            try:
                value = self.evaluate(valid_ds, self.epoch)[0]
            except RunFailed as e:  # no run started: bad input like any other
                raise InputError(e.failure.message) from None
            result = RunResult(status="evaluated", epochs=start.start_epoch, metric=value)
        elif cfg.train.benchmark_steps:
            from common.run.benchmark_mode import run_benchmark

            result = run_benchmark(self, train_ds)
        else:
            self._clear_page_cache(shards)
            if cfg.mlperf.start_barrier_dir:  # weak scaling: the set of instances starts together
                from common.run.instance_start import meet_the_other_instances

                events.on_instances_met(meet_the_other_instances(cfg.mlperf, dist))
            result = self.train(train_ds, valid_ds, start)  # metrics averaged; rank 0 writes
        # A collective, once on every rank whatever the mode and however it ended: after run_stop,
        # before the characterization's collectives and rank 0's report. All ranks must end with
        # identical variables, batch-norm statistics included (common.parallel.distribution).
        in_sync, compared = variables_in_sync(model.variables, dist)
        result = dataclasses.replace(
            result,
            runtime=runtime,
            num_params=self.info.num_params,
            resumed_from=start.resumed_from,
            staging=staging,
            weights_in_sync=in_sync,
            weights_compared=compared,
        )
        if cfg.runtime.characterize and self.completed:
            from common.run.characterization import characterize_run  # runtime.characterize only

            result = dataclasses.replace(
                result, characterization=characterize_run(self, train_ds, staging)
            )
        return result

    # ------------------------------------------------------------ the timed run
    def train(self, train_ds, valid_ds, start: ResumePoint) -> RunResult:
        """Every rank: the timed run from `start` (its position, and the epoch's losses so far), to
        its run_stop; what it found."""
        self.events.on_run_start()
        self.started = True
        run_start = time.perf_counter()
        # This rank's losses of the epoch in progress (a mid-epoch checkpoint's, resumed).
        self.epoch_losses = (
            [tf.constant(v) for v in start.rank_state.losses] if start.rank_state else []
        )
        try:
            return self._epochs(iter(train_ds), valid_ds, start.position.epoch, run_start)
        except RunFailed as e:
            from common.run.failures import end_failed

            return end_failed(self, e.failure, run_start)

    def _epochs(self, train_iter, valid_ds, first_epoch: int, run_start: float) -> RunResult:
        events, saver, t = self.events, self.saver, self.cfg.train
        status, checkpoint = "aborted", None
        epoch = self.epoch = first_epoch - 1  # the last epoch done
        stopped = False
        for epoch in range(first_epoch, t.n_epochs + 1):
            self.epoch = epoch
            events.on_epoch_start(epoch, self.global_step)
            train = self._epoch(train_iter, epoch)
            if train is None:  # stopped on request mid-epoch, checkpoint written
                stopped = True
                epoch -= 1  # the last epoch done
                break
            # As the MLCommons DeepCAM reference: each rank's batch-norm running statistics become
            # their mean over all ranks after every epoch (a collective).
            average_batchnorm_statistics(self.model, self.dist)
            events.on_epoch_stop(epoch, train)
            figures = dataclasses.asdict(train)
            record = {"epoch": epoch} | {
                k: v for k, v in figures.items() if k != "global_step" and v is not None
            }
            self.history.append(record)
            if epoch % t.eval_every == 0 or epoch == t.n_epochs:
                events.on_eval_start(epoch)
                value, eval_loss = self.evaluate(valid_ds, epoch)
                events.on_eval_stop(epoch, self.global_step, value, eval_loss)
                self.last_metric = record["metric"] = value
                record["eval_loss"] = eval_loss
            record["time_s"] = time.perf_counter() - run_start
            if "metric" in record and t.stop_at_target and self.reached(record["metric"]):
                status = "success"
                break
            # A request at the last epoch's end leaves nothing to resume: the run just ends.
            stopped = epoch < t.n_epochs and termination.agree_to_stop(self.dist)
            if stopped or saver.due_after_epoch(epoch, self.global_step):
                saver.save(epoch, self.steps_per_epoch, self.global_step, wait=stopped)
            if stopped:
                break
        if saver.enabled and not stopped:  # the final state, unless just saved
            saver.save(epoch, self.steps_per_epoch, self.global_step)
        saver.wait()
        checkpoint_save = saver.figures()
        if stopped:
            status = "preempted"
            checkpoint = saver.folder(self.global_step)
        elif not t.stop_at_target and self.reached(self.last_metric):
            status = "success"
        time_to_train_s = time.perf_counter() - run_start
        # A stopped run's log says aborted, and where it can go on from.
        events.on_run_stop("aborted" if stopped else status, self.epoch, checkpoint)
        self.completed = not stopped
        return RunResult(
            status=status,
            epochs=epoch,
            metric=self.last_metric,
            time_to_train_s=time_to_train_s,
            history=self.history,
            checkpoint=checkpoint,
            checkpoint_save=checkpoint_save,
        )

    def _epoch(self, train_iter, epoch) -> EpochTrain | None:
        """The rest of `epoch`'s steps; None if the ranks agreed to stop (checkpoint written);
        RunFailed on every rank once they agree that a step's input or loss was not finite. A step's
        values are read READ_LAG steps after its launch, the last ones at the epoch's end
        (_end_epoch), where batch-norm averaging and evaluation wait for them anyway."""
        t, saver, per_epoch = self.cfg.train, self.saver, self.steps_per_epoch
        start = time.perf_counter()
        losses = self.epoch_losses  # the steps a resumed run did before, if any
        first = len(losses)
        flags = []  # each step's StepResult.inputs_finite, from step first + 1
        checked = first  # losses[:checked] went through an agreement
        log_from, log_launched, log_start = first, first, start  # what the last TrainLog covered
        timer = None  # runtime.step_timing (a measurement, off by default): the first epoch's steps
        if self.cfg.runtime.step_timing and self.timed_epochs == 0:
            from common.run.benchmark_mode import StepTimer

            timer = StepTimer(train_iter)
        self.timed_epochs += 1
        with naming_bad_files(self.task, self.shards.train_files):
            for step in range(first + 1, per_epoch + 1):
                result = timer.run(self.train_step) if timer else self.train_step(train_iter)
                losses.append(result.loss)
                flags.append(result.inputs_finite)
                self.global_step += 1
                self.events.on_step(StepInfo(epoch, step, per_epoch, self.global_step))
                if step == per_epoch:
                    break  # the epoch's end checks and saves after its statistics are averaged
                finished = max(len(losses) - READ_LAG, checked)  # losses[:finished] are done
                if (
                    t.log_every_steps
                    and self.global_step % t.log_every_steps == 0
                    and finished > log_from
                ):
                    now = time.perf_counter()
                    self.events.on_train_log(
                        self._train_log(
                            epoch,
                            losses[log_from:finished],
                            self.global_step - (len(losses) - finished),
                            len(losses) - log_launched,
                            now - log_start,
                        )
                    )
                    log_from, log_launched, log_start = finished, len(losses), now
                stop = False
                if self.global_step % t.stop_check_steps == 0:
                    stop = self._agree(
                        epoch,
                        step,
                        losses[checked:finished],
                        flags[checked - first : finished - first],
                        first_step=self.global_step - (len(losses) - checked) + 1,
                    )
                    checked = finished
                if saver.due_mid_epoch(self.global_step):
                    saver.save(epoch, step, self.global_step, losses)
                if stop:
                    saver.save(epoch, step, self.global_step, losses, wait=True)
                    return None
            loss = self._end_epoch(epoch, losses[checked:], flags[checked - first :], losses)
        self.epoch_losses = []
        seconds = time.perf_counter() - start
        steps = per_epoch - first
        return EpochTrain(
            global_step=self.global_step,
            loss=loss,
            lr=self.schedule.at_step((epoch - 1) * per_epoch),
            samples_per_s=self.samples_per_epoch * steps / per_epoch / seconds,
            **(timer.figures() if timer else {}),
        )

    def _end_epoch(self, epoch, unchecked, flags, losses) -> float:
        """After the epoch's last step: the agreement over the steps not yet agreed on (a stop request
        waits for the epoch's end checks), then the epoch's mean loss over all ranks."""
        first_step = self.global_step - len(unchecked) + 1
        self._agree(epoch, self.steps_per_epoch, unchecked, flags, first_step=first_step)
        return float(self.dist.allreduce_mean([_mean(losses)])[0])

    def _agree(self, epoch, step, losses, flags, first_step: int) -> bool:
        """The agreement of the steps since the last one (`losses`, `flags`: this rank's, done steps
        from global step `first_step` on): True on every rank once any rank got a stop request;
        RunFailed on every rank when a batch or a loss was not finite on any rank."""
        values = tf.stack(losses).numpy() if losses else np.zeros(0)
        finite = tf.stack(flags).numpy() if flags else np.ones(0, bool)
        verdict = termination.agree(self.dist, first_step, values, finite)
        if verdict.bad_input_rank is not None or verdict.bad_loss_step is not None:
            from common.run.failures import fail_on_verdict  # a failing run only

            fail_on_verdict(self, verdict, epoch, step, values, first_step)
        return verdict.stop

    def _train_log(self, epoch, losses, global_step, launched, seconds) -> TrainLog:
        """This rank's mean loss over `losses` (done steps, the last of them `global_step`) and its LR;
        samples/s of the `launched` steps of the last `seconds`."""
        loss = float(np.mean(tf.stack(losses).numpy(), dtype=np.float64))
        samples = launched * self.samples_per_epoch / self.steps_per_epoch
        return TrainLog(
            epoch=epoch,
            global_step=global_step,
            loss=loss,
            lr=float(self.schedule.at_step(global_step - 1)),
            samples_per_s=samples / seconds if seconds > 0 else 0.0,
        )

    def evaluate(self, valid_ds, epoch: int) -> tuple[float, float]:
        """Every rank: (the metric, the per-sample mean loss) over every rank's validation files;
        RunFailed on every rank if a batch held NaN or Inf."""
        # Summed where the steps run and read once: a read per batch would wait for each.
        sums = tf.constant(EvalSums.zero_vector(self.metric.n_sums))
        with naming_bad_files(self.task, self.shards.valid_files):
            for x, y, n in valid_ds:
                sums = sums + self.eval_step(x, y, n)
            sums = sums.numpy()
        local = EvalSums.of(sums)
        # The ranks of a spatial group evaluate the same samples: each group counted once.
        total = EvalSums.of(self.dist.allreduce_sum(sums) / self.mesh.size)
        if total.non_finite_batches:
            from common.run.failures import fail_on_validation_input  # a failing run only

            fail_on_validation_input(self, epoch, bool(local.non_finite_batches))
        loss = float(total.loss / total.samples) if total.samples else float("nan")
        return float(self.metric.finalize(total.metric)), loss

    # ---------------------------------------------------------------- set-up
    def _build(self, plan, mesh):
        """(model, optimizer, schedule, loss, metric): the model under the precision policy with its
        batch-norm group, the task's optimizer wrapped for the precision and built (for this rank's
        variables only when it is sharded over the spatial group: self.optimizer_shard)."""
        task = self.task
        with runtime_lib.dtype_policy(self.precision):
            model = task.build_model(batchnorm_group(self.dist, task))
        optimizer, schedule = task.build_optimizer(plan.global_batch, plan.steps_per_epoch)
        optimizer = runtime_lib.wrap_optimizer(optimizer, self.precision)  # fp16: loss scaling
        self.optimizer_shard = None
        if self.cfg.parallel.shard_optimizer:
            from common.parallel.sharded_optimizer import optimizer_shard  # sharded runs only

            self.optimizer_shard = optimizer_shard(model, mesh)
        optimizer.build(
            self.optimizer_shard.owned_variables()
            if self.optimizer_shard
            else model.trainable_variables
        )
        return model, optimizer, schedule, task.build_losses(), task.build_metrics()

    def _restore_or_start(self, saver, model, plan) -> ResumePoint:
        t = self.cfg.train
        if not (t.resume or t.resume_from):
            return ResumePoint()
        from common.resume import resume_point  # a run that resumes only

        source = t.resume_from or saver.checkpointer.latest()
        # Rank 0 chooses for all: ranks that see the file system differently
        # must not resume from different epochs (and hang in the first collective).
        source = self.dist.broadcast_object(None if source is None else str(source))
        return resume_point(
            saver.checkpointer,
            source,
            model=model,
            rank=self.dist.rank,
            ranks=self.dist.size,
            steps_per_epoch=plan.steps_per_epoch,
            optimizer_shard=self.optimizer_shard,
            accumulation=t.gradient_accumulation_frequency,
        )

    def _build_steps(self, model, optimizer, loss_fn, metric):
        """Traces the train and eval steps from the task's TensorSpecs: init work under the MLPerf
        rules (graphs built, no training sample touched)."""
        cfg, task = self.cfg, self.task
        rt = cfg.runtime
        train_step = TrainStep(
            model,
            optimizer,
            loss_fn,
            self.dist,
            rt.gradient_compression,
            rt.xla,
            cfg.train.gradient_accumulation_frequency,
            preprocess=task.preprocess_batch,
            gradient_scales=task.gradient_scales(model),
            grouped_allreduce=rt.gradient_allreduce == "grouped",
            shard=self.optimizer_shard,
        )
        eval_step = make_eval_step(
            model, metric, rt.xla, preprocess=task.preprocess_batch, loss_fn=loss_fn
        )
        specs = task.input_specs()
        train_step.trace(specs)
        eval_step.get_concrete_function(*eval_step_specs(specs))
        return train_step, eval_step

    def _run_info(self, shards, plan, start, warmup) -> RunInfo:
        cfg, dist, task, model = self.cfg, self.dist, self.task, self.model
        return RunInfo(
            benchmark=task.name,
            seed=cfg.train.seed,
            num_nodes=dist.num_nodes,
            ranks=dist.size,
            # 0 on CPU-only nodes, as the MLPerf HPC rules ask; else the GPUs used on this node.
            accelerators_per_node=dist.local_size if self.runtime["device"] == "gpu" else 0,
            global_batch_size=plan.global_batch,
            train_samples=shards.train_set_size or shards.n_train,
            eval_samples=shards.n_valid,
            hyperparameters=task.mlperf_hyperparameters(plan.global_batch),
            target_name=self.metric.name,
            target=task.target,
            steps_per_epoch=plan.steps_per_epoch,
            n_epochs=cfg.train.n_epochs,
            resumed_from=start.resumed_from,
            model_name=model.name,
            num_params=int(sum(np.prod(v.shape) for v in model.trainable_variables)),
            spatial_ranks=self.mesh.size,
            spatial_plan=task.describe_split(model) if self.mesh.is_split else "",
            batchnorm_layers=len(batchnorm_statistics(model)) // 2,
            samples_per_epoch=plan.samples_per_epoch,
            shard_samples=shards.n_train,
            resumed_source=start.source,
            warmup_steps=warmup.steps,
            warmup_s=warmup.seconds,
        )

    def _check_specs(self, train_ds, valid_ds):
        """The graphs traced at init are the ones training and evaluation run: no tracing inside
        the timed region."""
        specs = tuple(self.task.input_specs())
        for declared, ds in ((specs, train_ds), (eval_step_specs(specs), valid_ds)):
            actual = tuple(ds.element_spec)
            if len(declared) != len(actual) or any(
                d.shape != a.shape or d.dtype != a.dtype for d, a in zip(declared, actual)
            ):
                raise RuntimeError(
                    f"{self.task.name}: the steps' specs {declared} differ from the "
                    f"dataset's element_spec {actual}"
                )

    def _record_shards(self, shards) -> None:
        """Writes <run dir>/shards/rank-NNNNN.json: this rank's host and files (tests, audits)."""
        folder = self.output_dir / "shards"
        folder.mkdir(parents=True, exist_ok=True)
        record = {
            "rank": self.dist.rank,
            "host": self.dist.hostname,
            "train": shards.train_files,
            "valid": shards.valid_files,
        }
        write_text_atomic(folder / f"rank-{self.dist.rank:05d}.json", json.dumps(record))

    def _clear_page_cache(self, shards) -> None:
        files = list(shards.train_files) + list(shards.valid_files)
        done, failed = (
            drop_from_page_cache(files) if self.cfg.runtime.cache_clear else (0, len(files))
        )
        done, failed = self.dist.allreduce_sum([done, failed])
        self.events.on_caches_cleared(bool(failed == 0 and done > 0), int(done))


def batchnorm_group(dist, task):
    """The RankGroup whose batch norm shares its statistics: the task's batchnorm_group_size ranks, times
    K when samples are split (a slab's statistics are not its sample's): a process set that
    Distribution's init registered (main names its size)."""
    k = task.mesh.size if task.mesh is not None else 1
    return dist.rank_group(
        task.batchnorm_group_size * k,
        "batchnorm_group_size"
        if k == 1
        else f"batchnorm_group_size x parallel.spatial_ranks ({task.batchnorm_group_size} x {k})",
    )


def padded_batches(dataset: tf.data.Dataset, batch_size: int) -> tf.data.Dataset:
    """`dataset`'s batches (x, y) as (x, y, n) of `batch_size` samples, the first n real, then
    copies of the last: the shape traced and warmed up at init (no retrace in the timed region)."""

    def pad(x, y):
        n = tf.shape(x)[0]
        fill = tf.minimum(tf.range(batch_size), n - 1)  # 0, 1, ..., n - 1, n - 1, ...
        x, y = tf.cond(
            n < batch_size, lambda: (tf.gather(x, fill), tf.gather(y, fill)), lambda: (x, y)
        )
        return (
            tf.ensure_shape(x, (batch_size, *x.shape[1:])),
            tf.ensure_shape(y, (batch_size, *y.shape[1:])),
            n,
        )

    return dataset.map(pad)


@dataclasses.dataclass(frozen=True)
class _EpochPlan:
    """One epoch in optimizer steps, and the global batch of a step."""

    steps_per_epoch: int
    global_batch: int

    @property
    def samples_per_epoch(self) -> int:
        return self.steps_per_epoch * self.global_batch


def _plan_epochs(shards, groups: int, accumulation: int) -> _EpochPlan:
    """Steps and samples per epoch from the shard (common.inputs.pipeline); InputError when no whole step fits."""
    # Gradient accumulation makes each optimizer step see n local batches; the ranks of a
    # spatial group share theirs.
    global_batch = shards.local_batch_size * groups * accumulation
    steps = (
        batches_per_epoch(len(shards.train_files), shards.local_batch_size, accumulation)
        // accumulation
    )
    if steps == 0:
        raise InputError(
            f"{len(shards.train_files)} training samples per rank make no whole step of "
            f"local batch {shards.local_batch_size} x accumulation {accumulation}"
        )
    return _EpochPlan(steps, global_batch)


def _mean(losses) -> float:
    """The mean of a list of scalar loss tensors, in float64 (reading it waits for the last step)."""
    return float(tf.reduce_mean(tf.cast(tf.stack(losses), tf.float64)).numpy())


def _error(rank_prefix: str, message: str) -> None:
    """This rank's one `error:` line, spaces folded, in one write: under horovodrun stderr is
    unbuffered and Horovod's threads log to it too (print writes the newline apart)."""
    sys.stderr.write(f"error:{rank_prefix} {' '.join(message.split())}\n")


def _fail(rank_prefix: str, message: str, code: int) -> None:
    _error(rank_prefix, message)
    sys.stdout.flush()
    os._exit(code)


def _abort(events, trainer) -> None:
    """Closes the MLPerf log of a failed run with run_stop status 'aborted'."""
    if events is None:
        return
    try:
        if trainer is not None and trainer.started:
            events.on_run_stop("aborted", trainer.epoch)
        events.close()
    except Exception:  # the original error matters more than a failure to log it
        pass


def _listeners(task, cfg, run_dir, console) -> list:
    """Rank 0's listeners: the MLPerf log (a benchmark run only), the console, TensorBoard."""
    listeners = [console]
    if not (cfg.train.evaluate_only or cfg.train.benchmark_steps):  # no MLPerf log otherwise
        m = dataclasses.asdict(cfg.mlperf)
        submission = {"benchmark": task.name} | {
            k: m[k] for k in ("org", "division", "status", "platform")
        }
        instance = {k: m[k] for k in ("instance_id", "number_of_instances") if m[k] is not None}
        listeners.insert(
            0, MLPerfLogger(run_dir, submission, metric_key=task.metric_name, instance=instance)
        )
    if cfg.runtime.tensorboard:
        from common.reporting.tensorboard import TensorBoardListener  # --tensorboard only

        listeners.append(TensorBoardListener(run_dir / "tensorboard", yaml_text(cfg)))
    return listeners
