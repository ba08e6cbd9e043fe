"""Batch normalization whose statistics are shared by a group of ranks.

MLPerf DeepCAM's `batchnorm_group_size` k: each group of k consecutive ranks
normalizes with the mean and variance of the k local batches together, which
keeps batch statistics meaningful at local batch sizes of 1 or 2. Horovod's
own SyncBatchNormalization syncs over all ranks only; this one takes a
`RankGroup` (common.parallel.distribution) so the group can be any divisor of the job.

The running statistics (moving mean and variance, used at evaluation) are a
separate matter: `average_batchnorm_statistics` averages them over all ranks
once per epoch, as the MLCommons reference does.
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
        # The running variance takes the unbiased batch variance (n / (n - 1)), as
        # PyTorch's BatchNorm2d / SyncBatchNorm and TF's fused kernel do; the
        # batch is normalized with the biased one. n counts the whole group.
        count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(inputs), reduction_axes)), tf.float32)
        count *= self.group.size
        self._unbiased_scale = count / tf.maximum(count - 1.0, 1.0)
        if self.group.size == 1:
            return mean, variance
        # Equal local batches: the group's moments are means of the local
        # E[x] and E[x^2] (Var = E[x^2] - E[x]^2).
        stacked = tf.stack([mean, variance + tf.square(mean)])
        stacked = self.group.sum(stacked) / self.group.size
        group_mean, group_mean_sq = tf.unstack(stacked)
        return group_mean, tf.maximum(group_mean_sq - tf.square(group_mean), 0.0)

    def _assign_moving_average(self, variable, value, momentum, inputs_size):
        # Called within the same call() as _moments, which set the scale.
        if variable is self.moving_variance:
            value = value * tf.cast(self._unbiased_scale, value.dtype)
        return super()._assign_moving_average(variable, value, momentum, inputs_size)

    def get_config(self):
        config = super().get_config()
        config.pop("fused", None)
        return config


def batchnorm_statistics(model) -> list:
    """The moving mean and variance of every batch-norm layer of `model`, in a fixed order.

    Layers nested in sub-models count, and so does any subclass
    (GroupBatchNormalization): a layer qualifies by holding `moving_mean` and
    `moving_variance`, as the reference picks modules with running statistics.
    The order is the model's own layer order, the same on every rank.
    """
    found = []
    for layer in model.submodules:   # each module once, sub-models' layers included
        if getattr(layer, "moving_mean", None) is not None and getattr(layer, "moving_variance", None) is not None:
            found += [layer.moving_mean, layer.moving_variance]
    return found


def average_batchnorm_statistics(model, dist) -> int:
    """Replaces each rank's batch-norm running statistics by their mean over all ranks.

    The MLCommons DeepCAM reference does this after every epoch's training,
    before validation: each rank's statistics saw only its own shard (or its
    batch-norm group's), while evaluation and checkpoints should reflect all
    ranks' data. One grouped allreduce for all layers; a model
    without batch norm (CosmoFlow) makes no collective.

    Args:
      model: a Keras model, built.
      dist: the Distribution (every rank calls this, in the same place).
    Returns:
      The number of batch-norm layers averaged.
    """
    statistics = batchnorm_statistics(model)
    if statistics:   # the same answer on every rank: they all build the same model
        dist.average_variables(statistics)
    return len(statistics) // 2
