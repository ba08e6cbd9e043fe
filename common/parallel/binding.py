"""How a rank is bound to CPUs: the intra-op threads a rank takes from its own CPU affinity
(the NUMA-local binding slurm/env.sh gives srun is common/parallel/gpu_binding.py).

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
with os.environ, os.sched_getaffinity(0) and Horovod's local size).
"""

import dataclasses
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
