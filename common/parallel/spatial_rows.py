"""Layers for 2D samples split along height (rows) across the ranks of a spatial group.

A rank holds a slab of Hs = H / K consecutive rows of each sample ([B, Hs, W, C]; the mesh is
common.parallel.spatial_mesh.SpatialMesh, whose exchange works along axis 1 whatever the rank).
A convolution of the unsplit network stays the layer it was, with its variables and names, and
reads the rows beyond its slab as follows:
- `RowHalo`: the neighbours' boundary rows, one alltoall in the group (zeros beyond the sample's
  top and bottom, as 'same' padding gives the whole sample), and the columns zero-padded; the
  layer (deepcam.height_split.SlabConvolution) convolves slab and halo 'valid', keeping for backward the slab and
  the halo's rows rather than their padded copy (common.parallel.rebuilt_input);
- `GatherRows` then `RowWindow`: where the halo is taller than a slab (DeepCAM's dilated ASPP
  branches at small slabs), the group's slabs gathered once and each rank's window cut from
  the whole map;
- `GroupMeanPool`: a global average over the whole sample (the slab's sum, summed over the group).

Gradients: every layer of a height-split network computes rows of its own slab only, so the
gradient of every variable on a rank is its slab's part: the update needs the sum over the
group (`all_partial_scales`), unlike CosmoFlow's gathered head (common.parallel.spatial).
"""

import dataclasses

import tensorflow as tf
from tf_keras import layers

from common.parallel.rebuilt_input import convolve_rebuilding_input


@dataclasses.dataclass(frozen=True)
class RowHalo:
    """What a convolution on a height slab reads beyond it: `top` rows of the slab above (the
    previous rank's last rows), `bottom` rows of the slab below (the next rank's first), zeros
    beyond the sample, then `cols` zero columns on each side.

    The exchange is the mesh's symmetric one (max(top, bottom) rows each way, every rank the same
    shapes, so Horovod's derived names agree), cropped: a one-sided halo (stride-2 layers need
    one row above, transposed convolutions one below) sends a row it does not use.
    """

    mesh: object
    top: int
    bottom: int
    cols: int = 0

    def padded_shape(self, shape) -> tf.TensorShape:
        """[B, Hs, W, C] -> the shape of the slab with its halo, [B, top + Hs + bottom, W + 2 cols, C]."""
        b, rows, width, c = tf.TensorShape(shape).as_list()
        return tf.TensorShape([b, rows + self.top + self.bottom, width + 2 * self.cols, c])

    def convolve(self, slab, kernel, convolve, name: str):
        """convolve(the slab with its halo, kernel), the padded input rebuilt for backward."""
        halo = max(self.top, self.bottom)
        received = self.mesh.neighbour_planes(slab, halo, name=f"{name}.alltoall")
        # The mesh's `below` comes from the previous rank: the rows above this slab.
        above, below = received.below[:, halo - self.top :], received.above[:, : self.bottom]
        return convolve_rebuilding_input(
            [above, slab, below], self._assemble, tf.convert_to_tensor(kernel), convolve
        )

    def _assemble(self, above, slab, below):
        return _pad_cols(tf.concat([above, slab, below], axis=1), self.cols)


class GatherRows(layers.Layer):
    """[B, Hs, W, C] slabs -> [B, K * Hs, W, C] the whole map on every rank of the group, for
    windows cut from it (RowWindow). Each rank then uses its own window, so the gradient that
    reaches a slab is the sum of what every rank's window sends back: Horovod's allgather
    gradient averages over the group, hence the factor K on the way back."""

    def __init__(self, mesh, **kwargs):
        super().__init__(**kwargs)
        self.mesh = mesh

    def call(self, inputs):
        return self.mesh.gather(
            _gradient_times(inputs, float(self.mesh.size)), name=f"{self.name}.allgather"
        )


class RowWindow(layers.Layer):
    """The whole map [B, H, W, C] -> this rank's rows with `top` above and `bottom` below
    (zeros beyond the sample), `cols` zero columns each side: what RowHalo gives, for any height."""

    def __init__(self, mesh, top: int, bottom: int, cols: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.mesh, self.top, self.bottom, self.cols = mesh, int(top), int(bottom), int(cols)

    def call(self, whole):
        rows = whole.shape[1] // self.mesh.size
        padded = tf.pad(whole, [[0, 0], [self.top, self.bottom], [0, 0], [0, 0]])
        # Rows [first - top, first + rows + bottom) of the whole map are rows [first, ...) of the padded one.
        first = self.mesh.index * rows
        return _pad_cols(padded[:, first : first + rows + self.top + self.bottom], self.cols)


class GroupMeanPool(layers.Layer):
    """[B, Hs, W, C] -> [B, 1, 1, C]: the mean over the whole sample's rows and columns, the same on
    every rank of the group (GlobalAveragePooling2D(keepdims=True) of the unsplit map). The
    allreduce's gradient sums what each rank's slab sends back to the pooled value."""

    def __init__(self, mesh, **kwargs):
        super().__init__(**kwargs)
        self.mesh = mesh

    def call(self, inputs):
        pixels = inputs.shape[1] * self.mesh.size * inputs.shape[2]
        partial = tf.reduce_sum(tf.cast(inputs, tf.float32), axis=[1, 2], keepdims=True) / pixels
        return tf.cast(self.mesh.sum(partial, name=f"{self.name}.allreduce"), inputs.dtype)


def all_partial_scales(model, mesh) -> list:
    """The allreduce factor of every trainable variable of a height-split network (see the module
    docstring): the group size K for all of them; 1 when the mesh does not split."""
    k = float(mesh.size) if mesh is not None and mesh.is_split else 1.0
    return [k] * len(model.trainable_variables)


def _pad_cols(x, cols: int):
    return x if not cols else tf.pad(x, [[0, 0], [0, 0], [cols, cols], [0, 0]])


@tf.custom_gradient
def _gradient_times_impl(x, factor):
    def grad(upstream):
        return upstream * tf.cast(factor, upstream.dtype), None

    return tf.identity(x), grad


def _gradient_times(x, factor: float):
    """x, with its gradient multiplied by `factor` on the way back."""
    return _gradient_times_impl(x, tf.constant(factor, tf.float32))
