"""What every task's input pipeline shares: which files a rank reads, what an epoch is and where a
run stands in the data order, whether a cache fits in memory,
the pipeline's last stage (batches copied to the device), and dropping the input files from the
page cache before a timed run.
"""

import dataclasses
import os
from pathlib import Path

import numpy as np
import psutil
import tensorflow as tf

from common.errors import InputError


def list_files(directory, suffixes) -> list[str]:
    """Sorted files in `directory` whose names end with one of `suffixes`."""
    d = Path(directory)
    if not d.is_dir():
        raise InputError(f"data directory not found: {d}")
    files = sorted(str(p) for p in d.iterdir() if p.is_file() and p.name.endswith(tuple(suffixes)))
    if not files:
        raise InputError(f"no {'/'.join(suffixes)} files in data directory {d}")
    return files


def check_divisible(
    n_samples: int, size: int, batch_size: int, key: str, accumulation: int = 1
) -> None:
    """Every rank must run the same number of whole optimizer steps, or collectives deadlock;
    and an epoch must be one exact pass (CosmoFlow's reference divides n_train evenly)."""
    per_step = size * batch_size * accumulation
    if n_samples <= 0 or n_samples % per_step:
        factors = f"ranks x local batch{' x accumulation' if accumulation > 1 else ''}"
        values = f"{size} x {batch_size}{f' x {accumulation}' if accumulation > 1 else ''}"
        raise InputError(
            f"{key}={n_samples} is not divisible by {factors} = {values} = {per_step}; "
            f"use a multiple of {per_step}"
        )


def select_and_shard(
    files, n_samples: int, rank: int, size: int, seed: int, key: str, even: bool = True
) -> list[str]:
    """The `rank`-th of `size` disjoint shards of a seeded selection of `n_samples` files.

    With `even`, every shard has n_samples // size files (the caller checks divisibility);
    otherwise the first n_samples % size ranks get one file more (for a single evaluation
    pass, where ranks need not run in lockstep).
    """
    if n_samples > len(files):
        raise InputError(
            f"{key}={n_samples} but only {len(files)} files were found "
            f"in {Path(files[0]).parent if files else 'the data directory'}"
        )
    order = np.random.default_rng(seed).permutation(len(files))[:n_samples]
    selected = [files[i] for i in order]
    per_rank = n_samples // size
    if even:
        return selected[rank * per_rank : (rank + 1) * per_rank]
    extra = n_samples % size
    start = rank * per_rank + min(rank, extra)
    return selected[start : start + per_rank + (1 if rank < extra else 0)]


# What one epoch is, and where in the data order a run stands.
#
# An epoch is one pass over each rank's shard in whole optimizer steps. As the
# references' samplers (drop_last), the last partial local batch of a pass is
# dropped, and so are the batches short of a whole gradient-accumulation group;
# the next epoch is a new, reshuffled pass. Every rank has a shard of the same
# size (above), so every rank runs the same number of steps.
#
# The order of epoch e is a function of (seed, e) alone, not of how many
# iterators came before, so a run resumed at (epoch, batch) reads exactly the
# batches an uninterrupted run would have read next (`Position`).

# Epoch e shuffles with seed seed * _SEED_STRIDE + e: distinct seeds for every
# (rank seed, epoch) pair that a run can reach.
_SEED_STRIDE = 1_000_003


@dataclasses.dataclass(frozen=True)
class Position:
    """The next local batch a rank reads: batch `batch` (from 0) of epoch `epoch` (from 1)."""

    epoch: int = 1
    batch: int = 0


def batches_per_epoch(shard_size: int, local_batch_size: int, accumulation: int = 1) -> int:
    """Local batches one epoch uses: full batches of the shard, in whole accumulation groups."""
    return shard_size // local_batch_size // accumulation * accumulation


def permutation(n: int, seed: int, epoch) -> tf.Tensor:
    """Epoch `epoch`'s order of n samples: a stateless function of (seed, epoch)."""
    keys = tf.random.stateless_uniform(
        [n], seed=tf.stack([tf.cast(seed, tf.int64), tf.cast(epoch, tf.int64)])
    )
    return tf.argsort(keys)


def training_dataset(
    files,
    read=None,
    *,
    batch_size: int,
    n_batches: int,
    seed: int,
    cache: bool = False,
    start: Position = Position(),
    transform=None,
    deterministic: bool = True,
    read_batches=None,
) -> tf.data.Dataset:
    """Endless training batches of one rank's shard, epoch after epoch, from `start`.

    Every epoch reads the whole shard in a new random order (a full shuffle,
    as the references' samplers), which depends on (seed, epoch) only.

    Args:
      files: the shard's paths, one sample per file.
      read: tf.data.Dataset of paths -> Dataset of samples (the benchmark's reader).
      read_batches: instead of `read`, Dataset of path batches [batch_size] -> Dataset
        of sample batches: a reader that fills a whole batch at once (no cache, no transform).
      batch_size: local batch; each epoch gives `n_batches` full batches.
      seed: this rank's seed.
      cache: read the shard once in file order and keep the samples in memory;
        each epoch then shuffles the cached samples.
      start: the first batch to give; the batches before it are skipped where
        skipping is cheap (file names, cached samples), before any reading or transform.
      transform: a per-sample function applied after the cache (e.g. log1p).
      deterministic: read in order even when several files are in flight (needed
        for an exact resume); False takes whichever file is read first.
    """
    if (read is None) == (read_batches is None) or (
        read_batches is not None and (cache or transform)
    ):
        raise ValueError("give either read, or read_batches without cache and transform")
    files = tf.constant([str(f) for f in files], dtype=tf.string)
    n_files = int(files.shape[0])
    options = tf.data.Options()
    options.deterministic = deterministic
    cached = read(tf.data.Dataset.from_tensor_slices(files)).cache() if cache else None

    def one_epoch(epoch):
        skip = tf.where(epoch == start.epoch, tf.constant(start.batch, tf.int64), 0)
        if cached is not None:
            # tf.data's shuffle with a seed that is a tensor: the graph seed of this
            # function is fixed here because the framework's seed logic cannot
            # compare a tensor seed with a graph seed of 0 (a run's --seed 0).
            tf.random.set_seed(_SEED_STRIDE)
            epoch_seed = tf.constant(seed, tf.int64) * _SEED_STRIDE + epoch
            # A full buffer: every sample is in memory already, and the cache is
            # complete once the first epoch's buffer is filled.
            ds = cached.shuffle(max(1, n_files), seed=epoch_seed, reshuffle_each_iteration=False)
            ds = ds.skip(skip * batch_size)
        else:
            order = tf.gather(files, permutation(n_files, seed, epoch))
            paths = tf.data.Dataset.from_tensor_slices(order).skip(skip * batch_size)
            if read_batches is not None:
                return read_batches(
                    paths.batch(batch_size, drop_remainder=True).take(n_batches - skip)
                )
            ds = read(paths)
        if transform is not None:
            ds = ds.map(transform, num_parallel_calls=tf.data.AUTOTUNE)
        return ds.batch(batch_size, drop_remainder=True).take(n_batches - skip)

    ds = tf.data.Dataset.range(start.epoch, 2**62).flat_map(one_epoch)
    return ds.with_options(options)


# Whether a cache fits in this node's memory.

CACHE_MEMORY_FRACTION = 0.5  # leave the rest to the framework, the model and the page cache


def fits_in_memory(nbytes: int, local_size: int) -> bool:
    """True if `nbytes` per rank, times the node's ranks, fits in half the available memory."""
    return nbytes * max(1, local_size) <= CACHE_MEMORY_FRACTION * psutil.virtual_memory().available


# The input pipeline's last stage: batches copied to the device ahead of the step that takes them.
#
# Without it, every train step starts by copying its batch from host memory to the GPU
# (a CosmoFlow local batch of 4 is 64 MiB of int16, a DeepCAM batch of 2 is 115 MB), while
# the GPU waits. `tf.data.experimental.prefetch_to_device` (in TF 2.x: copy_to_device, then
# a prefetch buffer on the device) makes the copy in tf.data's own thread instead, while the
# step before runs. What travels is what the pipeline yields, the compact batches (int16
# counts; float32 fields and uint8 labels): casts and normalization run inside the compiled
# step (Task.preprocess_batch), on the device.
#
# It must be the last transformation: the host pipeline behind it keeps its own options,
# optimizations and autotuning (its iterator is made on the host, where TensorFlow finalizes
# it), and the device side holds only the copy and its buffer. In eager mode the prefetch
# and the iterator of `iter(dataset)` are colocated with the copy, so `next()` from a Python
# loop returns tensors already on the device, which the tf.function steps take as they are.

# Batches held on the device beyond the one a step is using: the copy of the next batch
# overlaps the current step (a copy takes milliseconds, a step hundreds); each more batch
# costs device memory and gains nothing once one is always ready.
DEVICE_BUFFER = 1

OFF = "off"


def target_device(setting: str, device: str) -> str:
    """Where the last stage prefetches batches to: '/gpu:0', '/cpu:0', or 'off' (they stay in host memory).

    Args:
      setting: runtime.prefetch_to_device: 'auto' (on for a GPU, off for a CPU), 'on' or 'off'.
      device: the device kind this rank computes on ('gpu' or 'cpu', Distribution.device).
        A rank's GPU is '/gpu:0', the only one visible to it once pinned (common.parallel.distribution).
        'on' on a CPU prefetches to '/cpu:0': no copy, the same stage, so it can be tested there.
    """
    if setting not in ("auto", "on", "off"):
        raise ValueError(f"prefetch_to_device must be auto, on or off, not {setting!r}")
    if setting == "off" or (setting == "auto" and device != "gpu"):
        return OFF
    return "/gpu:0" if device == "gpu" else "/cpu:0"


def host_options(threads: int) -> tf.data.Options:
    """Options for the whole host pipeline, given last before the stage: tf.data's thread pool.

    Args:
      threads: the rank's cores (common.cpu's rule: its CPUs, divided among the
        node's ranks where they share them; the runtime's "input_threads").
    """
    options = tf.data.Options()
    # tf.data's maps and interleaves run on a private pool of the rank's cores: not on a pool
    # TensorFlow sizes itself, which ran at most as many calls at once as the process has CPUs
    # whatever runtime.inter_op_threads (TF 2.21; tests/test_device_prefetch.py), i.e. the whole
    # node's on a rank no launcher bound.
    options.threading.private_threadpool_size = threads
    return options


def prefetch_to(dataset: tf.data.Dataset, target: str) -> tf.data.Dataset:
    """`dataset` with its batches prefetched to `target` (a target_device answer; 'off': as it is).

    Nothing may be applied after it (prefetch_to_device must be the last transformation).
    """
    if target == OFF:
        return dataset
    return dataset.apply(tf.data.experimental.prefetch_to_device(target, buffer_size=DEVICE_BUFFER))


# Dropping input files from the OS page cache, so that a timed run reads them cold.
#
# MLPerf logs `cache_clear`: whether caches were cleared before the run. Dropping
# the whole page cache needs root (/proc/sys/vm/drop_caches); what a rank can do
# is tell the kernel it will not need the pages of the files it is about to
# read (posix_fadvise DONTNEED), after flushing any it wrote itself (staging).


def drop_from_page_cache(paths) -> tuple[int, int]:
    """Evicts each file's cached pages; returns (files done, files that could not be).

    Dirty pages (a file just staged) cannot be dropped, so each file is synced
    first. A file system without page cache (some parallel file systems) ignores
    the advice, which is harmless.
    """
    done = failed = 0
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            failed += 1
            continue
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            done += 1
        except OSError:
            failed += 1
        finally:
            os.close(fd)
    return done, failed
