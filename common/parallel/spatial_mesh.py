"""The mesh of a run whose samples are split across ranks: K consecutive ranks hold the slabs of
each sample, and the job's groups of K do data parallelism. Imported by split runs only
(Distribution.spatial_mesh); a data-parallel run's mesh is common.parallel.distribution.DataParallel.
"""

import dataclasses
import os
import socket

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from common.parallel import placement


def split_mesh(dist, k: int) -> "SpatialMesh":
    """This rank's place in a mesh of groups of `k` ranks (k divides the job); a collective for k > 1.
    k = 1 is the split code's one-rank reference (the tests' probes): a run of k = 1 has no SpatialMesh.

    Groups are consecutive ranks: on one node when K divides its ranks (the halo exchange stays on
    the node's links), else over K / ranks-per-node whole nodes (the halos between nodes cross the
    network). Both need ranks numbered node by node, which every rank checks from every rank's node
    (common.parallel.placement). The groups' process sets are Distribution's (group_sizes).
    """
    what = "parallel.spatial_ranks"
    spans = (1,) * (dist.size // k)
    if k > 1:
        # Every rank decides from the same gathered list: all refuse together.
        places = dist.allgather_object(placement.RankPlace(horovod_host(), dist.local_size))
        spans = placement.group_spans(places, k, f"{what}={k}")
    group = dist.rank_group(k, what)
    return SpatialMesh(
        size=k,
        index=dist.rank % k,
        group=dist.rank // k,
        groups=dist.size // k,
        process_set=group.process_set,
        group_nodes=spans,
    )


class SpatialMesh:
    """K ranks that split each sample along its first spatial axis (depth, z) between them.

    Rank `index` of a group holds planes [index * Zs, (index + 1) * Zs) of every
    sample of the group's batch; the `groups` groups do data parallelism. The
    methods are usable inside tf.function and are collectives over the group:
    every rank of a group calls them in the same order, with the same shapes.

    Horovod 0.28 has no point-to-point op; the halo exchange is one alltoall
    (alltoallv on Gloo and MPI) in which every rank sends exactly 2h planes: its
    first h to the rank below and its last h to the rank above, or to itself at
    the faces of the volume, where what comes back is replaced by zeros. Every
    rank therefore builds the same ops, its collectives with the same shapes
    (only constants differ), so the names Horovod derives for the backward
    collectives agree across ranks, and no count is zero (NCCL would skip it;
    Gloo would not).
    """

    def __init__(
        self,
        size: int,
        index: int = 0,
        group: int = 0,
        groups: int = 1,
        process_set=None,
        group_nodes: tuple = (),
    ):
        self.size, self.index, self.group, self.groups = size, index, group, groups
        self._process_set = process_set
        # The nodes each group spans (common.parallel.placement.group_spans); one each unless told.
        self.group_nodes = tuple(group_nodes) or (1,) * groups

    @property
    def is_split(self) -> bool:
        return self.size > 1

    def describe(self) -> str:
        least, most = min(self.group_nodes), max(self.group_nodes)
        spans = (
            "each on one node"
            if most == 1
            else f"each across {most} nodes"
            if least == most
            else f"across {least} to {most} nodes"
        )
        return f"{self.size}-way spatial x {self.groups} data-parallel group(s), {spans}"

    def neighbour_planes(self, x, halo: int, name: str) -> "NeighbourPlanes":
        """The halo of the slab x [B, Zs, ...] (a split mesh): the `halo` planes next to it from
        the rank below and from the rank above (zeros beyond the volume's faces), by one alltoall.

        Compute meant to run while the exchange is in flight waits for what is returned as `sent`
        (a control dependency): the alltoall then starts first, rather than its input's few ops
        queueing behind that compute for the same threads (CPU) or the same stream (GPU). On a GPU,
        Horovod 0.28.1's alltoall then still waits for that compute before it sends (docs/gpu.md).
        """
        zs = x.shape[1]
        if zs is None or zs < halo:
            raise ValueError(f"{name}: a slab of {zs} plane(s) cannot give a halo of {halo}")
        perm = [1, 0] + list(range(2, x.shape.rank))
        # One gather rather than two slices concatenated: backward then adds a single tensor to the
        # slab's gradient, not one per slice. Grappler rewrites a sum of three or more large
        # tensors into an accumulator initialised from a zeros_like it folds into a constant kept
        # between steps (of the slab's size: 27 MiB for DeepCAM at 384 x 576, K = 2).
        rows = list(range(halo)) + list(range(zs - halo, zs))
        # The planes go first: alltoall splits and concatenates along axis 0.
        send = tf.transpose(tf.gather(x, rows, axis=1), perm)
        below = self.index - 1 if self.index > 0 else self.index
        above = self.index + 1 if self.index < self.size - 1 else self.index
        splits = np.zeros(self.size, np.int32)
        splits[below] += halo
        splits[above] += halo
        received = hvd.alltoall(
            _wire(send), splits=tf.constant(splits), name=name, process_set=self._process_set
        )
        if isinstance(
            received, (tuple, list)
        ):  # (tensor, received_splits) in some Horovod versions
            received = received[0]
        received = tf.cast(tf.ensure_shape(received, send.shape), x.dtype)
        # Sources in rank order: [from below (its last planes), from above (its first)];
        # at a face that slot holds this rank's own planes, sent to itself: zeroed, by cutting out
        # the slots to keep and padding them back. Not tf.where against zeros_like: TensorFlow
        # folds a zeros_like of a static shape into a constant the graph keeps between steps
        # (the received planes' size: 74 MiB per rank over DeepCAM's exchanges at 768 x 1152,
        # K = 2; with the accumulator above, 0.15 GiB held between steps); a pad writes its zeros
        # as it runs. Every rank runs the same slice and pad (only their bounds differ): Horovod
        # names the backward alltoall after the op that hands it its gradient.
        first = halo if self.index == 0 else 0
        last = halo if self.index == self.size - 1 else 2 * halo
        faces = [[0, 0]] * (x.shape.rank - 1)
        received = tf.pad(received[first:last], [[first, 2 * halo - last]] + faces)
        received = tf.transpose(received, perm)
        return NeighbourPlanes(below=received[:, :halo], above=received[:, halo:], sent=send)

    def sum(self, x, name: str):
        """x summed over the ranks of the group, on each of them (the gradient: the group's sum of
        what each rank sends back). Usable inside tf.function; `x` the same shape on every rank."""
        if not self.is_split:
            return x
        return tf.cast(
            hvd.allreduce(_wire(x), op=hvd.Sum, name=name, process_set=self._process_set), x.dtype
        )

    def allgather(self, x, name: str):
        """x [N_i, ...] of every rank of the group, concatenated along axis 0 in group order (the
        N_i may differ: alltoallv's sibling, allgatherv), on each of them."""
        if not self.is_split:
            return x
        return hvd.allgather(x, name=name, process_set=self._process_set)

    def gather(self, x, name: str):
        """[B, Zs, ...] slabs -> [B, K * Zs, ...] whole samples on every rank of the group.

        The gradient of Horovod's allgather averages the incoming gradients over
        the group and hands each rank its slab's part: right for the layers after
        it, which every rank of the group runs on the same whole sample.
        """
        if not self.is_split:
            return x
        perm = [1, 0] + list(range(2, x.shape.rank))
        whole = hvd.allgather(
            _wire(tf.transpose(x, perm)), name=name, process_set=self._process_set
        )
        shape = [x.shape[1] * self.size] + [x.shape[0]] + x.shape[2:].as_list()
        return tf.cast(tf.transpose(tf.ensure_shape(whole, shape), perm), x.dtype)


@dataclasses.dataclass(frozen=True)
class NeighbourPlanes:
    """What SpatialMesh.neighbour_planes gives: `below` and `above`, [B, halo, ...] each, and `sent`,
    the alltoall's input (to order overlapping compute after it)."""

    below: tf.Tensor
    above: tf.Tensor
    sent: tf.Tensor


def _wire(tensor):
    """Horovod's collectives have no bfloat16: such tensors travel as float32 (exact both ways)."""
    return tf.cast(tensor, tf.float32) if tensor.dtype == tf.bfloat16 else tensor


def horovod_host() -> str:
    """The name of this rank's node as Horovod counts nodes.

    horovodrun's Gloo ranks get the -H name they were started under (HOROVOD_HOSTNAME), which
    is what makes 'localhost' and '127.0.0.1' two nodes of one machine; MPI's ranks are grouped
    by Horovod into nodes by shared memory, i.e. by machine, whose name is the host name.
    """
    return os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname()
