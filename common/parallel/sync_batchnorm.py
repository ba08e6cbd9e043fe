"""Batch normalization whose statistics are shared by a group of ranks.

MLPerf DeepCAM's `batchnorm_group_size` k: each group of k consecutive ranks
normalizes with the mean and variance of the k local batches together, which
keeps batch statistics meaningful at local batch sizes of 1 or 2. Horovod's
own SyncBatchNormalization syncs over all ranks only; this one takes a
`RankGroup` (common.parallel.distribution) so the group can be any divisor of the job.

The running statistics (moving mean and variance, used at evaluation) are averaged over all ranks
once per epoch (common.parallel.distribution.average_batchnorm_statistics).
"""

import tensorflow as tf
import tf_keras


class GroupBatchNormalization(tf_keras.layers.BatchNormalization):
    """BatchNormalization with moments averaged over `group` during training.

    Training has its backward pass written out (`_normalize`), as a fused kernel's: it keeps the
    layer's input and two vectors per channel, where autodiff through the moments, the group's
    allreduce and the normalization would keep float32 intermediates of the whole input too; one
    allreduce forward (the group's E[x] and E[x^2]) and one backward (the group's sums of dy and
    dy x_hat). Evaluation uses the running statistics (Keras' own inference path).

    Args:
      group: a RankGroup (size, sum(tensor)); of size 1 this is plain batch norm.
      **kwargs: passed on to tf_keras.layers.BatchNormalization.
    """

    def __init__(self, group, **kwargs):
        # Keras' fused kernel computes its moments internally, out of our reach.
        super().__init__(fused=False, **kwargs)
        self.group = group

    def call(self, inputs, training=None):
        training = self._get_training_value(training)
        if not isinstance(
            training, bool
        ):  # a Keras learning-phase tensor: not used by this project
            raise ValueError(
                f"{self.name}: GroupBatchNormalization needs training as a Python bool"
            )
        if not training:
            return super().call(inputs, training=False)
        x = tf.cast(inputs, self.compute_dtype)
        axes = list(range(x.shape.rank - 1))
        # Moments of the slab in float32 (two passes, as tf.nn.moments), then the group's: equal local
        # counts, so the group's moments are means of the local E[x] and E[x^2] (Var = E[x^2] - E[x]^2).
        mean, variance = tf.nn.moments(tf.cast(tf.stop_gradient(x), tf.float32), axes)
        local_count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)), tf.float32)
        count = local_count * self.group.size
        if self.group.size > 1:
            stacked = self.group.sum(
                tf.stack([mean, variance + tf.square(mean)]), name=f"{self.name}.moments"
            )
            mean, mean_sq = tf.unstack(stacked / self.group.size)
            variance = tf.maximum(mean_sq - tf.square(mean), 0.0)
        # The running variance takes the unbiased batch variance (n / (n - 1), n counting the whole
        # group), as PyTorch's BatchNorm2d / SyncBatchNorm and TF's fused kernel do; the batch is
        # normalized with the biased one.
        unbiased = variance * count / tf.maximum(count - 1.0, 1.0)
        self.add_update(
            lambda: self._assign_moving_average(self.moving_mean, mean, self.momentum, None)
        )
        self.add_update(
            lambda: self._assign_moving_average(self.moving_variance, unbiased, self.momentum, None)
        )
        return _normalize(
            x,
            self.gamma,
            self.beta,
            mean,
            variance,
            self.epsilon,
            count,
            lambda t: self.group.sum(t, name=f"{self.name}.grad_sums"),
        )

    def get_config(self):
        config = super().get_config()
        config.pop("fused", None)
        return config


def _normalize(x, gamma, beta, mean, variance, epsilon: float, count, group_sum):
    """gamma (x - mean) / sqrt(variance + epsilon) + beta, with the gradient of batch norm over the
    group's `count` values of each channel (mean and variance functions of all of them):
      dx = gamma / sigma (dy - sum(dy) / n - x_hat sum(dy x_hat) / n), sums over the group;
      dgamma = sum(dy x_hat), dbeta = sum(dy) over this rank's values (the gradient allreduce adds
      the other ranks' parts, as autodiff through the group's allreduce gives).
    Backward keeps x (in its own dtype) and the per-channel vectors; math in float32."""
    axes = list(range(x.shape.rank - 1))
    inv = tf.math.rsqrt(variance + epsilon)

    @tf.custom_gradient
    def run(x, gamma, beta):
        y = (tf.cast(x, tf.float32) - mean) * (inv * gamma) + beta

        def grad(dy):
            # After dy: x_hat, read from forward tensors only, would otherwise be computed during
            # forward and kept (a graph runs an op once its inputs are ready).
            with tf.control_dependencies([dy]):
                x_hat = (tf.cast(x, tf.float32) - mean) * inv
            dy = tf.cast(dy, tf.float32)
            dbeta, dgamma = tf.reduce_sum(dy, axes), tf.reduce_sum(dy * x_hat, axes)
            sum_dy, sum_dy_xhat = tf.unstack(group_sum(tf.stack([dbeta, dgamma])))
            dx = (inv * gamma) * (dy - sum_dy / count - x_hat * (sum_dy_xhat / count))
            return tf.cast(dx, x.dtype), dgamma, dbeta

        return tf.cast(y, x.dtype), grad

    return run(x, tf.convert_to_tensor(gamma, tf.float32), tf.convert_to_tensor(beta, tf.float32))
