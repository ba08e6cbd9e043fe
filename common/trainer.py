"""The generic training loop shared by every benchmark.

`Trainer.run` reads top to bottom in Horovod's canonical order: pin the
device by local rank, build the model, scale the LR with the global batch,
wrap the optimizer, broadcast the initial state from rank 0, train with
averaged gradients, average metrics, write on rank 0 only. The trainer emits
events; listeners (MLPerf log, progress, TensorBoard) act on them.
"""

import contextlib
import dataclasses
import json
import time
from pathlib import Path

import numpy as np
import tensorflow as tf

from common import epochs
from common import runtime as runtime_lib
from common import termination
from common.checkpoint import (Checkpointer, holds_training_state, random_generators, read_rank_state,
                               restore_model_weights)
from common.errors import EXIT_INPUT_ERROR, EXIT_NON_FINITE_LOSS, InputError
from common.data_preparation import prepare_data
from common.events import RunInfo, StepInfo, TrainLog
from common.files import write_text_atomic
from common.fingerprint import variables_in_sync
from common.page_cache import drop_from_page_cache
from common.staging import source_of
from common.run_measurements import characterize_run, pipeline_samples_per_s
from common.progress import Progress
from common.spatial import GatherSlabs, gradient_scales
from common.steps import TrainStep, make_eval_step
from common.sync_batchnorm import average_batchnorm_statistics, batchnorm_statistics


@dataclasses.dataclass
class RunResult:
    status: str = "aborted"
    epochs: int = 0
    metric: float = float("nan")
    time_to_train_s: float = float("nan")
    num_params: int = 0
    # One entry per epoch: epoch, seconds since run_start, train loss, samples/s, lr, metric (if evaluated).
    history: list = dataclasses.field(default_factory=list)
    staging: dict = dataclasses.field(default_factory=dict)
    weights_in_sync: bool = True
    # Values the weights_in_sync fingerprint covered: every model variable,
    # batch-norm running statistics included (more than num_params when the model has any).
    weights_compared: int = 0
    # {"checkpoint", "epoch", "step", "global_step"[, "weights_only"]} of a run that did not
    # start from scratch ("step": optimizer steps of that epoch already done).
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
    # A run that could not go on (status "aborted"): {"reason", "exit_code", "message", "step_num",
    # "loss", "input_file", "checkpoint"} (common.trainer.RunFailed); None otherwise.
    failure: dict | None = None


_NO_STEP = 2.0 ** 62   # "no bad step" in the agreement's allreduce_max of negated steps


class RunFailed(Exception):
    """Every rank agreed that the run cannot go on (a non-finite input or loss); `failure` says why.

    Raised inside the loop, on every rank at the same point; `Trainer._train` ends the run in
    order (log closed as aborted, summary written) and common.launch exits with failure["exit_code"].
    """

    def __init__(self, failure: dict):
        super().__init__(failure["message"])
        self.failure = failure


class Trainer:
    """Runs a bound Task (common.task) on every rank; rank 0 prints.

    Args:
      task: the benchmark's Task, built from the run's config (task.cfg).
      dist: the Distribution (rank, size, collectives).
      events: the Events that the listeners get.
      run_dir: the run's folder (checkpoints/, shards/).
    """

    def __init__(self, task, dist, events, run_dir, print_fn=print):
        self.task = task
        self.cfg = task.cfg
        self.dist = dist
        self.events = events
        self.output_dir = Path(run_dir)
        self.print = print_fn if dist.is_root else (lambda *a, **k: None)
        self.result = RunResult()
        self.run_started = False
        self.epoch = 0
        self.global_step = 0          # optimizer steps done, over the whole run (resumes included)
        self.position = epochs.Position()   # the next local batch this run reads
        self.epoch_losses = []        # the losses of the epoch in progress (restored on a mid-epoch resume)
        self._rank_state = None       # this rank's batch-norm statistics from a mid-epoch checkpoint
        self._saved_at = None         # global step of the newest checkpoint this run wrote
        self._blocked_s = []          # rank 0: seconds each save held the step up
        self._stage_bar = None
        self.start_epoch = 0
        self.resumed_from = None

    # ------------------------------------------------------------------ run
    def run(self) -> RunResult:
        """init -> (staging) -> run: the order every Horovod program follows, a line a step."""
        cfg, dist, task, events = self.cfg, self.dist, self.task, self.events
        events.on_init_start()
        # Horovod is initialized (common.distribution); pin the device by local rank, threads, precision.
        self.result.runtime = runtime_lib.configure(cfg.runtime, dist)
        tf.keras.utils.set_random_seed(cfg.train.seed)
        # Data parallelism is over groups: one rank each, or the K ranks that split each sample.
        self.mesh = task.mesh or dist.spatial_mesh(1)
        self._print_runtime()
        self.shards = task.shard(self.mesh.group, self.mesh.groups)   # this rank's (its group's) files
        global_batch = self._plan_epochs()
        self._build(global_batch)                                # model, LR for the global batch, wrapped optimizer
        self._restore_or_start()                                 # rank 0 picks the checkpoint, if any
        dist.broadcast_variables(self.model.variables + self.optimizer.variables)   # all start from rank 0's state
        self._restore_rank_state()
        self._build_steps()                                      # gradients allreduced inside TrainStep
        info = self._run_info(global_batch)
        events.on_init_stop(info)

        # Outside the timed region: stage the shard node-locally, build the input pipeline once.
        self.shards, self.result.staging = prepare_data(cfg, dist, self.shards, events, self.output_dir,
                                                        self._staging_progress, task.staged_layout())
        train_ds, valid_ds = task.build_inputs(self.shards, self.mesh.group, dist.local_size, self.position)
        self._check_specs(train_ds)
        if cfg.train.evaluate_only:
            return self._evaluate_only(valid_ds)
        if cfg.train.benchmark_steps:
            return self._benchmark(train_ds, info)
        self._clear_page_cache()
        return self._train(train_ds, valid_ds, info)             # metrics averaged; rank 0 writes

    # ---------------------------------------------------------------- set-up
    def _print_runtime(self):
        rt = self.result.runtime
        spatial = f"; {self.mesh.describe()}" if self.mesh.is_split else ""
        self.print(f"[init] {self.dist.describe()}{spatial}; runtime "
                   f"{ {k: v for k, v in rt.items() if k not in ('cpu', 'precision_note')} }")
        self.print(f"[init] CPU {rt['cpu']['cpu']}: {rt['cpu']['isa']}, bf16 {rt['cpu']['bf16']}, "
                   f"oneDNN {rt['cpu']['onednn']}")
        if rt["precision_note"]:
            self.print(f"[init] {rt['precision_note']}")

    def _plan_epochs(self) -> int:
        """Steps and samples per epoch from the shard; returns the global batch."""
        shards, accumulation = self.shards, self.cfg.train.gradient_accumulation_frequency
        # Gradient accumulation makes each optimizer step see n local batches; the ranks of a
        # spatial group share theirs.
        global_batch = shards.local_batch_size * self.mesh.groups * accumulation
        # An epoch is one pass over the shard in whole steps (common.epochs).
        self.steps_per_epoch = epochs.batches_per_epoch(
            len(shards.train_files), shards.local_batch_size, accumulation) // accumulation
        self.samples_per_epoch = self.steps_per_epoch * global_batch
        if self.steps_per_epoch == 0:
            raise InputError(f"{len(shards.train_files)} training samples per rank make no whole step of "
                             f"local batch {shards.local_batch_size} x accumulation {accumulation}")
        if self.samples_per_epoch < shards.n_train:
            self.print(f"[init] epoch: {self.steps_per_epoch} steps x global batch {global_batch} = "
                       f"{self.samples_per_epoch} of {shards.n_train} samples; the rest of each rank's "
                       f"shuffled shard is dropped each epoch (partial batches, as the reference's drop_last)")
        return global_batch

    def _build(self, global_batch: int):
        cfg, dist, task = self.cfg, self.dist, self.task
        precision = self.result.runtime["precision"]
        # Collective (registers a process set): every rank, same order.
        bn_group = dist.rank_group(task.batchnorm_group_size, "batchnorm_group_size")
        with runtime_lib.dtype_policy(precision):
            self.model = task.build_model(bn_group)
        self.result.num_params = int(sum(np.prod(v.shape) for v in self.model.trainable_variables))
        self.print(f"[init] model {self.model.name}: {self.result.num_params:,} trainable parameters")
        if self.mesh.is_split:
            gathers = [layer.name for layer in self.model.layers if isinstance(layer, GatherSlabs)]
            self.print(f"[init] spatial: each rank holds 1/{self.mesh.size} of every sample's depth; slabs "
                       f"gathered at {', '.join(gathers)}, the layers after it run whole on every rank of a group")
        n_bn = len(batchnorm_statistics(self.model)) // 2
        if n_bn and dist.size > 1:
            self.print(f"[init] batch norm: running statistics of {n_bn} layers averaged over the "
                       f"{dist.size} ranks after every epoch")
        optimizer, self.schedule = task.build_optimizer(global_batch, self.steps_per_epoch)
        self.optimizer = runtime_lib.wrap_optimizer(optimizer, precision)   # fp16: dynamic loss scaling
        self.optimizer.build(self.model.trainable_variables)
        self.loss_fn = task.build_losses()
        self.metric = task.build_metrics()
        self.target = task.target
        self.checkpointer = Checkpointer(self.output_dir / "checkpoints", self.model, self.optimizer,
                                         keep=cfg.train.keep_checkpoints, generators=random_generators(self.model))
        if dist.is_root:   # before any rank writes a part of a new checkpoint (collectives follow)
            self.checkpointer.remove_partial()
            if cfg.train.checkpoint_every or cfg.train.checkpoint_steps:
                self.checkpointer.prepare()

    def _restore_or_start(self):
        t = self.cfg.train
        if t.resume or t.resume_from:
            source = t.resume_from or self.checkpointer.latest()
            # Rank 0 chooses for all: ranks that see the file system differently
            # must not resume from different epochs (and hang in the first collective).
            source = self.dist.broadcast_object(None if source is None else str(source))
            self._restore(source)
        self.result.resumed_from = self.resumed_from

    def _restore_rank_state(self):
        if self._rank_state is not None:
            # Mid-epoch, each rank's running statistics are its own (averaged at the epoch's end).
            for i, v in enumerate(batchnorm_statistics(self.model)):
                v.assign(self._rank_state[f"bn_{i}"])

    def _run_info(self, global_batch: int) -> RunInfo:
        cfg, dist, shards = self.cfg, self.dist, self.shards
        return RunInfo(
            benchmark=self.task.name, seed=cfg.train.seed, num_nodes=dist.num_nodes, ranks=dist.size,
            accelerators_per_node=runtime_lib.accelerators_per_node(self.result.runtime["device"], dist),
            global_batch_size=global_batch, train_samples=shards.train_set_size or shards.n_train,
            eval_samples=shards.n_valid, hyperparameters=self.task.mlperf_hyperparameters(global_batch),
            target_name=self.metric.name, target=self.target, steps_per_epoch=self.steps_per_epoch,
            n_epochs=cfg.train.n_epochs, resumed_from=self.resumed_from)

    def _restore(self, source):
        """Continues a run from a training checkpoint, or starts one from a model-only folder."""
        if source is None:
            raise InputError(f"--resume: no checkpoint in {self.checkpointer.directory}")
        if not Path(source).is_dir():
            raise InputError(f"checkpoint not found: {source}")
        if not (Path(source) / "ckpt.index").is_file():
            raise InputError(f"{source}: not a checkpoint folder (no ckpt.index)")
        if holds_training_state(source):
            self._resume(source)
            return
        # A model without optimizer state or epoch (an imported reference model):
        # fine-tuning or evaluating it is a new run, from epoch 0.
        restore_model_weights(self.model, source)
        # Trained weights to start from are no benchmark result either (its log says so).
        self.resumed_from = {"checkpoint": str(Path(source).resolve()), "epoch": 0, "weights_only": True}
        self.print(f"[init] model weights from {source} (model-only folder: fresh optimizer, starting at epoch 0; "
                   f"not a valid benchmark result)")

    def _resume(self, source):
        """Continues a run at the step its checkpoint was written after, on the data it would read next."""
        state = self.checkpointer.restore(source)
        epoch, done, per_epoch = state["epoch"], state["steps_done"], state["steps_per_epoch"]
        if per_epoch != self.steps_per_epoch:
            raise InputError(f"{source}: written with {per_epoch} steps per epoch, this run has "
                             f"{self.steps_per_epoch} (other samples, ranks or batch size)")
        self.global_step = state["global_step"]
        if done >= per_epoch:   # written after the epoch's end (statistics averaged, evaluated)
            self.position = epochs.Position(epoch + 1, 0)
        else:
            if state["ranks"] != self.dist.size:
                raise InputError(f"{source}: a mid-epoch checkpoint of {state['ranks']} ranks; resume it with "
                                 f"{state['ranks']} ranks, or from a checkpoint written at an epoch's end")
            self._rank_state = read_rank_state(source, self.dist.rank)
            if self._rank_state is None:
                raise InputError(f"{source}: rank {self.dist.rank}'s state is missing (rank-{self.dist.rank:05d}.npz)")
            self.epoch_losses = [tf.constant(v) for v in self._rank_state["losses"]]
            accumulation = self.cfg.train.gradient_accumulation_frequency
            self.position = epochs.Position(epoch, done * accumulation)
        self.start_epoch = epoch
        self.resumed_from = {"checkpoint": str(Path(source).resolve()), "epoch": epoch, "step": done,
                             "global_step": self.global_step}
        self.print(f"[init] resumed from {source} (epoch {epoch}, {done} of {per_epoch} steps done); a resumed "
                   f"run is not a valid benchmark result (its log says so)")

    # ------------------------------------------------------------ checkpoints
    def _save(self, epoch: int, steps_done: int, wait: bool = False) -> None:
        """Every rank: checkpoint the state after `steps_done` steps of `epoch` (a collective mid-epoch)."""
        if self._saved_at == self.global_step:
            if wait and self.dist.is_root:
                self.checkpointer.wait()
            return
        mid_epoch = steps_done < self.steps_per_epoch
        if mid_epoch:
            arrays = {"losses": tf.stack(self.epoch_losses).numpy() if self.epoch_losses else np.zeros(0, np.float32)}
            for i, v in enumerate(batchnorm_statistics(self.model)):
                arrays[f"bn_{i}"] = v.numpy()
            self.checkpointer.write_rank_state(self.global_step, self.dist.rank, arrays)
            self.dist.barrier()   # every rank's part is on disk before rank 0 publishes the folder
        if self.dist.is_root:
            state = {"global_step": self.global_step, "epoch": epoch, "steps_done": steps_done,
                     "steps_per_epoch": self.steps_per_epoch, "ranks": self.dist.size,
                     "benchmark": self.task.name}
            self._blocked_s.append(self.checkpointer.save(self.global_step, state))
            if wait:
                self.checkpointer.wait()
        self._saved_at = self.global_step

    def _stop_agreed(self) -> bool:
        """A collective: True on every rank once any rank got SIGUSR1 or SIGTERM."""
        flag = 1.0 if termination.stop_requested() else 0.0
        return bool(self.dist.allreduce_max([flag])[0] > 0)

    def _clear_page_cache(self) -> None:
        files = list(self.shards.train_files) + list(self.shards.valid_files)
        done, failed = drop_from_page_cache(files) if self.cfg.runtime.cache_clear else (0, len(files))
        done, failed = self.dist.allreduce_sum([done, failed])
        self.events.on_caches_cleared(bool(failed == 0 and done > 0), int(done))

    def _build_steps(self):
        """Traces the train and eval steps from the task's TensorSpecs: init work under the MLPerf
        rules (graphs built, no training sample touched)."""
        cfg = self.cfg
        rt = cfg.runtime
        self.train_step = TrainStep(self.model, self.optimizer, self.loss_fn, self.dist,
                                    rt.gradient_compression, rt.xla, cfg.train.gradient_accumulation_frequency,
                                    preprocess=self.task.preprocess_batch,
                                    gradient_scales=gradient_scales(self.model))
        self.eval_step = make_eval_step(self.model, self.metric, rt.xla, preprocess=self.task.preprocess_batch,
                                        loss_fn=self.loss_fn)
        specs = self.task.input_specs()
        self.train_step.trace(specs)
        self.eval_step.get_concrete_function(*specs)

    def _check_specs(self, train_ds):
        """The graphs traced at init are the ones training runs: no tracing inside the timed region."""
        declared, actual = tuple(self.task.input_specs()), tuple(train_ds.element_spec)
        if any(d.shape != a.shape or d.dtype != a.dtype for d, a in zip(declared, actual)):
            raise RuntimeError(f"{self.task.name}: input_specs() {declared} differ from the training "
                               f"dataset's element_spec {actual}")

    def _staging_progress(self, done, total, nbytes):
        if not self.dist.is_root:
            return
        if self._stage_bar is None:
            self._stage_bar = Progress("staging", total, unit="files")
        self._stage_bar.update(done, f"rank 0: {nbytes / 1e6:.1f} MB")
        if done >= total:
            self._stage_bar.close()
            self._stage_bar = None

    # ------------------------------------------------------------------ loop
    def _train(self, train_ds, valid_ds, info) -> RunResult:
        self.events.on_run_start()
        self.run_started = True
        run_start = time.perf_counter()
        train_iter = iter(train_ds)
        try:
            return self._train_epochs(train_iter, valid_ds, info, run_start)
        except RunFailed as e:
            return self._end_failed(e.failure, run_start)

    def _train_epochs(self, train_iter, valid_ds, info, run_start) -> RunResult:
        cfg, events = self.cfg, self.events
        epoch = self.epoch = self.position.epoch - 1   # the last epoch done
        stopped = False
        for epoch in range(self.position.epoch, cfg.train.n_epochs + 1):
            self.epoch = epoch
            events.on_epoch_start(epoch)
            train = self._train_epoch(train_iter, epoch)
            if train is None:   # stopped on request mid-epoch, checkpoint written
                stopped = True
                epoch -= 1      # the last epoch done
                break
            # As the MLCommons DeepCAM reference: after every epoch's training,
            # evaluated or not, each rank's batch-norm running statistics (from
            # its own shard) become their mean over all ranks, so evaluation,
            # checkpoints (rank 0's) and the final model use the same statistics
            # on every rank. A collective: every rank calls it, here.
            average_batchnorm_statistics(self.model, self.dist)
            events.on_epoch_stop(epoch, train)
            record = {"epoch": epoch, "loss": train["loss"], "samples_per_s": train["samples_per_s"],
                      "lr": train["lr"]}
            self.result.history.append(record)
            if epoch % cfg.train.eval_every == 0 or epoch == cfg.train.n_epochs:
                events.on_eval_start(epoch)
                value, eval_loss = self._evaluate(valid_ds)
                events.on_eval_stop(epoch, value, eval_loss)
                self.result.metric = record["metric"] = value
                record["eval_loss"] = eval_loss
            record["time_s"] = time.perf_counter() - run_start
            if "metric" in record and cfg.train.stop_at_target and self._reached(record["metric"]):
                self.result.status = "success"
                break
            t = cfg.train
            # A request at the last epoch's end leaves nothing to resume: the run just ends.
            stopped = epoch < t.n_epochs and self._stop_agreed()
            if (stopped or (t.checkpoint_every and epoch % t.checkpoint_every == 0)
                    or (t.checkpoint_steps and self.global_step % t.checkpoint_steps == 0)):
                self._save(epoch, self.steps_per_epoch, wait=stopped)
            if stopped:
                break
        if (cfg.train.checkpoint_every or cfg.train.checkpoint_steps) and not stopped:
            self._save(epoch, self.steps_per_epoch)   # the final state, unless just saved
        if self.dist.is_root and self._saved_at is not None:
            self.checkpointer.wait()   # no save left in flight, and its error raised here
            self.result.checkpoint_save = dict(
                self.checkpointer.last_save, saves=len(self._blocked_s), blocked_max_s=max(self._blocked_s),
                blocked_mean_s=float(np.mean(self._blocked_s)), interval_steps=cfg.train.checkpoint_steps or None)
        if stopped:
            self.result.status = "preempted"
            self.result.checkpoint = str(self.checkpointer.folder(self.global_step).resolve())
        elif not cfg.train.stop_at_target and self._reached(self.result.metric):
            self.result.status = "success"
        self.result.epochs = epoch
        self.result.time_to_train_s = time.perf_counter() - run_start
        # A stopped run's log says aborted, and where it can go on from.
        events.on_run_stop("aborted" if stopped else self.result.status, self.epoch, self.result.checkpoint)
        self.result.weights_in_sync, self.result.weights_compared = self._weights_in_sync()
        if cfg.runtime.characterize and not stopped:
            self.result.characterization = self._characterize(train_iter.element_spec[0].shape[1:], info)
        return self.result

    def _end_failed(self, failure: dict, run_start: float) -> RunResult:
        """Every rank: ends a run that could not go on, in order (no rank leaves another in a collective)."""
        if self.dist.is_root and self._saved_at is not None:
            self.checkpointer.wait()   # the last finite state is on disk before anyone exits
        self.result.status, self.result.failure = "aborted", failure
        self.result.checkpoint = failure.get("checkpoint")
        self.result.epochs = self.epoch - 1
        self.result.time_to_train_s = time.perf_counter() - run_start
        self.events.on_run_stop("aborted", self.epoch, self.result.checkpoint, failure)
        self.result.weights_in_sync, self.result.weights_compared = self._weights_in_sync()
        return self.result

    def _benchmark(self, train_ds, info) -> RunResult:
        """Benchmark mode: the input pipeline alone, then train.benchmark_steps steps of the real
        loop (staged files, input pipeline, allreduce, events), timed after the warm-up steps."""
        t, dist = self.cfg.train, self.dist
        accumulation = t.gradient_accumulation_frequency
        # As many batches as the timed steps read, after the warm-up steps' worth.
        input_rate = pipeline_samples_per_s(iter(train_ds), self.shards.local_batch_size,
                                            t.benchmark_steps * accumulation,
                                            warmup_batches=t.benchmark_warmup_steps * accumulation)
        train_iter = iter(train_ds)
        loss = None
        for _ in range(t.benchmark_warmup_steps):
            loss = self.train_step(train_iter).loss
        if loss is not None:
            float(loss)   # the warm-up steps are done before the clock starts
        dist.barrier()
        start = time.perf_counter()
        for step in range(1, t.benchmark_steps + 1):
            loss = self.train_step(train_iter).loss
            self.global_step += 1
            self.events.on_step(StepInfo(1, step, t.benchmark_steps, self.global_step))
        float(loss)
        seconds = float(dist.allreduce_max([time.perf_counter() - start])[0])
        # A spatial group's ranks train the same samples: the job's rate counts groups.
        per_group = t.benchmark_steps * self.shards.local_batch_size * accumulation / seconds
        total = per_group * self.mesh.groups
        self.result.throughput = {
            "steps": t.benchmark_steps, "warmup_steps": t.benchmark_warmup_steps, "seconds": seconds,
            "samples_per_s_per_rank": total / dist.size, "samples_per_s": total,
            "spatial_ranks": self.mesh.size,
            "input_samples_per_s_per_rank": float(dist.allreduce_mean([input_rate])[0]),
            "global_batch_size": info.global_batch_size, "ranks": dist.size,
            "precision": self.result.runtime["precision"]}
        self.result.status = "benchmarked"
        self.result.weights_in_sync, self.result.weights_compared = self._weights_in_sync()
        return self.result

    def _evaluate_only(self, valid_ds) -> RunResult:
        """One pass over the validation set with the model as restored (--evaluate); rank 0's
        report says the result (no run, so no run events)."""
        try:
            self.result.metric = self._evaluate(valid_ds)[0]
        except RunFailed as e:   # no run started: bad input like any other
            raise InputError(e.failure["message"]) from None
        self.result.status = "evaluated"
        self.result.epochs = self.start_epoch
        self.result.weights_in_sync, self.result.weights_compared = self._weights_in_sync()
        return self.result

    def _characterize(self, sample_shape, info) -> dict:
        self.print("[characterize] measuring FLOPs, input pipeline, memory and allreduce (after run_stop)")
        return characterize_run(
            model=self.model, dist=self.dist, sample_shape=sample_shape, history=self.result.history,
            staging=self.result.staging, global_batch_size=info.global_batch_size,
            compression=self.cfg.runtime.gradient_compression,
            make_train_dataset=lambda: self.task.build_inputs(self.shards, self.mesh.group,
                                                              self.dist.local_size)[0],
            local_batch_size=self.shards.local_batch_size, files_read=self.shards.train_files,
            samples_read=len(self.shards.train_files))

    def _reached(self, value) -> bool:
        return value <= self.target if self.metric.lower_is_better else value >= self.target

    def _train_epoch(self, train_iter, epoch) -> dict | None:
        """The rest of `epoch`'s steps; None if the ranks agreed to stop (checkpoint written).

        Raises RunFailed on every rank once they agree that a step's input or loss was not finite.
        """
        t = self.cfg.train
        start = time.perf_counter()
        losses = self.epoch_losses   # the steps a resumed run did before, if any
        first = len(losses)
        flags = []                   # each step's StepResult.inputs_finite, from step first + 1
        checked = first              # losses[:checked] went through an agreement
        log_from, log_start = first, start   # the steps and time since the last TrainLog
        with self._naming_bad_files(self.shards.train_files):
            for step in range(first + 1, self.steps_per_epoch + 1):
                # Keep the tensors: reading one would wait for its step.
                result = self.train_step(train_iter)
                losses.append(result.loss)
                flags.append(result.inputs_finite)
                self.global_step += 1
                self.events.on_step(StepInfo(epoch, step, self.steps_per_epoch, self.global_step))
                if t.log_every_steps and self.global_step % t.log_every_steps == 0:
                    self.events.on_train_log(self._train_log(epoch, losses[log_from:], log_start))
                    log_from, log_start = len(losses), time.perf_counter()
                if step == self.steps_per_epoch:
                    break   # the epoch's end checks and saves after its statistics are averaged
                stop = False
                if self.global_step % t.stop_check_steps == 0:
                    stop = self._agree(epoch, step, losses[checked:], flags[checked - first:])
                    checked = len(losses)
                if t.checkpoint_steps and self.global_step % t.checkpoint_steps == 0:
                    self._save(epoch, step)
                if stop:
                    self._save(epoch, step, wait=True)
                    return None
            # The steps since the last agreement, before their losses are averaged and logged; a
            # stop request waits for the epoch's end checks.
            self._agree(epoch, self.steps_per_epoch, losses[checked:], flags[checked - first:])
            loss = _mean(losses)
        self.epoch_losses = []
        seconds = time.perf_counter() - start
        loss = float(self.dist.allreduce_mean([loss])[0])
        steps = self.steps_per_epoch - first
        return {"loss": loss, "seconds": seconds, "lr": self.schedule.at_step((epoch - 1) * self.steps_per_epoch),
                "samples_per_s": self.samples_per_epoch * steps / self.steps_per_epoch / seconds}

    def _agree(self, epoch, step, losses, flags) -> bool:
        """A collective every `train.stop_check_steps` steps: True on every rank once any rank got
        SIGUSR1 or SIGTERM. Raises RunFailed on every rank when a batch or a loss of the steps since
        the last call (`losses`, `flags`: this rank's) was not finite on any rank.

        The stop request and both checks share one allreduce: [stop, 1 + the rank of a
        non-finite batch, minus the first global step with a non-finite loss].
        """
        first = self.global_step - len(losses) + 1   # global step of losses[0]
        bad_batch = _first(~tf.stack(flags).numpy()) if flags else None
        values = tf.stack(losses).numpy() if losses else np.zeros(0)
        bad_loss = _first(~np.isfinite(values))
        stop, culprit, loss_step = self.dist.allreduce_max([
            1.0 if termination.stop_requested() else 0.0,
            0.0 if bad_batch is None else self.dist.rank + 1.0,
            -_NO_STEP if bad_loss is None else -float(first + bad_loss)])
        if culprit:
            self._fail_on_input(int(culprit) - 1, self.shards.train_files, epoch,
                                None if bad_batch is None else first + bad_batch, "training")
        if loss_step > -_NO_STEP:
            self._fail_on_loss(epoch, step, int(-loss_step), values[int(-loss_step) - first])
        return bool(stop > 0)

    def _fail_on_input(self, culprit, files, epoch, global_step, what) -> None:
        """Every rank: rank `culprit` (which read a batch with NaN or Inf) looks for the file in
        `files`; raises RunFailed naming it, on every rank."""
        message = None
        if self.dist.rank == culprit:
            found = self.task.find_bad_file(files)   # 'PATH: reason'
            path = found.split(": ", 1)[0] if found else None
            source = source_of(path) if path else None
            staged = f" (staged from {source})" if source else ""
            where = f"{what} step {global_step}" if global_step is not None else what
            message = {"input_file": source or path,
                       "text": (f"{found}{staged} (non-finite input, found after the {where} of epoch {epoch} "
                                f"on rank {culprit})" if found else
                                f"rank {culprit} read a {what} batch with NaN or Inf after preprocessing (epoch "
                                f"{epoch}, {where}), but no file of its shard holds one: the preprocessing "
                                f"overflowed (values beyond float32 after normalization?)")}
        message = self.dist.broadcast_object(message, root_rank=culprit)
        raise RunFailed({"reason": "non-finite input", "exit_code": EXIT_INPUT_ERROR, "input_file": message["input_file"],
                         "step_num": global_step if global_step is not None else self.global_step,
                         "message": message["text"] + "; MLPerf log closed as aborted"})

    def _fail_on_loss(self, epoch, step, global_step, local_loss) -> None:
        """Every rank: the loss of `global_step` was not finite on some rank, with every input
        batch finite. Keeps a checkpoint of the last finite state; raises RunFailed on every rank."""
        loss = float(np.mean(self.dist.allgather([local_loss])))   # the global loss of that step
        checkpoint, kept = self._keep_finite_state(epoch, step)
        failure = {"reason": "non-finite loss", "exit_code": EXIT_NON_FINITE_LOSS, "step_num": global_step,
                   "loss": str(loss), "checkpoint": checkpoint}
        failure["message"] = (
            f"the training loss was {loss} at step {global_step} (epoch {epoch}): the model diverged (a "
            f"learning rate too high?); no input file was found bad (every batch of every rank was finite, "
            f"checked in the step); {kept}; MLPerf log closed as aborted")
        raise RunFailed(failure)

    def _keep_finite_state(self, epoch, step) -> tuple:
        """Every rank: (checkpoint path or None, what the message says about it).

        Updates with non-finite gradients were skipped (common.steps.TrainStep), so the
        variables usually hold the last finite state: they are saved. If they are not finite
        all the same (a finite gradient times the LR overflowed, a batch-norm statistic of a
        diverged forward pass), the newest checkpoint written before is the last finite state.
        """
        state = self.model.variables + self.optimizer.variables
        broken = float(not all(bool(tf.reduce_all(tf.math.is_finite(v))) for v in state
                               if v.dtype.is_floating))
        if not self.dist.allreduce_max([broken])[0]:
            self._save(epoch, step, wait=True)
            path = str(self.checkpointer.folder(self.global_step).resolve())
            return path, f"checkpoint of the last finite state (its updates with non-finite gradients skipped): {path}"
        latest = self.checkpointer.latest() if self.dist.is_root else None
        latest = self.dist.broadcast_object(None if latest is None else str(Path(latest).resolve()))
        if latest is None:
            return None, "the weights are no longer finite and no checkpoint was written before (train.checkpoint_steps)"
        return latest, f"the weights are no longer finite; the last finite state is the newest checkpoint {latest}"

    def _train_log(self, epoch, losses, since) -> TrainLog:
        """This rank's mean loss over `losses` (waits for the last step), the LR, samples/s since `since`."""
        loss = _mean(losses)
        seconds = time.perf_counter() - since
        samples = len(losses) * self.samples_per_epoch / self.steps_per_epoch
        return TrainLog(epoch=epoch, global_step=self.global_step, loss=loss,
                        lr=float(self.schedule.at_step(self.global_step - 1)),
                        samples_per_s=samples / seconds if seconds > 0 else 0.0)

    def _evaluate(self, valid_ds) -> tuple[float, float]:
        """(the metric, the per-sample mean loss) over every rank's validation files; RunFailed on
        every rank if a batch held NaN or Inf."""
        sums = np.zeros(self.metric.n_sums + 3)   # a rank may hold no validation file
        with self._naming_bad_files(self.shards.valid_files):
            for x, y in valid_ds:
                sums = sums + self.eval_step(x, y).numpy()
        # ..., loss x samples, samples, non-finite batches; the ranks of a spatial group evaluate
        # the same samples: each group counted once.
        total = self.dist.allreduce_sum(sums) / self.mesh.size
        if total[-1]:
            culprit = self.dist.allreduce_max([self.dist.rank + 1.0 if sums[-1] else 0.0])[0]
            self._fail_on_input(int(culprit) - 1, self.shards.valid_files, self.epoch, None, "validation")
        loss = float(total[-3] / total[-2]) if total[-2] else float("nan")
        return float(self.metric.finalize(total[:-3])), loss

    @contextlib.contextmanager
    def _naming_bad_files(self, files):
        """Turns a TensorFlow read/parse error into an InputError naming the bad file."""
        try:
            yield
        except tf.errors.OpError:
            found = self.task.find_bad_file(files)
            if found:
                raise InputError(found) from None
            raise

    def _weights_in_sync(self) -> tuple[bool, int]:
        """All ranks must end with identical variables, batch-norm statistics included (common.fingerprint)."""
        return variables_in_sync(self.model.variables, self.dist)


def _first(flags) -> int | None:
    """The index of the first True of a bool vector, or None."""
    hits = np.flatnonzero(flags)
    return int(hits[0]) if hits.size else None


def _mean(losses) -> float:
    """The mean of a list of scalar loss tensors, in float64 (reading it waits for the last step)."""
    return float(tf.reduce_mean(tf.cast(tf.stack(losses), tf.float64)).numpy())


def write_summary(result: RunResult, path, extra: dict) -> None:
    """rank 0: the run's figures as JSON (temporary name, then rename)."""
    data = dataclasses.asdict(result) | extra
    write_text_atomic(path, json.dumps(data, indent=2, default=float))
