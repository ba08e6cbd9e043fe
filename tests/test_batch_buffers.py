"""Reused batch buffers (common.inputs.pipeline): refilled only once nothing else holds them."""

import numpy as np
import pytest
import tensorflow as tf

from deepcam.data import ALIGNMENT, BatchBuffers, aligned_empty


def _address(a) -> int:
    return a.ctypes.data


@pytest.mark.parametrize(
    "shape, dtype", [((3, 5), np.float32), ((7,), np.uint8), ((2, 1, 3), np.int16)]
)
def test_aligned_empty_is_aligned_and_contiguous(shape, dtype):
    for _ in range(5):
        a = aligned_empty(shape, dtype)
        assert a.shape == shape and a.dtype == dtype and a.flags.c_contiguous
        assert _address(a) % ALIGNMENT == 0


def test_a_buffer_is_reused_only_when_nothing_else_holds_it():
    pool = BatchBuffers([((4,), np.float32), ((2,), np.uint8)], batch_size=2, max_buffers=3)
    x, y = pool.take(2)
    first = _address(x)
    del x, y
    x1, y1 = pool.take(2)
    assert _address(x1) == first and pool.pooled == 1  # released: reused
    x2, y2 = pool.take(2)
    assert _address(x2) != first and pool.pooled == 2  # x1 held: a new one
    del y2
    x3, _ = pool.take(2)
    assert _address(x3) not in (first, _address(x2))  # x2 alone still held: its batch stays busy
    view = x1[1:]
    del x1, y1
    x4, _ = pool.take(2)
    assert _address(x4) not in (
        first,
        _address(x2),
        _address(x3),
    )  # a view of x1 keeps x1's batch busy
    assert pool.pooled == 3
    del view
    x5, _ = pool.take(2)
    assert _address(x5) == first


def test_beyond_the_cap_and_for_short_batches_buffers_are_not_pooled():
    pool = BatchBuffers([((3,), np.float32)], batch_size=4, max_buffers=1)
    held = [pool.take(4)[0] for _ in range(3)]
    assert pool.pooled == 1 and len({_address(a) for a in held}) == 3
    short = pool.take(1)[0]
    assert short.shape == (1, 3) and pool.pooled == 1
    with pytest.raises(ValueError, match="does not fit"):
        pool.take(5)


def test_tensors_from_numpy_function_keep_their_buffer_until_freed():
    # tf.numpy_function takes an aligned array without a copy and references it while the tensor
    # lives: held batches keep their values however many batches are read after them.
    pool = BatchBuffers([((1000,), np.float32)], batch_size=2, max_buffers=4)

    def fill(i):
        (x,) = pool.take(2)
        x[...] = i
        return x

    ds = tf.data.Dataset.range(8).map(
        lambda i: tf.ensure_shape(
            tf.numpy_function(fill, [i], tf.float32, stateful=False), (2, 1000)
        )
    )
    held = list(ds)
    for i, x in enumerate(held):
        assert np.all(x.numpy() == i)
    pooled = {
        _address(np.asarray(x)) for x in held[:4]
    }  # the first four batches: the pool's buffers
    assert pool.pooled == 4 and len({_address(np.asarray(x)) for x in held}) == 8
    del held
    # TensorFlow drops its references to numpy_function arrays under the GIL, at its next
    # numpy_function call: one here, so the pass below starts with the pool released.
    tf.numpy_function(lambda: np.int32(0), [], tf.int32)
    # Released by the consumer, the pooled buffers themselves come back: no copy, no new memory.
    # How many batches find one free depends on how far tf.data reads ahead and when TensorFlow
    # drops its reference (at its next numpy_function call), which a loaded machine changes: at
    # least one must, and every batch keeps its own values.
    reused = 0
    for i, x in enumerate(ds):
        assert np.all(x.numpy() == i)
        reused += _address(np.asarray(x)) in pooled
        del x
    assert reused >= 1, "no batch of the second pass got a released buffer back"
