"""The scaling model behind `python -m offline.projection`: time to train at N nodes, term by term.

Pure arithmetic on plain numbers: no TensorFlow, no files (inputs.py reads the machine YAML and
the measured model costs, rcp.py the epochs of the RCP table, cli.py prints). One data-parallel
job of `nodes` nodes with `devices_per_node` devices each, p = nodes x devices_per_node, global
batch B:

  local batch  b = B / p
  compute      = b x FLOPs_train / peak[precision]                     (per device)
  memory       = (b x activation bytes_train + weight bytes_train) / memory bandwidth
  device step  = max(compute, memory) / efficiency                     (roofline, derated)
  allreduce    = 2 (p-1)/p x G / link + 2 (p-1) x latency              (ring over p devices)
                 link = the node's NIC bandwidth shared by its devices across nodes, the
                 intra-node link (NVLink) within one node; G = gradient bytes
  step         = device step + (1 - overlap) x allreduce
  eval         = ceil(eval samples / p) x forward cost / efficiency    (once per epoch)
  epoch        = floor(train samples / B) x step + eval
  staging      = data set bytes / min(file system / instances, nodes x node-local write)
  time to train = staging + epochs x epoch

Split K ways (CosmoFlow, spatial.py), p / K groups share the global batch,
b = B / (p / K), the costs are one device's share of a sample, and the step adds the split
layers' halo exchanges and gather.

Staging counts by default (`staging_timed`): the MLPerf HPC rules as read here
(training_policies hpc_training_rules.adoc, "Data State at Start of Run") time "any staging to
node-local disk or memory", and most published logs do: Perlmutter's CosmoFlow logs
staging_start 1 ms after run_start, its DeepCAM runs stage during epoch 1, Fugaku and Longhorn
log staging inside the run. NVIDIA's v3.0 Eos logs stage inside init, before run_start: for
such a run, project with staging_timed=False.

Activation bytes are measured in float32 and scaled to the precision projected (2 bytes for fp16
and bf16); weights and gradients stay float32 (master weights). A ring allreduce moves
2 (p-1)/p of the gradient through every device's link and takes 2 (p-1) latency-bound steps; it
is not hierarchical beyond using the intra-node link when the job fits one node. The epochs
are given: mlperf_logging's reference convergence points for the global batch (rcp.py).

The efficiency is the one fitted number: the fraction of the roofline a real implementation
reaches on a device (optionally per benchmark), stated in the machine file and calibrated on one
published result (published_points.calibrate_efficiency) so that the projection, given the epochs
that run logged, reproduces its time.
"""

import dataclasses
import math

ELEMENT_BYTES = {"fp64": 8, "fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2}
COMPONENTS = ("compute", "allreduce", "staging", "eval")


@dataclasses.dataclass(frozen=True)
class Machine:
    """A machine description (machines/*.yaml); rates in bytes/s and FLOP/s, times in s.

    Attributes:
      name: the machine's name.
      device: the accelerator (or CPU, when the node is the device).
      peak_flop_per_s: peak FLOP/s of one device per precision ('fp32', 'fp16', 'bf16').
      memory_bytes_per_s: one device's memory bandwidth.
      devices_per_node: devices (GPUs, or 1 for a CPU node) per node.
      cores_per_node: host CPU cores per node (they run the input pipeline).
      nic_bytes_per_s: injection bandwidth of one node, all its NICs together, one direction.
      nic_latency_s: latency of one message between nodes.
      intra_node_bytes_per_s: one device's bandwidth to its node peers (NVLink); None: the NIC's.
      filesystem_bytes_per_s: aggregate read bandwidth of the shared file system (None: unknown,
        staging is then limited by the nodes alone).
      node_local_write_bytes_per_s: the rate one node writes staged data to its local store
        (None: unknown; with the file system also unknown, staging cannot be projected).
      precision: the precision projected unless told otherwise.
      efficiency: benchmark -> fraction of the roofline reached (calibrated); the key 'default'
        serves every benchmark without its own.
      allreduce_overlap: fraction of the allreduce hidden behind the backward pass (0: none).
      device_memory_bytes: one device's memory (None: unknown); what a split sample must fit.
    """

    name: str
    device: str
    peak_flop_per_s: dict
    memory_bytes_per_s: float
    devices_per_node: int
    cores_per_node: int
    nic_bytes_per_s: float
    nic_latency_s: float
    intra_node_bytes_per_s: float | None
    filesystem_bytes_per_s: float | None
    node_local_write_bytes_per_s: float | None
    precision: str
    efficiency: dict
    allreduce_overlap: float = 0.0
    device_memory_bytes: float | None = None

    def peak(self, precision: str) -> float:
        if precision not in self.peak_flop_per_s:
            raise ValueError(
                f"{self.name}: no {precision} peak (has {', '.join(self.peak_flop_per_s)})"
            )
        return self.peak_flop_per_s[precision]

    def efficiency_for(self, benchmark: str) -> float:
        value = self.efficiency.get(benchmark, self.efficiency.get("default"))
        if value is None:
            raise ValueError(
                f"{self.name}: no efficiency for {benchmark} (has {', '.join(self.efficiency)})"
            )
        return value

    def with_efficiency(self, benchmark: str, value: float) -> "Machine":
        return dataclasses.replace(self, efficiency={**self.efficiency, benchmark: value})


@dataclasses.dataclass(frozen=True)
class ModelCosts:
    """One training sample's cost (offline/model_costs/<benchmark>.json), float32 bytes."""

    flops_train: float
    flops_forward: float
    activation_bytes_train: float
    activation_bytes_forward: float
    weight_bytes_train: float  # per step, whatever the batch
    gradient_bytes: float  # allreduced per step
    input_samples_per_s_per_core: float | None = None


@dataclasses.dataclass(frozen=True)
class Dataset:
    """A benchmark's data: sample counts and the bytes staged from the shared file system."""

    train_samples: int
    eval_samples: int
    bytes: float


@dataclasses.dataclass(frozen=True)
class Projection:
    """Every term of one node count's projection (seconds unless named otherwise)."""

    nodes: int
    devices: int
    global_batch: int
    local_batch: float
    epochs: float | None  # None: no RCP for this global batch
    steps_per_epoch: int
    compute_s: float  # per step, at the roofline (before the efficiency)
    memory_s: float
    device_step_s: float  # max(compute, memory) / efficiency
    allreduce_s: float  # one allreduce, all of it
    step_s: float  # device step + the allreduce not overlapped
    eval_epoch_s: float
    train_epoch_s: float
    staging_s: float | None  # computed whether or not it is timed; None: no rate known
    staging_timed: bool  # whether it counts in the time to train
    input_headroom: float | None  # samples/s the host cores can feed / samples/s the devices take
    spatial_ranks: int = 1  # K devices split each sample (spatial.py)
    exchange_s: float = 0.0  # per step: the split layers' collectives (halos, gather)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"

    @property
    def epoch_s(self) -> float:
        return self.train_epoch_s + self.eval_epoch_s

    @property
    def groups(self) -> int:
        return self.devices // self.spatial_ranks

    @property
    def visible_allreduce_s(self) -> float:
        return self.step_s - self.device_step_s - self.exchange_s

    @property
    def time_to_train_s(self) -> float | None:
        return None if self.epochs is None else self.timed_staging_s + self.epochs * self.epoch_s

    @property
    def timed_staging_s(self) -> float:
        return self.staging_s if self.staging_timed else 0.0

    def parts_s(self) -> dict | None:
        """Seconds of the time to train spent in each of COMPONENTS (None without an RCP)."""
        if self.epochs is None:
            return None
        steps = self.epochs * self.steps_per_epoch
        parts = {
            "compute": steps * self.device_step_s,
            "allreduce": steps * self.visible_allreduce_s,
            "staging": self.timed_staging_s,
            "eval": self.epochs * self.eval_epoch_s,
        }
        # A split run's halos and gather: a component of their own, absent (not 0 %) at K = 1.
        return {**parts, "exchange": steps * self.exchange_s} if self.spatial_ranks > 1 else parts

    def shares(self) -> dict | None:
        parts = self.parts_s()
        if parts is None:
            return None
        total = sum(parts.values())
        return {k: v / total for k, v in parts.items()}


# ------------------------------------------------------------------ the terms
def staging_seconds(
    machine: Machine, dataset: Dataset, nodes: int, instances: int = 1
) -> float | None:
    """Data set bytes over the slower of the file system's share and the nodes' local writes.

    `instances` jobs staging at once (weak scaling) share the file system's bandwidth. A rate the
    machine file does not know (None) limits nothing; None when neither is known.
    """
    rates = []
    if machine.node_local_write_bytes_per_s:
        rates.append(nodes * machine.node_local_write_bytes_per_s)
    if machine.filesystem_bytes_per_s:
        rates.append(machine.filesystem_bytes_per_s / instances)
    return dataset.bytes / min(rates) if rates else None


def staging_saturation_nodes(machine: Machine, instances: int = 1) -> float | None:
    """Nodes beyond which the file system, not the nodes' local writes, limits staging (None: unknown)."""
    if not machine.filesystem_bytes_per_s or not machine.node_local_write_bytes_per_s:
        return None
    return machine.filesystem_bytes_per_s / instances / machine.node_local_write_bytes_per_s


def compute_seconds(
    machine: Machine, costs: ModelCosts, local_batch: float, precision: str
) -> float:
    return local_batch * costs.flops_train / machine.peak(precision)


def memory_seconds(
    machine: Machine, costs: ModelCosts, local_batch: float, precision: str
) -> float:
    activation = costs.activation_bytes_train * ELEMENT_BYTES[precision] / 4
    return (local_batch * activation + costs.weight_bytes_train) / machine.memory_bytes_per_s


def device_step_seconds(
    machine: Machine, costs: ModelCosts, local_batch: float, precision: str, benchmark: str
) -> float:
    """The roofline's step on one device, derated by the benchmark's efficiency."""
    return max(
        compute_seconds(machine, costs, local_batch, precision),
        memory_seconds(machine, costs, local_batch, precision),
    ) / machine.efficiency_for(benchmark)


def allreduce_seconds(machine: Machine, gradient_bytes: float, nodes: int) -> float:
    """One ring allreduce of `gradient_bytes` over every device of `nodes` nodes."""
    p = nodes * machine.devices_per_node
    if p == 1:
        return 0.0
    if nodes == 1 and machine.intra_node_bytes_per_s:
        link = machine.intra_node_bytes_per_s
    else:
        link = machine.nic_bytes_per_s / machine.devices_per_node
    return 2 * (p - 1) / p * gradient_bytes / link + 2 * (p - 1) * machine.nic_latency_s


def eval_seconds(
    machine: Machine,
    costs: ModelCosts,
    dataset: Dataset,
    devices: int,
    precision: str,
    efficiency: float,
) -> float:
    """One validation pass: each device's share of the samples through the forward pass.

    Split K ways, `devices` counts the groups and `costs` are a device's share of a sample (the
    split layers' forward collectives in evaluation are not counted).
    """
    per_device = math.ceil(dataset.eval_samples / devices)
    compute = costs.flops_forward / machine.peak(precision)
    memory = (
        costs.activation_bytes_forward * ELEMENT_BYTES[precision] / 4 / machine.memory_bytes_per_s
    )
    return per_device * max(compute, memory) / efficiency


def input_headroom(
    machine: Machine, costs: ModelCosts, local_batch: float, step_s: float
) -> float | None:
    """Samples/s a node's cores feed (this project's measured pipeline) over the samples/s its devices take."""
    if not costs.input_samples_per_s_per_core:
        return None
    consumed = machine.devices_per_node * local_batch / step_s
    return machine.cores_per_node * costs.input_samples_per_s_per_core / consumed


def project(
    machine: Machine,
    costs: ModelCosts,
    dataset: Dataset,
    benchmark: str,
    nodes: int,
    global_batch: int,
    epochs: float | None,
    precision: str | None = None,
    instances: int = 1,
    staging_timed: bool = True,
    spatial_ranks: int = 1,
    exchange_s_for=None,
) -> Projection:
    """Every term at `nodes` nodes and global batch `global_batch` (see the module docstring).

    With `spatial_ranks` K > 1 (spatial.py) the devices form devices / K groups
    that share the global batch, each group splitting its samples K ways: `costs` are then one
    device's share of a sample, and `exchange_s_for(local batch of a group)` the seconds per step
    of the split layers' collectives, added to the step (they sit in its critical path).

    Raises:
      ValueError: fewer samples in the global batch than devices (groups of K devices), or devices
        that make no whole groups; staging timed on a machine whose staging rates are unknown.
    """
    precision = precision or machine.precision
    staging = staging_seconds(machine, dataset, nodes, instances)
    if staging_timed and staging is None:
        raise ValueError(
            f"{machine.name} states no file-system or node-local bandwidth: staging cannot be "
            f"projected (project it as untimed)"
        )
    devices = nodes * machine.devices_per_node
    if devices % spatial_ranks:
        raise ValueError(
            f"the {devices} device(s) of {nodes} node(s) make no whole groups of {spatial_ranks}"
        )
    groups = devices // spatial_ranks
    if global_batch < groups:
        raise ValueError(
            f"global batch {global_batch} is smaller than the {devices} devices of {nodes} node(s)"
            if spatial_ranks == 1
            else f"global batch {global_batch} is smaller than the {groups} groups of {spatial_ranks} "
            f"devices on {nodes} node(s)"
        )
    local_batch = global_batch / groups
    efficiency = machine.efficiency_for(benchmark)
    compute = compute_seconds(machine, costs, local_batch, precision)
    memory = memory_seconds(machine, costs, local_batch, precision)
    device_step = device_step_seconds(machine, costs, local_batch, precision, benchmark)
    allreduce = allreduce_seconds(machine, costs.gradient_bytes, nodes)
    exchange = exchange_s_for(local_batch) if exchange_s_for else 0.0
    step = device_step + exchange + (1 - machine.allreduce_overlap) * allreduce
    steps = dataset.train_samples // global_batch
    return Projection(
        nodes=nodes,
        devices=devices,
        global_batch=global_batch,
        local_batch=local_batch,
        epochs=epochs,
        steps_per_epoch=steps,
        compute_s=compute,
        memory_s=memory,
        device_step_s=device_step,
        allreduce_s=allreduce,
        step_s=step,
        eval_epoch_s=eval_seconds(machine, costs, dataset, groups, precision, efficiency),
        train_epoch_s=steps * step,
        staging_s=staging,
        staging_timed=staging_timed,
        input_headroom=input_headroom(machine, costs, local_batch, step),
        spatial_ranks=spatial_ranks,
        exchange_s=exchange,
    )
