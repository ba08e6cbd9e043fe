"""What each rank got (device, GPU, CPUs, threads), gathered to every rank, and the checks made on it."""

import dataclasses

from common import cpu
from common.parallel import gpus
from common.parallel.cpu_binding import cpu_list


@dataclasses.dataclass(frozen=True)
class RankFacts:
    """One rank as the preflight reports it.

    Attributes:
      rank, host, local_rank: who.
      device: 'gpu' or 'cpu', as Distribution._pin_device settled it.
      gpu_uuid: the NVML UUID of the GPU it uses ('' when none or no NVML).
      nvml_gpus: GPUs NVML shows it (CUDA_VISIBLE_DEVICES applied); -1 without NVML.
      tf_gpus: GPUs TensorFlow sees (what training will use).
      cpus: its CPU affinity, as taskset writes it ('0-3,8').
      intra_op_threads, inter_op_threads: TensorFlow's pools as the run's runtime config set them.
      threads_note: the rule that chose the threads (and anything else the runtime said of them).
    """

    rank: int
    host: str
    local_rank: int
    device: str
    gpu_uuid: str
    nvml_gpus: int
    tf_gpus: int
    cpus: str
    intra_op_threads: int
    inter_op_threads: int
    threads_note: str


def this_rank(dist, runtime: dict, tf_gpus: int) -> RankFacts:
    """This rank's facts, after common.runtime.configure returned `runtime` (Distribution._pin_device set dist.gpu)."""
    seen = gpus.visible_uuids()
    return RankFacts(
        rank=dist.rank,
        host=dist.hostname,
        local_rank=dist.local_rank,
        device=runtime["device"],
        gpu_uuid=(dist.gpu.uuid if dist.gpu else None) or "",
        nvml_gpus=-1 if seen is None else len(seen),
        tf_gpus=tf_gpus,
        cpus=cpu_list(cpu.affinity()),
        intra_op_threads=runtime["intra_op_threads"],
        inter_op_threads=runtime["inter_op_threads"],
        threads_note=runtime["threads_note"],
    )


def facts_table(facts: list[RankFacts]) -> str:
    """One line per rank, then each rank's thread rule."""
    lines = [
        f"{'rank':>4} {'host':<16} {'local':>5} {'device':<6} {'GPU (NVML UUID)':<42} {'NVML':>4} {'TF':>3} "
        f"{'CPUs':<16} {'threads':>7}"
    ]
    for f in facts:
        nvml = "-" if f.nvml_gpus < 0 else str(f.nvml_gpus)
        lines.append(
            f"{f.rank:>4} {f.host:<16} {f.local_rank:>5} {f.device:<6} {f.gpu_uuid or '-':<42} {nvml:>4} "
            f"{f.tf_gpus:>3} {f.cpus:<16} {f.intra_op_threads:>3}/{f.inter_op_threads:<3}"
        )
    lines.append(
        "NVML, TF: GPUs the rank sees through NVML ('-': no NVML) and through TensorFlow; "
        "threads: intra-op/inter-op"
    )
    lines += [f"rank {f.rank}: {f.threads_note}" for f in facts]
    return "\n".join(lines)


def too_few_gpus(facts: list[RankFacts], expected: int | None) -> str | None:
    """The `error:` text when --expect-gpus N is given and a rank's TensorFlow sees fewer; else None."""
    if expected is None:
        return None
    short = [f for f in facts if f.tf_gpus < expected]
    if not short:
        return None
    seen = sorted({f.tf_gpus for f in short})
    return (
        f"--expect-gpus {expected}: rank(s) {', '.join(str(f.rank) for f in short)} see "
        f"{'/'.join(map(str, seen))} GPU(s) through TensorFlow (on {', '.join(sorted({f.host for f in short}))})"
    )
