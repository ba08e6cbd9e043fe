"""Typed configuration: YAML files mapped onto frozen dataclasses.

A config is a tree of frozen dataclasses. `load_config` reads a YAML file,
applies dotted-key overrides (from the command line), converts every value to
the type its field declares and rejects unknown keys, so a typo in a config
or a flag fails at start-up instead of being silently ignored. `parse_overrides` reads a
train.py command line (the config file, the task's flags, --set) and `load_run_config` gives the
run's config from it.

The sections every benchmark shares (training loop, runtime, staging, MLPerf) are `BaseConfig`'s, below; each benchmark's config subclasses it.
"""

import argparse
import collections.abc
import dataclasses
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml

from common.errors import ConfigError
from common.files import write_text_atomic

# Typed configuration: YAML files mapped onto frozen dataclasses.
#
# A config is a tree of frozen dataclasses. `load_config` reads a YAML file,
# applies dotted-key overrides (from the command line), converts every value to
# the type its field declares and rejects unknown keys, so a typo in a config
# or a flag fails at start-up instead of being silently ignored. `parse_overrides` reads a
# train.py command line (the config file, the task's flags, --set) and `load_run_config` gives the
# run's config from it.


def load_config(cls, path=None, overrides: Mapping[str, Any] | None = None):
    """Builds a `cls` config from a YAML file and dotted-key overrides.

    Args:
      cls: the root config dataclass.
      path: YAML file; None starts from the dataclass defaults.
      overrides: {"data.batch_size": 4, ...}; values may be strings (as
        typed on a command line) and are converted to the field's type.

    Returns:
      A frozen, validated instance of `cls`.

    Raises:
      ConfigError: unreadable file, unknown key, missing key or bad value.
    """
    raw = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        try:
            with open(path, encoding="utf-8") as f:
                raw = yaml.safe_load(f) or {}
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        except UnicodeDecodeError as e:
            raise ConfigError(f"config file {path} is not UTF-8 text: {_one_line(e)}") from None
        except OSError as e:  # a directory, no permission
            raise ConfigError(
                f"cannot read config file {path}: {e.strerror or _one_line(e)}"
            ) from None
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {path} is not valid YAML: {_one_line(e)}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"config file {path} must hold a mapping at the top level")
    for dotted, value in (overrides or {}).items():
        _set_dotted(raw, dotted, value, cls)
    cfg = _build(cls, raw, prefix="", source=source)
    validate = getattr(cfg, "validate", None)
    if validate is not None:
        validate()
    return cfg


def load_model_config(cls, path, overrides: Mapping[str, Any] | None = None):
    """As load_config, for tools that only build a model (import, predict): data.data_dir may be unset.

    Validation requires data.data_dir, which training needs and a model alone
    does not: a config that fails without it is validated with a stand-in,
    removed again (a config failing for another reason fails again).
    """
    overrides = dict(overrides or {})
    try:
        return load_config(cls, path, overrides)
    except ConfigError:
        cfg = load_config(cls, path, {**overrides, "data.data_dir": "unset"})
        return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, data_dir=None))


def peek(cls, path, overrides: Mapping[str, Any], dotted: str):
    """The value key `dotted` will have once load_config(cls, path, overrides) runs, read before it can run.

    For what must be decided before the config can be loaded (choosing a closed config needs
    the rank count Horovod's init gives): the launcher sets Horovod's environment before that
    init. Nothing is validated: None when the file or the value cannot be read (load_config will say
    why), and path None gives the dataclass default unless `overrides` sets the key.
    """
    tp = field_type(cls, dotted)
    parts = dotted.split(".")
    if dotted in overrides:
        value = overrides[dotted]
    else:
        try:
            value = _build(cls, {}, prefix="", source="defaults")
            for part in parts:
                value = getattr(value, part)
        except ConfigError:  # a key without a default: only a file or an override can give it
            value = None
        if path is not None:
            try:
                with open(path, encoding="utf-8") as f:
                    node = yaml.safe_load(f)
            except (OSError, UnicodeDecodeError, yaml.YAMLError):
                return None
            for part in parts:
                node = (
                    node.get(part, dataclasses.MISSING)
                    if isinstance(node, Mapping)
                    else dataclasses.MISSING
                )
            if node is not dataclasses.MISSING:
                value = node
    try:
        return None if value is None else _convert(value, tp, dotted, "peek")
    except ConfigError:
        return None


def to_dict(cfg) -> dict:
    """The config as plain YAML-friendly Python values."""

    def plain(v):
        if dataclasses.is_dataclass(v):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, Mapping):
            return {k: plain(x) for k, x in v.items()}
        return v

    return plain(cfg)


def yaml_text(cfg) -> str:
    """The resolved config as YAML text."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def dump_config(cfg, path) -> None:
    """Writes the resolved config as YAML (temporary name, then rename)."""
    write_text_atomic(path, yaml_text(cfg))


def replace(cfg, overrides: Mapping[str, Any]):
    """A copy of `cfg` with dotted-key overrides applied and validated."""
    raw = to_dict(cfg)
    for dotted, value in overrides.items():
        _set_dotted(raw, dotted, value, type(cfg))
    new = _build(type(cfg), raw, prefix="", source="overrides")
    if hasattr(new, "validate"):
        new.validate()
    return new


def field_type(cls, dotted: str):
    """The declared type of a dotted key, or ConfigError if there is no such key."""
    node = cls
    for part in dotted.split("."):
        hints = _hints(node) if dataclasses.is_dataclass(node) else {}
        if part not in hints:
            raise ConfigError(f"unknown config key '{dotted}'")
        node = hints[part]
    return node


def _set_dotted(raw: dict, dotted: str, value, cls) -> None:
    field_type(cls, dotted)  # rejects unknown keys early, naming the flag's key
    node = raw
    parts = dotted.split(".")
    for part in parts[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[parts[-1]] = value


def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _build(cls, raw, prefix: str, source: str):
    if not isinstance(raw, Mapping):
        raise ConfigError(
            f"config key '{prefix.rstrip('.') or '<root>'}' in {source} "
            f"must be a mapping, got {raw!r}"
        )
    hints = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - names)
    if unknown:
        raise ConfigError(f"unknown config key '{prefix}{unknown[0]}' in {source}")
    kwargs = {}
    for f in dataclasses.fields(cls):
        key = prefix + f.name
        if f.name in raw:
            kwargs[f.name] = _convert(raw[f.name], hints[f.name], key, source)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            if dataclasses.is_dataclass(hints[f.name]):
                kwargs[f.name] = _build(hints[f.name], {}, key + ".", source)
            else:
                raise ConfigError(f"missing config key '{key}' in {source}")
    return cls(**kwargs)


def _convert(value, tp, key: str, source: str):
    """Converts `value` to type `tp`, accepting command-line strings."""

    def bad(why=""):
        return ConfigError(
            f"config key '{key}' in {source}: cannot use {value!r} as {_type_name(tp)}{why}"
        )

    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value if value is not None else {}, key + ".", source)
    if origin in (typing.Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null", "")):
            if type(None) in args:
                return None
        for arg in [a for a in args if a is not type(None)]:
            try:
                return _convert(value, arg, key, source)
            except ConfigError:
                continue
        raise bad()
    if origin is typing.Literal:
        if value in args:
            return value
        raise bad(f" (choose one of {', '.join(map(repr, args))})")
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in (
            "true",
            "yes",
            "1",
            "on",
            "false",
            "no",
            "0",
            "off",
        ):
            return value.lower() in ("true", "yes", "1", "on")
        raise bad()
    if tp is int:
        if isinstance(value, bool):
            raise bad()
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                try:
                    as_float = float(value)
                except ValueError:
                    raise bad() from None
                if as_float.is_integer():
                    return int(as_float)
        raise bad()
    if tp is float:
        if isinstance(value, bool):
            raise bad()
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                raise bad() from None
        raise bad()
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise bad()
    if origin in (tuple, list, collections.abc.Sequence):
        if isinstance(value, str):
            value = [v for v in value.split(",") if v.strip()] if value.strip() else []
        if not isinstance(value, (list, tuple)):
            raise bad()
        item = args[0] if args else Any
        return tuple(
            _convert(v, item, f"{key}[{i}]", source) if item is not Any else v
            for i, v in enumerate(value)
        )
    if origin in (dict, collections.abc.Mapping):
        if isinstance(value, str):
            pairs = [p for p in value.split(",") if p.strip()]
            try:
                value = dict(p.split(":", 1) for p in pairs)
            except ValueError:
                raise bad(" (write key:value,key:value)") from None
        if not isinstance(value, Mapping):
            raise bad()
        kt, vt = args if args else (Any, Any)
        out = {}
        for k, v in value.items():
            out[_convert(k, kt, f"{key}.{k}", source) if kt is not Any else k] = (
                _convert(v, vt, f"{key}.{k}", source) if vt is not Any else v
            )
        # A read-only view keeps the frozen config frozen all the way down.
        return types.MappingProxyType(out)
    if tp is Any:
        return value
    raise bad(" (unsupported field type)")


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())


# ------------------------------------------------------------ the command line
def build_parser(task) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"{task.name}/train.py", description=f"Train {task.name} (MLPerf HPC)."
    )
    parser.add_argument(
        "config",
        nargs="?",
        default=None,
        help="YAML config file (see configs/); default: the closed config of the job's global batch",
    )
    for flag in task.flags:
        if flag.is_switch:
            parser.add_argument(
                *flag.names,
                dest=flag.key,
                action="store_const",
                const=True,
                default=None,
                help=flag.help,
            )
        else:
            parser.add_argument(
                *flag.names, dest=flag.key, default=None, metavar="VALUE", help=flag.help
            )
    parser.add_argument(
        "--tensorboard",
        dest="runtime.tensorboard",
        action="store_const",
        const=True,
        default=None,
        help="write TensorBoard event files to <run dir>/tensorboard (rank 0)",
    )
    parser.add_argument(
        "--benchmark",
        dest="train.benchmark_steps",
        default=None,
        metavar="STEPS",
        help="benchmark mode: time STEPS training steps through the real loop (staging, input "
        "pipeline, Horovod) after train.benchmark_warmup_steps, print samples/s; no MLPerf log",
    )
    parser.add_argument(
        "--tiny",
        dest="runtime.tiny",
        action="store_const",
        const=True,
        default=None,
        help="shrink the config into a smoke run of a few small steps (runtime.tiny)",
    )
    parser.add_argument(
        "--set",
        dest="_set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any config key, e.g. --set model.dropout=0.2 (repeatable)",
    )
    return parser


def parse_overrides(task, argv) -> tuple[str, dict]:
    args = build_parser(task).parse_args(argv)
    overrides = {}
    for item in args._set:
        if "=" not in item:
            raise ConfigError(f"--set expects KEY=VALUE, got '{item}'")
        key, value = item.split("=", 1)
        overrides[key.strip()] = value
    for flag in task.flags:
        value = getattr(args, flag.key)
        if value is not None:
            overrides.update(flag.parse(value) if flag.parse else {flag.key: value})
    for key in ("runtime.tensorboard", "train.benchmark_steps", "runtime.tiny"):
        if getattr(args, key) is not None:
            overrides[key] = getattr(args, key)
    return args.config, overrides


def load_run_config(task, config_path, overrides: dict, ranks: int) -> tuple[object, str]:
    """The run's validated config, and a note for the [init] line ('' when nothing to say).

    Without a config file, the closed config of the benchmark's registry entry
    whose global batch equals ranks x local batch x accumulation is used (the
    reference is started with flags only). runtime.tiny then shrinks the
    config (Task.tiny_overrides); what the command line sets still wins.
    """
    note = ""
    if config_path is None:
        config_path = closed_config_for(task, overrides, ranks)
        note = f"no config given: using {config_path}, the closed config of this job's global batch"
    cfg = load_config(task.config_class, config_path, overrides)
    if cfg.runtime.tiny:
        cfg = replace(cfg, {**task.tiny_overrides(cfg), **overrides})
        note = (
            note + "; " if note else ""
        ) + "runtime.tiny: the config is shrunk into a smoke run (not a benchmark result)"
    return cfg, note


def closed_config_for(task, overrides: dict, ranks: int) -> str:
    """The closed config whose train.global_batch_size this job gives; ConfigError if none does."""
    from common import benchmarks  # the benchmark table: a run without CONFIG only

    bench = benchmarks.get(task.name)
    local_batch = overrides.get(bench.local_batch_key)
    accumulation = overrides.get("train.gradient_accumulation_frequency")
    # Ranks that split samples add no data parallelism: the global batch counts their groups.
    spatial = int(overrides.get("parallel.spatial_ranks", 1))
    if spatial > 1 and ranks % spatial == 0:
        ranks //= spatial
    path = benchmarks.closed_config_for_ranks(
        task.name,
        ranks,
        int(local_batch) if local_batch else None,
        int(accumulation) if accumulation else None,
    )
    if path is not None:
        return str(path)
    offered = ", ".join(
        f"{p.name} (global batch {gbs})"
        for p, gbs, _, _ in benchmarks.closed_config_batches(task.name)
    )
    raise ConfigError(
        f"no config given and no closed config of {task.name} has this job's global batch "
        f"({ranks} ranks): give a config file, or launch as one of {offered}"
    )


# Config sections every benchmark shares: training loop, runtime, staging, MLPerf.


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
