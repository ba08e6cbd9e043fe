"""Typed configuration: YAML files mapped onto frozen dataclasses.

A config is a tree of frozen dataclasses. `load_config` reads a YAML file,
applies dotted-key overrides (from the command line), converts every value to
the type its field declares and rejects unknown keys, so a typo in a config
or a flag fails at start-up instead of being silently ignored. `parse_overrides` reads a
train.py command line (the config file, the task's flags, --set) and `load_run_config` gives the
run's config from it.
"""

import argparse
import collections.abc
import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any

import yaml

from common.errors import ConfigError
from common.files import write_text_atomic


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
