"""Spatial parallelism in the projection: CosmoFlow samples split along depth across K devices.

The benchmark is the one common/benchmarks.py's table splits along depth; the links of a group,
a collective's time and the scaling of analytic costs to the measured model (`GroupLinks`,
`Collective`, `scaled_costs`) serve the height split too (height_split.py, DeepCAM).

Pure arithmetic, as model.py (no TensorFlow). The network is rebuilt here from its
layer shapes, as cosmoflow/model.py builds it, so that the terms can be computed at sample edges
that were never measured (256^3, 512^3) and split K ways:

  conv layers   log2(N) - 2 at N^3 (5 at 128^3, the closed model; 6 and 7 at 256^3 and 512^3,
                filters capped at 256 there, as issue 21's spatial configs set model.max_channels)
  split         every rank of a group of K holds a slab of N / K planes; a conv layer is split,
                and so is the pool after it while a slab holds whole 2x windows
                (common.parallel.spatial.pool_stays_local); then the slabs are gathered (one allgather)
                and the rest, the "head", runs on the whole sample on every rank of the group
  FLOPs         2 k^3 Cin Cout Z Y X per conv forward, 2 in out per dense layer; a training step
                is 3x forward (as offline/measure_model_costs.py counts it). Scaled to the
                measured 128^3 figure by one ratio (measured / analytic at 128^3, ~1.001: the
                element-wise layers the analytic count leaves out)
  traffic       inputs + outputs of every layer once, float32, scaled the same way
  halo          per split conv layer and rank, forward: 2 halos x h planes x Y x X x Cin x element
                bytes x local batch (h = k // 2, one alltoall in the group); backward the same
                again (the alltoall's gradient is another alltoall), over the intra-node link, and
                where a slab's neighbour is on another node (a group over several nodes) that halo
                over the device's share of the node's NIC, plus the NIC's latency per alltoall;
                the group waits for its slowest rank, the one with the most halos off its node
  gather        forward: an allgather receiving (K-1)/K of the tensor; backward: an allreduce of
                the whole tensor's gradient (a ring, 2 (K-1)/K of it) and an allgather of sizes;
                over several nodes at the NIC's share, and the NIC's latency per step of the 3 rings
  latency       ASSUMPTION: each collective issued in the step's critical path waits at most one
                cycle of Horovod's background loop (HOROVOD_CYCLE_TIME, 1 ms by default since
                Horovod 0.21.0, its changelog: "Changed default cycle time from 5ms to 1ms"),
                so the split layers add (2 x split convs + 3 with a gather) cycles per step. The
                data-parallel gradient allreduce, which K = 1 runs as well, is left as
                model.py counts it.
  memory        per device, local batch 1: the saved activations of one sample (the volume, conv
                outputs, activations, pool outputs; the split layers' / K, plus each split conv's
                padded slab with its halo, which it keeps for its backward), the replicated head,
                the backward's working set (the gradients of the largest tensor's output and
                input at once) and float32 weights, gradients and SGD's momentum slot.

A group is K consecutive devices, node by node (a Horovod process set of K consecutive ranks,
common.parallel.placement): K divides a node's devices (the group sits on one node) or is a
multiple of them (it spans K / devices-per-node whole nodes, and K / devices-per-node - 1 of its
K - 1 slab boundaries join two nodes).
"""

import dataclasses
import math

from common import benchmarks
from common.parallel import placement
from offline.projection.model import ELEMENT_BYTES, Machine, ModelCosts

AXIS = "depth"
BENCHMARK = benchmarks.split_along(AXIS)  # the network rebuilt here (the table's spatial_split)
MEASURED_EDGE = 128  # offline/model_costs/cosmoflow.json is the 128^3 closed model
EDGES = (128, 256, 512)
IN_CHANNELS = 4
CONV_SIZE, KERNEL, FC_SIZES, TARGETS = 32, 3, (128, 64), 4
MAX_CHANNELS = {128: None, 256: 256, 512: 256}  # the closed model; the spatial configs' cap
HOROVOD_CYCLE_S = 1e-3  # ASSUMPTION (module docstring): at most one cycle per collective
TRAIN_FACTOR = 3  # a training step is 3x forward
STATE_COPIES = 3  # float32 weights, their gradients, one SGD momentum slot


@dataclasses.dataclass(frozen=True)
class Layer:
    """One layer of the network on the whole sample; `split`: it runs on a z-slab of each rank.

    Shapes are (Z, Y, X, C) for volumes, (features,) after Flatten.
    """

    name: str
    kind: str  # 'input', 'conv', 'act', 'pool', 'gather', 'dense'
    in_shape: tuple
    out_shape: tuple
    split: bool
    params: int = 0
    kernel: int = 1

    @property
    def forward_flops(self) -> int:
        if self.kind == "conv":
            return 2 * self.kernel**3 * self.in_shape[-1] * math.prod(self.out_shape)
        if self.kind == "dense":
            return 2 * self.in_shape[0] * self.out_shape[0]
        return 0

    @property
    def traffic_elements(self) -> int:
        """Inputs and outputs, each read or written once (offline/measure_model_costs.py's count)."""
        return (0 if self.kind == "input" else math.prod(self.in_shape)) + math.prod(self.out_shape)

    @property
    def halo(self) -> int:
        return self.kernel // 2 if self.kind == "conv" and self.split else 0


def conv_layer_count(edge: int) -> int:
    """log2(N) - 2 conv layers at N^3: every layer pools 2x, down to 4^3 before Flatten."""
    if edge < 8 or edge & (edge - 1):
        raise ValueError(f"a CosmoFlow sample edge is a power of two of at least 8, got {edge}")
    return int(math.log2(edge)) - 2


def pool_stays_local(planes: int) -> bool:
    # common.parallel.spatial.pool_stays_local's rule for a 2x pool (not imported: it pulls in TensorFlow).
    return planes >= 2 and planes % 2 == 0


def check_split(machine: Machine, edge: int, spatial_ranks: int) -> None:
    """The limits of a K-way split (cosmoflow/config.py's check_spatial_split, and groups of whole nodes).

    Raises:
      ValueError: K does not divide the depth, or leaves too few planes per rank.
      ConfigError: K neither divides nor is a multiple of a node's devices.
    """
    k, halo = spatial_ranks, KERNEL // 2
    if k < 1:
        raise ValueError(f"--spatial-ranks must be at least 1, got {k}")
    if k == 1:
        return
    group_links(
        machine, k
    )  # refuses a K that fits no node: neither a divisor nor a multiple of its devices
    least = max(2, halo)
    if edge % k or edge // k < least:
        raise ValueError(
            f"--spatial-ranks {k} does not cut the depth {edge} into slabs of at least {least} "
            f"planes: at most {edge // least} spatial ranks for this sample"
        )


def network_layers(edge: int, spatial_ranks: int = 1) -> list[Layer]:
    """The network at `edge`^3 as cosmoflow/model.py builds it for a split of `spatial_ranks`."""
    n_conv, cap = conv_layer_count(edge), MAX_CHANNELS.get(edge, 256)
    shape = (edge, edge, edge, IN_CHANNELS)
    split = spatial_ranks > 1
    planes = edge // spatial_ranks
    layers = [Layer("volume", "input", shape, shape, split)]
    for i in range(n_conv):
        filters = CONV_SIZE * 2**i if cap is None else min(CONV_SIZE * 2**i, cap)
        out = shape[:3] + (filters,)
        layers.append(
            Layer(
                f"conv{i + 1}",
                "conv",
                shape,
                out,
                split,
                KERNEL**3 * shape[-1] * filters + filters,
                KERNEL,
            )
        )
        layers.append(Layer(f"conv{i + 1}_act", "act", out, out, split))
        if split and not pool_stays_local(planes):
            layers.append(Layer(f"gather_before_pool{i + 1}", "gather", out, out, False))
            split = False
        shape = tuple(d // 2 for d in out[:3]) + (filters,)
        layers.append(Layer(f"pool{i + 1}", "pool", out, shape, split))
        planes //= 2
    if split:
        layers.append(Layer("gather_before_flatten", "gather", shape, shape, False))
    features = (math.prod(shape),)
    for j, size in enumerate(FC_SIZES + (TARGETS,)):
        name = f"fc{j + 1}" if j < len(FC_SIZES) else "head"
        layers.append(Layer(name, "dense", features, (size,), False, features[0] * size + size))
        features = (size,)
    return layers


def parameters(layers: list[Layer]) -> int:
    return sum(layer.params for layer in layers)


def split_and_head(layers: list[Layer], value) -> tuple[float, float]:
    """(the split layers' sum of value(layer), the replicated layers' sum)."""
    split = sum(value(layer) for layer in layers if layer.split)
    return split, sum(value(layer) for layer in layers if not layer.split)


def device_costs(measured: ModelCosts, edge: int, spatial_ranks: int) -> ModelCosts:
    """One device's share of one sample at `edge`^3 split K ways: the split layers' / K plus the head.

    The input rate is the 128^3 reader's (each rank of a group decodes the whole sample, then
    slices it: issue 21, item 4); at other edges it is unknown (None).
    """
    return scaled_costs(
        measured,
        network_layers(MEASURED_EDGE),
        network_layers(edge, spatial_ranks),
        spatial_ranks,
        measured.input_samples_per_s_per_core if edge == MEASURED_EDGE else None,
    )


def scaled_costs(
    measured: ModelCosts,
    reference: list,
    layers: list,
    spatial_ranks: int,
    input_rate: float | None,
) -> ModelCosts:
    """One device's share of one sample of `layers` split K ways (the split layers' / K plus the
    replicated ones), from the analytic counts scaled by measured / analytic of `reference`, the
    measured model rebuilt. Weights and gradients are the whole model's on every device.

    `reference` and `layers` hold layers with `forward_flops`, `traffic_elements`, `split` and `params`.
    """
    k = spatial_ranks
    flop_ratio = measured.flops_forward / sum(layer.forward_flops for layer in reference)
    byte_ratio = measured.activation_bytes_forward / (
        4 * sum(layer.traffic_elements for layer in reference)
    )
    flops_split, flops_head = split_and_head(layers, lambda layer: layer.forward_flops)
    traffic_split, traffic_head = split_and_head(layers, lambda layer: 4 * layer.traffic_elements)
    flops_forward = flop_ratio * (flops_split / k + flops_head)
    traffic_forward = byte_ratio * (traffic_split / k + traffic_head)
    weight_scale = parameters(layers) / parameters(reference)
    return ModelCosts(
        flops_train=flops_forward * measured.flops_train / measured.flops_forward,
        flops_forward=flops_forward,
        activation_bytes_train=traffic_forward
        * measured.activation_bytes_train
        / measured.activation_bytes_forward,
        activation_bytes_forward=traffic_forward,
        weight_bytes_train=measured.weight_bytes_train * weight_scale,
        gradient_bytes=measured.gradient_bytes * weight_scale,
        input_samples_per_s_per_core=input_rate,
    )


# ------------------------------------------------------------------ the split layers' collectives
@dataclasses.dataclass(frozen=True)
class GroupLinks:
    """The links between the K consecutive devices of a group, node by node."""

    spatial_ranks: int
    devices_per_node: int
    nodes: int  # nodes the group spans (placement.group_span)
    intra_bytes_per_s: float  # between two devices of a node
    network_bytes_per_s: float  # one device's share of its node's NIC
    network_latency_s: float  # one message between nodes

    def crossing_boundaries(self) -> list[int]:
        """The slab boundaries that join two nodes: b between slabs b - 1 and b (b = 1 .. K - 1)."""
        if self.nodes == 1:
            return []
        return [b for b in range(1, self.spatial_ranks) if b % self.devices_per_node == 0]

    @property
    def halos_across(self) -> int:
        """The most of its 2 halos one rank sends off its node (the one the group waits for)."""
        crossing = set(self.crossing_boundaries())
        return max((i in crossing) + (i + 1 in crossing) for i in range(self.spatial_ranks))


def group_links(machine: Machine, spatial_ranks: int) -> GroupLinks:
    """The links of a group of `spatial_ranks` devices on `machine`.

    Raises:
      ConfigError: K neither divides nor is a multiple of a node's devices.
    """
    d = machine.devices_per_node
    nodes = placement.group_span(
        spatial_ranks,
        d,
        f"--spatial-ranks {spatial_ranks}",
        f"device(s) per node of {machine.name}",
    )
    return GroupLinks(
        spatial_ranks,
        d,
        nodes,
        intra_node_link(machine),
        machine.nic_bytes_per_s / d,
        machine.nic_latency_s,
    )


@dataclasses.dataclass(frozen=True)
class Collective:
    """One split layer's collectives in a step, per sample of the local batch and per rank."""

    layer: str
    what: str  # 'halo', 'gather' or 'allreduce' (a ring over the group)
    slab: tuple  # the rank's input (Zs, Y, X, C), or (Hs, W, C) of a height split
    forward_bytes: float  # the bytes a rank sends (halo) or receives (gather), forward
    backward_bytes: float  # the same for the backward
    count: int  # collectives per step (forward and backward)
    network_messages: int  # messages in sequence per step where it crosses nodes (ring steps)
    per_sample: bool = (
        True  # False: the bytes are the step's whatever the batch (batch-norm statistics)
    )

    def crosses(self, links: GroupLinks) -> bool:
        return bool(links.halos_across) if self.what == "halo" else links.nodes > 1

    def transfer_s(self, links: GroupLinks, local_batch: float) -> float:
        sent = (local_batch if self.per_sample else 1) * (self.forward_bytes + self.backward_bytes)
        if self.what == "halo":
            off_node = links.halos_across / 2  # of the slowest rank's 2 halos
            return sent * (
                (1 - off_node) / links.intra_bytes_per_s + off_node / links.network_bytes_per_s
            )
        # A ring goes at its slowest link: the NIC's share once it joins nodes.
        return sent / (
            links.network_bytes_per_s if self.crosses(links) else links.intra_bytes_per_s
        )

    def latency_s(self, links: GroupLinks, cycle_s: float) -> float:
        """The assumed cycle per collective, and the NIC's latency per message between nodes."""
        network = self.network_messages * links.network_latency_s if self.crosses(links) else 0.0
        return self.count * cycle_s + network

    def seconds(self, links: GroupLinks, local_batch: float, cycle_s: float) -> float:
        return self.transfer_s(links, local_batch) + self.latency_s(links, cycle_s)


def halo_bytes(slab_shape: tuple, halo: int, element_bytes: int) -> int:
    """Bytes one rank sends in one halo exchange of one sample: h planes (or rows) to each of 2 neighbours."""
    return 2 * halo * math.prod(slab_shape[1:]) * element_bytes


def collectives(edge: int, spatial_ranks: int, precision: str) -> list[Collective]:
    """The split layers' collectives: one halo alltoall per split conv forward and backward, and
    the gather (allgather forward; allreduce and an allgather of sizes backward)."""
    k, eb = spatial_ranks, ELEMENT_BYTES[precision]
    out = []
    for layer in network_layers(edge, k):
        slab = (layer.in_shape[0] // k,) + tuple(layer.in_shape[1:])
        if layer.halo:
            exchanged = halo_bytes(slab, layer.halo, eb)
            out.append(Collective(layer.name, "halo", slab, exchanged, exchanged, 2, 2))
        elif layer.kind == "gather":
            whole = math.prod(layer.in_shape) * eb
            # Ring steps: the allgather K - 1, the allreduce 2 (K - 1), the allgather of sizes K - 1.
            out.append(
                Collective(
                    layer.name,
                    "gather",
                    slab,
                    (k - 1) / k * whole,
                    2 * (k - 1) / k * whole,
                    3,
                    4 * (k - 1),
                )
            )
    return out


def intra_node_link(machine: Machine) -> float:
    """The link between devices of a node: the intra-node one, or the NIC's share without it."""
    return machine.intra_node_bytes_per_s or machine.nic_bytes_per_s / machine.devices_per_node


def exchange_seconds(
    machine: Machine,
    edge: int,
    spatial_ranks: int,
    precision: str,
    local_batch: float,
    cycle_s: float = HOROVOD_CYCLE_S,
) -> float:
    """Per step: the split layers' collectives at `local_batch` samples per group (0 at K = 1)."""
    links = group_links(machine, spatial_ranks)
    return sum(
        c.seconds(links, local_batch, cycle_s) for c in collectives(edge, spatial_ranks, precision)
    )


# ------------------------------------------------------------------ memory per device
@dataclasses.dataclass(frozen=True)
class Memory:
    """Bytes on one device at local batch 1 (one sample per group)."""

    edge: int  # the sample's size along the split axis (a CosmoFlow edge, DeepCAM's height)
    spatial_ranks: int
    split_activations: float  # the slab's share of the split layers' saved tensors
    halo_copies: float  # each split conv's padded slab with its halo planes
    head_activations: float  # the replicated layers', whole on every rank
    backward_working: float  # two gradients of the largest tensor at once
    state: float  # weights, gradients and the momentum slot, float32

    @property
    def total(self) -> float:
        return self.total_at(1)

    def total_at(self, local_batch: float) -> float:
        """With `local_batch` samples per group: the activations grow with it, the state does not."""
        per_sample = (
            self.split_activations
            + self.halo_copies
            + self.head_activations
            + self.backward_working
        )
        return math.ceil(local_batch) * per_sample + self.state

    def fits(self, device_bytes: float) -> bool:
        return self.total <= device_bytes


def saved_elements(layer: Layer) -> int:
    """Elements of one sample that `layer` keeps for the backward: its output (the volume, conv
    outputs for the activation's gradient, activations and pool outputs for the pool's, the
    gathered tensor and the dense layers' for theirs)."""
    return math.prod(layer.out_shape)


def padded_slab_elements(layer: Layer, spatial_ranks: int) -> int:
    """A split conv's input slab with its halo and the y/x padding (SpatialConv3D saves it)."""
    h = layer.halo
    if not h:
        return 0
    z, y, x, c = layer.in_shape
    return (z // spatial_ranks + 2 * h) * (y + 2 * h) * (x + 2 * h) * c


def memory_per_device(edge: int, spatial_ranks: int, precision: str) -> Memory:
    """Memory on one device of a K-way split at local batch 1 (module docstring)."""
    k, eb = spatial_ranks, ELEMENT_BYTES[precision]
    layers = network_layers(edge, k)
    split, head = split_and_head(layers, saved_elements)
    largest = max(saved_elements(layer) / (k if layer.split else 1) for layer in layers)
    return Memory(
        edge=edge,
        spatial_ranks=k,
        split_activations=eb * split / k,
        halo_copies=eb * sum(padded_slab_elements(layer, k) for layer in layers),
        head_activations=eb * head,
        backward_working=eb * 2 * largest,
        state=4 * STATE_COPIES * parameters(layers),
    )
