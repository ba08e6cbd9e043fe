"""Config sections every benchmark shares: training loop, runtime, staging, MLPerf."""

import dataclasses
from pathlib import Path
from typing import Literal


@dataclasses.dataclass(frozen=True)
class TrainLoopConfig:
    n_epochs: int = 100
    seed: int = 0
    checkpoint_every: int = 0  # epochs between checkpoints; 0 = none
    # Optimizer steps between checkpoints (0 = none), mid-epoch included; a save
    # copies the state and writes it in the background while training goes on.
    checkpoint_steps: int = 0
    keep_checkpoints: int = 2
    resume: bool = False  # continue from the newest checkpoint in output_dir
    resume_from: str | None = None  # or from this checkpoint folder (checkpoints/step-NNNNNNNNNN)
    # Steps between the collective check for a stop request (SIGUSR1, SIGTERM on any
    # rank); the end of each epoch checks too. 1 reacts soonest; each check is a
    # small allreduce of the losses and input flags of steps already done (two behind).
    stop_check_steps: int = 10
    eval_every: int = 1  # epochs between evaluations
    # Steps between training figures (loss, LR, samples/s) for TensorBoard and the
    # progress line; the loss is of steps already done (two behind), so nothing waits (0: none).
    log_every_steps: int = 50
    # Benchmark mode (NVIDIA DLE's --benchmark): train this many steps through the
    # real loop (staging, input pipeline, Horovod), print samples/s, no MLPerf log (0: off).
    benchmark_steps: int = 0
    benchmark_warmup_steps: int = 5  # steps of benchmark mode left out of the figures
    # Before run_start, optimizer steps on synthetic batches through the real train and eval steps,
    # the state put back after (common.run.warmup): the first timed step pays no compile or
    # autotune. Not in evaluation mode (0: none).
    warmup_steps: int = 2
    # Evaluate the (restored or imported, see --checkpoint) model once on the
    # validation set and stop: no training, no MLPerf log.
    evaluate_only: bool = False
    stop_at_target: bool = True
    # Local batches whose gradients are summed before each optimizer step.
    gradient_accumulation_frequency: int = 1
    # The global batch the config's hyperparameters are for (its RCP entry).
    # Closed division: a run launched at another global batch stops at init.
    global_batch_size: int | None = None


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
    # Mixed precision: fp16 with loss scaling (or bf16) on GPUs; bf16 on CPUs that compute it
    # natively (AVX512_BF16, AMX); elsewhere 'auto' stays float32 and says so (runtime.choose_precision).
    amp: bool = False
    amp_dtype: Literal["auto", "bfloat16", "float16"] = "auto"
    xla: bool = False  # jit_compile the train step
    intra_op_threads: int = (
        0  # 0 = the rank's own CPUs, divided among ranks sharing them (parallel.binding)
    )
    inter_op_threads: int = 2
    gradient_compression: Literal["none", "fp16"] = "none"
    # How gradients are averaged over the ranks: 'overlap', an allreduce per gradient, each started
    # as soon as backward produces it (Horovod fuses those that meet in one cycle), so communication
    # runs beside the rest of backward; 'grouped', one grouped allreduce once backward is done.
    gradient_allreduce: Literal["overlap", "grouped"] = "overlap"
    # The input pipeline's last stage copies each batch to the device while the step before runs
    # (common.inputs.pipeline): 'auto' on a GPU, not on a CPU (nothing to copy); 'on' on a
    # CPU prefetches to /cpu:0 (the same stage, for tests); 'off': each step takes its batch from host memory.
    prefetch_to_device: Literal["auto", "on", "off"] = "auto"
    # On a GPU, warm-up ends the run (exit 2) naming each op TensorFlow left on the CPU but what
    # belongs on the host (common.run.device_placement); these op types may stay there (Erf,MaxPool3DGrad).
    allow_cpu_ops: tuple[str, ...] = ()
    record_shards: bool = False  # write each rank's file list to shards/ (tests, audits)
    # Op determinism and in-order reading: a run resumed from a checkpoint ends
    # with the weights of an uninterrupted one, bit for bit (slower input pipeline).
    deterministic: bool = False
    # SIGTERM (scancel, a launcher ending the job): the log is closed as aborted at
    # once, then the ranks get this long to agree on a stop and write a checkpoint
    # before the process exits with 143 anyway (it may be blocked in a collective
    # with a dead rank). SIGUSR1 (SLURM's --signal) has no deadline.
    sigterm_grace_s: float = 20.0
    # Before run_start, drop this rank's input files from the OS page cache
    # (posix_fadvise DONTNEED), so that the timed run reads them cold; logged as cache_clear.
    cache_clear: bool = True
    check_log: bool = True  # run the MLPerf compliance checker on rank 0 at the end
    # Shrink the config into a smoke run of a few small steps (big_vision's runlocal):
    # each benchmark's Task.shrink says how; data paths, precision and the loop stay.
    tiny: bool = False
    # Write TensorBoard event files to <run dir>/tensorboard on rank 0 (train loss,
    # LR, samples/s every train.log_every_steps steps; the validation metric per epoch).
    tensorboard: bool = False
    # A measurement, not for timed runs: wait for each step of the first epoch this process runs and
    # time it, for the [timing] line (the first step against the median). On a GPU each wait empties
    # the queue the steps are launched into.
    step_timing: bool = False
    # After run_stop, measure FLOPs, input rate, memory, allreduce time for
    # `python -m offline.characterize RUN_DIR` (outside the timed region).
    characterize: bool = False


@dataclasses.dataclass(frozen=True)
class StagingConfig:
    # Node-local directory; None = read data_dir in place. '{node}' and '{host}'
    # are replaced by the node's index and hostname.
    stage_dir: str | None = None
    # Stage each file in the benchmark's fast layout (Task.staged_layout: CosmoFlow
    # inflates GZIP TFRecords, DeepCAM writes HDF5 samples as raw arrays); false copies as is.
    convert: bool = True
    # Keep decoded samples in memory after the first epoch: 'auto' when they fit.
    cache: Literal["auto", "true", "false"] = "auto"
    # A staged file is reused while its source keeps the size and mtime recorded in
    # its manifest entry; verify also compares a SHA-256 of the source bytes, which
    # catches content rewritten under the same size and mtime but reads every
    # source on every run.
    verify: bool = False
    threads: int = 4  # files each rank stages at once; 1 = one after another


@dataclasses.dataclass(frozen=True)
class ParallelConfig:
    # Ranks that split every sample along depth (z) between them (spatial
    # parallelism, common.parallel.spatial): groups of this many consecutive ranks, on one
    # node; the job's ranks / spatial_ranks groups do data parallelism. 1: none.
    spatial_ranks: int = 1
    # With spatial_ranks > 1: each split convolution computes the planes that read no neighbour
    # while its halo exchange is in flight (CosmoFlow's common.parallel.spatial.SpatialConv3D;
    # DeepCAM's row split exchanges first), the same function either way; false exchanges first,
    # then convolves the slab in one op (no copy of the output). The overlap is shown on a CPU; on
    # a GPU, Horovod 0.28.1's alltoall first waits for the work already queued on the GPU, the
    # interior convolution included, so it is expected to gain nothing there (docs/gpu.md).
    halo_overlap: bool = True
    # With spatial_ranks > 1: the optimizer's slots (LAMB and Adam: two copies of the weights) kept
    # once per group, each variable's by one rank that updates it and hands it to the others
    # (common.parallel.sharded_optimizer). Memory for an allgather of the weights a step.
    shard_optimizer: bool = False


@dataclasses.dataclass(frozen=True)
class MLPerfConfig:
    org: str = "reference"
    division: Literal["closed", "open"] = "closed"
    status: Literal["onprem", "cloud", "preview", "research"] = "research"
    platform: str = "unknown"
    ruleset: str = "3.0.0"
    # Weak scaling: this model instance's index and how many train concurrently (logged).
    instance_id: int | None = None
    number_of_instances: int | None = None
    # Weak scaling: a directory every instance sees, where they meet before run_start
    # (common.run.instance_start), and how long rank 0 waits there for the others.
    start_barrier_dir: str | None = None
    start_barrier_timeout_s: float = 1800.0


def check_global_batch(cfg, global_batch_size: int, local_batch_size: int, ranks: int) -> None:
    """A closed-division config reproduces one RCP entry: its global batch and no other.

    Raised at init, so a mislaunched job costs seconds instead of a multi-day run
    that fails the RCP check.
    """
    from common.errors import ConfigError

    declared = cfg.train.global_batch_size
    if cfg.mlperf.division != "closed" or declared is None or declared == global_batch_size:
        return
    accumulation = cfg.train.gradient_accumulation_frequency
    # `ranks` counts data-parallel groups: with spatial parallelism, K ranks each.
    k = cfg.parallel.spatial_ranks
    groups = (
        f"{ranks} ranks"
        if k == 1
        else f"{ranks} data-parallel groups ({ranks * k} ranks / {k} spatial)"
    )
    raise ConfigError(
        f"config key 'train.global_batch_size'={declared}: this closed-division config holds the RCP "
        f"hyperparameters for global batch {declared}, but the job runs {groups} x local batch "
        f"{local_batch_size} x accumulation {accumulation} = {global_batch_size}; launch "
        f"{declared // max(1, local_batch_size * accumulation) * k} ranks, use the config for {global_batch_size} "
        f"if one exists, or --set mlperf.division=open"
    )


def check_shared_sections(cfg) -> None:
    """The checks of the sections every benchmark shares (train loop, runtime); ConfigError naming the key."""
    from common.errors import ConfigError

    t, r = cfg.train, cfg.runtime
    for key, value, least in (
        ("train.checkpoint_every", t.checkpoint_every, 0),
        ("train.checkpoint_steps", t.checkpoint_steps, 0),
        ("train.keep_checkpoints", t.keep_checkpoints, 0),
        ("train.eval_every", t.eval_every, 1),
        ("train.stop_check_steps", t.stop_check_steps, 1),
        ("train.log_every_steps", t.log_every_steps, 0),
        ("train.benchmark_steps", t.benchmark_steps, 0),
        ("train.benchmark_warmup_steps", t.benchmark_warmup_steps, 0),
        ("train.warmup_steps", t.warmup_steps, 0),
        ("runtime.sigterm_grace_s", r.sigterm_grace_s, 0),
        ("parallel.spatial_ranks", cfg.parallel.spatial_ranks, 1),
    ):
        if value < least:
            raise ConfigError(f"config key '{key}' must be >= {least}, got {value}")
    if r.xla and cfg.parallel.spatial_ranks > 1:
        # The halo exchange and the gather sit inside the forward pass, and Horovod's alltoall and
        # allgather have no XLA kernel on any device: the compiled step would fail at its first run,
        # after run_start. Refused here, before anything runs.
        raise ConfigError(
            "config keys 'runtime.xla' and 'parallel.spatial_ranks' > 1 cannot go together "
            "(the halo exchange's alltoall and allgather have no XLA kernel)"
        )
    if cfg.parallel.shard_optimizer and cfg.parallel.spatial_ranks == 1:
        raise ConfigError(
            "config key 'parallel.shard_optimizer' shards the optimizer over a spatial group: "
            "set parallel.spatial_ranks > 1 too"
        )
    m = cfg.mlperf
    if m.start_barrier_dir and not (
        m.number_of_instances
        and m.instance_id is not None
        and 0 <= m.instance_id < m.number_of_instances
    ):
        raise ConfigError(
            f"config key 'mlperf.start_barrier_dir' needs mlperf.instance_id in "
            f"[0, mlperf.number_of_instances), got {m.instance_id} and {m.number_of_instances}"
        )
    if r.characterize and cfg.parallel.spatial_ranks > 1:
        raise ConfigError(
            f"config key 'parallel.spatial_ranks'={cfg.parallel.spatial_ranks}: runtime.characterize "
            f"measures the unsplit model; run it with 1"
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class BaseConfig:
    """The root of every benchmark's config: where the run goes and the shared sections.

    A benchmark's config subclasses it, adds its own sections (data, model,
    optimizer) and target, and may change the defaults of the shared ones.
    """

    output_dir: str = "runs"
    run_tag: str = ""  # the run's folder inside output_dir (the reference's --run_tag)
    train: TrainLoopConfig = TrainLoopConfig()
    staging: StagingConfig = StagingConfig()
    runtime: RuntimeConfig = RuntimeConfig()
    parallel: ParallelConfig = ParallelConfig()
    mlperf: MLPerfConfig = MLPerfConfig()

    @property
    def run_dir(self) -> str:
        """The run's folder: output_dir, or output_dir/run_tag."""
        return str(Path(self.output_dir) / self.run_tag)

    def validate(self) -> None:
        check_shared_sections(self)
