"""Layers for 2D samples split along height (rows) across the ranks of a spatial group.

A rank holds a slab of Hs = H / K consecutive rows of each sample ([B, Hs, W, C]; the mesh is
common.parallel.distribution.SpatialMesh, whose exchange works along axis 1 whatever the rank).
The layers here hold no weights: they give a convolution of the unsplit network the rows it
reads beyond its slab, so the convolution itself stays the layer it was, with its variables and
names, run with 'valid' padding:
- `RowHalo`: the neighbours' boundary rows, one alltoall in the group (zeros beyond the sample's
  top and bottom, as 'same' padding gives the whole sample), and the columns zero-padded;
- `GatherRows` then `RowWindow`: where the halo is taller than a slab (DeepCAM's dilated ASPP
  branches at small slabs), the group's slabs gathered once and each rank's window cut from
  the whole map;
- `GroupMeanPool`: a global average over the whole sample (the slab's sum, summed over the group).

Gradients: every layer of a height-split network computes rows of its own slab only, so the
gradient of every variable on a rank is its slab's part: the update needs the sum over the
group (`all_partial_scales`), unlike CosmoFlow's gathered head (common.parallel.spatial).
"""

import tensorflow as tf
from tensorflow.keras import layers


class RowHalo(layers.Layer):
    """[B, Hs, W, C] -> [B, top + Hs + bottom, W + 2 * cols, C]: `top` rows of the slab above
    (the previous rank's last rows), `bottom` rows of the slab below (the next rank's first),
    zeros beyond the sample, then `cols` zero columns on each side.

    The exchange is the mesh's symmetric one (max(top, bottom) rows each way, every rank the same
    shapes, so Horovod's derived names agree), cropped: a one-sided halo (stride-2 layers need
    one row above, transposed convolutions one below) sends a row it does not use.
    """

    def __init__(self, mesh, top: int, bottom: int, cols: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.mesh, self.top, self.bottom, self.cols = mesh, int(top), int(bottom), int(cols)

    def call(self, inputs):
        halo = max(self.top, self.bottom)
        x = self.mesh.exchange_halo(inputs, halo, name=f"{self.name}.alltoall")
        rows = inputs.shape[1]
        x = x[:, halo - self.top: halo + rows + self.bottom]
        return _pad_cols(x, self.cols)


class GatherRows(layers.Layer):
    """[B, Hs, W, C] slabs -> [B, K * Hs, W, C] the whole map on every rank of the group, for
    windows cut from it (RowWindow). Each rank then uses its own window, so the gradient that
    reaches a slab is the sum of what every rank's window sends back: Horovod's allgather
    gradient averages over the group, hence the factor K on the way back."""

    def __init__(self, mesh, **kwargs):
        super().__init__(**kwargs)
        self.mesh = mesh

    def call(self, inputs):
        return self.mesh.gather(_gradient_times(inputs, float(self.mesh.size)), name=f"{self.name}.allgather")


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
        return _pad_cols(padded[:, first:first + rows + self.top + self.bottom], self.cols)


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
