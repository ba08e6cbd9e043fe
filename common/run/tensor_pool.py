"""The input cache's share of TensorFlow's CPU tensor pool, written once before run_start.

With oneDNN on (common.cpu turns it on for x86-64), TensorFlow takes CPU tensors of 256 KiB and
more from a BFC pool: regions mapped as they are needed, each twice the last, never given back.
The kernel backs a region's pages only when they are first written, a page fault each (a zeroed
4 KiB page: 3.7 us on the 2-core AMD EPYC VM of bench/results, 19 ms for 20 MiB). An in-memory
input cache fills the pool with the shard's samples after run_start, and it takes the chunks
where warm-up had left the train step's working set: on `make run`'s config the first timed step
then ran on about 5,000 pages never written and took 1.3-2.1x the median step, and the cache's
own fill faulted its 1.1 GiB in the timed region (docs/gpu.md).

So before run_start the cache's size plus twice the step's working set (the pool's peak during
warm-up: weights, slots and the step's tensors) is allocated, written and freed: the pool keeps those regions, and the cache and the step then
land on pages already backed. The memory is mostly what the cache takes anyway: on `make run`'s
config the peak RSS was 2.01 GB against 1.96 GB without the write, reached before run_start
instead of during the first epoch. Nothing is done when
there is no cache, or when the CPU allocator is not a pool (oneDNN off without
TF_CPU_ALLOCATOR_USE_BFC: large buffers go back to the system when freed).
"""

import dataclasses
import os
import time

import tensorflow as tf

from common import cpu
from common.inputs.memory import fits_in_memory


@dataclasses.dataclass(frozen=True)
class Reservation:
    bytes: int = 0            # written and freed, kept by the pool
    cache_bytes: int = 0
    working_set_bytes: int = 0
    seconds: float = 0.0
    skipped: str = ""         # why nothing was written although a cache is on


def is_pool() -> bool:
    """Whether TensorFlow's CPU allocator keeps freed regions (oneDNN's allocator, or BFC by request)."""
    if os.environ.get("TF_CPU_ALLOCATOR_USE_BFC", "").lower() in ("1", "true"):
        return True
    return bool(cpu.onednn_enabled())


def reset_peak() -> None:
    """Starts the pool's peak count afresh (a no-op where the allocator keeps no statistics)."""
    try:
        tf.config.experimental.reset_memory_stats("CPU:0")
    except ValueError:
        pass


def peak_bytes() -> int:
    """The most bytes the pool has held at once since reset_peak; 0 where it keeps no statistics."""
    try:
        return int(tf.config.experimental.get_memory_info("CPU:0")["peak"])
    except ValueError:
        return 0


def write_pages(nbytes: int) -> None:
    """Allocates `nbytes` from the CPU allocator as one tensor, writes every byte, frees it.

    One tensor, so one region of the pool (BFC carves a free chunk from its start, and takes the
    smallest free chunk that fits): the cache's samples and then the step fill it from its start,
    over pages written here. Smaller pieces would be separate regions, and the allocator could
    place the cache in the one written least (seen: 1 GiB + 146 MiB, the first step still faulted
    5,800 pages)."""
    # Eager ops on the CPU run as they are called: the bytes are written before fill returns.
    block = tf.fill(tf.constant(block_shape(nbytes), tf.int64), tf.constant(1, tf.uint8))
    del block


def block_shape(nbytes: int) -> tuple[int, int]:
    """[rows, 1 MiB] covering `nbytes`: a shape given as one Python int past 2**31 - 1 is taken
    as int32 and wraps (seen with tf.raw_ops.Empty: an 8 GiB request became an empty tensor)."""
    row = 1 << 20
    return (-(-nbytes // row), row)


def reserve_for_cache(cache_bytes: int, working_set_bytes: int, local_size: int) -> Reservation:
    """Writes the cache's bytes plus the step's working set once, before run_start, where the
    allocator is a pool and the total fits in memory as the cache's decision counts it."""
    if cache_bytes <= 0:
        return Reservation()
    # Twice the working set: the pipeline's batches in flight beside the cache at the first step,
    # and the step's chunks placed around them, need room past the cache's end.
    total = cache_bytes + 2 * working_set_bytes
    if not is_pool():
        return Reservation(cache_bytes=cache_bytes, working_set_bytes=working_set_bytes,
                           skipped="TensorFlow's CPU allocator is not a pool (oneDNN off)")
    if not fits_in_memory(total, local_size):
        return Reservation(cache_bytes=cache_bytes, working_set_bytes=working_set_bytes,
                           skipped="the cache and the step's working set exceed the memory a cache may take")
    start = time.perf_counter()
    write_pages(total)
    return Reservation(total, cache_bytes, working_set_bytes, time.perf_counter() - start)
