"""What every task's input pipeline shares: which files a rank reads, the epochs and where a run
stands in them, whether a cache fits in memory, the last stage (batches prefetched to the device)
and dropping the input files from the page cache.
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
    """InputError unless n_samples is a multiple of size x batch_size x accumulation: every rank
    runs the same whole optimizer steps (or collectives deadlock), an epoch one exact pass."""
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
    """The `rank`-th of `size` disjoint shards of a seeded selection of `n_samples` files: each
    n_samples // size files with `even`, else the first n_samples % size ranks get one more."""
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


# Epoch e of a cached shard shuffles with seed * _SEED_STRIDE + e: distinct for every reachable
# (rank seed, epoch).
_SEED_STRIDE = 1_000_003


@dataclasses.dataclass(frozen=True)
class Position:
    """The next local batch a rank reads: batch `batch` (from 0) of epoch `epoch` (from 1)."""

    epoch: int = 1
    batch: int = 0


def batches_per_epoch(shard_size: int, local_batch_size: int, accumulation: int = 1) -> int:
    """Local batches one epoch uses: full batches of the shard, in whole accumulation groups (the
    rest is dropped, as the references' drop_last samplers)."""
    return shard_size // local_batch_size // accumulation * accumulation


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

    Every epoch reads the whole shard in a new order that depends on (seed, epoch) only, so a run
    resumed at `start` reads what an uninterrupted run would have.

    Args:
      files: the shard's paths, one sample per file.
      read: Dataset of paths -> Dataset of samples; or `read_batches`: Dataset of path batches
        -> Dataset of sample batches (then no cache and no transform).
      batch_size, n_batches: each epoch gives `n_batches` full batches of `batch_size`.
      seed: this rank's seed.
      cache: keep the samples in memory after a first pass in file order; epochs shuffle them.
      start: the first batch to give; those before it are skipped as file names or cached
        samples, before any read or transform.
      transform: a per-sample function applied after the cache (e.g. log1p).
      deterministic: read in order with several files in flight (needed for an exact resume).
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
            # A fixed graph seed: tf.data cannot compare a tensor seed with a graph seed of 0.
            tf.random.set_seed(_SEED_STRIDE)
            epoch_seed = tf.constant(seed, tf.int64) * _SEED_STRIDE + epoch
            ds = cached.shuffle(max(1, n_files), seed=epoch_seed, reshuffle_each_iteration=False)
            ds = ds.skip(skip * batch_size)
        else:
            keys = tf.random.stateless_uniform(
                [n_files], seed=tf.stack([tf.cast(seed, tf.int64), tf.cast(epoch, tf.int64)])
            )
            order = tf.gather(files, tf.argsort(keys))
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


CACHE_MEMORY_FRACTION = 0.5  # leave the rest to the framework, the model and the page cache


def fits_in_memory(nbytes: int, local_size: int) -> bool:
    """True if `nbytes` per rank, times the node's ranks, fits in half the available memory."""
    return nbytes * max(1, local_size) <= CACHE_MEMORY_FRACTION * psutil.virtual_memory().available


# The last stage copies batches to the device in tf.data's thread while the step before runs
# (docs/gpu.md#the-input-pipeline-on-a-gpu); one batch in its buffer overlaps copy and step.
DEVICE_BUFFER = 1


def target_device(setting: str, device: str) -> str:
    """Where the last stage prefetches batches to, by runtime.prefetch_to_device ('auto': on for a
    GPU, off for a CPU) and Distribution.device: '/gpu:0' (a rank's pinned GPU), '/cpu:0' ('on' on
    a CPU: the same stage, testable there) or 'off'."""
    if setting not in ("auto", "on", "off"):
        raise ValueError(f"prefetch_to_device must be auto, on or off, not {setting!r}")
    if setting == "off" or (setting == "auto" and device != "gpu"):
        return "off"
    return "/gpu:0" if device == "gpu" else "/cpu:0"


def host_options(threads: int) -> tf.data.Options:
    """Options for the whole host pipeline: tf.data's maps run on a private pool of `threads` (the
    rank's cores, the runtime's "input_threads"), not on one as large as the node's CPUs."""
    options = tf.data.Options()
    options.threading.private_threadpool_size = threads
    return options


def prefetch_to(dataset: tf.data.Dataset, target: str) -> tf.data.Dataset:
    """`dataset` with its batches prefetched to `target` (a target_device answer; 'off': as it is).
    Nothing may be applied after it."""
    if target == "off":
        return dataset
    return dataset.apply(tf.data.experimental.prefetch_to_device(target, buffer_size=DEVICE_BUFFER))


def drop_from_page_cache(paths) -> tuple[int, int]:
    """Evicts each file's cached pages (synced first, posix_fadvise DONTNEED: no root needed), so a
    timed run reads them cold (MLPerf's cache_clear); returns (files done, files not)."""
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
