"""The one place that imports Horovod.

`Distribution` is the small object passed to everything that needs to know
about other ranks. A single process is simply Horovod of size 1: there is no
separate non-distributed code path to drift out of sync.

Every collective here must be called by every rank, in the same order. Never
call one inside `if dist.is_root:`: the other ranks would wait forever.
"""

import contextlib
import dataclasses
import os
import socket

import horovod
import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from common.errors import ConfigError
from common.parallel import cycle_time, gpus, placement


class Distribution:
    """Rank, size, node layout and collectives of the current job."""

    def __init__(self, group_sizes=()):
        """Initialises Horovod, with a static process set per group of ranks the run makes, and pins
        this rank's device.

        Args:
          group_sizes: the sizes of the groups of consecutive ranks the run makes (batch-norm
            groups, spatial splits: rank_group, spatial_mesh). Horovod registers their sets in
            hvd.init (static process sets), for the job's size as its launcher tells it
            (launched_size): a set for every group of a size g with 1 < g < size that divides it.
            A group of one rank or of the whole job needs none; a data-parallel run, and any run
            on as many ranks as its group, gets a plain hvd.init(). A launcher that sets none of
            SIZE_VARIABLES is taken for one rank: a run with groups under it stops with a
            ConfigError naming them. Never dynamic process sets: their bookkeeping (a global
            allgather in every cycle of Horovod's background thread) made each allreduce of 2
            Gloo ranks 1.45x slower (bench/horovod_cycle.py).
        """
        first = (
            not hvd.is_initialized()
        )  # a later init is a no-op: Horovod keeps what it read first
        launched, told_by = launched_size()
        sets = {
            g: [hvd.ProcessSet(range(start, start + g)) for start in range(0, launched, g)]
            for g in sorted(set(group_sizes))
            if 1 < g < launched and launched % g == 0
        }
        # A dynamic init (another library's, or a parent's) leaves this in the environment, where
        # this init would read it and turn dynamic sets on.
        os.environ.pop("HOROVOD_DYNAMIC_PROCESS_SETS", None)
        wrong_job = (
            f"{told_by} said {launched} rank(s) before Horovod's init, which the process sets of "
            f"the run's groups of ranks were made for"
        )
        try:
            hvd.init(process_sets=[s for group in sets.values() for s in group])
        except ValueError as e:  # a set with a rank the job does not have
            raise ConfigError(f"{wrong_job}; Horovod refused them: {e}") from e
        if max(group_sizes, default=1) > 1 and hvd.size() != launched:
            raise ConfigError(f"{wrong_job}; Horovod counts {hvd.size()}")
        # group size -> this rank's static Horovod process set (rank_group)
        self._process_sets = {g: group[hvd.rank() // g] for g, group in sets.items()}
        self.cycle_time = cycle_time.at_init(
            first
        )  # as Horovod's background thread read it, in hvd.init
        self.rank = hvd.rank()
        self.size = hvd.size()
        self.local_rank = hvd.local_rank()
        self.local_size = hvd.local_size()
        # Horovod's cross rank/size count nodes: ranks that share a host.
        self.node_rank = hvd.cross_rank()
        self.num_nodes = hvd.cross_size()
        self.hostname = socket.gethostname()
        # Before any TensorFlow op (the first one initializes TensorFlow on every visible GPU,
        # after which neither the visible devices nor memory growth can change, and the thread
        # pools are fixed): every collective below is such an op.
        self.device = self._pin_device()

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def controller(self) -> str:
        """Which Horovod controller wires the ranks: 'mpi' or 'gloo'."""
        return "mpi" if hvd.mpi_enabled() else "gloo"

    # The GPU this rank uses, as _pin_device found it at init (common.parallel.gpus).
    gpu: gpus.RankGpu | None = None

    def _pin_device(self) -> str:
        """Makes this rank's GPU the only one TensorFlow sees; returns the device kind.

        Its local rank's GPU among those the process sees (all of the node's: NCCL keeps
        peer-to-peer between them), or the only one it sees. Called by __init__, right after
        Horovod's; runs no TensorFlow op: two ranks on one GPU are refused by
        check_one_rank_per_gpu, once the thread pools are sized.
        """
        seen = (
            gpus.visible_uuids()
        )  # NVML's UUIDs as CUDA_VISIBLE_DEVICES leaves them; None without NVML
        devices = tf.config.list_physical_devices("GPU")
        self.gpu = gpus.RankGpu(
            self.rank,
            self.hostname,
            self.local_rank,
            uuid=seen[gpus.index_for(self.local_rank, len(seen))] if seen else None,
            visible=len(seen) if seen is not None else len(devices),
        )
        if not devices:
            return "cpu"
        for gpu in devices:
            tf.config.experimental.set_memory_growth(gpu, True)
        tf.config.set_visible_devices(devices[gpus.index_for(self.local_rank, len(devices))], "GPU")
        return "gpu"

    def check_one_rank_per_gpu(self) -> None:
        """Raises ConfigError, naming the ranks, host and GPU UUID, when two ranks of a host would use one GPU.

        A collective (every rank tells the others its _pin_device GPU), and TensorFlow ops: call it on
        every rank after the thread pools are sized. NVML alone decides, so it holds
        where TensorFlow sees no GPU.
        """
        if self.size > 1:
            error = gpus.sharing_error(self.allgather_object(self.gpu))
            if error:
                raise ConfigError(error)

    def allgather_object(self, obj) -> list:
        """Every rank's picklable `obj`, in rank order (a collective)."""
        return hvd.allgather_object(obj)

    def horovod_build(self) -> dict:
        """Which controllers and GPU collectives this Horovod was built with: {'nccl', 'mpi', 'gloo'} -> bool."""
        return {
            "nccl": bool(hvd.nccl_built()),
            "mpi": bool(hvd.mpi_built()),
            "gloo": bool(hvd.gloo_built()),
        }

    def barrier(self) -> None:
        """Returns once every rank has called it (horovod.tensorflow has no barrier op)."""
        hvd.allreduce(tf.constant(0.0), op=hvd.Sum, name="barrier").numpy()

    def allreduce_sum(self, values) -> np.ndarray:
        """Sums a float64 vector over all ranks (eager; for metrics, not gradients)."""
        t = tf.constant(np.asarray(values, dtype=np.float64))
        return hvd.allreduce(t, op=hvd.Sum, name=None).numpy()

    def allreduce_mean(self, values) -> np.ndarray:
        return self.allreduce_sum(values) / self.size

    def allreduce_max(self, values) -> np.ndarray:
        t = tf.constant(np.asarray(values, dtype=np.float64))
        return hvd.allreduce(t, op=hvd.Max).numpy()

    def allgather(self, values) -> np.ndarray:
        """Stacks a same-shaped float64 vector from every rank: result[rank]."""
        t = tf.constant(np.asarray(values, dtype=np.float64)[None, ...])
        return hvd.allgather(t).numpy()

    def broadcast_object(self, obj, root_rank: int = 0):
        return hvd.broadcast_object(obj, root_rank=root_rank)

    def broadcast_variables(self, variables, root_rank: int = 0) -> None:
        """Gives every rank rank 0's initial weights."""
        if (
            self.size == 1
        ):  # nothing to send; Horovod would still build a broadcast per variable (3 s for DeepCAM)
            return
        hvd.broadcast_variables(variables, root_rank=root_rank)

    def average_gradients(self, grads, compression: str = "none", grouped: bool = False):
        """Averages a list of gradients over all ranks. Usable inside tf.function.

        By default each gradient gets its own allreduce, named by its index (every rank
        builds the same names), which depends on that gradient alone: in the step's graph
        it starts as soon as backward has produced it, while backward goes on with the
        layers below, and Horovod's background thread fuses the tensors that meet in one
        cycle (HOROVOD_FUSION_THRESHOLD, HOROVOD_CYCLE_TIME), as its DistributedGradientTape
        does. `grouped`: one grouped allreduce, which waits for every gradient. An
        XLA-compiled backward (runtime.xla) emits all gradients at once, so both start
        together then. `compression='fp16'` halves the bytes on the wire, as Horovod's
        Compression.fp16 does.
        """
        if self.size == 1:
            return grads
        comp = hvd.Compression.fp16 if compression == "fp16" else hvd.Compression.none
        if grouped:
            return hvd.grouped_allreduce(grads, op=hvd.Average, compression=comp)
        return [
            hvd.allreduce(g, op=hvd.Average, compression=comp, name=f"gradient_{i}")
            for i, g in enumerate(grads)
        ]

    def average_variables(self, variables) -> None:
        """Sets each variable to its mean over all ranks (sum / size), in one grouped allreduce.

        Eager, between steps (batch-norm running statistics after an epoch).
        Every rank must pass the same variables in the same order.
        """
        if self.size == 1:
            return
        sums = hvd.grouped_allreduce([tf.convert_to_tensor(v) for v in variables], op=hvd.Sum)
        for variable, total in zip(variables, sums):
            variable.assign(total / self.size)

    @contextlib.contextmanager
    def timeline(self, path):
        """Records Horovod's timeline (Chrome trace JSON, rank 0 writes it) of what runs inside the
        block: each tensor's negotiation and reduction, with its name. Every rank enters it.
        Horovod allows it when HOROVOD_TIMELINE=DYNAMIC was set at its init."""
        hvd.start_timeline(str(path), mark_cycles=False)  # returns on rank 0 once the file is open
        # Another rank may submit the block's first collective before rank 0 has started: its
        # negotiation then began unrecorded and the file holds its end alone. No rank passes this
        # barrier before rank 0 has started, so what the block submits is recorded whole.
        self.barrier()
        try:
            yield
        finally:
            hvd.stop_timeline()

    def rank_group(self, group_size: int, what: str = "group size") -> "RankGroup":
        """This rank's group of `group_size` consecutive ranks (sync batch norm, spatial groups).

        The group's Horovod process set was registered by hvd.init (Distribution's group_sizes), so
        this is no collective. A group of one rank needs no set, a group of the whole job is
        Horovod's global set.
        """
        if group_size < 1 or self.size % group_size:
            raise ConfigError(
                f"{what}={group_size} does not divide the {self.size} ranks of this job"
            )
        if group_size == 1:
            return RankGroup(1, None)
        if group_size == self.size:
            return RankGroup(group_size, hvd.global_process_set)
        if group_size not in self._process_sets:
            raise RuntimeError(
                f"{what}={group_size}: Horovod was initialised without the process sets of groups "
                f"of {group_size} ranks (Distribution(group_sizes=...) must name every group size)"
            )
        return RankGroup(group_size, self._process_sets[group_size])

    def spatial_mesh(self, spatial_ranks: int) -> "SpatialMesh":
        """This rank's place in a mesh of data-parallel groups of `spatial_ranks` ranks each.

        Groups are consecutive ranks: on one node when K divides its ranks (the halo exchange
        stays on the node's links), else over K / ranks-per-node whole nodes (the halos between
        nodes cross the network). Both need ranks numbered node by node, which every rank checks
        from every rank's node (common.parallel.placement). A collective when spatial_ranks > 1
        (gathers the nodes); its groups' process sets are Distribution's (group_sizes).
        """
        k = int(spatial_ranks)
        what = "parallel.spatial_ranks"
        if k < 1 or self.size % k:
            raise ConfigError(
                f"{what}={k} does not divide the {self.size} ranks of this job "
                f"(launch a multiple of {k} ranks)"
            )
        spans = (1,) * (self.size // k)
        if k > 1:
            # Every rank decides from the same gathered list: all refuse together.
            places = self.allgather_object(placement.RankPlace(horovod_host(), self.local_size))
            spans = placement.group_spans(places, k, f"{what}={k}")
        group = self.rank_group(k, what)
        return SpatialMesh(
            size=k,
            index=self.rank % k,
            group=self.rank // k,
            groups=self.size // k,
            process_set=group.process_set,
            group_nodes=spans,
        )

    def describe(self) -> str:
        return (
            f"{self.size} rank(s) on {self.num_nodes} node(s), {self.local_size} per node, "
            f"Horovod {horovod.__version__} over {self.controller()}, {self.cycle_time.describe()}"
            f"{self._describe_sets()}"
        )

    def _describe_sets(self) -> str:
        """', static process sets of 2 and 4 ranks' (those hvd.init registered), else ''."""
        sizes = sorted(self._process_sets)
        if not sizes:
            return ""
        listed = " and ".join(
            [", ".join(map(str, sizes[:-1])), str(sizes[-1])] if len(sizes) > 1 else [str(sizes[0])]
        )
        return f", static process sets of {listed} ranks"


class RankGroup:
    """A group of ranks that sums tensors among themselves (inside tf.function too)."""

    def __init__(self, size: int, process_set):
        self.size = size
        self._process_set = process_set

    @property
    def process_set(self):
        """The Horovod process set (None for a group of one rank)."""
        return self._process_set

    def sum(self, tensor, name: str | None = None):
        """`tensor` summed over the group's ranks (each passes the same shape); `name` names the
        collective, the same on every rank."""
        if self._process_set is None:
            return tensor
        return hvd.allreduce(tensor, op=hvd.Sum, name=name, process_set=self._process_set)


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


# Where each launcher says how many ranks it started, first found first: horovodrun's Gloo ranks,
# Open MPI's mpirun, MPICH/Intel MPI's Hydra (PMI-1/2), a SLURM job step (srun's own variable for
# its step, whatever the allocation's SLURM_NTASKS says).
SIZE_VARIABLES = ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS")


def launched_size(environ=None) -> tuple[int, str]:
    """The job's number of ranks as its launcher told it, read before Horovod's init, and which
    variable told it: (1, 'no launcher variable') for a process started alone."""
    environ = os.environ if environ is None else environ
    for key in SIZE_VARIABLES:
        value = environ.get(key, "").strip()
        if value:
            if not value.isdigit() or int(value) < 1:
                raise ConfigError(f"{key}={value!r} is no number of ranks")
            return int(value), key
    return 1, f"no launcher variable ({', '.join(SIZE_VARIABLES)})"


def launcher_env() -> dict:
    """Environment variables that tell which launcher started us (for the log)."""
    keys = (
        "SLURM_JOB_ID",
        "SLURM_NNODES",
        "SLURM_NTASKS",
        "SLURM_PROCID",
        "OMPI_COMM_WORLD_SIZE",
        "PMIX_RANK",
        "HOROVOD_RANK",
        "HOROVOD_CONTROLLER",
    )
    return {k: os.environ[k] for k in keys if k in os.environ}
