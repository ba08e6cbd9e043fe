"""Optimizers and learning-rate schedules with the semantics of the PyTorch references, chosen by name.

Keras' Adam(weight_decay=...) decays weights decoupled from the gradient, like
AdamW; PyTorch's Adam adds weight_decay * w to the gradient (an L2 term).
`AdamL2` restores that, so a recipe tuned on the reference means the same here.
LAMB follows NVIDIA apex FusedLAMB, the reference's: bias-corrected Adam moments
with gradient averaging, decoupled weight decay, a per-tensor trust ratio
||w|| / ||update|| (applied when weight decay is on, as apex does), and the
global gradient norm clipped to `max_grad_norm` before anything else.

A config names its optimizer; OPTIMIZERS maps that name to the class (TF Model Garden's
OPTIMIZERS_CLS), and `build_optimizer` passes it the config's hyperparameters. A config
accepts the optimizers that take every hyperparameter it sets (`names_taking`). A new
optimizer is its class here, its entry in OPTIMIZERS and its test.

The learning-rate schedules (below) follow the same pattern: SCHEDULES maps a task's schedule name to its class and `build_schedule` builds it.
"""

import dataclasses
import math
from collections.abc import Sequence

import tensorflow as tf
import tf_keras

from common.errors import ConfigError

# Learning-rate schedules of the MLCommons references, as pure functions of the step and as Keras schedules.
#
# Each schedule has a Python form (`at_step`), used for tests and logging, and a
# TensorFlow form (`__call__`), used by the optimizer inside the compiled step.
# Both compute the same numbers; a test checks it, and another checks both
# against a step-by-step simulation of the reference's schedulers.
#
# A task names its schedule; SCHEDULES maps the name to the class and `build_schedule` builds
# it. A new schedule is its class here, its entry in SCHEDULES and its test.


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

    Warmup: for e < warmup_epochs, init_lr + e * (peak_lr - init_lr) / warmup_epochs.
    Then peak_lr times the factor of the last decay boundary b with b < e: a
    boundary of 32 first acts in 0-based epoch 33 (the 34th epoch), exactly as
    the reference's Keras LearningRateScheduler. Factors are absolute, not
    cumulative: boundaries [32, 64] with factors [0.25, 0.125] mean peak/4, then peak/8.
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

    def get_config(self):
        return dict(
            peak_lr=self.peak_lr,
            init_lr=self.init_lr,
            warmup_epochs=self.warmup_epochs,
            boundaries=[b for b, _ in self.decay],
            factors=[f for _, f in self.decay],
            steps_per_epoch=self.steps_per_epoch,
        )


class StepWarmupSchedule(tf_keras.optimizers.schedules.LearningRateSchedule):
    """DeepCAM's step schedules, exactly as the reference drives them.

    The reference (utils/optimizer_helpers.py) builds its PyTorch scheduler
    with last_epoch = start_step = 0, so the constructor's initial step moves
    it to 1 and optimizer step j (0-based) runs at scheduler position k = j + 1:
    the first update already uses start_lr / warmup_steps. The one exception
    is cosine annealing without warmup, built with torch's default
    last_epoch=-1: there step j runs at k = j.

    At position k:
      warmup (k <= warmup_steps):  start_lr * k / warmup_steps (warmup_factor 1), or
                                   start_lr * ((warmup_factor - 1) * k / warmup_steps + 1);
      'multistep':  peak * decay_rate ** (number of milestones m reached), where
                    m is reached at k >= m, shifted to k >= m + warmup_steps + 1 with warmup;
      'cosine_annealing':  eta_min + (peak - eta_min) * (1 + cos(pi * t / t_max)) / 2,
                    t = k - warmup_steps (periodic in 2 t_max, as torch);
    with peak = start_lr * warmup_factor after a warmup, else start_lr.
    (With warmup_factor != 1 the reference's warmup schedulers raise, reading an
    undefined `self.multiplier`; every RCP uses 1. Here the factor gives the
    ramp the reference intended.)
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
        # Where the scheduler stands at optimizer step 0 (see the class doc).
        self.offset = 0 if (kind == "cosine_annealing" and not self.warmup_steps) else 1
        # Milestones count from the end of warmup, one step later (the reference shifts them).
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

    def get_config(self):
        return dict(
            kind=self.kind,
            start_lr=self.start_lr,
            warmup_steps=self.warmup_steps,
            warmup_factor=self.warmup_factor,
            milestones=self.milestones,
            decay_rate=self.decay_rate,
            t_max=self.t_max,
            eta_min=self.eta_min,
        )


SCHEDULES = {
    "epoch_warmup_step_decay": EpochWarmupStepDecay,  # CosmoFlow's
    "step_warmup": StepWarmupSchedule,  # DeepCAM's multistep and cosine annealing
}


def build_schedule(name: str, **kwargs) -> tf_keras.optimizers.schedules.LearningRateSchedule:
    """The schedule of SCHEDULES called `name`, built with these arguments.

    Raises:
      ConfigError: no schedule has that name (the message lists those that do).
    """
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

    def get_config(self):
        return super().get_config() | {"l2": self.l2}


class LAMB(tf_keras.optimizers.Optimizer):
    """Layer-wise adaptive moments (You et al. 2019), apex FusedLAMB flavour.

    The update is written per variable, as Keras' optimizers are; where Keras would compile it (a
    GPU), TrainStep compiles every variable's update, the clip and the finiteness check as one XLA
    function, whose kernels XLA's GPU backend can fuse across variables (common/run/steps.py).

    Args:
      learning_rate: float or schedule.
      beta_1, beta_2, epsilon: Adam moments; epsilon is added to sqrt(v_hat).
      weight_decay_rate: decoupled decay added to the update before the trust ratio.
      max_grad_norm: gradients are scaled so their global norm is at most this.
    """

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
        # weight_decay=None: Keras' own decoupled decay (its default here is 0) would multiply every
        # variable by 0 each step, as the step starts (it waits for no gradient).
        super().__init__(
            name=name, global_clipnorm=max_grad_norm or None, weight_decay=None, **kwargs
        )
        self._learning_rate = self._build_learning_rate(learning_rate)
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon
        self.weight_decay_rate = weight_decay_rate
        self.max_grad_norm = max_grad_norm

    def build(self, var_list):
        super().build(var_list)
        if hasattr(self, "_built") and self._built:
            return
        self._built = True
        self._m = [self.add_variable_from_reference(v, "m") for v in var_list]
        self._v = [self.add_variable_from_reference(v, "v") for v in var_list]

    def update_step(self, gradient, variable):
        dtype = variable.dtype
        lr = tf.cast(self.learning_rate, dtype)
        step = tf.cast(self.iterations + 1, dtype)
        b1, b2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
        index = self._index_dict[self._var_key(variable)]
        m, v = self._m[index], self._v[index]
        # Every term the size of the variable comes from the gradient or after it: a graph runs an op
        # once its inputs are ready, and one of the slots or weights alone (b1 * m, decay * w) would
        # run as the step starts and be held through forward and backward (1.2 GiB more at the peak
        # of DeepCAM's step at 768 x 1152 fp32 on a 2-core AVX2 EPYC: docs/figures.md).
        m.assign_add((gradient - m) * (1.0 - b1))  # b1 m + (1 - b1) g
        v.assign_add((tf.square(gradient) - v) * (1.0 - b2))  # b2 v + (1 - b2) g^2
        m_hat = m / (1.0 - tf.pow(b1, step))
        v_hat = v / (1.0 - tf.pow(b2, step))
        update = m_hat / (tf.sqrt(v_hat) + tf.cast(self.epsilon, dtype))
        if self.weight_decay_rate:
            with tf.control_dependencies([update]):
                update += tf.cast(self.weight_decay_rate, dtype) * variable
                w_norm = tf.norm(variable)
            u_norm = tf.norm(update)
            ratio = tf.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, tf.ones_like(w_norm))
        else:
            ratio = tf.constant(1.0, dtype)
        variable.assign_sub(lr * ratio * update)

    def get_config(self):
        config = super().get_config()
        config.pop("global_clipnorm", None)
        return config | {
            "learning_rate": self._serialize_hyperparameter(self._learning_rate),
            "beta_1": self.beta_1,
            "beta_2": self.beta_2,
            "epsilon": self.epsilon,
            "weight_decay_rate": self.weight_decay_rate,
            "max_grad_norm": self.max_grad_norm,
        }


@dataclasses.dataclass(frozen=True)
class OptimizerEntry:
    """An optimizer class and the hyperparameters it takes.

    Hyperparameters go by Keras' names (learning_rate, momentum, beta_1, beta_2, epsilon,
    weight_decay) and max_grad_norm, whatever the class calls them.

    Attributes:
      cls: the optimizer class.
      takes: the hyperparameters it uses; others given to `build` are not passed to it.
      renamed: (hyperparameter, the class's keyword for it) pairs, where the two differ.
    """

    cls: type
    takes: tuple[str, ...]
    renamed: tuple[tuple[str, str], ...] = ()

    def build(self, **hyperparameters) -> tf_keras.optimizers.Optimizer:
        keywords = dict(self.renamed)
        return self.cls(
            **{
                keywords.get(key, key): value
                for key, value in hyperparameters.items()
                if key in self.takes
            }
        )


_ADAM = ("learning_rate", "beta_1", "beta_2", "epsilon", "weight_decay")
# Named as the configs and the MLPerf log's opt_name spell them.
OPTIMIZERS = {
    "SGD": OptimizerEntry(tf_keras.optimizers.SGD, takes=("learning_rate", "momentum")),
    # PyTorch's Adam: weight decay as an L2 term of the gradient.
    "Adam": OptimizerEntry(AdamL2, takes=_ADAM, renamed=(("weight_decay", "l2"),)),
    "AdamW": OptimizerEntry(tf_keras.optimizers.AdamW, takes=_ADAM),
    "LAMB": OptimizerEntry(
        LAMB, takes=(*_ADAM, "max_grad_norm"), renamed=(("weight_decay", "weight_decay_rate"),)
    ),
}


def names_taking(*hyperparameters: str) -> tuple[str, ...]:
    """The optimizers of OPTIMIZERS that take every one of these hyperparameters."""
    return tuple(
        name for name, entry in OPTIMIZERS.items() if set(hyperparameters) <= set(entry.takes)
    )


def check_name(name: str, hyperparameters) -> None:
    """A config's check of its optimizer.name: an optimizer of OPTIMIZERS taking every one of
    `hyperparameters` (those the config sets for every run).

    Raises:
      ConfigError: it names another (the message lists those that would do).
    """
    usable = names_taking(*hyperparameters)
    if name not in usable:
        raise ConfigError(
            f"config key 'optimizer.name'={name!r}: choose one of {', '.join(usable)} (the "
            f"optimizers of common/optimizers.py taking {', '.join(hyperparameters)})"
        )


def build_optimizer(name: str, **hyperparameters) -> tf_keras.optimizers.Optimizer:
    """The optimizer of OPTIMIZERS called `name`, built with the hyperparameters it takes.

    Raises:
      ConfigError: no optimizer has that name (the message lists those that do).
    """
    if name not in OPTIMIZERS:
        raise ConfigError(f"unknown optimizer {name!r}; known: {', '.join(OPTIMIZERS)}")
    return OPTIMIZERS[name].build(**hyperparameters)
