"""Host buffers for input batches that a Python reader fills, reused instead of allocated per batch.

A reader inside `tf.numpy_function` that returns a fresh array costs a page fault
per 4 KiB page of it (a 768x1152x16 DeepCAM batch of 2 is 115 MB: 28,000 faults),
and TensorFlow then copies it unless it is aligned. Two properties of
tf.numpy_function make reuse safe and copy-free:

- it hands an ndarray to TensorFlow without a copy when the data is aligned to
  64 bytes (TensorFlow's allocator alignment); numpy's own large allocations are
  16-byte aligned, so they are copied;
- the tensor keeps a reference to that ndarray until the tensor is freed (after
  the train step that consumed the batch).

So an array whose only references are the pool's own is free to refill (its
memory's owner is checked too: a view of the array, which references the owner,
not the array, keeps it busy as well). The pool holds at most `max_buffers`
batches; beyond that (a consumer holding many batches) and for a short batch it
allocates unpooled ones, so a batch is never overwritten while in use.
"""

import sys
import threading

import numpy as np

ALIGNMENT = 64  # tensorflow::Allocator::kAllocatorAlignment


def aligned_empty(shape, dtype, alignment: int = ALIGNMENT) -> np.ndarray:
    """An uninitialized C-contiguous array whose data starts on an `alignment`-byte boundary."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + alignment, np.uint8)
    offset = (-raw.ctypes.data) % alignment
    return raw[offset : offset + nbytes].view(dtype).reshape(shape)


class BatchBuffers:
    """A pool of batch arrays (one per field), reused once TensorFlow has released them.

    Args:
      fields: (per-sample shape, dtype) of each array a batch holds, e.g. the fields and the labels.
      batch_size: samples per batch; `take(n)` with a smaller n (a partial last
        validation batch) gives unpooled arrays.
      max_buffers: batches pooled at most; size it as what can be alive at once
        (reads in flight + the dataset's buffers + the batch being consumed).
    """

    def __init__(self, fields, batch_size: int, max_buffers: int):
        self._fields = [(tuple(int(s) for s in shape), np.dtype(dtype)) for shape, dtype in fields]
        self._batch_size = int(batch_size)
        self._max_buffers = int(max_buffers)
        self._pool: list[list[np.ndarray]] = []
        self._lock = threading.Lock()
        # The references an idle pooled array and its memory's owner have, counted the same way
        # on an array kept as the pool keeps its own (a slot list).
        self._idle = _slot_refs([aligned_empty((1,), np.uint8)])[0]

    def take(self, n: int) -> tuple[np.ndarray, ...]:
        """Arrays for a batch of n samples, one per field, not referenced by anything else."""
        if not 0 < n <= self._batch_size:
            raise ValueError(f"a batch of {n} samples does not fit buffers of {self._batch_size}")
        if n < self._batch_size:
            return self._new(n)
        with self._lock:
            for slot in self._pool:
                if all(
                    now <= idle for refs in _slot_refs(slot) for now, idle in zip(refs, self._idle)
                ):
                    # The tuple returned references the arrays before the lock is released.
                    return tuple(slot)
            slot = self._new(n)
            if len(self._pool) < self._max_buffers:
                self._pool.append(list(slot))
            return slot

    def _new(self, n: int) -> tuple[np.ndarray, ...]:
        return tuple(aligned_empty((n, *shape), dtype) for shape, dtype in self._fields)

    @property
    def pooled(self) -> int:
        """Batches the pool holds now (for tests and benchmarks)."""
        return len(self._pool)


def _slot_refs(slot) -> list[tuple[int, int]]:
    """Reference counts of each array of a slot and of its memory's owner."""
    return [(sys.getrefcount(a), sys.getrefcount(a.base)) for a in slot]
