"""Batch normalization whose statistics are shared by a group of ranks.

MLPerf DeepCAM's `batchnorm_group_size` k: each group of k consecutive ranks
normalizes with the mean and variance of the k local batches together, which
keeps batch statistics meaningful at local batch sizes of 1 or 2. Horovod's
own SyncBatchNormalization syncs over all ranks only; this one takes a
`RankGroup` (common.distribution) so the group can be any divisor of the job.
"""

import tensorflow as tf


class GroupBatchNormalization(tf.keras.layers.BatchNormalization):
    """BatchNormalization with moments averaged over `group` during training.

    Args:
      group: a RankGroup (size, sum(tensor)); of size 1 this is plain batch norm.
      **kwargs: passed on to tf.keras.layers.BatchNormalization.
    """

    def __init__(self, group, **kwargs):
        # The fused kernel computes its moments internally, out of our reach.
        super().__init__(fused=False, **kwargs)
        self.group = group

    def _moments(self, inputs, reduction_axes, keep_dims, **kwargs):
        mean, variance = super()._moments(inputs, reduction_axes, keep_dims=keep_dims, **kwargs)
        if self.group.size == 1:
            return mean, variance
        # Equal local batches: the group's moments are means of the local
        # E[x] and E[x^2] (Var = E[x^2] - E[x]^2).
        stacked = tf.stack([mean, variance + tf.square(mean)])
        stacked = self.group.sum(stacked) / self.group.size
        group_mean, group_mean_sq = tf.unstack(stacked)
        return group_mean, tf.maximum(group_mean_sq - tf.square(group_mean), 0.0)

    def get_config(self):
        config = super().get_config()
        config.pop("fused", None)
        return config
