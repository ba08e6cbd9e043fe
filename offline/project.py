"""Projects a benchmark's time to train at N nodes of a described machine, term by term.

  python -m offline.project --benchmark cosmoflow --machine machines/perlmutter-a100.yaml --nodes 16,32,64,128,256
  python -m offline.project --benchmark deepcam --machine machines/eos-h100.yaml --nodes 64,128,256 \\
         --global-batch 2048 --staging untimed
  python -m offline.project --validate            # docs/scaling.md's table: projection vs published results
  python -m offline.project --calibrate perlmutter-cosmoflow-128   # the efficiency a published point implies

For each node count it prints the global and local batch, the epochs to converge from
mlperf_logging's RCP table for that global batch ("no RCP" outside the table), the staging time,
the step time from the roofline (compute or memory bound) plus the ring allreduce, the
evaluation time per epoch, the input pipeline's headroom and the projected time to train; then
where the time goes, from which node count staging from the shared file system dominates, and
what local batch keeps a device busy. It writes a PNG of the curves with the published points
of that machine and benchmark. The model and its assumptions: offline/projection.py.

Flags:
  --benchmark NAME        a benchmark of common/benchmarks.py
  --machine YAML          a machine description (machines/*.yaml)
  --nodes N,N,...         node counts to project
  --global-batch G        a fixed global batch (strong scaling); the local batch is G / devices
  --local-batch B         a fixed local batch (the global batch grows with the nodes); default: the
                          local batch of most of the benchmark's closed configs
  --precision P           fp32, tf32, fp16 or bf16 (default: the machine file's)
  --characterization DIR  take FLOPs, traffic, gradient bytes and input rate from a run's
                          characterization.json (offline.characterize) instead of the stored
                          full-size measurements (offline/model_costs/<benchmark>.json)
  --instances M           M jobs staging at once share the file system (weak scaling)
  --staging timed|untimed whether staging counts in the time to train (default timed, as the
                          MLPerf HPC rules read here; NVIDIA's v3.0 Eos runs staged during init)
  --rcp-pass full|pruned  the RCP table as measured, or pruned as the RCP checker prunes it
  --ruleset R             mlperf_logging's hpc ruleset for the RCP table (default 3.0.0)
  --busy F                the device-busy fraction the local-batch answer aims at (default 0.9)
  --png PATH              where the figure goes (default runs/projection/<benchmark>_<machine>.png)
  --spatial-ranks K       cosmoflow: each sample split along depth across K devices of a node; prints
                          the split layers' halo/gather traffic per layer, memory per device at
                          128^3/256^3/512^3 against the machine's, and K=1 beside K (default 1: the
                          projection above, unchanged). Model: offline/spatial_projection.py
  --sample-edge N         cosmoflow: 128 (default), 256 or 512 (analytic scaling of the 128^3 costs)
  --cycle-time-ms T       the split layers' latency per collective (default 1: Horovod's cycle time)
"""

import argparse
import collections
import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import yaml

from common import benchmarks
from offline import projection, spatial_projection
from offline.projection import Dataset, Machine, ModelCosts

REPO = Path(__file__).resolve().parents[1]
MACHINES_DIR = REPO / "machines"
COSTS_DIR = Path(__file__).resolve().parent / "model_costs"
POINTS_FILE = Path(__file__).resolve().parent / "published_points.yaml"
WITHIN = 0.25   # the accuracy the validation asks for

# What each benchmark stages and trains on. Sample counts: train_samples / eval_samples of every
# published v3.0 log read. Bytes: the data set as published, which includes a test split the
# runs do not stage, so staging is an upper bound.
DATASETS = {
    # 1.7 TB: the gzip TFRecord tarball cosmoUniverse_2019_05_4parE_tf_v2.tar with its train,
    # validation and test folders (mlcommons/hpc, cosmoflow/README.md).
    "cosmoflow": Dataset(train_samples=524_288, eval_samples=65_536, bytes=1.7e12),
    # 8.8 TB: MLCommons' MLPerf HPC v0.7 announcement (mlcommons.org/en/news/mlperf-hpc-v07).
    "deepcam": Dataset(train_samples=121_266, eval_samples=15_158, bytes=8.8e12),
}
MACHINE_KEYS = {f.name for f in dataclasses.fields(Machine)}
OPTIONAL_MACHINE_KEYS = {"intra_node_bytes_per_s", "filesystem_bytes_per_s", "node_local_write_bytes_per_s",
                         "allreduce_overlap", "device_memory_bytes"}


class InputError(ValueError):
    """A machine file, costs file, point or flag this tool cannot use (one line for the user)."""


# ------------------------------------------------------------------ loading
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
        raise InputError(f"{path}: a mapping of keys is expected, peak_flop_per_s a mapping of precisions")
    unknown = set(raw) - MACHINE_KEYS
    missing = MACHINE_KEYS - OPTIONAL_MACHINE_KEYS - set(raw)
    if unknown or missing:
        raise InputError(f"{path}: " + "; ".join(filter(None, [
            f"unknown keys {', '.join(sorted(unknown))}" if unknown else "",
            f"missing keys {', '.join(sorted(missing))}" if missing else ""])))
    peaks = {str(k): _number(v, f"peak_flop_per_s.{k}", path) for k, v in (raw["peak_flop_per_s"] or {}).items()}
    efficiency = raw["efficiency"]
    efficiency = ({str(k): _number(v, f"efficiency.{k}", path) for k, v in efficiency.items()}
                  if isinstance(efficiency, dict) else {"default": _number(efficiency, "efficiency", path)})
    numbers = {key: _number(raw.get(key), key, path) for key in
               ("memory_bytes_per_s", "nic_bytes_per_s", "nic_latency_s", "intra_node_bytes_per_s",
                "filesystem_bytes_per_s", "node_local_write_bytes_per_s", "device_memory_bytes")}
    machine = Machine(name=str(raw["name"]), device=str(raw["device"]), peak_flop_per_s=peaks,
                      devices_per_node=int(raw["devices_per_node"]), cores_per_node=int(raw["cores_per_node"]),
                      precision=str(raw["precision"]), efficiency=efficiency,
                      allreduce_overlap=_number(raw.get("allreduce_overlap", 0.0), "allreduce_overlap", path),
                      **numbers)
    machine.peak(machine.precision)   # the default precision must have a peak
    return machine


def stored_costs(benchmark: str) -> dict:
    """The full-size measurement of offline/model_costs/<benchmark>.json (offline.measure_model_costs)."""
    path = COSTS_DIR / f"{benchmark}.json"
    if not path.exists():
        raise InputError(f"{path} not found: run python -m offline.measure_model_costs --bench {benchmark}")
    return json.loads(path.read_text())


def load_costs(benchmark: str, characterization=None) -> tuple[ModelCosts, str]:
    """The model's costs per sample and a line saying where they were measured."""
    record = stored_costs(benchmark)
    if characterization is None:
        on = record["measured_on"]
        return (ModelCosts(flops_train=record["flops_per_sample_train"],
                           flops_forward=record["flops_per_sample_forward"],
                           activation_bytes_train=record["activation_bytes_per_sample_train_fp32"],
                           activation_bytes_forward=record["activation_bytes_per_sample_forward_fp32"],
                           weight_bytes_train=record["weight_bytes_per_step_train_fp32"],
                           gradient_bytes=record["gradient_bytes_fp32"],
                           input_samples_per_s_per_core=record.get("input_samples_per_s_per_core")),
                f"closed {benchmark} model at full size ({record['parameters']:,} parameters), measured with "
                f"TensorFlow {on['tensorflow']} on {on['cpu']} ({on['isa']})")
    path = Path(characterization) / "characterization.json"
    if not path.exists():
        raise InputError(f"{path} not found: run python -m offline.characterize {characterization} first")
    c = json.loads(path.read_text())
    # offline.characterize counts a training step as 3x forward and the weights once per sample.
    return (ModelCosts(flops_train=c["flops_per_sample_train"], flops_forward=c["flops_per_sample_train"] / 3,
                       activation_bytes_train=c["memory_bytes_per_sample_train"],
                       activation_bytes_forward=c["memory_bytes_per_sample_train"] / 3,
                       weight_bytes_train=0.0, gradient_bytes=c["gradient_bytes_per_step"],
                       input_samples_per_s_per_core=c["input_samples_per_s"] / max(1, c["machine"].get("cpus", 1))),
            f"the model of run {characterization} ({c['parameters']:,} parameters, its characterization.json)")


def rcp_records(benchmark: str, ruleset: str = "3.0.0") -> dict:
    """mlperf_logging's rcps_<benchmark>.json of hpc `ruleset`."""
    spec = importlib.util.find_spec("mlperf_logging")
    path = Path(spec.submodule_search_locations[0]) / "rcp_checker" / f"hpc_{ruleset}" / f"rcps_{benchmark}.json"
    if not path.exists():
        raise InputError(f"mlperf_logging has no RCP table {path.name} for hpc {ruleset}")
    return json.loads(path.read_text())


def rcp_means(benchmark: str, ruleset: str = "3.0.0", rcp_pass: str = "full") -> dict:
    means = projection.rcp_means(rcp_records(benchmark, ruleset))
    return projection.pruned_rcp_means(means) if rcp_pass == "pruned" else means


def default_local_batch(benchmark: str) -> int:
    """The local batch most of the benchmark's closed configs use."""
    batches = [local for _, _, local, _ in benchmarks.closed_config_batches(benchmark) if local]
    return collections.Counter(batches).most_common(1)[0][0]


def load_points() -> dict:
    return yaml.safe_load(POINTS_FILE.read_text())["points"]


# ------------------------------------------------------------------ one projection run
@dataclasses.dataclass(frozen=True)
class Request:
    benchmark: str
    machine: Machine
    nodes: tuple
    global_batch: int | None
    local_batch: int
    precision: str
    instances: int
    staging_timed: bool
    means: dict
    spatial_ranks: int = 1          # K > 1: the costs are a device's share (offline/spatial_projection.py)
    exchange_s_for: object = None   # local batch -> seconds of the split layers' collectives per step
    dataset: Dataset | None = None  # None: the benchmark's (DATASETS)
    memory: object = None           # a spatial_projection.Memory: node counts whose batch does not fit fail

    def global_batch_for(self, nodes: int) -> int:
        # A fixed local batch is per group of K devices (a sample per group, split K ways).
        return self.global_batch or nodes * self.machine.devices_per_node // self.spatial_ranks * self.local_batch

    def project(self, costs: ModelCosts, nodes: int) -> projection.Projection:
        """Raises ValueError where projection.project does, and where the local batch does not fit."""
        batch = self.global_batch_for(nodes)
        p = projection.project(self.machine, costs, self.dataset or DATASETS[self.benchmark], self.benchmark,
                               nodes, batch, projection.rcp_epochs(self.means, batch), self.precision,
                               self.instances, self.staging_timed, self.spatial_ranks, self.exchange_s_for)
        device = self.machine.device_memory_bytes
        if self.memory is not None and device and self.memory.total_at(p.local_batch) > device:
            raise ValueError(f"does not fit: local batch {p.local_batch:g} needs "
                             f"{self.memory.total_at(p.local_batch) / 1e9:.1f} GB per device, more than its "
                             f"{device / 1e9:.0f} GB")
        return p

    def rows(self, costs: ModelCosts) -> list:
        """A Projection per node count, or the one-line reason it cannot be projected."""
        rows = []
        for nodes in self.nodes:
            try:
                rows.append(self.project(costs, nodes))
            except ValueError as e:
                rows.append(f"{nodes:>6} {e}")
        return rows


def _minutes(seconds) -> str:
    return "-" if seconds is None else f"{seconds / 60:.2f} min"


def format_projections(request: Request, costs: ModelCosts, costs_line: str, rows: list, rcp_line: str) -> str:
    m, split = request.machine, request.spatial_ranks > 1
    lines = [f"{request.benchmark} on {m.name}: {request.precision}, efficiency "
             f"{m.efficiency_for(request.benchmark):.3f}, staging {'timed' if request.staging_timed else 'untimed'}"
             + (f", {request.instances} jobs sharing the file system" if request.instances > 1 else ""),
             f"model: {costs.flops_train / 1e9:.1f} GFLOP and "
             f"{costs.activation_bytes_train * projection.ELEMENT_BYTES[request.precision] / 4 / 1e9:.2f} GB of "
             f"activation traffic per training sample"
             + (f" and device (its 1/{request.spatial_ranks} of the split layers, the replicated head)"
                if split else "") + f"; {costs_line}",
             f"epochs: {rcp_line}", ""]
    step_header = "step: device + exchange + allreduce" if split else "step: device + allreduce"
    width = 37 if split else 26
    header = (f"{'nodes':>6} {'devices':>7} {'global':>7} {'local':>6} {'epochs':>7} {'staging':>9} "
              f"{step_header:>{width}} {'bound':>7} {'eval/epoch':>10} {'headroom':>8} {'time to train':>14}")
    lines.append(header)
    for p in rows:
        if isinstance(p, str):
            lines.append(p)
            continue
        epochs = f"{p.epochs:7.2f}" if p.epochs is not None else f"{'no RCP':>7}"
        staging = "-" if p.staging_s is None else f"{p.staging_s:.1f} s"
        headroom = "-" if p.input_headroom is None else f"{p.input_headroom:.2f}"
        step = (f"{p.device_step_s * 1e3:.1f} + " + (f"{p.exchange_s * 1e3:.1f} + " if split else "")
                + f"{p.visible_allreduce_s * 1e3:.1f} ms")
        lines.append(f"{p.nodes:>6} {p.devices:>7} {p.global_batch:>7} {p.local_batch:>6g} {epochs} {staging:>9} "
                     f"{step:>{width}} {p.bound:>7} {p.eval_epoch_s:>8.2f} s {headroom:>8} "
                     f"{_minutes(p.time_to_train_s):>14}")
    components = projection.COMPONENTS + (("exchange",) if split else ())
    lines += ["", "where the time goes (share of the time to train):",
              f"{'nodes':>6} " + " ".join(f"{c:>9}" for c in components)]
    for p in rows:
        if isinstance(p, str) or p.shares() is None:
            continue
        lines.append(f"{p.nodes:>6} " + " ".join(f"{p.shares()[c]:>9.0%}" for c in components))
    return "\n".join(lines)


def answers(request: Request, costs: ModelCosts, busy: float) -> list[str]:
    """The questions users ask, answered by the same model."""
    m, bench, out = request.machine, request.benchmark, []
    if projection.staging_seconds(m, DATASETS[bench], 1) is None:
        out.append("staging: the machine file states neither a file-system nor a node-local bandwidth")
        return out + _batch_answers(request, costs, busy)
    saturation = projection.staging_saturation_nodes(m, request.instances)
    if saturation is not None:
        out.append(f"staging: the shared file system ({m.filesystem_bytes_per_s / 1e12:.2f} TB/s"
                   + (f" / {request.instances} jobs" if request.instances > 1 else "")
                   + f") limits it beyond {saturation:,.0f} nodes ({m.node_local_write_bytes_per_s / 1e9:.2f} GB/s "
                   f"per node below that)")
    else:
        out.append("staging: the file system's bandwidth is not in the machine file, so the nodes alone limit it")
    dominates, checked = projection.staging_dominates_from(
        m, costs, DATASETS[bench], bench, request.global_batch_for,
        lambda batch: projection.rcp_epochs(request.means, batch), request.precision, request.instances)
    policy = (f"global batch {request.global_batch}" if request.global_batch
              else f"local batch {request.local_batch}")
    if dominates:
        out.append(f"staging takes over half the time to train from {dominates:,} nodes on ({policy})")
    elif checked:
        out.append(f"staging stays under half the time to train at every power-of-two node count up to "
                   f"{checked:,}, the largest with an RCP and a sample per device ({policy})")
    else:
        out.append(f"staging dominance: no power-of-two node count has an RCP for its global batch ({policy})")
    return out + _batch_answers(request, costs, busy)


def _batch_answers(request: Request, costs: ModelCosts, busy: float) -> list[str]:
    """What local batch keeps a device busy, and whether the input pipeline keeps up."""
    m, bench, out = request.machine, request.benchmark, []
    bound = projection.smallest_compute_bound_local_batch(m, costs, request.precision)
    intensity = costs.flops_train / (costs.activation_bytes_train * projection.ELEMENT_BYTES[request.precision] / 4)
    ridge = m.peak(request.precision) / m.memory_bytes_per_s
    out.append(f"local batch: compute-bound from {bound} sample(s) per device" if bound else
               f"local batch: memory-bound at every batch ({intensity:.0f} FLOP per byte of activation traffic, "
               f"below the device's ridge of {ridge:.0f})")
    for nodes in sorted({min(request.nodes), max(request.nodes)}):
        b = projection.smallest_busy_local_batch(m, costs, bench, nodes, busy, request.precision)
        out.append(f"at {nodes} nodes a device is busy {busy:.0%} of a step from local batch {b}" if b else
                   f"at {nodes} nodes no local batch up to 4096 keeps a device {busy:.0%} busy (the allreduce dominates)")
    if costs.input_samples_per_s_per_core:
        out.append(f"input pipeline: this project's reader measured {costs.input_samples_per_s_per_core:.2f} samples/s "
                   f"per core; headroom < 1 means {m.cores_per_node} cores could not feed a node's devices "
                   f"(not counted in the time to train: the published runs read with their own pipelines)")
    return out


# ------------------------------------------------------------------ validation
def point_projection(point: dict, costs: ModelCosts, epochs: float,
                     efficiency: float | None = None) -> projection.Projection:
    """A published point projected with `epochs` epochs (and `efficiency` instead of the machine file's)."""
    machine = load_machine(point["machine"])
    if efficiency is not None:
        machine = machine.with_efficiency(point["benchmark"], efficiency)
    return projection.project(machine, costs, DATASETS[point["benchmark"]], point["benchmark"], point["nodes"],
                              point["global_batch"], epochs, None, point["instances"], point["staging_timed"])


def calibrate(name: str, points: dict | None = None) -> float:
    """The efficiency a calibration point implies (its logged epochs; see projection.calibrate_efficiency)."""
    points = points or load_points()
    point = points[name]
    costs, _ = load_costs(point["benchmark"])
    machine = load_machine(point["machine"])
    return projection.calibrate_efficiency(machine, costs, DATASETS[point["benchmark"]], point["benchmark"],
                                           point["nodes"], point["global_batch"], point["logged_epochs"],
                                           point["published_minutes"] * 60, None, point["instances"],
                                           point["staging_timed"])


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    point: dict
    efficiency: float
    epochs_rcp: float | None
    projected_min: float | None       # RCP epochs: what a user gets
    projected_logged_min: float       # the epochs the runs logged
    parts: dict                       # error share of each term (of the published time)

    @property
    def error(self) -> float | None:
        return None if self.projected_min is None else self.projected_min / self.point["published_minutes"] - 1

    @property
    def within(self) -> bool:
        return self.error is not None and abs(self.error) <= WITHIN

    @property
    def dominant(self) -> str:
        return max(self.parts, key=lambda k: abs(self.parts[k]))


def check_point(name: str, points: dict, ruleset: str = "3.0.0") -> Check:
    """A point projected with the efficiency of its calibration point (itself for a calibration point).

    The error splits into epochs (RCP mean vs the epochs logged), staging (projected vs logged,
    where the logs time it) and training (the rest: compute, allreduce and eval per epoch).
    """
    point = points[name]
    source = name if point["role"] == "calibration" else point["calibrated_by"]
    if point["role"] == "validation" and (source == name or points[source]["role"] != "calibration"):
        raise InputError(f"{name}: calibrated_by must name another, calibration point")
    efficiency = calibrate(source, points)
    costs, _ = load_costs(point["benchmark"])
    epochs = projection.rcp_epochs(rcp_means(point["benchmark"], ruleset), point["global_batch"])
    with_rcp = point_projection(point, costs, epochs, efficiency) if epochs is not None else None
    logged = point_projection(point, costs, point["logged_epochs"], efficiency)
    published_s = point["published_minutes"] * 60
    parts = {"epochs": ((with_rcp.time_to_train_s if with_rcp else logged.time_to_train_s)
                        - logged.time_to_train_s) / published_s}
    staging_error = 0.0
    if "logged_staging_s" in point and point["staging_timed"]:
        staging_error = (logged.timed_staging_s - point["logged_staging_s"]) / published_s
        parts["staging"] = staging_error
    parts["training"] = (logged.time_to_train_s - published_s) / published_s - staging_error
    return Check(name, point, efficiency, epochs, with_rcp and with_rcp.time_to_train_s / 60,
                 logged.time_to_train_s / 60, parts)


def validation_table(checks: list) -> str:
    """The markdown table of docs/scaling.md's "Scaling projection" section."""
    rows = ["| point | nodes x devices | global batch | published | projected (RCP epochs) | error | "
            "projected (logged epochs) | error | efficiency | error parts: epochs / staging / training |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for c in checks:
        p = c.point
        machine = load_machine(p["machine"])
        role = "calibration point" if p["role"] == "calibration" else f"from {p['calibrated_by']}"
        projected = "no RCP" if c.projected_min is None else f"{c.projected_min:.2f} min ({c.epochs_rcp:.1f} ep.)"
        error = "-" if c.error is None else f"{c.error:+.0%}"
        logged_error = c.projected_logged_min / p["published_minutes"] - 1
        parts = " / ".join("-" if k not in c.parts else f"{c.parts[k]:+.0%}" for k in ("epochs", "staging", "training"))
        rows.append(f"| {c.name} ({p['benchmark']}) | {p['nodes']} x {machine.devices_per_node} | {p['global_batch']} | "
                    f"{p['published_minutes']:.2f} min ({p['logged_epochs']:g} ep.) | {projected} | {error} | "
                    f"{c.projected_logged_min:.2f} min | {logged_error:+.0%} | {c.efficiency:.3f}, {role} | {parts} |")
    return "\n".join(rows)


# ------------------------------------------------------------------ figure
def plot(request: Request, rows: list, costs_line: str, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    projected = [p for p in rows if not isinstance(p, str) and p.time_to_train_s is not None]
    fig, ax = plt.subplots(figsize=(9, 5.5))
    if projected:
        nodes = [p.nodes for p in projected]
        ax.plot(nodes, [p.time_to_train_s / 60 for p in projected], "o-", color="black", lw=2, label="time to train")
        for component, style in zip(projection.COMPONENTS, ("s--", "^--", "v--", "d--")):
            values = [p.parts_s()[component] / 60 for p in projected]
            if any(values):
                ax.plot(nodes, values, style, alpha=0.8, label=component)
    machine_stem = None
    for name, point in load_points().items():
        if point["benchmark"] != request.benchmark or load_machine(point["machine"]).name != request.machine.name:
            continue
        machine_stem = point["machine"]
        jobs = f", {point['instances']} jobs" if point["instances"] > 1 else ""
        ax.plot([point["nodes"]], [point["published_minutes"]], "*", markersize=14,
                label=f"published: {name} ({point['role']}, batch {point['global_batch']}{jobs})")
    _nodes_axes(ax, {p.nodes for p in projected})
    policy = f"global batch {request.global_batch}" if request.global_batch else f"local batch {request.local_batch}"
    ax.set_title(f"{request.benchmark} on {request.machine.name}\nprojected, {request.precision}, {policy}, "
                 f"efficiency {request.machine.efficiency_for(request.benchmark):.3f}"
                 + ("" if machine_stem else " (no published point of this machine)"), fontsize=10)
    _save(fig, costs_line, path)


def _nodes_axes(ax, nodes) -> None:
    """Log-log minutes against nodes, the node counts as ticks."""
    import matplotlib.ticker
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sorted(nodes))
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("nodes")
    ax.set_ylabel("minutes")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)


def _save(fig, costs_line: str, path) -> None:
    from common.plots import save_figure
    fig.text(0.01, 0.01, f"FLOPs and bytes per sample: {costs_line}", fontsize=7)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path)


# ------------------------------------------------------------------ spatial parallelism (CosmoFlow)
def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.2f} GB"


def spatial_requests(args, machine: Machine, precision: str, means: dict, measured: ModelCosts) -> tuple:
    """((K=1 request, its costs), (K-way request, its costs)) at the sample edge asked for.

    Away from 128^3 there is no RCP (the table is the 128^3 benchmark's) and no data set: the
    epoch is one of a hypothetical data set with the 128^3 one's sample counts, its bytes scaled.
    """
    edge, k = args.sample_edge, args.spatial_ranks
    dataset = DATASETS["cosmoflow"]
    if edge != spatial_projection.MEASURED_EDGE:
        means = {}
        dataset = dataclasses.replace(dataset, bytes=dataset.bytes * (edge / spatial_projection.MEASURED_EDGE) ** 3)
    cycle_s = args.cycle_time_ms / 1e3

    def request(ranks):
        exchange = (lambda b: spatial_projection.exchange_seconds(machine, edge, ranks, precision, b, cycle_s)
                    ) if ranks > 1 else None
        return (Request("cosmoflow", machine, parse_nodes(args.nodes), args.global_batch,
                        args.local_batch or default_local_batch("cosmoflow"), precision, args.instances,
                        args.staging == "timed", means, ranks, exchange, dataset,
                        spatial_projection.memory_per_device(edge, ranks, precision)),
                spatial_projection.device_costs(measured, edge, ranks))
    return request(1), request(k)


def collectives_table(machine: Machine, edge: int, k: int, precision: str, cycle_s: float) -> list[str]:
    """Per split layer: what a rank sends (halo) or receives (gather) per sample, and its time."""
    link = spatial_projection.intra_node_link(machine)
    lines = [f"the split layers' collectives per rank, per sample of a group's local batch, {precision} "
             f"({spatial_projection.ELEMENT_BYTES[precision]} bytes), over the intra-node link at "
             f"{link / 1e9:.0f} GB/s:",
             f"{'layer':>22} {'kind':>6} {'slab in (Zs,Y,X,C)':>20} {'forward':>10} {'backward':>10} "
             f"{'transfer':>10} {'collectives':>11} {'latency':>9}"]
    total_bytes = total_latency = 0.0
    for c in spatial_projection.collectives(edge, k, precision):
        latency = c.count * cycle_s
        total_bytes += c.forward_bytes + c.backward_bytes
        total_latency += latency
        lines.append(f"{c.layer:>22} {c.what:>6} {'x'.join(map(str, c.slab)):>20} {c.forward_bytes / 1e6:>7.3f} MB "
                     f"{c.backward_bytes / 1e6:>7.3f} MB {c.transfer_s(link, 1) * 1e6:>7.1f} us {c.count:>11} "
                     f"{latency * 1e3:>6.1f} ms")
    lines.append(f"{'total':>22} {'':>6} {'':>20} {'':>10} {total_bytes / 1e6:>7.3f} MB "
                 f"{total_bytes / link * 1e6:>7.1f} us {'':>11} {total_latency * 1e3:>6.1f} ms  (forward + backward)")
    lines.append(f"latency: ASSUMPTION, at most one Horovod cycle ({cycle_s * 1e3:g} ms, HOROVOD_CYCLE_TIME's default "
                 f"since Horovod 0.21.0) of waiting per collective issued serially; halo bytes = 2 halos x "
                 f"h={spatial_projection.KERNEL // 2} plane x Y x X x Cin x element bytes")
    return lines


def memory_table(machine: Machine, k: int, precision: str) -> list[str]:
    """Memory per device at local batch 1, each edge, K = 1 and K, against the device's memory."""
    device = machine.device_memory_bytes
    lines = [f"memory per device, local batch 1 (one sample per group), {precision} activations, float32 weights + "
             f"gradients + momentum (K=1: nothing split, all of it replicated); device memory "
             f"{_gb(device) if device else 'unknown (no device_memory_bytes)'}:",
             f"{'sample':>7} {'K':>3} {'split/K':>10} {'halo':>10} {'replicated':>10} {'backward':>10} {'state':>9} "
             f"{'total':>10} {'fp32 total':>11} {'fits':>5}"]
    for edge in spatial_projection.EDGES:
        for ranks in sorted({1, k}):
            m = spatial_projection.memory_per_device(edge, ranks, precision)
            fp32 = spatial_projection.memory_per_device(edge, ranks, "fp32")
            fits = "-" if device is None else ("yes" if m.fits(device) else "NO")
            lines.append(f"{edge:>5}^3 {ranks:>3} {_gb(m.split_activations):>10} {_gb(m.halo_copies):>10} "
                         f"{_gb(m.head_activations):>10} {_gb(m.backward_working):>10} {_gb(m.state):>9} "
                         f"{_gb(m.total):>10} {_gb(fp32.total):>11} {fits:>5}")
    return lines


def spatial_verdicts(args, precision: str, base, split, split_rows: list) -> list[str]:
    """Where splitting loses, where it wins, and where it is the only way.

    A split run on N nodes is set against the K=1 run on N / K nodes: the same number of groups
    (data-parallel replicas) at the same local batch, so the split's gain is its device time / K
    and its cost the collectives. At equal node counts the devices would do the same work.
    """
    (base_request, base_costs), (split_request, _) = base, split
    k, machine, out = args.spatial_ranks, base_request.machine, []
    device = machine.device_memory_bytes
    for e in spatial_projection.EDGES if device else ():
        one = spatial_projection.memory_per_device(e, 1, precision)
        many = spatial_projection.memory_per_device(e, k, precision)
        if not one.fits(device):
            out.append(f"{e}^3: one sample needs {_gb(one.total)} on one device ({precision}), more than its "
                       f"{_gb(device)}: splitting is the only way; K={k} needs {_gb(many.total)} "
                       + ("(fits)" if many.fits(device) else "(does not fit either: a larger K)"))
    for p in (p for p in split_rows if not isinstance(p, str)):
        if p.nodes % k:
            continue
        try:
            b = base_request.project(base_costs, p.nodes // k)
        except ValueError as e:
            out.append(f"{p.nodes} nodes at K={k} ({_span(p)}) vs {p.nodes // k} at K=1: the latter {e}")
            continue
        verdict = "splitting loses" if p.step_s > b.step_s else "splitting wins"
        out.append(f"{p.nodes} nodes at K={k} vs {b.nodes} at K=1 ({p.groups} replicas of local batch "
                   f"{p.local_batch:g}): {verdict}: step {p.step_s * 1e3:.1f} vs {b.step_s * 1e3:.1f} ms (device time "
                   f"{b.device_step_s * 1e3:.1f} -> {p.device_step_s * 1e3:.1f} ms, collectives "
                   f"+{p.exchange_s * 1e3:.1f} ms), {_span(p)} vs {_span(b)}")
    beyond = [p for p in split_rows if not isinstance(p, str) and p.global_batch < p.devices]
    if beyond:
        out.append(f"past the data-parallel limit (fewer samples than devices) only the split runs: "
                   + ", ".join(f"{p.nodes} nodes {_span(p)}" for p in beyond))
    fastest = [min((p for p in rows if not isinstance(p, str)), key=lambda p: p.time_to_train_s or p.epoch_s,
                   default=None) for rows in (base_request.rows(base_costs), split_rows)]
    out.append("fastest of the node counts asked: " + "; ".join(
        f"K={ranks} {_span(p)} on {p.nodes} nodes" for ranks, p in zip((1, k), fastest) if p is not None))
    collectives = spatial_projection.collectives(args.sample_edge, k, precision)
    latency_ms = sum(c.count for c in collectives) * args.cycle_time_ms
    out.append(f"a split step waits on {sum(c.count for c in collectives)} collectives, ~{latency_ms:g} ms of latency "
               f"whatever the batch (the assumed cycle): splitting pays where the device time it saves exceeds "
               f"that, or where K=1 cannot run at all")
    return out


def _span(p: projection.Projection) -> str:
    """The time to train, or the epoch's time where no RCP gives epochs."""
    return _minutes(p.time_to_train_s) if p.epochs is not None else f"{p.epoch_s / 60:.2f} min/epoch"


def run_spatial_projection(args) -> int:
    """--spatial-ranks K and/or --sample-edge N: CosmoFlow split K ways, next to K = 1."""
    machine = load_machine(args.machine)
    precision = args.precision or machine.precision
    machine.peak(precision)
    edge, k = args.sample_edge, args.spatial_ranks
    spatial_projection.check_split(machine, edge, k)
    if args.characterization:
        raise InputError("--characterization projects the unsplit 128^3 model only (drop --spatial-ranks/--sample-edge)")
    measured, measured_line = load_costs("cosmoflow")
    costs_line = f"{edge}^3, scaled analytically by the layer shapes from the {measured_line}"
    means = rcp_means("cosmoflow", args.ruleset, args.rcp_pass)
    (base, base_costs), (split, split_costs) = spatial_requests(args, machine, precision, means, measured)
    if split.staging_timed and projection.staging_seconds(machine, split.dataset, 1) is None:
        raise InputError(f"{machine_path(args.machine)} states neither a file-system nor a node-local bandwidth, "
                         f"so staging cannot be projected: give --staging untimed")
    layers = spatial_projection.cosmoflow_layers(edge, k)
    gather = next((layer.name for layer in layers if layer.kind == "gather"), "none (K=1)")
    filters = [layer.out_shape[-1] for layer in layers if layer.kind == "conv"]
    print(f"cosmoflow at {edge}^3 split {k} ways along depth (z) on {machine.name}, machine file "
          f"{machine_path(args.machine)}")
    print(f"model: {len(filters)} conv layers of {', '.join(map(str, filters))} filters, "
          f"{spatial_projection.parameters(layers):,} parameters; slabs of {edge // k} planes, gathered at {gather}")
    print(f"FLOPs and bytes: ANALYTIC SCALING of the 128^3 measurement ({measured_line}) by the layer shapes: "
          f"2 k^3 Cin Cout N^3 per conv forward, x3 for training, the split layers' / K on each device plus "
          f"the replicated head")
    if edge != spatial_projection.MEASURED_EDGE:
        print(f"no RCP at {edge}^3 (the table is the 128^3 benchmark's): epochs of a hypothetical data set of "
              f"{split.dataset.train_samples:,} samples ({split.dataset.bytes / 1e12:.0f} TB), no time to train")
    print()
    if k > 1:
        print("\n".join(collectives_table(machine, edge, k, precision, args.cycle_time_ms / 1e3)))
        print()
    print("\n".join(memory_table(machine, k, precision)))
    rows = {}
    for request, costs, title in ((base, base_costs, "data parallel only (K=1)"),
                                  (split, split_costs, f"{k}-way spatial x data parallel")):
        if request is split and k == 1:
            break
        rows[request.spatial_ranks] = request.rows(costs)
        print(f"\n{title}:")
        print(format_projections(request, costs, costs_line, rows[request.spatial_ranks],
                                 rcp_line(args, request.means) if request.means else "none (no RCP at this size)"))
    print()
    print("\n".join(spatial_verdicts(args, precision, (base, base_costs), (split, split_costs), rows.get(k, []))))
    png = args.png or REPO / "runs" / "projection" / f"cosmoflow_{edge}_k{k}_{machine_path(args.machine).stem}.png"
    plot_spatial(machine, args, precision, rows, costs_line, png)
    print(f"wrote {png}")
    return 0


def plot_spatial(machine: Machine, args, precision: str, rows: dict, costs_line: str, path) -> None:
    """Time to train (or per epoch, away from 128^3) against nodes for each K; memory per device per edge."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.5))
    nodes = set()
    for k, projected in rows.items():
        projected = [p for p in projected if not isinstance(p, str)]
        nodes.update(p.nodes for p in projected)
        minutes = [(p.time_to_train_s or p.epoch_s) / 60 for p in projected]
        left.plot([p.nodes for p in projected], minutes, "o-" if k == 1 else "s-", lw=2,
                  label=f"K={k}" + (" (data parallel only)" if k == 1 else f" ({k}-way spatial)")
                  + ("" if projected else ": no node count fits or runs"))
    _nodes_axes(left, nodes)
    what = "time to train" if args.sample_edge == spatial_projection.MEASURED_EDGE else "minutes per epoch"
    policy = f"global batch {args.global_batch}" if args.global_batch else "local batch per group"
    left.set_title(f"cosmoflow {args.sample_edge}^3 on {machine.name}: {what}, {policy}, {precision}", fontsize=9)
    ks = sorted(rows)
    width = 0.8 / len(ks)
    for i, k in enumerate(ks):
        totals = [spatial_projection.memory_per_device(e, k, precision).total / 1e9 for e in spatial_projection.EDGES]
        right.bar([j + i * width for j in range(len(totals))], totals, width, label=f"K={k}")
    if machine.device_memory_bytes:
        right.axhline(machine.device_memory_bytes / 1e9, color="red", ls="--", label="device memory")
    right.set_xticks([j + width * (len(ks) - 1) / 2 for j in range(len(spatial_projection.EDGES))])
    right.set_xticklabels([f"{e}^3" for e in spatial_projection.EDGES])
    right.set_yscale("log")
    right.set_ylabel("GB per device, local batch 1")
    right.set_title(f"memory per device ({precision} activations)", fontsize=9)
    right.legend(fontsize=8)
    right.grid(alpha=0.3, which="both", axis="y")
    _save(fig, costs_line, path)


# ------------------------------------------------------------------ command line
def parse_nodes(text: str) -> tuple:
    try:
        nodes = tuple(int(n) for n in text.split(",") if n.strip())
    except ValueError:
        raise InputError(f"--nodes takes comma-separated whole numbers, got {text!r}") from None
    if not nodes or min(nodes) < 1:
        raise InputError(f"--nodes needs node counts of at least 1, got {text!r}")
    return nodes


def run_projection(args) -> int:
    machine = load_machine(args.machine)
    precision = args.precision or machine.precision
    machine.peak(precision)
    costs, costs_line = load_costs(args.benchmark, args.characterization)
    means = rcp_means(args.benchmark, args.ruleset, args.rcp_pass)
    if args.staging == "timed" and projection.staging_seconds(machine, DATASETS[args.benchmark], 1) is None:
        raise InputError(f"{machine_path(args.machine)} states neither a file-system nor a node-local bandwidth, "
                         f"so staging cannot be projected: give --staging untimed")
    request = Request(args.benchmark, machine, parse_nodes(args.nodes), args.global_batch,
                      args.local_batch or default_local_batch(args.benchmark), precision, args.instances,
                      args.staging == "timed", means)
    rows = request.rows(costs)
    print(format_projections(request, costs, costs_line, rows, rcp_line(args, means)))
    print()
    print("\n".join(answers(request, costs, args.busy)))
    png = args.png or REPO / "runs" / "projection" / f"{args.benchmark}_{machine_path(args.machine).stem}.png"
    plot(request, rows, costs_line, png)
    print(f"wrote {png}")
    return 0


def rcp_line(args, means: dict) -> str:
    return (f"mlperf_logging hpc {args.ruleset} rcps_{args.benchmark}.json, {args.rcp_pass} table, mean epochs "
            + ", ".join(f"{bs}: {e:.2f}" for bs, e in means.items())
            + "; linear between batch sizes, none outside")


def run_validation(ruleset: str) -> int:
    points = load_points()
    checks = [check_point(name, points, ruleset) for name in points]
    print(validation_table(checks))
    print()
    for c in checks:
        if c.point["role"] == "validation":
            verdict = "within" if c.within else f"OUTSIDE (dominant term: {c.dominant})"
            print(f"{c.name}: {verdict} +-{WITHIN:.0%}; source: {c.point['source']}")
            if not c.within:
                print(f"    {c.point.get('outside_because', 'no reason recorded in offline/published_points.yaml')}")
        else:
            print(f"{c.name}: calibration point; source: {c.point['source']}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--benchmark", choices=benchmarks.names())
    parser.add_argument("--machine", help="machines/*.yaml (a path or a name of machines/)")
    parser.add_argument("--nodes", help="node counts, comma-separated")
    batch = parser.add_mutually_exclusive_group()
    batch.add_argument("--global-batch", type=int)
    batch.add_argument("--local-batch", type=int)
    parser.add_argument("--precision", choices=sorted(projection.ELEMENT_BYTES))
    parser.add_argument("--characterization", metavar="RUN_DIR")
    parser.add_argument("--instances", type=int, default=1)
    parser.add_argument("--staging", choices=("timed", "untimed"), default="timed")
    parser.add_argument("--rcp-pass", choices=("full", "pruned"), default="full")
    parser.add_argument("--ruleset", default="3.0.0")
    parser.add_argument("--busy", type=float, default=0.9)
    parser.add_argument("--png")
    parser.add_argument("--spatial-ranks", type=int, default=1, metavar="K",
                        help="cosmoflow: split each sample along depth across K devices of a node")
    parser.add_argument("--sample-edge", type=int, default=128, choices=spatial_projection.EDGES,
                        help="cosmoflow: the sample's edge N (N^3 x 4 volumes)")
    parser.add_argument("--cycle-time-ms", type=float, default=spatial_projection.HOROVOD_CYCLE_S * 1e3,
                        help="per-collective latency of the split layers (Horovod's cycle time)")
    parser.add_argument("--validate", action="store_true", help="print the validation table and exit")
    parser.add_argument("--calibrate", metavar="POINT", help="print the efficiency a published point implies")
    args = parser.parse_args(argv)
    try:
        if args.validate:
            return run_validation(args.ruleset)
        if args.calibrate:
            print(f"{calibrate(args.calibrate):.4f}")
            return 0
        if not (args.benchmark and args.machine and args.nodes):
            parser.error("--benchmark, --machine and --nodes are needed (or --validate / --calibrate)")
        if args.instances < 1 or (args.global_batch is not None and args.global_batch < 1) \
                or (args.local_batch is not None and args.local_batch < 1):
            raise InputError("--instances, --global-batch and --local-batch must be at least 1")
        if args.spatial_ranks != 1 or args.sample_edge != spatial_projection.MEASURED_EDGE:
            if args.benchmark != "cosmoflow":
                raise InputError(f"--spatial-ranks and --sample-edge are for cosmoflow only, not {args.benchmark}")
            return run_spatial_projection(args)
        return run_projection(args)
    except (InputError, KeyError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
