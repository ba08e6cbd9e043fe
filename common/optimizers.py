"""Optimizers and learning-rate schedules with the semantics of the PyTorch references, by name.

`AdamL2` is PyTorch's Adam (weight decay added to the gradient), `LAMB` apex's FusedLAMB. A config
names its optimizer and schedule; OPTIMIZERS and SCHEDULES map the names to the classes (TF Model
Garden's OPTIMIZERS_CLS). A schedule's `at_step` (Python, for logs and tests) and `__call__`
(TensorFlow, inside the step) compute the same numbers.
"""

import math
import types
from collections.abc import Sequence

import tensorflow as tf
import tf_keras

from common.errors import ConfigError


def scale_lr(base_lr: float, global_batch_size: int, base_batch_size: int, scaling: str) -> float:
    """The reference's LR scaling with global batch size: 'linear', 'sqrt' or 'none'."""
    if scaling == "linear":
        return base_lr * global_batch_size / base_batch_size
    if scaling == "sqrt":
        return base_lr * math.sqrt(global_batch_size / base_batch_size)
    if scaling == "none":
        return base_lr
    raise ValueError(f"unknown LR scaling '{scaling}'")


class EpochWarmupStepDecay(tf_keras.optimizers.schedules.LearningRateSchedule):
    """CosmoFlow's schedule (reference utils/optimizers.py::_lr_schedule), per 0-based epoch e.

    For e < warmup_epochs: init_lr + e * (peak_lr - init_lr) / warmup_epochs; then peak_lr times
    the (absolute, not cumulative) factor of the last boundary b < e, as the reference's Keras
    LearningRateScheduler: a boundary of 32 first acts in epoch 33.
    """

    def __init__(
        self,
        peak_lr: float,
        init_lr: float,
        warmup_epochs: int,
        boundaries: Sequence[int],
        factors: Sequence[float],
        steps_per_epoch: int,
    ):
        super().__init__()
        if len(boundaries) != len(factors):
            raise ValueError(f"{len(boundaries)} decay boundaries but {len(factors)} factors")
        self.peak_lr = float(peak_lr)
        self.init_lr = float(init_lr)
        self.warmup_epochs = int(warmup_epochs)
        self.decay = sorted(zip((int(b) for b in boundaries), (float(f) for f in factors)))
        self.steps_per_epoch = int(steps_per_epoch)

    def at_epoch(self, epoch: int) -> float:
        if epoch < self.warmup_epochs:
            return self.init_lr + epoch * (self.peak_lr - self.init_lr) / self.warmup_epochs
        factor = 1.0
        for boundary, f in self.decay:
            if boundary < epoch:
                factor = f
        return self.peak_lr * factor

    def at_step(self, step: int) -> float:
        return self.at_epoch(step // self.steps_per_epoch)

    def __call__(self, step):
        epoch = tf.cast(step, tf.float32) // float(self.steps_per_epoch)
        factor = tf.constant(1.0)
        for boundary, f in self.decay:
            factor = tf.where(epoch > boundary, tf.constant(f), factor)
        decayed = self.peak_lr * factor
        if self.warmup_epochs == 0:
            return decayed
        warm = self.init_lr + epoch * (self.peak_lr - self.init_lr) / self.warmup_epochs
        return tf.where(epoch < self.warmup_epochs, warm, decayed)


class StepWarmupSchedule(tf_keras.optimizers.schedules.LearningRateSchedule):
    """DeepCAM's step schedules as the reference (utils/optimizer_helpers.py) drives them.

    Optimizer step j runs at scheduler position k = j + 1 (k = j for cosine annealing without
    warmup, built with torch's last_epoch=-1). At position k:
      warmup (k <= warmup_steps): start_lr * k / warmup_steps (warmup_factor 1), else
        start_lr * ((warmup_factor - 1) * k / warmup_steps + 1);
      'multistep': peak * decay_rate ** (milestones m with k >= m, or k >= m + warmup_steps + 1
        after a warmup);
      'cosine_annealing': eta_min + (peak - eta_min) * (1 + cos(pi * t / t_max)) / 2,
        t = k - warmup_steps;
    with peak = start_lr * warmup_factor after a warmup, else start_lr.
    """

    def __init__(
        self,
        kind: str,
        start_lr: float,
        warmup_steps: int = 0,
        warmup_factor: float = 1.0,
        milestones=(),
        decay_rate: float = 0.1,
        t_max: int = 1,
        eta_min: float = 0.0,
    ):
        super().__init__()
        if kind not in ("multistep", "cosine_annealing"):
            raise ValueError(f"unknown LR schedule type '{kind}' (multistep, cosine_annealing)")
        self.kind = kind
        self.start_lr = float(start_lr)
        self.warmup_steps = int(warmup_steps)
        self.warmup_factor = float(warmup_factor)
        self.milestones = tuple(sorted(int(m) for m in milestones))
        self.decay_rate = float(decay_rate)
        self.t_max = int(t_max)
        self.eta_min = float(eta_min)
        self.peak_lr = self.start_lr * (self.warmup_factor if self.warmup_steps else 1.0)
        self.offset = 0 if (kind == "cosine_annealing" and not self.warmup_steps) else 1
        self.milestone_shift = self.warmup_steps + 1 if self.warmup_steps else 0

    def _warmup(self, k):
        fraction = k / self.warmup_steps
        if self.warmup_factor == 1.0:
            return self.start_lr * fraction
        return self.start_lr * ((self.warmup_factor - 1.0) * fraction + 1.0)

    def at_step(self, step: int) -> float:
        k = step + self.offset
        if self.warmup_steps and k <= self.warmup_steps:
            return self._warmup(k)
        if self.kind == "multistep":
            passed = sum(1 for m in self.milestones if k >= m + self.milestone_shift)
            return self.peak_lr * self.decay_rate**passed
        t = k - self.warmup_steps
        return (
            self.eta_min
            + (self.peak_lr - self.eta_min) * (1 + math.cos(math.pi * t / self.t_max)) / 2
        )

    def __call__(self, step):
        k = tf.cast(step, tf.float32) + self.offset
        if self.kind == "multistep":
            passed = tf.zeros([])
            for m in self.milestones:
                passed += tf.cast(k >= m + self.milestone_shift, tf.float32)
            after = self.peak_lr * tf.pow(self.decay_rate, passed)
        else:
            t = k - self.warmup_steps
            after = (
                self.eta_min
                + (self.peak_lr - self.eta_min) * (1 + tf.cos(math.pi * t / self.t_max)) / 2
            )
        if not self.warmup_steps:
            return after
        return tf.where(k <= self.warmup_steps, self._warmup(k), after)


SCHEDULES = {"epoch_warmup_step_decay": EpochWarmupStepDecay, "step_warmup": StepWarmupSchedule}


def build_schedule(name: str, **kwargs) -> tf_keras.optimizers.schedules.LearningRateSchedule:
    """The schedule of SCHEDULES called `name`, built with these arguments; ConfigError if none."""
    if name not in SCHEDULES:
        raise ConfigError(f"unknown LR schedule {name!r}; known: {', '.join(SCHEDULES)}")
    return SCHEDULES[name](**kwargs)


class AdamL2(tf_keras.optimizers.Adam):
    """Adam with PyTorch's coupled weight decay: g <- g + weight_decay * w."""

    def __init__(self, l2: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.l2 = float(l2)

    def update_step(self, gradient, variable):
        if self.l2:
            gradient = gradient + tf.cast(self.l2, variable.dtype) * variable
        super().update_step(gradient, variable)


class LAMB(tf_keras.optimizers.Optimizer):
    """LAMB (You et al. 2019) as apex FusedLAMB: bias-corrected Adam moments (`epsilon` added to
    sqrt(v_hat)), `weight_decay_rate` decoupled, added to the update before a per-tensor trust ratio
    ||w|| / ||update|| (when weight decay is on), and the global gradient norm clipped to
    `max_grad_norm` first."""

    def __init__(
        self,
        learning_rate=1e-3,
        beta_1=0.9,
        beta_2=0.999,
        epsilon=1e-6,
        weight_decay_rate=0.0,
        max_grad_norm=1.0,
        name="LAMB",
        **kwargs,
    ):
        # weight_decay=None: Keras' own decay, even at 0, would scale every variable as steps start.
        super().__init__(
            name=name, global_clipnorm=max_grad_norm or None, weight_decay=None, **kwargs
        )
        self._learning_rate = self._build_learning_rate(learning_rate)
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon
        self.weight_decay_rate = weight_decay_rate
        self.max_grad_norm = max_grad_norm
        # A plain object: what is attached to it is not tracked, so checkpoints keep their keys.
        self._per_step = types.SimpleNamespace(scalars=None)

    def build(self, var_list):
        super().build(var_list)
        if getattr(self, "_built", False):
            return
        self._built = True
        self._m = [self.add_variable_from_reference(v, "m") for v in var_list]
        self._v = [self.add_variable_from_reference(v, "v") for v in var_list]

    def _distributed_apply_gradients_fn(self, distribution, grads_and_vars, **kwargs):
        # What every variable's update shares (the learning rate, the bias corrections, constants)
        # is made once per step and graph, not once per variable: the same values, in a third fewer
        # ops to trace and compile. (Under jit_compile, Keras' default where a GPU is, each
        # variable's update is a function of its own and makes its own.)
        self._per_step.scalars = {}
        try:
            return super()._distributed_apply_gradients_fn(distribution, grads_and_vars, **kwargs)
        finally:
            self._per_step.scalars = None

    def _scalars(self, dtype) -> tuple:
        cache = self._per_step.scalars
        key = (tf.compat.v1.get_default_graph(), dtype)
        if cache is not None and key in cache:
            return cache[key]
        step = tf.cast(self.iterations + 1, dtype)
        b1, b2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
        scalars = (
            tf.cast(self.learning_rate, dtype),
            1.0 - b1,
            1.0 - b2,
            1.0 - tf.pow(b1, step),  # the bias corrections
            1.0 - tf.pow(b2, step),
            tf.cast(self.epsilon, dtype),
            tf.cast(self.weight_decay_rate, dtype),
            tf.constant(0, dtype),
            tf.constant(1, dtype),
        )
        if cache is not None:
            cache[key] = scalars
        return scalars

    def update_step(self, gradient, variable):
        dtype = variable.dtype
        lr, one_minus_b1, one_minus_b2, correction1, correction2, epsilon, decay, zero, one = (
            self._scalars(dtype)
        )
        index = self._index_dict[self._var_key(variable)]
        m, v = self._m[index], self._v[index]
        # Every variable-sized term waits for the gradient, so none is held through the forward
        # and backward passes (docs/figures.md).
        m.assign_add((gradient - m) * one_minus_b1)  # b1 m + (1 - b1) g
        v.assign_add((tf.square(gradient) - v) * one_minus_b2)  # b2 v + (1 - b2) g^2
        update = (m / correction1) / (tf.sqrt(v / correction2) + epsilon)
        if self.weight_decay_rate:
            with tf.control_dependencies([update]):
                update += decay * variable
                w_norm = tf.norm(variable)
            u_norm = tf.norm(update)
            ratio = tf.where((w_norm > zero) & (u_norm > zero), w_norm / u_norm, one)
        else:
            ratio = one
        variable.assign_sub(lr * ratio * update)


_ADAM = {k: k for k in ("learning_rate", "beta_1", "beta_2", "epsilon")}
# Name (as the configs and the MLPerf log's opt_name spell it) -> (class, {hyperparameter: the
# class's keyword for it}); a hyperparameter an optimizer does not take is not passed to it.
OPTIMIZERS = {
    "SGD": (tf_keras.optimizers.SGD, {"learning_rate": "learning_rate", "momentum": "momentum"}),
    "Adam": (AdamL2, _ADAM | {"weight_decay": "l2"}),
    "AdamW": (tf_keras.optimizers.AdamW, _ADAM | {"weight_decay": "weight_decay"}),
    "LAMB": (LAMB, _ADAM | {"weight_decay": "weight_decay_rate", "max_grad_norm": "max_grad_norm"}),
}


def check_name(name: str, hyperparameters) -> None:
    """Raises ConfigError unless `name` is an optimizer taking every one of `hyperparameters`."""
    usable = [n for n, (_, takes) in OPTIMIZERS.items() if set(hyperparameters) <= set(takes)]
    if name not in usable:
        raise ConfigError(
            f"config key 'optimizer.name'={name!r}: choose one of {', '.join(usable)} (the "
            f"optimizers of common/optimizers.py taking {', '.join(hyperparameters)})"
        )


def build_optimizer(name: str, **hyperparameters) -> tf_keras.optimizers.Optimizer:
    """The optimizer of OPTIMIZERS called `name`, given the hyperparameters it takes; ConfigError
    if none has that name."""
    if name not in OPTIMIZERS:
        raise ConfigError(f"unknown optimizer {name!r}; known: {', '.join(OPTIMIZERS)}")
    cls, keywords = OPTIMIZERS[name]
    return cls(**{keywords[k]: v for k, v in hyperparameters.items() if k in keywords})
