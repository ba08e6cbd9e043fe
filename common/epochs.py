"""What one epoch is: one pass over each rank's shard, in whole optimizer steps.

As the references' samplers (drop_last), the last partial local batch of a
pass is dropped, and so are the batches short of a whole gradient-accumulation
group; the next epoch is a new, reshuffled pass. Every rank has a shard of the
same size (common.sharding), so every rank runs the same number of steps.
"""

import tensorflow as tf


def batches_per_epoch(shard_size: int, local_batch_size: int, accumulation: int = 1) -> int:
    """Local batches one epoch uses: full batches of the shard, in whole accumulation groups."""
    return shard_size // local_batch_size // accumulation * accumulation


def batch_by_epoch(ds: tf.data.Dataset, batch_size: int, n_batches: int | None = None) -> tf.data.Dataset:
    """Batches `ds` (one pass over the shard) and repeats it, each pass giving exactly n_batches
    (None: every full batch).

    Batches beyond n_batches in a pass are read and skipped rather than cut
    with take(): a cache() upstream must see the whole pass to keep it.
    """
    if n_batches is None:
        return ds.batch(batch_size, drop_remainder=True).repeat()

    def within_epoch(index, batch):
        del batch
        return index < n_batches

    def without_index(index, batch):
        del index
        return batch

    ds = ds.batch(batch_size, drop_remainder=True)
    ds = ds.enumerate().filter(within_epoch).map(without_index)
    return ds.repeat()
