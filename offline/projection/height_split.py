"""Spatial parallelism in the projection: DeepCAM samples split along height across K devices.

Pure arithmetic, as spatial.py (no TensorFlow). The network is rebuilt here from its layer
shapes, as deepcam/model.py builds it (768 x 1152 x 16 at width 1.0, 16 middle blocks; the
benchmark is the one common/benchmarks.py's table splits along height), so that each layer's
share of the split is counted at any K:

  split         every rank of a group of K holds a slab of H / K rows of every layer (deepcam.height_split's
                `SplitBuilder`): no head is gathered, the output is a map of the same height
  FLOPs         2 k^2 Cin Cout Ho Wo per convolution (2 k^2 C Ho Wo depthwise, 2 k^2 Cin Cout Hi Wi
                transposed), x3 for training; each device does 1/K of every layer. Scaled to the
                measured figures (offline/model_costs/deepcam.json) by measured / analytic at K = 1
                (spatial.scaled_costs), as spatial.py scales CosmoFlow's
  traffic       every layer's inputs and outputs once, float32, / K, scaled the same way
  halo          per layer of kernel 3 (3x3, depthwise, dilated, strided, transposed), rank and sample:
                h = max(rows above, rows below) rows each way (common.parallel.spatial_rows.RowHalo's
                symmetric exchange, then cropped), 2 x h x W x Cin x element bytes, one alltoall
                forward and one backward (its gradient). Stride-1 layers at dilation d read d rows
                each side, stride-2 ones one row above (sent symmetric: 1 row each way), transposed
                ones one row from below (likewise 1 each way)
  gather        where h exceeds the slab's rows (the ASPP branches at rate 6/12/18 once H / (16 K) is
                smaller), one allgather of that layer's input (one per map, shared by its branches),
                backward an allreduce and an allgather of sizes, as CosmoFlow's gather
  batch norm    GroupBatchNormalization over the K ranks of the group (batchnorm_group_size 1, the
                closed configs'): one allreduce of [mean, mean of squares] (2 C float32) forward and
                its gradient's allreduce backward, per layer, whatever the batch
  image pool    the ASPP's global mean: one allreduce of [B, 1, 1, C] float32 forward, one backward
  loss          one allreduce of the group's loss forward (the gradient is each rank's own share;
                evaluation's IoU allreduce is outside the step and, as CosmoFlow's forward
                collectives in evaluation, not counted). Gradients x K before the data-parallel
                allreduce cost no collective
  latency       the ASSUMPTION of spatial.py: at most one Horovod cycle per collective issued in the
                step's critical path (each layer's waits on the layer before), plus the NIC's latency
                per message where a group spans nodes. train.py shortens the cycle to 0.1 ms
                (common.parallel.cycle_time.BATCHNORM_GROUP_MS) for a height split, whose batch norm
                sums over the spatial group, unless HOROVOD_CYCLE_TIME is set; the default here is
                Horovod's 1 ms (--cycle-time-ms 0.1 projects what train.py runs)
  memory        per device, local batch 1: every layer's output / K (what the backward keeps), each
                halo layer's padded slab (kept for its 'valid' convolution's backward; unsplit, the
                strided layers' zero-padded inputs), the gathered
                maps whole, the backward's two gradients of the largest tensor, and float32 weights,
                gradients and LAMB's two slots, replicated

A group is K consecutive devices, node by node, as spatial.py's (spatial.group_links).
"""

import dataclasses
import math

from common import benchmarks
from offline.projection import spatial
from offline.projection.model import ELEMENT_BYTES, Machine, ModelCosts

AXIS = "height"
BENCHMARK = benchmarks.split_along(AXIS)
# deepcam/model.py and deepcam/config.py at the reference size (tests/test_height_split_rebuild.py
# builds the real model and compares).
HEIGHT, WIDTH, IN_CHANNELS, N_CLASSES = 768, 1152, 16, 3
OUTPUT_STRIDE = 16
MIDDLE_BLOCKS = 16
ASPP_RATES = (6, 12, 18)
EXIT_FLOW_DILATION = 2
STATE_COPIES = 4  # float32 weights, their gradients, LAMB's two moment slots
HALO_KINDS = ("conv", "depthwise", "transposed")


@dataclasses.dataclass(frozen=True)
class Layer:
    """One layer on the whole sample, shapes (H, W, C); `split`: it computes its slab's rows on each rank.

    `top` and `bottom` are the rows it reads beyond its slab when split, `cols` the zero columns
    padded each side (the unsplit layer pads them all).
    """

    name: str
    kind: str  # 'input', 'pad', 'conv', 'depthwise', 'transposed', 'bn', 'relu', 'add', 'concat',
    # 'slice', 'pool', 'affine', 'upsample', 'gather'
    in_shape: tuple
    out_shape: tuple
    in_elements: int  # every input's elements (an add's two, a concat's all)
    split: bool = True
    params: int = 0
    kernel: int = 1
    top: int = 0
    bottom: int = 0
    cols: int = 0

    @property
    def forward_flops(self) -> int:
        k2 = self.kernel**2
        if self.kind == "conv":
            return 2 * k2 * self.in_shape[-1] * math.prod(self.out_shape)
        if self.kind == "depthwise":
            return 2 * k2 * math.prod(self.out_shape)
        if self.kind == "transposed":
            return 2 * k2 * math.prod(self.in_shape) * self.out_shape[-1]
        return 0

    @property
    def traffic_elements(self) -> int:
        """Inputs and outputs once (offline/measure_model_costs.py counts an input layer's tensor twice)."""
        return self.in_elements + math.prod(self.out_shape)

    @property
    def halo(self) -> int:
        """The rows exchanged each way when split: RowHalo's symmetric max(top, bottom)."""
        return max(self.top, self.bottom) if self.kind in HALO_KINDS else 0


class _Net:
    """deepcam/model.py's `LayerBuilder` (deepcam/height_split.py's `SplitBuilder` at K > 1), on shapes: each method appends the layers it builds and returns
    the output as (name, shape). `spatial_ranks` K > 1 leaves out the zero-padding layers the split
    replaces by halos, and adds one gather before the first layer reading beyond a neighbour's slab."""

    def __init__(self, spatial_ranks: int):
        self.k = spatial_ranks
        self.layers: list[Layer] = []
        self._gathered = set()

    def add(self, name, kind, x, out_shape, *, inputs=None, split=None, **kw):
        """Appends a layer reading `x` (and `inputs`, all its inputs when given) and returns its output."""
        in_elements = sum(math.prod(shape) for _, shape in (inputs or [x]))
        split = (
            x[1][0] > 1 if split is None else split
        )  # a 1x1 map (the pooled branch) is whole on every rank
        self.layers.append(Layer(name, kind, x[1], tuple(out_shape), in_elements, split, **kw))
        return name, tuple(out_shape)

    def reads(self, x, top: int, bottom: int):
        """Before a layer reading `top`/`bottom` rows of `x` beyond its slab: the gather, where a
        neighbour's slab has fewer rows (deepcam.height_split's `rows_beyond`), once per map."""
        rows = x[1][0] // self.k
        if self.k > 1 and max(top, bottom) > rows and x[0] not in self._gathered:
            self._gathered.add(x[0])
            self.add(f"{x[0]}_gather", "gather", x, x[1], split=False)

    def pad(self, x, top, bottom, cols, name):
        """Unsplit: the ZeroPadding2D of a strided layer (symmetric); split, the halo does it."""
        if self.k > 1:
            return x
        h, w, c = x[1]
        return self.add(name, "pad", x, (h + 2 * top, w + 2 * cols, c))

    def conv(self, x, filters, kernel, name, dilation=1, stride=1, use_bias=False):
        h, w, c = x[1]
        halo = dilation * (kernel // 2)
        if stride == 1:
            top = bottom = halo
            out = (h, w, filters)
        else:  # entry_conv: symmetric padding 1, its last zero row never read
            top, bottom = halo, halo - 1
            x = self.pad(x, halo, halo, halo, f"{name}_pad")
            out = (h // 2, w // 2, filters)
        self.reads(x, top, bottom)
        params = kernel * kernel * c * filters + (filters if use_bias else 0)
        return self.add(
            name, "conv", x, out, params=params, kernel=kernel, top=top, bottom=bottom, cols=halo
        )

    def sep_conv(self, x, filters, name, stride=1, dilation=1):
        h, w, c = x[1]
        if stride == 1:
            self.reads(x, dilation, dilation)
            x = self.add(
                f"{name}.conv1",
                "depthwise",
                x,
                (h, w, c),
                params=9 * c,
                kernel=3,
                top=dilation,
                bottom=dilation,
                cols=dilation,
            )
        else:
            x = self.pad(x, dilation, dilation, dilation, f"{name}_pad")
            self.reads(x, dilation, dilation - 1)
            x = self.add(
                f"{name}.conv1",
                "depthwise",
                x,
                (h // 2, w // 2, c),
                params=9 * c,
                kernel=3,
                top=dilation,
                bottom=dilation - 1,
                cols=dilation,
            )
        return self.add(f"{name}.pointwise", "conv", x, x[1][:2] + (filters,), params=c * filters)

    def bn(self, x, name):
        return self.add(f"{name}.bn", "bn", x, x[1], params=2 * x[1][-1])

    def relu(self, x, name):
        return self.add(name, "relu", x, x[1])

    def block(
        self,
        x,
        planes,
        reps,
        name,
        stride=1,
        dilation=1,
        end_with_relu=True,
        grow_first=True,
        is_last=False,
    ):
        inplanes = x[1][-1]
        shortcut = x
        if planes != inplanes or stride != 1:
            sub = x
            if stride != 1:
                h, w, c = x[1]
                sub = self.add(f"{name}_skip_slice", "slice", x, (h // stride, w // stride, c))
            shortcut = self.conv(sub, planes, 1, f"{name}.skip")
            shortcut = self.bn(shortcut, f"{name}.skipbn")
        widths = [planes] * reps if grow_first else [inplanes] * (reps - 1) + [planes]
        for i, width in enumerate(widths):
            x = self.sep_conv(x, width, f"{name}.rep.{3 * i}", dilation=dilation)
            x = self.bn(x, f"{name}.rep.{3 * i + 1}")
            if i < len(widths) - 1:
                x = self.relu(x, f"{name}.rep.{3 * i + 2}")
        if stride != 1:
            x = self.sep_conv(x, planes, f"{name}.rep.{3 * reps - 1}", stride=stride)
        elif is_last:
            x = self.sep_conv(x, planes, f"{name}.rep.{3 * reps - 1}")
        x = self.add(f"{name}_add", "add", x, x[1], inputs=[x, shortcut])
        return self.relu(x, f"{name}_relu") if end_with_relu else x

    def transposed(self, x, filters, name):
        h, w, c = x[1]
        self.reads(x, 0, 1)
        return self.add(
            name,
            "transposed",
            x,
            (2 * h, 2 * w, filters),
            params=9 * c * filters,
            kernel=3,
            bottom=1,
        )


def network_layers(spatial_ranks: int = 1) -> list[Layer]:
    """DeepCAM at 768 x 1152 x 16 as deepcam/model.py builds it, for a split of `spatial_ranks`."""
    n = _Net(spatial_ranks)
    p = "xception_features"
    x = n.add(
        "fields", "input", ("fields", (HEIGHT, WIDTH, IN_CHANNELS)), (HEIGHT, WIDTH, IN_CHANNELS)
    )
    x = n.conv(x, 32, 3, f"{p}.conv1", stride=2)
    x = n.relu(n.bn(x, f"{p}.bn1"), f"{p}.relu1")
    x = n.conv(x, 64, 3, f"{p}.conv2")
    x = n.relu(n.bn(x, f"{p}.bn2"), f"{p}.relu2")
    x = n.block(x, 128, 2, f"{p}.block1", stride=2, end_with_relu=False)
    low_level = x = n.relu(x, f"{p}.block1_relu")
    x = n.block(x, 256, 2, f"{p}.block2", stride=2)
    x = n.block(x, 728, 2, f"{p}.block3", stride=2, is_last=True)
    for i in range(MIDDLE_BLOCKS):
        x = n.block(x, 728, 3, f"{p}.block{4 + i}")
    x = n.block(
        x,
        1024,
        2,
        f"{p}.block{4 + MIDDLE_BLOCKS}",
        end_with_relu=False,
        grow_first=False,
        is_last=True,
    )
    for i, filters in enumerate((1536, 1536, 2048), start=3):
        x = n.sep_conv(x, filters, f"{p}.conv{i}", dilation=EXIT_FLOW_DILATION)
        x = n.relu(n.bn(x, f"{p}.bn{i}"), f"{p}.relu{i}")
    # The bottleneck (ASPP)
    b, c = "bottleneck", 256
    branches = []
    for i, rate in enumerate((1,) + ASPP_RATES, start=1):
        y = n.conv(x, c, 1 if rate == 1 else 3, f"{b}.aspp{i}.atrous_convolution", dilation=rate)
        branches.append(n.relu(n.bn(y, f"{b}.aspp{i}.bn"), f"{b}.aspp{i}.relu"))
    g = f"{b}.global_avg_pool.global_average_pool"
    pooled = n.add(f"{g}.0", "pool", x, (1, 1, x[1][-1]))
    pooled = n.conv(pooled, c, 1, f"{g}.1")
    pooled = n.add(f"{g}.2", "affine", pooled, pooled[1], params=2 * c)
    pooled = n.relu(pooled, f"{g}.3")
    pooled = n.add(f"{b}.global_avg_pool_tile", "upsample", pooled, x[1][:2] + (c,), split=True)
    branches.append(pooled)
    x = n.add(f"{b}.concat", "concat", x, x[1][:2] + (c * len(branches),), inputs=branches)
    x = n.conv(x, c, 1, f"{b}.conv")
    x = n.relu(n.bn(x, f"{b}.bn"), f"{b}.relu")
    # The decoder
    low_level = n.conv(low_level, 48, 1, "conv2")
    low_level = n.relu(n.bn(low_level, "bn2"), "relu")
    u = "upsample"
    for i in (0, 3):
        x = n.transposed(x, c, f"{u}.deconv1.{i}")
        x = n.relu(n.bn(x, f"{u}.deconv1.{i + 1}"), f"{u}.deconv1.{i + 2}")
    x = n.add(
        f"{u}.concat", "concat", x, x[1][:2] + (x[1][-1] + low_level[1][-1],), inputs=[x, low_level]
    )
    for i in (0, 3):
        x = n.conv(x, c, 3, f"{u}.conv1.{i}")
        x = n.relu(n.bn(x, f"{u}.conv1.{i + 1}"), f"{u}.conv1.{i + 2}")
    x = n.conv(x, c, 1, f"{u}.conv1.6", use_bias=True)
    x = n.transposed(x, c, f"{u}.deconv2.0")
    x = n.relu(n.bn(x, f"{u}.deconv2.1"), f"{u}.deconv2.2")
    n.transposed(x, N_CLASSES, f"{u}.last_deconv.0")
    return n.layers


def check_split(machine: Machine, spatial_ranks: int) -> None:
    """The limits of a K-way height split (deepcam/config.py's check_height_split, and groups of whole nodes).

    Raises:
      ValueError: the height is not a multiple of K x the output stride.
      ConfigError: K neither divides nor is a multiple of a node's devices.
    """
    k = spatial_ranks
    if k < 1:
        raise ValueError(f"--spatial-ranks must be at least 1, got {k}")
    if k == 1:
        return
    spatial.group_links(machine, k)
    if HEIGHT % (k * OUTPUT_STRIDE):
        raise ValueError(
            f"--spatial-ranks {k}: the height {HEIGHT} must be a multiple of {k} x the output stride "
            f"{OUTPUT_STRIDE} (each rank's rows halve evenly down to stride {OUTPUT_STRIDE}): K one of "
            + ", ".join(map(str, valid_ranks()))
        )


def valid_ranks() -> list[int]:
    """Every K > 1 that cuts the height into slabs of whole rows at the output stride."""
    return [k for k in range(2, HEIGHT // OUTPUT_STRIDE + 1) if HEIGHT % (k * OUTPUT_STRIDE) == 0]


def device_costs(measured: ModelCosts, spatial_ranks: int) -> ModelCosts:
    """One device's share of one sample split K ways: every layer's / K, the gathered maps whole.
    The input rate stays the reader's: every rank of a group reads the whole sample."""
    return spatial.scaled_costs(
        measured,
        network_layers(1),
        network_layers(spatial_ranks),
        spatial_ranks,
        measured.input_samples_per_s_per_core,
    )


# ------------------------------------------------------------------ the split's collectives
def slab(shape: tuple, spatial_ranks: int) -> tuple:
    return (shape[0] // spatial_ranks,) + tuple(shape[1:])


def collectives(spatial_ranks: int, precision: str) -> list[spatial.Collective]:
    """Every collective a split step issues, in order (module docstring), per rank; [] at K = 1."""
    k, eb = spatial_ranks, ELEMENT_BYTES[precision]
    if k == 1:
        return []
    ring = 2 * (k - 1) / k  # of the tensor, through each rank's link, in a ring allreduce
    out = []
    for layer in network_layers(k):
        part = slab(layer.in_shape, k)
        if layer.kind == "gather":
            whole = math.prod(layer.in_shape) * eb
            out.append(
                spatial.Collective(
                    layer.name, "gather", part, (k - 1) / k * whole, ring * whole, 3, 4 * (k - 1)
                )
            )
        elif layer.halo and layer.halo <= part[0]:
            sent = spatial.halo_bytes(part, layer.halo, eb)
            out.append(spatial.Collective(layer.name, "halo", part, sent, sent, 2, 2))
        elif layer.kind == "bn":
            stats = ring * 2 * layer.in_shape[-1] * 4  # [mean, mean of squares], float32
            out.append(
                spatial.Collective(
                    layer.name, "allreduce", part, stats, stats, 2, 4 * (k - 1), per_sample=False
                )
            )
        elif layer.kind == "pool":
            pooled = ring * layer.in_shape[-1] * 4  # [B, 1, 1, C], float32
            out.append(
                spatial.Collective(layer.name, "allreduce", part, pooled, pooled, 2, 4 * (k - 1))
            )
    out.append(
        spatial.Collective(
            "weighted_cross_entropy",
            "allreduce",
            (),
            ring * 4,
            0.0,
            1,
            2 * (k - 1),
            per_sample=False,
        )
    )
    return out


def exchange_seconds(
    machine: Machine,
    spatial_ranks: int,
    precision: str,
    local_batch: float,
    cycle_s: float = spatial.HOROVOD_CYCLE_S,
) -> float:
    """Per step: the split's collectives at `local_batch` samples per group (0 at K = 1)."""
    if spatial_ranks == 1:
        return 0.0
    links = spatial.group_links(machine, spatial_ranks)
    return sum(
        c.seconds(links, local_batch, cycle_s) for c in collectives(spatial_ranks, precision)
    )


# ------------------------------------------------------------------ memory per device
def padded_slab_elements(layer: Layer, spatial_ranks: int) -> int:
    """A halo layer's input slab with its rows and zero columns (the 'valid' convolution keeps it);
    unsplit, the zero-padded input of a strided layer (its ZeroPadding2D's output)."""
    if layer.kind == "pad":
        return math.prod(layer.out_shape)
    if not layer.halo or spatial_ranks == 1:
        return 0
    h, w, c = layer.in_shape
    return (h // spatial_ranks + layer.top + layer.bottom) * (w + 2 * layer.cols) * c


def memory_per_device(spatial_ranks: int, precision: str) -> spatial.Memory:
    """Memory on one device of a K-way height split at local batch 1 (module docstring)."""
    k, eb = spatial_ranks, ELEMENT_BYTES[precision]
    layers = network_layers(k)
    split, whole = spatial.split_and_head(
        [layer for layer in layers if layer.kind != "pad"], lambda layer: math.prod(layer.out_shape)
    )
    largest = max(math.prod(layer.out_shape) / (k if layer.split else 1) for layer in layers)
    return spatial.Memory(
        edge=HEIGHT,
        spatial_ranks=k,
        split_activations=eb * split / k,
        halo_copies=eb * sum(padded_slab_elements(layer, k) for layer in layers),
        head_activations=eb * whole,
        backward_working=eb * 2 * largest,
        state=4 * STATE_COPIES * spatial.parameters(layers),
    )
