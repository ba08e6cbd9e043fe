"""The compiled train and eval steps, shared by the trainer and the benchmarks in bench/."""

import dataclasses
import functools
from typing import NamedTuple

import numpy as np
import tensorflow as tf
import tf_keras

# The steps are traced as written: their control flow on tensors is explicit (tf.cond), so
# autograph's rewrite of their source would add only its own time (a small DeepCAM run's init took
# 9.6 s with it, 8.0 s without) and rewritten tracebacks.
step_function = functools.partial(tf.function, autograph=False)


class StepResult(NamedTuple):
    """What one optimizer step hands back (tensors: reading one waits for the step)."""

    loss: tf.Tensor  # this rank's mean loss over the step's micro-batches
    inputs_finite: tf.Tensor  # bool: every value of the step's preprocessed batches was finite


def all_finite(tensors) -> tf.Tensor:
    """A scalar bool: no NaN or Inf in any floating tensor of `tensors`. A finite sum holds none,
    and a sum reads the data once, cheaper than is_finite's mask; only a non-finite sum (which an
    overflow can give) looks at every value."""
    tensors = [t for t in tensors if t.dtype.is_floating]
    if not tensors:
        return tf.constant(True)
    sums = [
        tf.reduce_sum(t)
        if t.dtype in (tf.float32, tf.float64)
        else tf.reduce_sum(tf.cast(t, tf.float32))
        for t in tensors
    ]
    return tf.cond(
        tf.reduce_all(tf.stack([tf.math.is_finite(s) for s in sums])),
        lambda: tf.constant(True),
        lambda: tf.reduce_all(tf.stack([tf.reduce_all(tf.math.is_finite(t)) for t in tensors])),
    )


def apply_or_skip(optimizer, pairs, finite) -> None:
    """Applies the (gradient, variable) `pairs` where `finite` (a scalar bool) holds, else only
    counts the step: an update with a non-finite gradient is skipped on every rank alike."""

    def update():
        optimizer.apply_gradients(pairs)

    def skip():
        optimizer.iterations.assign_add(1, read_value=False)

    tf.cond(finite, update, skip)


class TrainStep:
    """One optimizer step: forward and backward over `accumulation` micro-batches (gradients summed
    in variables), allreduce average, update.

    - `preprocess` (Task.preprocess_batch) casts and normalizes the batch inside the compiled step,
      on the accelerator; the step checks it for NaN/Inf there (`StepResult.inputs_finite`).
    - `xla` compiles forward and backward only: Horovod's allreduce is a custom op XLA cannot
      compile. Under fp16 (a LossScaleOptimizer) the gradients are unscaled before the allreduce.
    - An update whose averaged gradients are not all finite is skipped (the step count advances),
      on every rank alike, so a NaN loss leaves the last finite weights to checkpoint.
    - The update after the allreduce (finiteness check, global-norm clip, every variable's step)
      is one XLA function where the optimizer asks for XLA: one launch whose small kernels XLA
      can fuse (docs/figures.md).
    - With `shard` (common.parallel.sharded_optimizer), the optimizer holds this rank's
      variables' slots only, the clip moves here, and the updated variables are allgathered.
    """

    def __init__(
        self,
        model,
        optimizer,
        loss_fn,
        dist,
        compression: str = "none",
        xla: bool = False,
        accumulation: int = 1,
        preprocess=None,
        gradient_scales=None,
        grouped_allreduce: bool = False,
        shard=None,
    ):
        self.model, self.optimizer, self.dist = model, optimizer, dist
        self._shard = shard
        self._grouped = grouped_allreduce  # else an allreduce per gradient, overlapping backward
        # Per trainable variable, a factor applied before the allreduce average: the group
        # size for the layers that hold a slab of each sample (common.parallel.spatial.gradient_scales).
        self._gradient_scales = None
        if gradient_scales is not None and any(s != 1.0 for s in gradient_scales):
            self._gradient_scales = list(gradient_scales)
        self._preprocess = preprocess or (lambda x, y: (x, y))
        self.accumulation = int(accumulation)
        self._scaled = isinstance(optimizer, tf_keras.mixed_precision.LossScaleOptimizer)
        self._loss_fn = loss_fn
        self._compression = compression
        self._clip_norm = None
        inner = optimizer.inner_optimizer if self._scaled else optimizer
        # Sharded, the optimizer sees this rank's gradients only: the clip over all is ours.
        if shard is not None:
            self._clip_norm, inner.global_clipnorm = inner.global_clipnorm, None
        # Variables made on first use inside tf.cond's branch would be refused: make them now
        # (as the LossScaleOptimizer does; a no-op for a built optimizer).
        with tf.init_scope():
            optimizer.build(
                shard.owned_variables() if shard is not None else model.trainable_variables
            )
        update = self._update_sharded_py if shard is not None else self._update_py
        self._update = step_function(update, jit_compile=True) if inner.jit_compile else update
        # With XLA, forward and backward are one compiled function, the allreduce outside it. Without,
        # they are traced into the step's own graph, not called as a nested function: a function call
        # hands back all its outputs at once, at its end, which would hold each gradient's allreduce
        # until backward is done (no overlap; seen in Horovod's timeline, tests/test_gradient_overlap.py).
        self._loss_and_grads = (
            step_function(self._loss_and_grads_py, jit_compile=True)
            if xla
            else self._loss_and_grads_py
        )
        if self.accumulation == 1:
            self._fused = step_function(self._fused_py)
        else:
            self._sums = [
                tf.Variable(tf.zeros_like(v), trainable=False, name="grad_sum")
                for v in model.trainable_variables
            ]
            self._accumulate = step_function(self._accumulate_py)
            self._apply_sums = step_function(self._apply_sums_py)

    def _loss_and_grads_py(self, x, y):
        x, y = self._preprocess(x, y)
        finite = all_finite([x, y])
        with tf.GradientTape() as tape:
            pred = self.model(x, training=True)
            loss = self._loss_fn(y, pred)
            if self.model.losses:
                loss += tf.add_n(self.model.losses)
            objective = self.optimizer.get_scaled_loss(loss) if self._scaled else loss
        grads = tape.gradient(objective, self.model.trainable_variables)
        if self._scaled:
            grads = self.optimizer.get_unscaled_gradients(grads)
        return loss, finite, grads

    def reduce_gradients(self, grads):
        """This rank's gradients -> the update's: averaged over the ranks (split layers' summed
        over the spatial group first)."""
        if self._gradient_scales is not None:
            grads = [g * s if s != 1.0 else g for g, s in zip(grads, self._gradient_scales)]
        return self.dist.average_gradients(grads, self._compression, grouped=self._grouped)

    def _apply(self, grads):
        self._update(self.reduce_gradients(grads))
        if self._shard is not None:
            self._shard.share()  # reads the variables after their update (automatic control dependencies)

    def _update_py(self, grads):
        pairs = list(zip(grads, self.model.trainable_variables))
        if self._scaled:  # skips non-finite gradients itself, and lowers the loss scale
            self.optimizer.apply_gradients(pairs)
        else:
            apply_or_skip(self.optimizer, pairs, all_finite(grads))

    def _update_sharded_py(self, grads):
        self._shard.update(self.optimizer, grads, self._clip_norm, self._scaled)

    def _fused_py(self, x, y):
        loss, finite, grads = self._loss_and_grads(x, y)
        self._apply(grads)
        return loss, finite

    def _accumulate_py(self, x, y):
        loss, finite, grads = self._loss_and_grads(x, y)
        for total, g in zip(self._sums, grads):
            total.assign_add(g)
        return loss, finite

    def _apply_sums_py(self):
        self._apply([total / self.accumulation for total in self._sums])
        for total in self._sums:
            total.assign(tf.zeros_like(total))

    def __call__(self, batches) -> StepResult:
        """Runs one optimizer step on the next `accumulation` batches: their mean loss, whether all were finite."""
        if self.accumulation == 1:
            return StepResult(*self._fused(*next(batches)))
        losses, flags = zip(*[self._accumulate(*next(batches)) for _ in range(self.accumulation)])
        self._apply_sums()
        return StepResult(
            tf.add_n(list(losses)) / self.accumulation, tf.reduce_all(tf.stack(flags))
        )

    def state_variables(self) -> list:
        """The variables the step keeps of its own (the accumulated gradients), beside the model's and
        the optimizer's."""
        return list(self._sums) if self.accumulation > 1 else []

    def trace(self, element_spec) -> None:
        """Builds the graphs without running them (init work under the MLPerf rules)."""
        if self.accumulation == 1:
            self._fused.get_concrete_function(*element_spec)
        else:
            self._accumulate.get_concrete_function(*element_spec)
            self._apply_sums.get_concrete_function()


# After the metric's sums, the eval step's vector holds the loss x samples, the samples and the
# non-finite batches; EvalSums.of is the one reader of that layout.
_EVAL_TAIL = 3


@dataclasses.dataclass(frozen=True)
class EvalSums:
    """The eval step's sums over batches (and over ranks, once allreduced), by name."""

    metric: np.ndarray  # the metric's sums: common.task.EvalMetric.finalize's input
    loss: float  # the loss times the samples of each batch; 0 without a loss function
    samples: float  # 0 without a loss function
    non_finite_batches: float  # batches whose preprocessed values held a NaN or Inf

    @staticmethod
    def zero_vector(n_sums: int) -> np.ndarray:
        """The vector of no batch, to add the eval step's vectors to (a rank may hold no validation file)."""
        return np.zeros(n_sums + _EVAL_TAIL)

    @classmethod
    def of(cls, vector) -> "EvalSums":
        """Names the entries of a sum of the eval step's vectors."""
        loss, samples, non_finite = vector[-_EVAL_TAIL:]
        return cls(
            metric=vector[:-_EVAL_TAIL], loss=loss, samples=samples, non_finite_batches=non_finite
        )


def eval_step_specs(input_specs) -> tuple:
    """The eval step's arguments: a batch of `input_specs` (x, y) and n, how many of its samples count."""
    return (*input_specs, tf.TensorSpec((), tf.int32))


def make_eval_step(model, metric, xla: bool = False, preprocess=None, loss_fn=None):
    """A tf.function (x, y, n) -> float64 vector for a batch whose first n samples count (the rest
    pad it to the traced shape: common.run.trainer.padded_batches): the metric's sums, the loss
    times the samples, the samples (0, 0 without `loss_fn`) and 1.0 if the batch held a NaN or Inf.
    Summed over batches and ranks, EvalSums.of names the entries."""
    preprocess = preprocess or (lambda x, y: (x, y))

    def forward(x, y):
        x, y = preprocess(x, y)
        return x, y, model(x, training=False)

    if xla:  # compiled at the batch's shape; the samples that count are cut outside, at run time
        forward = step_function(forward, jit_compile=True)

    def eval_step(x, y, n):
        x, y, pred = forward(x, y)
        # In inference a sample's prediction is its own: the padding is dropped after the model.
        x, y, pred = x[:n], y[:n], pred[:n]
        sums = tf.cast(metric.update(y, tf.cast(pred, tf.float32)), tf.float64)
        samples = tf.cast(tf.shape(y)[0], tf.float64)
        loss = (
            tf.cast(loss_fn(y, pred), tf.float64) * samples
            if loss_fn
            else tf.constant(0.0, tf.float64)
        )
        non_finite = 1.0 - tf.cast(all_finite([x, y]), tf.float64)
        return tf.concat([sums, tf.stack([loss, samples if loss_fn else 0.0, non_finite])], axis=0)

    return step_function(eval_step)
