"""A sweep of single eager Horovod allreduces, each timed end to end, printed in the columns of
nccl-tests' all_reduce_perf.

For each size every rank allreduces (sum) a float32 tensor of that many bytes, a few untimed times,
then `iterations` times back to back, each call completing before the next (Horovod's eager
allreduce returns once its collective is done); the time of a size is the slowest rank's mean.
  algorithm bandwidth  algbw = bytes / time
  bus bandwidth        busbw = algbw x 2(n-1)/n     (nccl-tests' factor for allreduce, n ranks)
busbw is what each rank's link carries in a ring allreduce of that time. One allreduce's time is all
of Horovod's path: the eager call, the wait for its background thread's next cycle
(HOROVOD_CYCLE_TIME), the negotiation between the ranks over its controller (MPI or Gloo), the
reduction itself (NCCL on GPUs built with it, else Gloo or MPI) and the return to TensorFlow; with
one tensor a cycle, no fusion buffer. It is not bare NCCL, which nccl-tests' all_reduce_perf times.
"""

import dataclasses
import re
import time

from common.errors import InputError

DEFAULT_SIZES = (8, 64, 512, 4 << 10, 32 << 10, 256 << 10, 2 << 20, 16 << 20, 64 << 20)
ELEMENT_BYTES = 4  # float32
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


@dataclasses.dataclass(frozen=True)
class SweepRow:
    """One size of the sweep (seconds per allreduce; bandwidths in bytes/s)."""

    size_bytes: int
    count: int
    seconds: float
    algbw: float
    busbw: float


def parse_sizes(text: str) -> tuple[int, ...]:
    """'8,64K,1M' -> (8, 65536, 1048576): byte counts (K, M, G: powers of 1024), multiples of 4 from 4 up."""
    sizes = []
    for word in (w.strip() for w in text.split(",") if w.strip()):
        match = re.fullmatch(r"(\d+)\s*([KMG]?)(?:i?B)?", word, re.IGNORECASE)
        if not match:
            raise InputError(f"--sweep-sizes takes sizes such as 8,64K,1M, got {word!r}")
        size = int(match[1]) * _UNITS[match[2].upper()]
        if size < ELEMENT_BYTES or size % ELEMENT_BYTES:
            raise InputError(
                f"--sweep-sizes: {word} is not a whole number of float32 elements (4 bytes each)"
            )
        sizes.append(size)
    if not sizes:
        raise InputError(f"--sweep-sizes names no size: {text!r}")
    return tuple(sizes)


def bandwidths(size_bytes: int, seconds: float, ranks: int) -> SweepRow:
    """The row, in nccl-tests' columns, of one allreduce of `size_bytes` over `ranks` ranks taking `seconds`."""
    algbw = size_bytes / seconds if seconds > 0 else 0.0
    return SweepRow(
        size_bytes=size_bytes,
        count=size_bytes // ELEMENT_BYTES,
        seconds=seconds,
        algbw=algbw,
        busbw=algbw * 2 * (ranks - 1) / ranks,
    )


def run_sweep(dist, sizes, iterations: int, warmup: int = 2) -> list[SweepRow]:
    """Every size's row (a collective: every rank, the same sizes in the same order). [] on one rank."""
    import tensorflow as tf

    if dist.size == 1:
        return []
    group = dist.rank_group(dist.size)  # all ranks: Horovod's global process set, no registration
    rows = []
    for size in sizes:
        tensor = tf.ones([size // ELEMENT_BYTES], tf.float32)
        for _ in range(warmup):
            out = group.sum(tensor)
        out[:1].numpy()
        start = time.perf_counter()
        for _ in range(iterations):
            out = group.sum(tensor)
        out[:1].numpy()
        mine = (time.perf_counter() - start) / iterations
        rows.append(bandwidths(size, float(dist.allreduce_max([mine])[0]), dist.size))
    return rows


def sweep_table(rows: list[SweepRow], title: str) -> str:
    """The rows in all_reduce_perf's columns: size (B), count, type, redop, time (us), algbw, busbw (GB/s)."""
    lines = [
        title,
        f"{'size (B)':>12} {'count':>12} {'type':>7} {'redop':>6} {'time (us)':>11} "
        f"{'algbw (GB/s)':>13} {'busbw (GB/s)':>13}",
    ]
    for r in rows:
        lines.append(
            f"{r.size_bytes:>12} {r.count:>12} {'float':>7} {'sum':>6} {r.seconds * 1e6:>11.1f} "
            f"{r.algbw / 1e9:>13.3f} {r.busbw / 1e9:>13.3f}"
        )
    return "\n".join(lines)
