"""The NUMA-local binding slurm/env.sh gives srun: each local rank on CPUs of its GPU's NUMA domain.

`python -m common.parallel.gpu_binding gpu-local RANKS CPUS_PER_TASK < topology`: slurm/env.sh, when
CPU_BIND is not given and the node has nvidia-smi, reads each GPU's "CPU Affinity" and "NUMA
Affinity" from `nvidia-smi topo -m` and gives srun --cpu-bind=mask_cpu:M0,M1,...: local rank i
(which uses GPU i, common/parallel/gpus.py) gets CPUS_PER_TASK CPUs of GPU i's NUMA domain, whole
cores first, no CPU shared with another rank of that domain (fewer each where the domain holds fewer
than its ranks x CPUS_PER_TASK). srun's --cpu-bind=cores alone follows SLURM's default distribution,
block:cyclic, which deals consecutive tasks to alternating sockets: local rank 1 of a DGX H100 lands
on socket 1 while GPU 1 hangs off socket 0, as does about half of the ranks. A mask per task is
srun's own mechanism (no numactl on the node or in the image), SLURM exports what it applied
(common/cpu.py reads it), and memory follows the CPUs: Linux places a page on the NUMA
node of the CPU that first touches it. SLURM cuts a task's mask to the CPUs its step holds
(task/affinity: "Ignoring user CPU binding outside of job step allocation"), so the masks are whole
only where the job holds the whole node: the sbatch scripts ask for --exclusive.

Standard library only (slurm/env.sh runs it before any rank starts); not imported by a run.
"""

import dataclasses
import re
import sys

from common.cpu import cores_text
from common.parallel.cpu_binding import cpu_list

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
            "usage: python -m common.parallel.gpu_binding gpu-local RANKS CPUS_PER_TASK < topology",
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
            f" {cores_text(len(masks[members[0]]))} a rank"
            for g, members in domains.items()
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
