"""Learning-rate schedules of the MLCommons references, as pure functions of the step and as Keras schedules.

Each schedule has a Python form (`at_step`), used for tests and logging, and a
TensorFlow form (`__call__`), used by the optimizer inside the compiled step.
Both compute the same numbers; a test checks it, and another checks both
against a step-by-step simulation of the reference's schedulers.

A task names its schedule; SCHEDULES maps the name to the class and `build_schedule` builds
it. A new schedule is its class here, its entry in SCHEDULES and its test.
"""

import math
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
