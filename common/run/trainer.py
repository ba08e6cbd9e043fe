"""The generic run shared by every benchmark: init, data preparation, then one run mode.

`Trainer.run` reads top to bottom in Horovod's canonical order: pin the
device by local rank, build the model, scale the LR with the global batch,
wrap the optimizer, broadcast the initial state from rank 0, then hand the
bound run (common.run.context) to its mode: training (common.run.train_mode),
evaluation (common.run.evaluate_mode) or benchmark (common.run.benchmark_mode). The
mode returns what it found as a RunResult; the trainer adds what init found and the
end-of-run weights check, which every rank makes once, whatever the mode. The
trainer prints nothing: it emits events, and listeners (rank 0's console,
the MLPerf log, TensorBoard) act on them.
"""

import dataclasses
from pathlib import Path

import numpy as np
import tf_keras

from common import runtime as runtime_lib
from common.checkpoints.checkpointer import ResumePoint, resume_point
from common.checkpoints.save_policy import CheckpointSaver
from common.errors import InputError
from common.inputs import epochs
from common.inputs.device_prefetch import host_options, prefetch_to
from common.inputs.page_cache import drop_from_page_cache
from common.parallel.fingerprint import variables_in_sync
from common.parallel.sync_batchnorm import batchnorm_statistics
from common.reporting.events import RunInfo
from common.run.context import RunContext, RunState
from common.run.data_preparation import prepare_data
from common.run.evaluate_mode import padded_batches, run_evaluation
from common.run.result import RunResult
from common.run.steps import TrainStep, eval_step_specs, make_eval_step
from common.run.train_mode import TrainingRun
from common.run.warmup import state_variables, warm_up


def batchnorm_group(dist, task):
    """The RankGroup whose batch norm shares its statistics: the task's batchnorm_group_size ranks, times
    K when samples are split (a slab's statistics are not its sample's): a process set that
    Distribution's init registered (launch.py names its size)."""
    k = task.mesh.size if task.mesh is not None else 1
    return dist.rank_group(
        task.batchnorm_group_size * k,
        "batchnorm_group_size"
        if k == 1
        else f"batchnorm_group_size x parallel.spatial_ranks ({task.batchnorm_group_size} x {k})",
    )


def optimizer_shard(cfg, model, mesh):
    """With parallel.shard_optimizer, this rank's share of `model`'s variables for the optimizer (a
    common.parallel.sharded_optimizer.ShardedUpdate), the updated weights allgathered over the
    spatial group; else None (every rank updates all of them)."""
    if not cfg.parallel.shard_optimizer:
        return None
    from common.parallel.sharded_optimizer import ShardedUpdate  # sharded runs only

    return ShardedUpdate(
        model.trainable_variables,
        mesh.index,
        mesh.size,
        lambda flat: mesh.allgather(flat, "sharded_optimizer.weights"),
    )


class Trainer:
    """Runs a bound Task (common.task) on every rank.

    Args:
      task: the benchmark's Task, built from the run's config (task.cfg).
      dist: the Distribution (rank, size, collectives).
      events: the Events that the listeners get.
      run_dir: the run's folder (checkpoints/, shards/).
      runtime: what common.runtime.configure set (device, threads, precision): the launcher
        configures it right after Horovod's init, before any TensorFlow op.
    """

    def __init__(self, task, dist, events, run_dir, runtime: dict):
        self.task, self.cfg, self.dist, self.events = task, task.cfg, dist, events
        self.runtime = runtime
        self.output_dir = Path(run_dir)
        self.state = RunState()  # where the run stands (common.run.launch reads it on a crash)
        self.optimizer_shard = None  # a ShardedUpdate when parallel.shard_optimizer (set by _build)

    def run(self) -> RunResult:
        """init -> (staging) -> one run mode: the order every Horovod program follows, a line a step."""
        cfg, dist, task, events = self.cfg, self.dist, self.task, self.events
        events.on_init_start()
        # Horovod is initialized and the device pinned (common.parallel.distribution), threads and
        # precision set (common.runtime.configure), all before the first op.
        runtime = self.runtime
        tf_keras.utils.set_random_seed(cfg.train.seed)
        # Data parallelism is over groups: one rank each, or the K ranks that split each sample.
        mesh = task.mesh or dist.spatial_mesh(1)
        split = f"; {mesh.describe()}" if mesh.is_split else ""
        if cfg.parallel.shard_optimizer:
            split += ", the optimizer's state sharded over each group"
        events.on_runtime_configured(dist.describe() + split, runtime)
        shards = task.shard(mesh.group, mesh.groups)  # this rank's (its group's) files
        plan = _plan_epochs(shards, mesh.groups, cfg.train.gradient_accumulation_frequency)
        # The LR scaled for the global batch:
        model, optimizer, schedule, loss_fn, metric = self._build(runtime["precision"], plan, mesh)
        saver = CheckpointSaver(
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
        self.state.global_step = start.global_step
        # All start from rank 0's state. A sharded optimizer's differs by rank: zeros from scratch,
        # and each rank's own part of a checkpoint, read by every rank.
        dist.broadcast_variables(
            model.variables + (optimizer.variables if self.optimizer_shard is None else [])
        )
        if start.rank_state is not None:
            # Mid-epoch, each rank's running statistics are its own (averaged at the epoch's end).
            start.rank_state.restore_batchnorm(model, start.source)
        train_step, eval_step = self._build_steps(
            model, optimizer, loss_fn, metric
        )  # gradients allreduced inside
        # Compile and autotune on synthetic batches, the state put back: not in the timed region.
        warmup = warm_up(
            train_step,
            eval_step,
            task.input_specs(),
            state_variables(model, optimizer, train_step),
            0 if cfg.train.evaluate_only else cfg.train.warmup_steps,
            # On a GPU: an op of the steps left on the CPU ends the run (exit 2) unless allowed.
            cfg.runtime.allow_cpu_ops if runtime["device"] == "gpu" else None,
        )
        info = self._run_info(runtime, mesh, shards, plan, model, metric, start, warmup)
        events.on_init_stop(info)

        # Outside the timed region: stage the shard node-locally, build the input pipeline once.
        shards, staging = prepare_data(
            cfg, dist, shards, events, self.output_dir, task.staged_layout()
        )
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
        ctx = RunContext(
            cfg=cfg,
            task=task,
            dist=dist,
            events=events,
            mesh=mesh,
            shards=shards,
            model=model,
            optimizer=optimizer,
            schedule=schedule,
            metric=metric,
            train_step=train_step,
            eval_step=eval_step,
            saver=saver,
            info=info,
            precision=runtime["precision"],
            state=self.state,
        )
        training = None
        if cfg.train.evaluate_only:
            result = run_evaluation(ctx, valid_ds, start.start_epoch)
        elif cfg.train.benchmark_steps:
            from common.run.benchmark_mode import run_benchmark

            result = run_benchmark(ctx, train_ds)
        else:
            self._clear_page_cache(shards)
            if cfg.mlperf.start_barrier_dir:  # weak scaling: the set of instances starts together
                from common.run.instance_start import meet_the_other_instances

                events.on_instances_met(meet_the_other_instances(cfg.mlperf, dist))
            training = TrainingRun(ctx, start)
            result = training.run(train_ds, valid_ds)  # metrics averaged; rank 0 writes
        # A collective, once on every rank whatever the mode and however it ended: after run_stop,
        # before the characterization's collectives and rank 0's report. All ranks must end with
        # identical variables, batch-norm statistics included (common.parallel.fingerprint).
        in_sync, compared = variables_in_sync(model.variables, dist)
        result = dataclasses.replace(
            result,
            runtime=runtime,
            num_params=info.num_params,
            resumed_from=start.resumed_from,
            staging=staging,
            weights_in_sync=in_sync,
            weights_compared=compared,
        )
        if training is not None:
            result = dataclasses.replace(
                result, characterization=training.characterize(train_ds, staging)
            )
        return result

    # ---------------------------------------------------------------- set-up
    def _build(self, precision: str, plan, mesh):
        """(model, optimizer, schedule, loss, metric): the model under the precision policy with its
        batch-norm group, the task's optimizer wrapped for the precision and built (for this rank's
        variables only when it is sharded over the spatial group: self.optimizer_shard)."""
        task = self.task
        with runtime_lib.dtype_policy(precision):
            model = task.build_model(batchnorm_group(self.dist, task))
        optimizer, schedule = task.build_optimizer(plan.global_batch, plan.steps_per_epoch)
        optimizer = runtime_lib.wrap_optimizer(optimizer, precision)  # fp16: dynamic loss scaling
        self.optimizer_shard = optimizer_shard(self.cfg, model, mesh)
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

    def _run_info(self, runtime, mesh, shards, plan, model, metric, start, warmup) -> RunInfo:
        cfg, dist, task = self.cfg, self.dist, self.task
        return RunInfo(
            benchmark=task.name,
            seed=cfg.train.seed,
            num_nodes=dist.num_nodes,
            ranks=dist.size,
            accelerators_per_node=runtime_lib.accelerators_per_node(runtime["device"], dist),
            global_batch_size=plan.global_batch,
            train_samples=shards.train_set_size or shards.n_train,
            eval_samples=shards.n_valid,
            hyperparameters=task.mlperf_hyperparameters(plan.global_batch),
            target_name=metric.name,
            target=task.target,
            steps_per_epoch=plan.steps_per_epoch,
            n_epochs=cfg.train.n_epochs,
            resumed_from=start.resumed_from,
            model_name=model.name,
            num_params=int(sum(np.prod(v.shape) for v in model.trainable_variables)),
            spatial_ranks=mesh.size,
            spatial_plan=task.describe_split(model) if mesh.is_split else "",
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

    def _clear_page_cache(self, shards) -> None:
        files = list(shards.train_files) + list(shards.valid_files)
        done, failed = (
            drop_from_page_cache(files) if self.cfg.runtime.cache_clear else (0, len(files))
        )
        done, failed = self.dist.allreduce_sum([done, failed])
        self.events.on_caches_cleared(bool(failed == 0 and done > 0), int(done))


@dataclasses.dataclass(frozen=True)
class _EpochPlan:
    """One epoch in optimizer steps, and the global batch of a step."""

    steps_per_epoch: int
    global_batch: int

    @property
    def samples_per_epoch(self) -> int:
        return self.steps_per_epoch * self.global_batch


def _plan_epochs(shards, groups: int, accumulation: int) -> _EpochPlan:
    """Steps and samples per epoch from the shard (common.inputs.epochs); InputError when no whole step fits."""
    # Gradient accumulation makes each optimizer step see n local batches; the ranks of a
    # spatial group share theirs.
    global_batch = shards.local_batch_size * groups * accumulation
    steps = (
        epochs.batches_per_epoch(len(shards.train_files), shards.local_batch_size, accumulation)
        // accumulation
    )
    if steps == 0:
        raise InputError(
            f"{len(shards.train_files)} training samples per rank make no whole step of "
            f"local batch {shards.local_batch_size} x accumulation {accumulation}"
        )
    return _EpochPlan(steps, global_batch)
