"""Typed configuration: YAML files and dotted-key overrides mapped onto frozen dataclasses.

`load_config` converts every value to its field's declared type and rejects unknown keys, so a
typo fails at start-up; `parse_overrides` reads a train.py command line. `BaseConfig` holds the
sections every benchmark shares; each benchmark's config subclasses it.
"""

import argparse
import dataclasses
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml

from common.errors import ConfigError, write_text_atomic
from common.task import Flag


def load_config(cls, path=None, overrides: Mapping[str, Any] | None = None):
    """A validated, frozen `cls` from a YAML file (None: the defaults) and dotted-key overrides
    ({"data.batch_size": "4"}; strings as typed on a command line are converted).

    Raises:
      ConfigError: unreadable file, unknown key, bad value, or a failed validation.
    """
    cfg = _load(cls, path, overrides)
    cfg.validate()
    return cfg


def load_model_config(cls, path, overrides: Mapping[str, Any] | None = None):
    """As load_config, for tools that only build a model (import, predict): data.data_dir may be
    unset (the config is validated with a stand-in)."""
    cfg = _load(cls, path, overrides)
    data = dataclasses.replace(cfg.data, data_dir=cfg.data.data_dir or "unset")
    dataclasses.replace(cfg, data=data).validate()
    return cfg


def peek(cls, path, overrides: Mapping[str, Any], dotted: str):
    """The value of key `dotted` in load_config(cls, path, overrides), read before that can run
    (before Horovod's init); not validated. None when the config cannot be built (load_config will
    say why)."""
    try:
        value = _load(cls, path, overrides)
    except ConfigError:
        return None
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def replace(cfg, overrides: Mapping[str, Any]):
    """A validated copy of `cfg` with dotted-key overrides applied."""
    new = _load(type(cfg), None, overrides, to_dict(cfg))
    new.validate()
    return new


def to_dict(cfg) -> dict:
    """The config as plain YAML-friendly Python values (tuples as lists)."""
    return dataclasses.asdict(
        cfg,
        dict_factory=lambda items: {k: list(v) if isinstance(v, tuple) else v for k, v in items},
    )


def yaml_text(cfg) -> str:
    """The resolved config as YAML text."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def dump_config(cfg, path) -> None:
    """Writes the resolved config as YAML (temporary name, then rename)."""
    write_text_atomic(path, yaml_text(cfg))


def _load(cls, path, overrides, raw=None):
    """A `cls` from the YAML file `path` (else `raw`, else the defaults) and the overrides."""
    raw = _read_yaml(path) if path is not None else raw or {}
    for dotted, value in (overrides or {}).items():
        _set_dotted(raw, dotted, value, cls)
    return _build(cls, raw, "", str(path or "overrides"))


def _read_yaml(path) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f) or {}
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {path} is not UTF-8 text: {e}") from None
    except OSError as e:  # a directory, no permission
        raise ConfigError(f"cannot read config file {path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return raw


def _set_dotted(raw: dict, dotted: str, value, cls) -> None:
    """Sets raw[a][b][c] = value for dotted 'a.b.c', a key of `cls` (else ConfigError naming it)."""
    tp = cls
    for part in dotted.split("."):
        if not dataclasses.is_dataclass(tp) or part not in (hints := typing.get_type_hints(tp)):
            raise ConfigError(f"unknown config key '{dotted}'")
        tp = hints[part]
    *parents, last = dotted.split(".")
    for part in parents:
        if not isinstance(raw.get(part), dict):
            raw[part] = {}
        raw = raw[part]
    raw[last] = value


def _build(cls, raw, prefix: str, source: str, base=None):
    """A `cls` from the mapping `raw`; fields it does not set keep their values in `base` (the
    enclosing config's default for this section), else their class defaults."""
    if not isinstance(raw, Mapping):
        where = prefix.rstrip(".") or "<root>"
        raise ConfigError(f"config key '{where}' in {source} must be a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - names)
    if unknown:
        raise ConfigError(f"unknown config key '{prefix}{unknown[0]}' in {source}")
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    values = {k: _convert(v, hints[k], prefix + k, source, defaults[k]) for k, v in raw.items()}
    return dataclasses.replace(base, **values) if base is not None else cls(**values)


_TRUE, _FALSE = ("true", "yes", "1", "on"), ("false", "no", "0", "off")


def _convert(value, tp, key: str, source: str, default=None):
    """`value` as type `tp`, one of the configs' field types: a dataclass, X | None, Literal, bool,
    int, float, str, tuple[X, ...]. Strings (a command line) are parsed; ConfigError otherwise."""

    def bad(why=""):
        name = getattr(tp, "__name__", None) or str(tp).replace("typing.", "")
        return ConfigError(f"config key '{key}' in {source}: cannot use {value!r} as {name}{why}")

    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        base = default if isinstance(default, tp) else None
        return _build(tp, {} if value is None else value, key + ".", source, base)
    if origin in (typing.Union, types.UnionType):  # X | None
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null", "")):
            return None
        return _convert(value, args[0], key, source)
    if origin is Literal:
        if value in args:
            return value
        raise bad(f" (choose one of {', '.join(map(repr, args))})")
    if isinstance(value, bool) and tp is not bool:
        raise bad()
    if tp is bool:
        if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
            return value.lower() in _TRUE
        if isinstance(value, bool):
            return value
    elif tp is int and isinstance(value, int):
        return value
    elif tp in (int, float) and isinstance(value, (str, int, float)):
        try:
            number = float(value)
        except ValueError:
            raise bad() from None
        if tp is float:
            return number
        if number.is_integer():  # "1e3", 8.0
            return int(number)
    elif tp is str and isinstance(value, (str, int, float)):
        return str(value)
    elif origin is tuple:
        if isinstance(value, str):
            value = [v for v in value.split(",") if v.strip()]
        if isinstance(value, (list, tuple)):
            return tuple(_convert(v, args[0], f"{key}[{i}]", source) for i, v in enumerate(value))
    raise bad()


# ------------------------------------------------------------ the command line
_RUN_FLAGS = (  # the flags of every benchmark's train.py
    Flag(("--tensorboard",), "runtime.tensorboard", "write TensorBoard events", is_switch=True),
    Flag(("--benchmark",), "train.benchmark_steps", "benchmark mode: time VALUE steps"),
    Flag(("--tiny",), "runtime.tiny", "shrink the config into a smoke run", is_switch=True),
)


def build_parser(task) -> argparse.ArgumentParser:
    """train.py's parser: CONFIG, the task's flags, the flags of every run and --set KEY=VALUE."""
    parser = argparse.ArgumentParser(
        prog=f"{task.name}/train.py", description=f"Train {task.name} (MLPerf HPC)."
    )
    parser.add_argument(
        "config",
        nargs="?",
        default=None,
        help="YAML config file (see configs/); default: the closed config of the job's global batch",
    )
    for flag in (*task.flags, *_RUN_FLAGS):
        kind = dict(action="store_const", const=True) if flag.is_switch else dict(metavar="VALUE")
        parser.add_argument(*flag.names, dest=flag.key, default=None, help=flag.help, **kind)
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
    """The config file (or None) and the dotted-key overrides of a train.py command line."""
    args = build_parser(task).parse_args(argv)
    overrides = {}
    for item in args._set:
        if "=" not in item:
            raise ConfigError(f"--set expects KEY=VALUE, got '{item}'")
        key, value = item.split("=", 1)
        overrides[key.strip()] = value
    for flag in (*task.flags, *_RUN_FLAGS):
        value = getattr(args, flag.key)
        if value is not None:
            overrides.update(flag.parse(value) if flag.parse else {flag.key: value})
    return args.config, overrides


def load_run_config(task, config_path, overrides: dict, ranks: int) -> tuple[object, str]:
    """The run's validated config, and a note for the [init] line ('' when nothing to say).

    Without a config file, the closed config whose global batch this job gives is used (the
    reference is started with flags only). runtime.tiny then shrinks the config
    (Task.tiny_overrides); what the command line sets still wins.
    """
    note = ""
    if config_path is None:
        from common.benchmarks import closed_config_for  # a run started without CONFIG only

        config_path = closed_config_for(task, overrides, ranks)
        note = f"no config given: using {config_path}, the closed config of this job's global batch"
    cfg = load_config(task.config_class, config_path, overrides)
    if cfg.runtime.tiny:
        cfg = replace(cfg, {**task.tiny_overrides(cfg), **overrides})
        note = (
            note + "; " if note else ""
        ) + "runtime.tiny: the config is shrunk into a smoke run (not a benchmark result)"
    return cfg, note


# ------------------------------------------------------------ the sections every benchmark shares
@dataclasses.dataclass(frozen=True)
class TrainLoopConfig:
    n_epochs: int = 100
    seed: int = 0
    checkpoint_every: int = 0  # epochs between checkpoints; 0 = none
    checkpoint_steps: int = 0  # optimizer steps between checkpoints, mid-epoch included; 0 = none
    keep_checkpoints: int = 2
    resume: bool = False  # continue from the newest checkpoint in output_dir
    resume_from: str | None = None  # or from this checkpoint folder (checkpoints/step-NNNNNNNNNN)
    # Steps between the collective checks for a stop request (SIGUSR1, SIGTERM); each epoch's end too.
    stop_check_steps: int = 10
    eval_every: int = 1  # epochs between evaluations
    log_every_steps: int = 50  # steps between training figures (TensorBoard, progress); 0 = none
    # Benchmark mode: train this many steps through the real loop, print samples/s (0: off).
    benchmark_steps: int = 0
    benchmark_warmup_steps: int = 5  # steps of benchmark mode left out of the figures
    # Steps on synthetic batches before run_start, the state put back after (common.run.warmup).
    warmup_steps: int = 2
    # Evaluate the (restored or imported) model once and stop: no training, no MLPerf log.
    evaluate_only: bool = False
    stop_at_target: bool = True
    gradient_accumulation_frequency: int = 1  # local batches summed per optimizer step
    # The global batch of the config's RCP entry; closed division: another one stops at init.
    global_batch_size: int | None = None


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
    # Mixed precision; 'auto': fp16 on GPUs, bf16 on CPUs computing it natively, else float32.
    amp: bool = False
    amp_dtype: Literal["auto", "bfloat16", "float16"] = "auto"
    xla: bool = False  # jit_compile the train step
    intra_op_threads: int = 0  # 0: the rank's own CPUs (common.cpu.intra_op_threads)
    inter_op_threads: int = 2
    gradient_compression: Literal["none", "fp16"] = "none"
    # 'overlap': an allreduce per gradient as backward produces it; 'grouped': one after backward.
    gradient_allreduce: Literal["overlap", "grouped"] = "overlap"
    # Copy each batch to the device one step ahead: 'auto' on a GPU only (docs/running.md).
    prefetch_to_device: Literal["auto", "on", "off"] = "auto"
    # Op types that may stay on the CPU of a GPU run (common.run.device_placement).
    allow_cpu_ops: tuple[str, ...] = ()
    record_shards: bool = False  # write each rank's file list to shards/ (tests, audits)
    # Op determinism and in-order reading: a resumed run ends bit for bit as an uninterrupted one.
    deterministic: bool = False
    # After SIGTERM, seconds the ranks get to agree on a stop and checkpoint before exit 143.
    sigterm_grace_s: float = 20.0
    cache_clear: bool = True  # drop the input files from the page cache before run_start
    check_log: bool = True  # run the MLPerf compliance checker on rank 0 at the end
    tiny: bool = False  # shrink the config into a smoke run (Task.tiny_overrides)
    tensorboard: bool = False  # TensorBoard event files in <run dir>/tensorboard (rank 0)
    # Time each step of the first epoch for the [timing] line (a measurement: not for timed runs).
    step_timing: bool = False
    # After run_stop, measure FLOPs, input rate, memory, allreduce time (offline.characterize).
    characterize: bool = False


@dataclasses.dataclass(frozen=True)
class StagingConfig:
    # Node-local directory; None = read data_dir in place. '{node}', '{host}' are replaced.
    stage_dir: str | None = None
    convert: bool = True  # stage in the benchmark's fast layout (Task.staged_layout), else copy
    # Keep decoded samples in memory after the first epoch: 'auto' when they fit.
    cache: Literal["auto", "true", "false"] = "auto"
    # Also compare a SHA-256 of each source with the staged copy's (reads every source each run).
    verify: bool = False
    threads: int = 4  # files each rank stages at once; 1 = one after another


@dataclasses.dataclass(frozen=True)
class ParallelConfig:
    # Consecutive ranks of one node that split every sample between them (common.parallel.spatial).
    spatial_ranks: int = 1
    # Split convolutions compute the interior while the halo exchange is in flight (docs/scaling.md).
    halo_overlap: bool = True
    # Optimizer slots kept once per spatial group (common.parallel.sharded_optimizer).
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
    # Weak scaling: where the instances meet before run_start (common.run.instance_start).
    start_barrier_dir: str | None = None
    start_barrier_timeout_s: float = 1800.0


def check_at_least(*checks: tuple[str, float, float]) -> None:
    """ConfigError naming the first (key, value, least) whose value is below least."""
    for key, value, least in checks:
        if value < least:
            raise ConfigError(f"config key '{key}' must be >= {least}, got {value}")


def check_global_batch(cfg, global_batch_size: int, local_batch_size: int, ranks: int) -> None:
    """ConfigError at init when a closed-division config runs at a global batch other than its
    train.global_batch_size (its RCP entry). `ranks` counts data-parallel groups."""
    declared = cfg.train.global_batch_size
    if cfg.mlperf.division != "closed" or declared is None or declared == global_batch_size:
        return
    accumulation = cfg.train.gradient_accumulation_frequency
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class BaseConfig:
    """The root of every benchmark's config: where the run goes and the shared sections. A
    benchmark's config adds its own sections and target, and may change the shared defaults."""

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
        """ConfigError naming the key for the shared sections; subclasses check their own."""
        t, r, p, m = self.train, self.runtime, self.parallel, self.mlperf
        check_at_least(
            ("train.n_epochs", t.n_epochs, 1),
            ("train.gradient_accumulation_frequency", t.gradient_accumulation_frequency, 1),
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
            ("parallel.spatial_ranks", p.spatial_ranks, 1),
        )
        if r.xla and p.spatial_ranks > 1:  # refused before anything runs, not at the first step
            raise ConfigError(
                "config keys 'runtime.xla' and 'parallel.spatial_ranks' > 1 cannot go together "
                "(the halo exchange's alltoall and allgather have no XLA kernel)"
            )
        if p.shard_optimizer and p.spatial_ranks == 1:
            raise ConfigError(
                "config key 'parallel.shard_optimizer' shards the optimizer over a spatial group: "
                "set parallel.spatial_ranks > 1 too"
            )
        if m.start_barrier_dir and not (
            m.number_of_instances
            and m.instance_id is not None
            and 0 <= m.instance_id < m.number_of_instances
        ):
            raise ConfigError(
                f"config key 'mlperf.start_barrier_dir' needs mlperf.instance_id in "
                f"[0, mlperf.number_of_instances), got {m.instance_id} and {m.number_of_instances}"
            )
        if r.characterize and p.spatial_ranks > 1:
            raise ConfigError(
                f"config key 'parallel.spatial_ranks'={p.spatial_ranks}: runtime.characterize "
                f"measures the unsplit model; run it with 1"
            )
