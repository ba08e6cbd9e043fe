"""How a rank is bound to CPUs: the NUMA-local binding slurm/env.sh gives srun, and the intra-op
threads a rank takes from its own CPU affinity.

The binding (`gpu_affinity`, `gpu_local_masks`; `python -m common.parallel.binding gpu-local RANKS
CPUS_PER_TASK < topology`): slurm/env.sh, when CPU_BIND is not given and the node has nvidia-smi,
reads each GPU's "CPU Affinity" and "NUMA Affinity" from `nvidia-smi topo -m` and gives srun
--cpu-bind=mask_cpu:M0,M1,...: local rank i (which uses GPU i, common/parallel/gpus.py) gets
CPUS_PER_TASK CPUs of GPU i's NUMA domain, whole cores first, no CPU shared with another rank of
that domain (fewer each where the domain holds fewer than its ranks x CPUS_PER_TASK). srun's
--cpu-bind=cores alone follows SLURM's default distribution, block:cyclic, which deals consecutive
tasks to alternating sockets: local rank 1 of a DGX H100 lands on socket 1 while GPU 1 hangs off
socket 0, as does about half of the ranks. A mask per task is srun's own mechanism (no numactl on
the node or in the image), SLURM exports what it applied (read below), and memory follows the CPUs:
Linux places a page on the NUMA node of the CPU that first touches it. SLURM cuts a task's mask to
the CPUs its step holds (task/affinity: "Ignoring user CPU binding outside of job step allocation"),
so the masks are whole only where the job holds the whole node: the sbatch scripts ask for
--exclusive.

The threads: a rank may run on the CPUs of its affinity mask (os.sched_getaffinity). Whether the
node's other ranks run on the same CPUs is something only the launcher knows, and says in the
variables it exports; the mask's size cannot tell, since a job-wide cgroup (SLURM's task/cgroup, a
container's --cpuset-cpus) shrinks every rank's mask to the same cores. `intra_op_threads` reads:

- srun: SLURM's task/affinity plugin turns --cpu-bind=cores (or sockets, threads, its automatic
  binding) into one CPU mask per local task and exports what it applied:
  SLURM_CPU_BIND_TYPE=mask_cpu: and SLURM_CPU_BIND_LIST=0x3,0xc (slurm src/plugins/task/affinity/
  dist_tasks.c). A task owns its mask, or shares it with the local tasks given the same CPUs
  (--cpu-bind=sockets; or one mask for all when it binds nothing). SLURM_CPU_BIND_TYPE=cores (the
  option itself, not a mask) means no plugin applied it: the one-node SLURM of
  tools/local_slurm.sh (task/none) exports it, says "cluster configuration lacks support for cpu
  binding" and leaves every task on all CPUs. --cpu-bind=map_ldom:/mask_ldom: (a site binding each
  task to its GPU's NUMA domain) stays as written: tasks given the same domain share it.
- mpirun (Open MPI 4): OMPI_MCA_orte_bound_at_launch=1 when it bound the process, with
  OMPI_MCA_hwloc_base_binding_policy when --bind-to was given (seen on Open MPI 4.1.4). core and
  hwthread give each rank CPUs of its own; socket, numa, a cache or board bind a domain that the
  node's ranks may share. Its default (no --bind-to) is core for up to 2 processes, socket for more,
  none when oversubscribed (mpirun(1)).
- horovodrun (Gloo) binds nothing and exports nothing about it.
A mask the launcher says it applied is believed only if it is this process's affinity: variables
inherited from an enclosing step (a launcher started inside an srun task) describe another process.

Pure: no TensorFlow, no Horovod, only the standard library (common.runtime calls intra_op_threads
with os.environ, os.sched_getaffinity(0) and Horovod's local size; slurm/env.sh runs this module).
"""

import dataclasses
import re
import sys
from collections.abc import Mapping

# Open MPI's --bind-to levels that give each rank CPUs of its own.
_OMPI_OWN = ("core", "hwthread", "cpu")


@dataclasses.dataclass(frozen=True)
class ThreadChoice:
    """How many intra-op threads a rank gets, and the rule that chose it (for the [init] line)."""

    threads: int
    rule: str


def intra_op_threads(environ: Mapping, affinity, local_size: int) -> ThreadChoice:
    """The rank's intra-op threads: its affinity's CPUs, divided among the local ranks sharing them.

    Args:
      environ: the process environment (the launcher's variables).
      affinity: the CPUs this process may run on (os.sched_getaffinity(0)).
      local_size: the ranks on this node (Horovod's local size).
    """
    cpus = frozenset(affinity)
    n, local_size = len(cpus), max(1, int(local_size))
    if "OMPI_COMM_WORLD_SIZE" in environ or "OMPI_MCA_orte_bound_at_launch" in environ:
        return _open_mpi(environ, n, local_size)
    if "HOROVOD_RANK" in environ:
        return _divided(n, local_size, "horovodrun binds no CPUs")
    bind_type = environ.get("SLURM_CPU_BIND_TYPE", "").strip().lower()
    if bind_type:
        return _slurm(environ, bind_type, cpus, local_size)
    return _divided(n, local_size, "no launcher binding seen")


def _divided(n: int, ranks: int, why: str, who: str = "the node's") -> ThreadChoice:
    threads = max(1, n // ranks)
    if ranks == 1:
        return ThreadChoice(threads, f"{why}: the task's {_cores(n)}, the only rank on its node")
    return ThreadChoice(
        threads, f"{why}: the task's {_cores(n)} shared by {who} {ranks} ranks -> {threads} each"
    )


def _own(n: int, how: str) -> ThreadChoice:
    return ThreadChoice(n, f"{how}: the task's own {_cores(n)}, not divided")


def _cores(n: int) -> str:
    return f"{n} CPU{'s' if n != 1 else ''}"


def _open_mpi(environ: Mapping, n: int, local_size: int) -> ThreadChoice:
    policy = environ.get("OMPI_MCA_hwloc_base_binding_policy", "").split(":")[0].strip().lower()
    if environ.get("OMPI_MCA_orte_bound_at_launch") != "1":
        return _divided(
            n, local_size, f"mpirun bound no CPUs{f' (--bind-to {policy})' if policy else ''}"
        )
    if policy in _OMPI_OWN:
        return _own(n, f"mpirun bound each rank (--bind-to {policy})")
    if (
        not policy
    ):  # mpirun(1) of Open MPI 4: "Bind to core: when the number of processes is <= 2"; else socket
        if int(environ.get("OMPI_COMM_WORLD_SIZE", "0") or 0) in (1, 2):
            return _own(n, "mpirun bound each rank to a core (its default for up to 2 processes)")
        return _divided(
            n,
            local_size,
            "mpirun bound the rank to a socket (its default for more than 2 processes) "
            "the node's ranks may share",
        )
    return _divided(
        n, local_size, f"mpirun bound the rank to a {policy} domain the node's ranks may share"
    )


def _slurm(environ: Mapping, bind_type: str, cpus: frozenset, local_size: int) -> ThreadChoice:
    n = len(cpus)
    if bind_type == "none":
        return _divided(n, local_size, "srun bound no CPUs (--cpu-bind=none)")
    kind = bind_type.rstrip(":")
    if kind in ("map_ldom", "mask_ldom"):
        return _numa(environ, kind, n, local_size)
    if kind not in ("mask_cpu", "map_cpu"):
        return _divided(
            n,
            local_size,
            f"SLURM_CPU_BIND_TYPE={bind_type} names a binding no task plugin "
            f"applied (it would be a mask_cpu: list)",
        )
    masks, local_id = _bind_list(environ, kind)
    if not masks:
        return _divided(
            n,
            local_size,
            f"SLURM_CPU_BIND_TYPE={bind_type} without a readable SLURM_CPU_BIND_LIST "
            f"and SLURM_LOCALID",
        )
    mine = masks[local_id % len(masks)]
    if mine != cpus:
        return _divided(
            n,
            local_size,
            f"SLURM's {kind} for local task {local_id} ({cpu_list(mine)}) is not this "
            f"process's affinity ({cpu_list(cpus)}): the variables describe another "
            f"process",
        )
    sharing = sum(1 for r in range(local_size) if masks[r % len(masks)] & mine)
    if sharing <= 1:
        return _own(n, f"srun bound each task ({kind} {cpu_list(mine)})")
    return _divided(
        n,
        sharing,
        f"srun bound local tasks to overlapping CPUs ({kind} {cpu_list(mine)})",
        who="its",
    )


def _bind_list(environ: Mapping, kind: str) -> tuple[list, int]:
    """SLURM_CPU_BIND_LIST's sets (CPUs, or NUMA nodes for the *_ldom kinds) and this task's SLURM_LOCALID;
    ([], -1) when either is missing or unreadable."""
    try:
        sets = [
            _cpu_set(kind, entry)
            for entry in environ.get("SLURM_CPU_BIND_LIST", "").split(",")
            if entry.strip()
        ]
        return sets, int(environ["SLURM_LOCALID"])
    except (KeyError, ValueError):
        return [], -1


def _numa(environ: Mapping, kind: str, n: int, local_size: int) -> ThreadChoice:
    """--cpu-bind=map_ldom:/mask_ldom: (a site's GPU-local NUMA domains): a task shares its domains with the
    local tasks given overlapping ones. The entries name NUMA nodes, not CPUs: nothing to hold the affinity to."""
    domains, local_id = _bind_list(environ, kind)
    if not domains:
        return _divided(
            n,
            local_size,
            f"SLURM_CPU_BIND_TYPE={kind}: without a readable SLURM_CPU_BIND_LIST and SLURM_LOCALID",
        )
    mine = domains[local_id % len(domains)]
    sharing = sum(1 for r in range(local_size) if domains[r % len(domains)] & mine)
    where = f"{kind} NUMA node(s) {cpu_list(mine)}"
    if sharing <= 1:
        return _own(n, f"srun bound each task ({where})")
    return _divided(
        n, sharing, f"srun bound local tasks to the same NUMA nodes ({where})", who="its"
    )


def _cpu_set(kind: str, entry: str) -> frozenset:
    """The members of one SLURM_CPU_BIND_LIST entry: a hex mask (mask_cpu, mask_ldom) or one number
    (map_cpu, map_ldom) of CPUs or NUMA nodes."""
    entry = entry.strip().lower()
    if kind.startswith("map_"):
        return frozenset([int(entry, 16) if entry.startswith("0x") else int(entry)])
    bits = int(entry, 16)
    return frozenset(i for i in range(bits.bit_length()) if bits >> i & 1)


def cpu_list(cpus) -> str:
    """A CPU set as lscpu and taskset write it: '0-3,8' for {0, 1, 2, 3, 8}."""
    out, run = [], []
    for c in sorted(cpus):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [c]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out) or "none"


# The binding slurm/env.sh gives srun: each local rank on CPUs of its GPU's NUMA domain.

# nvidia-smi separates the matrix's columns with tabs; a copy from a terminal has runs of spaces.
_COLUMNS = re.compile(r"\t| {2,}")


@dataclasses.dataclass(frozen=True)
class GpuAffinity:
    """One GPU's row of `nvidia-smi topo -m`: its CPU affinity as written ("0-55,112-167") and its
    NUMA node (None where nvidia-smi writes N/A or has no such column)."""

    cpus: str
    numa: int | None


def gpu_affinity(text: str) -> list[GpuAffinity]:
    """The GPUs of `nvidia-smi topo -m`'s matrix in its order (GPU0, GPU1, ...), each with its "CPU
    Affinity" and "NUMA Affinity". A GPU row has the header's columns, and X where it meets its own
    column; ValueError names the line that does not read so."""
    header, gpus = None, []
    for number, line in enumerate(text.splitlines(), 1):
        fields = [f.strip() for f in _COLUMNS.split(line) if f.strip()]
        if header is None:
            header = fields if "CPU Affinity" in fields else None
            continue
        if not fields or not re.fullmatch(r"GPU\d+", fields[0]):
            continue
        n = header.index("CPU Affinity")  # the devices' columns come first
        index = len(gpus)
        if (
            len(fields) != 1 + len(header)
            or fields[0] != f"GPU{index}"
            or header[index] != fields[0]
            or fields[1 + index] != "X"
        ):
            raise ValueError(
                f"line {number}: {fields[0]}'s row does not read as the matrix's GPU{index} "
                f"({len(fields) - 1} columns for the header's {len(header)},"
                " X where it meets itself)"
            )
        cpus = fields[1 + n]
        if not re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", cpus):
            raise ValueError(f"line {number}: {fields[0]} has no CPU affinity ({cpus!r})")
        numa = fields[2 + n] if "NUMA Affinity" in header else "N/A"
        gpus.append(GpuAffinity(cpus, int(numa) if numa.isdigit() else None))
    if not gpus:
        raise ValueError("no GPU row under a header with a 'CPU Affinity' column")
    return gpus


def _by_core(cpus: str) -> list[int]:
    """The CPUs of an affinity list with a core's hardware threads next to each other. Linux numbers
    the first thread of every core, then the second ones, so a domain reads as equal ranges, one per
    thread of a core ("0-55,112-167": CPUs 0 and 112 are one core's): taken in turn from each. Any
    other list keeps its order."""
    ranges = [
        range(int(a), int(b or a) + 1)
        for a, _, b in (part.partition("-") for part in cpus.split(","))
    ]
    if len(ranges) > 1 and len({len(r) for r in ranges}) == 1:
        return [c for threads in zip(*ranges, strict=True) for c in threads]
    return [c for r in ranges for c in r]


def gpu_local_masks(gpus: list[GpuAffinity], ranks: int, cpus_per_task: int) -> list[frozenset]:
    """The CPUs of local ranks 0..ranks-1, rank i next to GPU i: cpus_per_task of GPU i's affinity,
    whole cores first, none shared with another rank of that domain; fewer where the domain holds
    fewer than its ranks x cpus_per_task (each its share). ValueError when the node has fewer GPUs
    than ranks."""
    if ranks > len(gpus):
        raise ValueError(f"{ranks} local ranks, but nvidia-smi lists {len(gpus)} GPU(s)")
    domains: dict[str, list[int]] = {}
    for rank in range(ranks):
        domains.setdefault(gpus[rank].cpus, []).append(rank)
    masks: list[frozenset] = [frozenset()] * ranks
    for cpus, members in domains.items():
        order = _by_core(cpus)
        each = min(cpus_per_task, len(order) // len(members))
        if each < 1:
            raise ValueError(f"{len(members)} ranks share the {len(order)} CPU(s) {cpus}")
        for k, rank in enumerate(members):
            masks[rank] = frozenset(order[k * each : (k + 1) * each])
    if sum(map(len, masks)) != len(frozenset().union(*masks)):
        raise ValueError("GPUs of different CPU affinity lists share CPUs: no disjoint binding")
    return masks


def _main(argv: list[str]) -> int:
    """gpu-local RANKS CPUS_PER_TASK, `nvidia-smi topo -m` on stdin: the --cpu-bind value, then one
    line saying each NUMA domain's GPUs (local rank i uses GPU i) and the CPUs a rank of it gets."""
    if len(argv) != 3 or argv[0] != "gpu-local" or not all(a.isdigit() for a in argv[1:]):
        print(
            "usage: python -m common.parallel.binding gpu-local RANKS CPUS_PER_TASK < topology",
            file=sys.stderr,
        )
        return 2
    ranks, cpus_per_task = int(argv[1]), int(argv[2])
    try:
        gpus = gpu_affinity(sys.stdin.read())
        masks = gpu_local_masks(gpus, ranks, cpus_per_task)
    except ValueError as e:
        print(f"error: nvidia-smi topo -m: {e}", file=sys.stderr)
        return 1
    print("mask_cpu:" + ",".join(hex(sum(1 << c for c in m)) for m in masks))
    domains: dict[GpuAffinity, list[int]] = {}
    for rank in range(ranks):
        domains.setdefault(gpus[rank], []).append(rank)
    print(
        "; ".join(
            f"GPU {cpu_list(members)} (NUMA node {'?' if g.numa is None else g.numa},"
            f" CPUs {g.cpus}):"
            f" {_cores(len(masks[members[0]]))} a rank"
            for g, members in domains.items()
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
