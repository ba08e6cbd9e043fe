"""DeepCAM split along height over a spatial group (parallel.spatial_ranks), imported by split runs
only: each layer computes its slab's rows (common.parallel.spatial_rows, docs/scaling.md), with the
unsplit model's variables and names; the loss and the [init] line of such a run.
"""

import tensorflow as tf
import tf_keras
from tf_keras import layers

from common.parallel.spatial_rows import GatherRows, GroupMeanPool, RowHalo, RowWindow
from deepcam.model import DilatedConv2D, LayerBuilder
from deepcam.task import weighted_cross_entropy


class SlabConvolution:
    """Mixin for a Keras convolution layer whose input may be a height slab: with `row_halo` (a
    common.parallel.spatial_rows.RowHalo) its op convolves the slab with that halo ('valid'
    padding), else the input as given. The layer keeps its class's variables and names."""

    row_halo: RowHalo | None = None

    def convolve_slab(self, inputs, kernel, convolve):
        """convolve(inputs, kernel), with the halo rows added first when the layer has them."""
        if self.row_halo is None:
            return convolve(inputs, kernel)
        return self.row_halo.convolve(inputs, kernel, convolve, name=self.name)

    def compute_output_shape(self, input_shape):
        if self.row_halo is not None:
            input_shape = self.row_halo.padded_shape(input_shape)
        return super().compute_output_shape(input_shape)


class SlabConv2D(SlabConvolution, DilatedConv2D):
    """A Conv2D of a height-split network (any kernel, stride or dilation): 'valid' on its slab with
    the `row_halo` rows (common.parallel.spatial_rows.RowHalo), or on a window of the gathered map."""

    def __init__(self, *args, row_halo: RowHalo | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.row_halo = row_halo

    def convolution_op(self, inputs, kernel):
        return self.convolve_slab(inputs, kernel, super().convolution_op)


class SlabDepthwiseConv2D(SlabConvolution, layers.DepthwiseConv2D):
    """The DepthwiseConv2D (no bias) of a height-split network, as SlabConv2D."""

    def __init__(self, *args, row_halo: RowHalo | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        if self.use_bias:
            raise ValueError(f"{self.name}: a depthwise convolution on a slab takes no bias here")
        self.row_halo = row_halo

    def call(self, inputs):
        return self.convolve_slab(inputs, self.depthwise_kernel, self._depthwise)

    def _depthwise(self, x, kernel):
        return tf_keras.backend.depthwise_conv2d(
            x,
            kernel,
            strides=self.strides,
            padding=self.padding,
            dilation_rate=self.dilation_rate,
            data_format=self.data_format,
        )


class SplitBuilder(LayerBuilder):
    """deepcam.model's layer factory for a height-split network: 'valid' layers on the slab with the
    halo rows its neighbours send (RowHalo), or on a window of the group's gathered map (rows_beyond)."""

    def __init__(self, width: float, bn_group, mesh):
        super().__init__(width, bn_group)
        self.mesh = mesh
        self.gathered = {}  # id(tensor) -> (tensor, its gathered whole map): one allgather per map

    def rows_beyond(self, x, top: int, bottom: int, cols: int, name: str):
        """(input, RowHalo or None) for a 'valid' layer reading `top` rows above x's slab, `bottom`
        below and `cols` zero columns each side: the slab and the halo its layer takes from the
        neighbours while their slabs hold that many rows, else the window cut from the gathered map."""
        if max(top, bottom) <= x.shape[1]:
            return x, RowHalo(self.mesh, top, bottom, cols)
        if id(x) not in self.gathered:
            self.gathered[id(x)] = (x, GatherRows(self.mesh, name=f"{name}_gather")(x))
        return RowWindow(self.mesh, top, bottom, cols, name=f"{name}_window")(
            self.gathered[id(x)][1]
        ), None

    def same_padding(self, x, halo: int, name: str):
        if halo == 0:
            return x, None, "same"
        return *self.rows_beyond(x, halo, halo, halo, name=f"{name}_halo"), "valid"

    def strided_padding(self, x, pad: int, name: str):
        # The output rows read `pad` rows above the slab and pad - 1 below (the last zero row is
        # never read).
        return self.rows_beyond(x, pad, pad - 1, pad, name=name)

    def transposed_halo(self) -> RowHalo:
        return RowHalo(self.mesh, 0, 1)

    def conv2d(self, filters: int, kernel: int, row_halo, dilation: int = 1, **kwargs):
        direct = dilation != 1 and self.direct_dilation
        return SlabConv2D(
            filters, kernel, row_halo=row_halo, dilation_rate=dilation, direct=direct, **kwargs
        )

    def depthwise(self, row_halo, **kwargs):
        return SlabDepthwiseConv2D(3, row_halo=row_halo, use_bias=False, **kwargs)

    def pooled_mean(self, x, name: str):
        return GroupMeanPool(self.mesh, name=name)(x)


def split_weighted_cross_entropy(mesh):
    """weighted_cross_entropy of the whole sample, from each rank's rows of it (a height split).

    Slabs hold equal pixel counts, so the whole sample's mean is the group's sum of each slab's
    mean / K. Each rank differentiates its own share only (the gradients' sum over the group is
    the trainer's, common.parallel.spatial_rows.all_partial_scales); the value it returns is the
    group's sum, the whole sample's loss, as the unsplit model reports it.
    """

    def loss(labels, logits):
        share = weighted_cross_entropy(labels, logits) / mesh.size
        whole = mesh.sum(tf.stop_gradient(share), name="weighted_cross_entropy.allreduce")
        return share + tf.stop_gradient(whole - share)

    return loss


def describe_height_split(net, k: int, height: int) -> str:
    """The [init] line of a height split: the rows per rank and which layers read a gathered map."""
    windows = [
        layer.name.removesuffix("_halo_window")
        for layer in net.layers
        if isinstance(layer, RowWindow)
    ]
    halos = sum(getattr(layer, "row_halo", None) is not None for layer in net.layers)
    gathered = (
        f"; from the group's gathered map (halo taller than a slab): {', '.join(windows)}"
        if windows
        else "; no layer reads further than a neighbour's slab"
    )
    return (
        f"each rank holds {height // k} of every sample's {height} rows (1/{k}); {halos} layers take halo rows "
        f"from their neighbours{gathered}; batch norm statistics and the image pooling summed over the group"
    )
