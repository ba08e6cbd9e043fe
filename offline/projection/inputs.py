"""What the projection reads: machine files, model costs, published points, data sets, node counts.

Each reader checks what it reads and raises common.errors.InputError, one line naming the file
and the fault, for the command to print as `error: ...`.
"""

import collections
import dataclasses
import json
from pathlib import Path

import yaml

from common import benchmarks
from common.errors import InputError
from offline.projection import model
from offline.projection.model import Dataset, Machine, ModelCosts

REPO = Path(__file__).resolve().parents[2]
OFFLINE = REPO / "offline"
MACHINES_DIR = REPO / "machines"
COSTS_DIR = OFFLINE / "model_costs"
POINTS_FILE = OFFLINE / "published_points.yaml"

# What each benchmark stages and trains on: the full data set as published (common/benchmarks.py
# cites the figures). Its bytes include a test split the runs do not stage, so staging is an upper bound.
DATASETS = {
    b.name: Dataset(
        train_samples=b.published_train_samples,
        eval_samples=b.published_eval_samples,
        bytes=b.published_dataset_bytes,
    )
    for b in benchmarks.BENCHMARKS
}
MACHINE_KEYS = {f.name for f in dataclasses.fields(Machine)}
OPTIONAL_MACHINE_KEYS = {
    "intra_node_bytes_per_s",
    "filesystem_bytes_per_s",
    "node_local_write_bytes_per_s",
    "allreduce_overlap",
    "device_memory_bytes",
}


def _number(value, key: str, source) -> float | None:
    # YAML 1.1 reads 19.5e12 (no sign in the exponent) as a string: accept both spellings.
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise InputError(f"{source}: {key} must be a number, got {value!r}") from None


def machine_path(name_or_path) -> Path:
    """A machine file from a path or a name of machines/ ('perlmutter-a100')."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return path
    return MACHINES_DIR / f"{name_or_path}.yaml"


def load_machine(path) -> Machine:
    """A machines/*.yaml file as a Machine; unknown or missing keys are errors."""
    path = machine_path(path)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except OSError as e:
        raise InputError(f"cannot read machine file {path}: {e.strerror}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("peak_flop_per_s", {}), dict):
        raise InputError(
            f"{path}: a mapping of keys is expected, peak_flop_per_s a mapping of precisions"
        )
    unknown = set(raw) - MACHINE_KEYS
    missing = MACHINE_KEYS - OPTIONAL_MACHINE_KEYS - set(raw)
    if unknown or missing:
        raise InputError(
            f"{path}: "
            + "; ".join(
                filter(
                    None,
                    [
                        f"unknown keys {', '.join(sorted(unknown))}" if unknown else "",
                        f"missing keys {', '.join(sorted(missing))}" if missing else "",
                    ],
                )
            )
        )
    peaks = {
        str(k): _number(v, f"peak_flop_per_s.{k}", path)
        for k, v in (raw["peak_flop_per_s"] or {}).items()
    }
    efficiency = raw["efficiency"]
    efficiency = (
        {str(k): _number(v, f"efficiency.{k}", path) for k, v in efficiency.items()}
        if isinstance(efficiency, dict)
        else {"default": _number(efficiency, "efficiency", path)}
    )
    numbers = {
        key: _number(raw.get(key), key, path)
        for key in (
            "memory_bytes_per_s",
            "nic_bytes_per_s",
            "nic_latency_s",
            "intra_node_bytes_per_s",
            "filesystem_bytes_per_s",
            "node_local_write_bytes_per_s",
            "device_memory_bytes",
        )
    }
    machine = Machine(
        name=str(raw["name"]),
        device=str(raw["device"]),
        peak_flop_per_s=peaks,
        devices_per_node=int(raw["devices_per_node"]),
        cores_per_node=int(raw["cores_per_node"]),
        precision=str(raw["precision"]),
        efficiency=efficiency,
        allreduce_overlap=_number(raw.get("allreduce_overlap", 0.0), "allreduce_overlap", path),
        **numbers,
    )
    machine.peak(machine.precision)  # the default precision must have a peak
    return machine


def stored_costs(benchmark: str) -> dict:
    """The full-size measurement of offline/model_costs/<benchmark>.json (offline.measure_model_costs)."""
    path = COSTS_DIR / f"{benchmark}.json"
    if not path.exists():
        raise InputError(
            f"{path} not found: run python -m offline.measure_model_costs --bench {benchmark}"
        )
    return json.loads(path.read_text())


def load_costs(benchmark: str, characterization=None) -> tuple[ModelCosts, str]:
    """The model's costs per sample and a line saying where they were measured."""
    record = stored_costs(benchmark)
    if characterization is None:
        on = record["measured_on"]
        return (
            ModelCosts(
                flops_train=record["flops_per_sample_train"],
                flops_forward=record["flops_per_sample_forward"],
                activation_bytes_train=record["activation_bytes_per_sample_train_fp32"],
                activation_bytes_forward=record["activation_bytes_per_sample_forward_fp32"],
                weight_bytes_train=record["weight_bytes_per_step_train_fp32"],
                gradient_bytes=record["gradient_bytes_fp32"],
                input_samples_per_s_per_core=record.get("input_samples_per_s_per_core"),
            ),
            f"closed {benchmark} model at full size ({record['parameters']:,} parameters), measured with "
            f"TensorFlow {on['tensorflow']} on {on['cpu']} ({on['isa']})",
        )
    path = Path(characterization) / "characterization.json"
    if not path.exists():
        raise InputError(
            f"{path} not found: run python -m offline.characterize {characterization} first"
        )
    c = json.loads(path.read_text())
    # offline.characterize counts a training step as 3x forward and the weights once per sample.
    return (
        ModelCosts(
            flops_train=c["flops_per_sample_train"],
            flops_forward=c["flops_per_sample_train"] / 3,
            activation_bytes_train=c["memory_bytes_per_sample_train"],
            activation_bytes_forward=c["memory_bytes_per_sample_train"] / 3,
            weight_bytes_train=0.0,
            gradient_bytes=c["gradient_bytes_per_step"],
            input_samples_per_s_per_core=c["input_samples_per_s"]
            / max(1, c["machine"].get("cpus", 1)),
        ),
        f"the model of run {characterization} ({c['parameters']:,} parameters, its characterization.json)",
    )


def default_local_batch(benchmark: str) -> int:
    """The local batch most of the benchmark's closed configs use."""
    batches = [local for _, _, local, _ in benchmarks.closed_config_batches(benchmark) if local]
    return collections.Counter(batches).most_common(1)[0][0]


def load_points() -> dict:
    """The published results of offline/published_points.yaml, by name."""
    return yaml.safe_load(POINTS_FILE.read_text())["points"]


def parse_nodes(text: str) -> tuple:
    """The node counts of --nodes ('16,32,64')."""
    try:
        nodes = tuple(int(n) for n in text.split(",") if n.strip())
    except ValueError:
        raise InputError(f"--nodes takes comma-separated whole numbers, got {text!r}") from None
    if not nodes or min(nodes) < 1:
        raise InputError(f"--nodes needs node counts of at least 1, got {text!r}")
    return nodes


def check_staging_rates(machine_file, machine: Machine, dataset: Dataset) -> None:
    """Timed staging needs a file-system or a node-local bandwidth in the machine file."""
    if model.staging_seconds(machine, dataset, 1) is None:
        raise InputError(
            f"{machine_path(machine_file)} states neither a file-system nor a node-local bandwidth, "
            f"so staging cannot be projected: give --staging untimed"
        )
