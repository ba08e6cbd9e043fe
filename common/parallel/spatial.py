"""Layers for samples split along depth (z) across the ranks of a spatial group.

A rank holds a slab of Zs consecutive planes of each sample (common.parallel.distribution.
SpatialMesh). A 3D convolution needs kernel // 2 planes of each neighbouring slab
(the halo); a 2x pooling stays local while a slab has an even number of planes;
past that, the slabs are gathered and the rest of the network runs on the whole
sample, the same on every rank of the group ("replicated"). Each layer computes
exactly what its unsplit counterpart computes on the planes it holds.

Gradients: the kernels of the split layers get, on each rank, the part of the
gradient that its slab contributes: the update needs their sum over the group.
The replicated layers get the same whole gradient on every rank of the group.
`gradient_scales` says which is which, for the one allreduce of the train step.
"""

import tensorflow as tf
from tf_keras import layers

from common.parallel.rebuilt_input import convolve_rebuilding_input


class SpatialConv3D(layers.Conv3D):
    """Conv3D (stride 1, 'same' padding, odd kernel) on a z-slab: the variables and names of
    Conv3D, so checkpoints and imported weights load either way.

    The neighbours' boundary planes come in through `mesh.neighbour_planes` (zeros at the
    volume's faces, as 'same' padding gives), y and x are zero-padded here, then the
    convolution is 'valid' in all three axes.

    With `overlap` (parallel.halo_overlap), the exchange runs while the slab convolves: the
    Zs - 2h planes that read no neighbour come from the slab alone (the op named `interior`,
    ordered after the alltoall's input so the exchange starts first), then the h planes next
    to each neighbour from its halo and the slab's 2h edge planes (`boundary_below`,
    `boundary_above`), concatenated. Every output plane reads the same window through the same
    kernel as without overlap; the cost is that concatenation, one copy of the output (and of
    its gradient in backward).

    Either way each convolution keeps, for backward, the planes it was given rather than their
    zero-padded copy, which backward builds again (common.parallel.rebuilt_input): a split layer
    holds its slab once, as the unsplit one does.
    """

    def __init__(self, filters, kernel_size, mesh, *, overlap: bool, **kwargs):
        kwargs.setdefault("padding", "same")
        super().__init__(filters, kernel_size, **kwargs)
        if (
            self.padding != "same"
            or any(s != 1 for s in self.strides)
            or any(k % 2 == 0 for k in self.kernel_size)
        ):
            raise ValueError(
                f"{self.name}: a spatial convolution needs stride 1, 'same' padding and an odd kernel, "
                f"got strides {self.strides}, padding {self.padding}, kernel {self.kernel_size}"
            )
        self.mesh = mesh
        self.overlap = bool(overlap)
        # Whether this layer's kernel gradient is a partial sum over its slab (see gradient_scales).
        self.holds_slab = bool(mesh is not None and mesh.is_split)

    def build(self, input_shape):
        super().build(input_shape)
        # Whether call() overlaps: a slab of 2h planes or fewer has no interior to compute while its halo travels.
        self.overlaps = (
            self.holds_slab and self.overlap and input_shape[1] > 2 * (self.kernel_size[0] // 2)
        )

    def call(self, inputs):
        if not self.holds_slab:
            return super().call(inputs)
        hz = self.kernel_size[0] // 2
        kernel = tf.convert_to_tensor(self.kernel)
        if self.overlaps:
            outputs = self._overlapped(inputs, kernel, hz)
        else:
            halo = self.mesh.neighbour_planes(inputs, hz, name=f"{self.name}.halo")
            outputs = self._valid([halo.below, inputs, halo.above], kernel, name="slab")
        if self.use_bias:
            outputs = tf.nn.bias_add(outputs, self.bias)
        return self.activation(outputs) if self.activation is not None else outputs

    def _overlapped(self, inputs, kernel, hz: int):
        zs = inputs.shape[1]
        halo = self.mesh.neighbour_planes(inputs, hz, name=f"{self.name}.halo")
        # After the alltoall's input, so the exchange is under way while the slab convolves.
        with tf.control_dependencies([halo.sent]):
            interior = self._valid([inputs], kernel, name="interior")
        below = self._valid([halo.below, inputs[:, : 2 * hz]], kernel, name="boundary_below")
        above = self._valid([inputs[:, zs - 2 * hz :], halo.above], kernel, name="boundary_above")
        return tf.concat([below, interior, above], axis=1)

    def _valid(self, planes: list, kernel, name: str):
        """The convolution of `planes` stacked along z and zero-padded in y and x, 'valid' along z (2h
        planes fewer than the stack), backward rebuilding that padded stack."""
        return convolve_rebuilding_input(
            planes,
            self._stack_and_pad,
            kernel,
            lambda x, k: tf.nn.conv3d(x, k, strides=[1] * 5, padding="VALID", name=name),
        )

    def _stack_and_pad(self, *planes):
        _, hy, hx = (k // 2 for k in self.kernel_size)
        x = planes[0] if len(planes) == 1 else tf.concat(planes, axis=1)
        return tf.pad(x, [[0, 0], [0, 0], [hy, hy], [hx, hx], [0, 0]])


class GatherSlabs(layers.Layer):
    """[B, Zs, Y, X, C] slabs of the group -> [B, K * Zs, Y, X, C] whole samples on every rank."""

    def __init__(self, mesh, **kwargs):
        super().__init__(**kwargs)
        self.mesh = mesh

    def call(self, inputs):
        return self.mesh.gather(inputs, name=f"{self.name}.allgather")


def pool_stays_local(planes: int, pool: int = 2) -> bool:
    """Whether a pool of `pool` planes (stride `pool`) on a slab of `planes` planes needs no
    neighbour: the slab must hold whole windows (slab boundaries then fall between windows)."""
    return planes >= pool and planes % pool == 0


def gradient_scales(model) -> list:
    """A factor per trainable variable of `model` for the train step's allreduce *average*.

    Averaging over all ranks and multiplying a split layer's gradient by the group
    size K gives the sum over the group's slabs, averaged over the data-parallel
    groups: the gradient of the unsplit model on the global batch. Replicated
    layers (the same gradient on every rank of a group) keep 1.
    """
    split = [layer for layer in model.submodules if getattr(layer, "holds_slab", False)]
    partial = {id(v) for layer in split for v in layer.trainable_variables}
    k = max((layer.mesh.size for layer in split), default=1)
    return [float(k) if id(v) in partial else 1.0 for v in model.trainable_variables]


def describe_depth_split(model, k: int) -> str:
    """The [init] line of a depth split over `k` ranks: where the slabs are gathered."""
    gathered = ", ".join(layer.name for layer in model.layers if isinstance(layer, GatherSlabs))
    return (
        f"each rank holds 1/{k} of every sample's depth; slabs gathered at "
        f"{gathered}, the layers after it run whole on every rank of a group"
    )
