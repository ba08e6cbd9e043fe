"""The compiled train and eval steps, shared by the trainer and the benchmarks in bench/."""

import tensorflow as tf


class TrainStep:
    """One optimizer step: forward/backward over `accumulation` micro-batches,
    allreduce-average, update.

    With `accumulation` n > 1 the gradients of n consecutive local batches
    are summed in variables and averaged, so the global batch is
    n x local batch x ranks at the memory of one local batch; the allreduce
    runs once per optimizer step, not per micro-batch.

    With `xla`, only forward and backward are XLA-compiled: Horovod's allreduce
    is a custom op that XLA cannot compile, so it runs outside the cluster.
    Under fp16 mixed precision (a LossScaleOptimizer) the loss is scaled before
    the backward pass and the gradients unscaled before the allreduce.

    `preprocess` (Task.preprocess_batch) turns a batch as the input pipeline
    yields it (compact: int16 counts, uint8 labels) into the model's input and
    labels, inside the compiled step, so casts and normalization run on the
    accelerator.
    """

    def __init__(self, model, optimizer, loss_fn, dist, compression: str = "none", xla: bool = False,
                 accumulation: int = 1, preprocess=None, gradient_scales=None):
        self.model, self.optimizer, self.dist = model, optimizer, dist
        # Per trainable variable, a factor applied before the allreduce average: the group
        # size for the layers that hold a slab of each sample (common.spatial.gradient_scales).
        self._gradient_scales = None
        if gradient_scales is not None and any(s != 1.0 for s in gradient_scales):
            self._gradient_scales = list(gradient_scales)
        self._preprocess = preprocess or (lambda x, y: (x, y))
        self.accumulation = int(accumulation)
        self._scaled = isinstance(optimizer, tf.keras.mixed_precision.LossScaleOptimizer)
        self._loss_fn = loss_fn
        self._compression = compression
        self._loss_and_grads = tf.function(self._loss_and_grads_py, jit_compile=xla)
        if self.accumulation == 1:
            self._fused = tf.function(self._fused_py)
        else:
            self._sums = [tf.Variable(tf.zeros_like(v), trainable=False, name="grad_sum")
                          for v in model.trainable_variables]
            self._accumulate = tf.function(self._accumulate_py)
            self._apply_sums = tf.function(self._apply_sums_py)

    def _loss_and_grads_py(self, x, y):
        x, y = self._preprocess(x, y)
        with tf.GradientTape() as tape:
            pred = self.model(x, training=True)
            loss = self._loss_fn(y, pred)
            if self.model.losses:
                loss += tf.add_n(self.model.losses)
            objective = self.optimizer.get_scaled_loss(loss) if self._scaled else loss
        grads = tape.gradient(objective, self.model.trainable_variables)
        if self._scaled:
            grads = self.optimizer.get_unscaled_gradients(grads)
        return loss, grads

    def reduce_gradients(self, grads):
        """This rank's gradients -> the update's: averaged over the ranks (split layers' summed
        over the spatial group first)."""
        if self._gradient_scales is not None:
            grads = [g * s if s != 1.0 else g for g, s in zip(grads, self._gradient_scales)]
        return self.dist.average_gradients(grads, self._compression)

    def _apply(self, grads):
        grads = self.reduce_gradients(grads)
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))

    def _fused_py(self, x, y):
        loss, grads = self._loss_and_grads(x, y)
        self._apply(grads)
        return loss

    def _accumulate_py(self, x, y):
        loss, grads = self._loss_and_grads(x, y)
        for total, g in zip(self._sums, grads):
            total.assign_add(g)
        return loss

    def _apply_sums_py(self):
        self._apply([total / self.accumulation for total in self._sums])
        for total in self._sums:
            total.assign(tf.zeros_like(total))

    def __call__(self, batches):
        """Runs one optimizer step on the next `accumulation` batches; returns the mean loss."""
        if self.accumulation == 1:
            return self._fused(*next(batches))
        losses = [self._accumulate(*next(batches)) for _ in range(self.accumulation)]
        self._apply_sums()
        return tf.add_n(losses) / self.accumulation

    def trace(self, element_spec) -> None:
        """Builds the graphs without running them (init work under the MLPerf rules)."""
        if self.accumulation == 1:
            self._fused.get_concrete_function(*element_spec)
        else:
            self._accumulate.get_concrete_function(*element_spec)
            self._apply_sums.get_concrete_function()


def make_eval_step(model, metric, xla: bool = False, preprocess=None):
    """A tf.function (x, y) -> float64 vector of metric sums for one batch (x as the pipeline yields it)."""
    preprocess = preprocess or (lambda x, y: (x, y))

    def eval_step(x, y):
        x, y = preprocess(x, y)
        pred = model(x, training=False)
        return tf.cast(metric.update(y, tf.cast(pred, tf.float32)), tf.float64)

    return tf.function(eval_step, jit_compile=xla)
