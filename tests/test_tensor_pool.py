"""The input cache's share of TensorFlow's CPU tensor pool, written before run_start
(common.run.tensor_pool): a cache filled after it takes pages already backed, not new ones."""

import json
import os
import subprocess
import sys

import pytest

from common.run import tensor_pool
from tests import helpers

# A cache of 256 samples of 256 KiB (the size from which oneDNN's allocator takes tensors from its
# pool), each made by a TensorFlow op, as CosmoFlow's decoded samples are.
FILL = """
import json, mmap, sys
import common   # oneDNN on, as in training
import tensorflow as tf
from common.run import tensor_pool

N, SIZE = 256, 1 << 18
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * mmap.PAGESIZE
def samples(n):
    return tf.data.Dataset.range(n).map(lambda i: tf.fill([SIZE], tf.cast(i, tf.uint8)))
for _ in samples(4):   # tf.data's threads and the op's kernel made outside the counts
    pass
before = rss()
reservation = tensor_pool.reserve_for_cache(N * SIZE if sys.argv[1] == "reserve" else 0, 0, 1)
written = rss() - before
cache = samples(N).cache()
before = rss()
for _ in cache:
    pass
print(json.dumps({"written": written, "fill_growth": rss() - before, "reserved": reservation.bytes,
                  "skipped": reservation.skipped}))
"""
CACHE_BYTES = 256 << 18


def _fill(mode: str, onednn: str = "1") -> dict:
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": onednn, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run([sys.executable, "-c", FILL, mode], capture_output=True, text=True, env=env,
                          cwd=helpers.REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mode", ["reserve", "none"], ids=["written before", "not written (control)"])
def test_a_cache_filled_after_the_reservation_takes_pages_already_backed(mode):
    got = _fill(mode)
    if mode == "reserve":
        assert got["reserved"] == CACHE_BYTES and got["written"] >= 0.9 * CACHE_BYTES
        assert got["fill_growth"] < 0.2 * CACHE_BYTES, got
    else:
        # The control: the same fill backs new pages for its whole size.
        assert got["reserved"] == 0 and got["fill_growth"] > 0.8 * CACHE_BYTES, got


def test_nothing_is_written_where_the_allocator_gives_memory_back():
    # oneDNN off: TensorFlow's CPU allocator is malloc's, which returns large buffers on free.
    got = _fill("reserve", onednn="0")
    assert got["reserved"] == 0 and "not a pool" in got["skipped"]
    assert got["written"] < 0.2 * CACHE_BYTES


def test_a_cache_too_large_for_memory_is_not_written(monkeypatch):
    monkeypatch.setattr(tensor_pool, "is_pool", lambda: True)
    got = tensor_pool.reserve_for_cache(1 << 50, 1 << 20, 1)
    assert got.bytes == 0 and "exceed" in got.skipped
    assert tensor_pool.reserve_for_cache(0, 1 << 20, 1) == tensor_pool.Reservation()   # no cache


@pytest.mark.parametrize("nbytes", [1, 1 << 20, (1 << 20) + 1, 5 << 30])
def test_the_written_block_covers_the_bytes_in_dimensions_below_2_to_the_31(nbytes):
    rows, row = tensor_pool.block_shape(nbytes)
    assert nbytes <= rows * row < nbytes + row
    assert max(rows, row) < 2**31
