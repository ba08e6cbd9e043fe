"""The one place that imports Horovod (with common.parallel.spatial_mesh, its split runs' part).

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
from common.parallel import gpus

# The variables Horovod's background loop reads its cycle time from (common.parallel.cycle_time), as
# the process's first hvd.init found them: a later init, or a later change, changes nothing.
CYCLE_VARIABLES = ("HOROVOD_CYCLE_TIME", "HOROVOD_AUTOTUNE", "HOROVOD_ENABLE_XLA_OPS")
_cycle_env = None
DEFAULT_CYCLE = "cycle time 1 ms (Horovod's default)"


class Distribution:
    """Rank, size, node layout and collectives of the current job."""

    def __init__(self, group_sizes=()):
        """Initialises Horovod and pins this rank's device.

        `group_sizes`: the sizes of the groups of consecutive ranks the run makes (batch-norm
        groups, spatial splits), whose static process sets hvd.init registers for the job's size as
        its launcher tells it (launched_size). Never dynamic process sets: their bookkeeping made
        each allreduce of 2 Gloo ranks 1.45x slower (docs/figures.md).
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
        global _cycle_env
        if first or _cycle_env is None:
            _cycle_env = {k: os.environ[k] for k in CYCLE_VARIABLES if k in os.environ}
        self.cycle_env = _cycle_env
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

    @property
    def cycle_time(self):
        """Horovod's cycle time as its init read it (a common.parallel.cycle_time.CycleTime)."""
        from common.parallel import cycle_time

        return cycle_time.read(self.cycle_env)

    def controller(self) -> str:
        """Which Horovod controller wires the ranks: 'mpi' or 'gloo'."""
        return "mpi" if hvd.mpi_enabled() else "gloo"

    # The GPU this rank uses, as _pin_device found it at init (common.parallel.gpus).
    gpu: gpus.RankGpu | None = None

    def _pin_device(self) -> str:
        """Makes its local rank's GPU the only one TensorFlow sees (no TensorFlow op); returns the
        device kind, 'gpu' or 'cpu'."""
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
        """A collective, after the thread pools are sized: ConfigError naming the ranks, host and
        GPU UUID (from NVML) when two ranks of a host would use one GPU."""
        if self.size > 1:
            from common.parallel.gpu_sharing import sharing_error

            error = sharing_error(self.allgather_object(self.gpu))
            if error:
                raise ConfigError(error)

    def allgather_object(self, obj) -> list:
        """Every rank's picklable `obj`, in rank order (a collective)."""
        return hvd.allgather_object(obj)

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
        """Averages gradients over all ranks, inside tf.function. Each gets its own allreduce, named
        by its index, which starts as soon as backward has produced it (Horovod fuses those that
        meet in a cycle, as its DistributedGradientTape); `grouped`: one allreduce that waits for
        all. `compression='fp16'` halves the bytes on the wire."""
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
        """Sets each variable to its mean over all ranks, in one grouped allreduce (eager)."""
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
        """This rank's group of `group_size` consecutive ranks (batch-norm and spatial groups), on
        the process set hvd.init registered (no collective)."""
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

    def spatial_mesh(self, spatial_ranks: int):
        """This rank's place among the data-parallel groups of `spatial_ranks` ranks each: 1, a rank
        each (DataParallel); more, the group's ranks split each sample (a collective)."""
        k = int(spatial_ranks)
        if k < 1 or self.size % k:
            raise ConfigError(
                f"parallel.spatial_ranks={k} does not divide the {self.size} ranks of this job "
                f"(launch a multiple of {k} ranks)"
            )
        if k == 1:
            return DataParallel(group=self.rank, groups=self.size)
        from common.parallel.spatial_mesh import split_mesh

        return split_mesh(self, k)

    def describe(self) -> str:
        return (
            f"{self.size} rank(s) on {self.num_nodes} node(s), {self.local_size} per node, "
            f"Horovod {horovod.__version__} over {self.controller()}, {self._describe_cycle()}"
            f"{self._describe_sets()}"
        )

    def _describe_cycle(self) -> str:
        # Without the variables, cycle_time.read({}).describe() (tests/test_cycle_time.py).
        return self.cycle_time.describe() if self.cycle_env else DEFAULT_CYCLE

    def _describe_sets(self) -> str:
        """', static process sets of 2 and 4 ranks' (those hvd.init registered), else ''."""
        sizes = sorted(self._process_sets)
        if not sizes:
            return ""
        listed = " and ".join(map(str, sizes))  # at most two: the spatial and batch-norm groups
        return f", static process sets of {listed} ranks"


@dataclasses.dataclass(frozen=True)
class DataParallel:
    """The mesh of a run that does not split samples: each rank is a data-parallel group of its own
    (common.parallel.spatial_mesh.SpatialMesh is that of a split run)."""

    group: int = 0  # this rank's group: its rank
    groups: int = 1  # the job's ranks
    size: int = 1  # ranks a group
    index: int = 0  # this rank's place in its group
    is_split: bool = False


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


# Whether every rank holds the same variables: a fingerprint of three numbers per rank, gathered once.
_PROBE_SEED = 1234  # the random direction of the projection: the same on every rank


def fingerprint(variables) -> np.ndarray:
    """[sum, sum of |values|, projection on a fixed random direction] of `variables` in float64,
    where a change of one float32 ulp survives; the projection sees values that moved between
    elements. One variable at a time on the host, to keep the peak memory of the steps."""
    direction = np.random.default_rng(_PROBE_SEED)
    total = np.zeros(3)
    for variable in variables:
        w = np.asarray(
            variable, dtype=np.float64
        ).ravel()  # a tf.Variable's values come to the host
        total += [w.sum(), np.abs(w).sum(), float(w @ direction.standard_normal(w.size))]
    return total


def variables_in_sync(variables, dist) -> tuple[bool, int]:
    """A collective: (whether every rank holds the same `variables`, by exact fingerprints; the
    values compared per rank). Pass all of a model's variables: batch-norm statistics count."""
    values = fingerprint(variables)
    gathered = dist.allgather(values)
    n_values = sum(int(np.prod(v.shape)) for v in variables)
    return bool(np.all(gathered == gathered[0])), n_values


def batchnorm_statistics(model) -> list:
    """The moving mean and variance of every batch-norm layer of `model` (sub-models' included), in
    the model's layer order, the same on every rank."""
    found = []
    for layer in model.submodules:
        if (
            getattr(layer, "moving_mean", None) is not None
            and getattr(layer, "moving_variance", None) is not None
        ):
            found += [layer.moving_mean, layer.moving_variance]
    return found


def average_batchnorm_statistics(model, dist) -> int:
    """Every rank: replaces its batch-norm running statistics by their mean over all ranks, as the
    MLCommons DeepCAM reference does after each epoch's training (one grouped allreduce; none
    without batch norm). Returns the number of layers averaged."""
    statistics = batchnorm_statistics(model)
    if statistics:  # the same answer on every rank: they all build the same model
        dist.average_variables(statistics)
    return len(statistics) // 2
