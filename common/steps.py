"""The compiled train and eval steps, shared by the trainer and the benchmarks in bench/."""

import tensorflow as tf


def make_train_step(model, optimizer, loss_fn, dist, compression: str = "none", xla: bool = False):
    """A tf.function (x, y) -> loss: forward, backward, allreduce-average, update.

    With `xla`, only forward and backward are XLA-compiled: Horovod's allreduce
    is a custom op that XLA cannot compile, so it runs outside the cluster.
    Under fp16 mixed precision (a LossScaleOptimizer) the loss is scaled before
    the backward pass and the gradients unscaled before the allreduce.
    """
    scaled = isinstance(optimizer, tf.keras.mixed_precision.LossScaleOptimizer)

    @tf.function(jit_compile=xla)
    def loss_and_grads(x, y):
        with tf.GradientTape() as tape:
            pred = model(x, training=True)
            loss = loss_fn(y, pred)
            if model.losses:
                loss += tf.add_n(model.losses)
            objective = optimizer.get_scaled_loss(loss) if scaled else loss
        grads = tape.gradient(objective, model.trainable_variables)
        return loss, grads

    @tf.function
    def train_step(x, y):
        loss, grads = loss_and_grads(x, y)
        if scaled:
            grads = optimizer.get_unscaled_gradients(grads)
        grads = dist.average_gradients(grads, compression)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return train_step


def make_eval_step(model, metric, xla: bool = False):
    """A tf.function (x, y) -> float64 vector of metric sums for one batch."""
    def eval_step(x, y):
        pred = model(x, training=False)
        return tf.cast(metric.update(y, tf.cast(pred, tf.float32)), tf.float64)

    return tf.function(eval_step, jit_compile=xla)
