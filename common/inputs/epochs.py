"""What one epoch is, and where in the data order a run stands.

An epoch is one pass over each rank's shard in whole optimizer steps. As the
references' samplers (drop_last), the last partial local batch of a pass is
dropped, and so are the batches short of a whole gradient-accumulation group;
the next epoch is a new, reshuffled pass. Every rank has a shard of the same
size (common.inputs.sharding), so every rank runs the same number of steps.

The order of epoch e is a function of (seed, e) alone, not of how many
iterators came before, so a run resumed at (epoch, batch) reads exactly the
batches an uninterrupted run would have read next (`Position`).
"""

import dataclasses

import tensorflow as tf

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
