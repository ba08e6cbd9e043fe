"""How mpirun or srun bound a rank's CPUs, read from their variables: whether the rank's CPUs are
its own or shared by the node's ranks (common.cpu.intra_op_threads asks, for a launched rank only).
Standard library only. Each rule returns its ThreadChoice, or why the node's ranks may share the
rank's CPUs.
"""

from collections.abc import Mapping

from common.cpu import ThreadChoice, divided, own

# Open MPI's --bind-to levels that give each rank CPUs of its own.
_OMPI_OWN = ("core", "hwthread", "cpu")


def open_mpi(environ: Mapping, n: int) -> ThreadChoice | str:
    policy = environ.get("OMPI_MCA_hwloc_base_binding_policy", "").split(":")[0].strip().lower()
    if environ.get("OMPI_MCA_orte_bound_at_launch") != "1":
        return f"mpirun bound no CPUs{f' (--bind-to {policy})' if policy else ''}"
    if policy in _OMPI_OWN:
        return own(n, f"mpirun bound each rank (--bind-to {policy})")
    if policy:
        return f"mpirun bound the rank to a {policy} domain the node's ranks may share"
    # mpirun(1) of Open MPI 4 binds to a core for up to 2 processes, else to a socket.
    if int(environ.get("OMPI_COMM_WORLD_SIZE", "0") or 0) in (1, 2):
        return own(n, "mpirun bound each rank to a core (its default for up to 2 processes)")
    return (
        "mpirun bound the rank to a socket (its default for more than 2 processes) "
        "the node's ranks may share"
    )


def slurm(environ: Mapping, bind_type: str, cpus: frozenset, local_size: int) -> ThreadChoice | str:
    """srun's binding: masks or lists of CPUs (*_cpu) or of NUMA nodes (*_ldom), one per local task;
    a task shares its set with the local tasks whose sets overlap it."""
    n = len(cpus)
    if bind_type == "none":
        return "srun bound no CPUs (--cpu-bind=none)"
    kind = bind_type.rstrip(":")
    if kind not in ("mask_cpu", "map_cpu", "map_ldom", "mask_ldom"):
        return (
            f"SLURM_CPU_BIND_TYPE={bind_type} names a binding no task plugin "
            f"applied (it would be a mask_cpu: list)"
        )
    try:
        sets = [
            cpu_set(kind, entry)
            for entry in environ.get("SLURM_CPU_BIND_LIST", "").split(",")
            if entry.strip()
        ]
        local_id = int(environ["SLURM_LOCALID"])
    except (KeyError, ValueError):
        sets = []
    if not sets:
        return (
            f"SLURM_CPU_BIND_TYPE={bind_type} without a readable SLURM_CPU_BIND_LIST "
            f"and SLURM_LOCALID"
        )
    mine = sets[local_id % len(sets)]
    numa = kind.endswith("_ldom")  # NUMA nodes, not CPUs: nothing to hold the affinity to
    if not numa and mine != cpus:
        return (
            f"SLURM's {kind} for local task {local_id} ({cpu_list(mine)}) is not this "
            f"process's affinity ({cpu_list(cpus)}): the variables describe another process"
        )
    where = f"{kind} {'NUMA node(s) ' if numa else ''}{cpu_list(mine)}"
    sharing = sum(1 for r in range(local_size) if sets[r % len(sets)] & mine)
    if sharing <= 1:
        return own(n, f"srun bound each task ({where})")
    shared = "the same NUMA nodes" if numa else "overlapping CPUs"
    return divided(n, sharing, f"srun bound local tasks to {shared} ({where})", who="its")


def cpu_set(kind: str, entry: str) -> frozenset:
    """The members of one SLURM_CPU_BIND_LIST entry: a hex mask (mask_cpu, mask_ldom) or one number
    (map_cpu, map_ldom) of CPUs or NUMA nodes."""
    entry = entry.strip().lower()
    if kind.startswith("map_"):
        return frozenset([int(entry, 16) if entry.startswith("0x") else int(entry)])
    bits = int(entry, 16)
    return frozenset(i for i in range(bits.bit_length()) if bits >> i & 1)


def cpu_list(cpus) -> str:
    """A CPU set as lscpu and taskset write it: '0-3,8' for {0, 1, 2, 3, 8}."""
    runs = []  # [first, last] of each run of consecutive CPUs
    for c in sorted(cpus):
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in runs) or "none"
