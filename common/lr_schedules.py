"""Learning-rate schedules, as pure functions of the step and as Keras schedules.

Each schedule has a Python form (`at_step`), used for tests and logging, and a
TensorFlow form (`__call__`), used by the optimizer inside the compiled step.
Both compute the same numbers; a test checks it.
"""

import math
from typing import Mapping

import tensorflow as tf


def scale_lr(base_lr: float, global_batch_size: int, base_batch_size: int, scaling: str) -> float:
    """The reference's LR scaling with global batch size: 'linear', 'sqrt' or 'none'."""
    if scaling == "linear":
        return base_lr * global_batch_size / base_batch_size
    if scaling == "sqrt":
        return base_lr * math.sqrt(global_batch_size / base_batch_size)
    if scaling == "none":
        return base_lr
    raise ValueError(f"unknown LR scaling '{scaling}'")


class EpochWarmupStepDecay(tf.keras.optimizers.schedules.LearningRateSchedule):
    """CosmoFlow's schedule: per-epoch linear warmup, then step decay.

    As in the reference: during epoch e < warmup_epochs the LR is
    init_lr + e * (peak_lr - init_lr) / warmup_epochs, with
    init_lr = base_lr * warmup_factor; afterwards it is peak_lr times the
    factor of the last decay boundary reached (factors are absolute, not
    cumulative: {32: 0.25, 64: 0.125} means peak/4 then peak/8).
    """

    def __init__(self, peak_lr: float, init_lr: float, warmup_epochs: int,
                 decay: Mapping[int, float], steps_per_epoch: int):
        super().__init__()
        self.peak_lr = float(peak_lr)
        self.init_lr = float(init_lr)
        self.warmup_epochs = int(warmup_epochs)
        self.decay = sorted((int(e), float(f)) for e, f in decay.items())
        self.steps_per_epoch = int(steps_per_epoch)

    def at_epoch(self, epoch: int) -> float:
        if epoch < self.warmup_epochs:
            return self.init_lr + epoch * (self.peak_lr - self.init_lr) / self.warmup_epochs
        factor = 1.0
        for boundary, f in self.decay:
            if epoch >= boundary:
                factor = f
        return self.peak_lr * factor

    def at_step(self, step: int) -> float:
        return self.at_epoch(step // self.steps_per_epoch)

    def __call__(self, step):
        epoch = tf.cast(step, tf.float32) // float(self.steps_per_epoch)
        factor = tf.constant(1.0)
        for boundary, f in self.decay:
            factor = tf.where(epoch >= boundary, tf.constant(f), factor)
        decayed = self.peak_lr * factor
        if self.warmup_epochs == 0:
            return decayed
        warm = self.init_lr + epoch * (self.peak_lr - self.init_lr) / self.warmup_epochs
        return tf.where(epoch < self.warmup_epochs, warm, decayed)

    def get_config(self):
        return dict(peak_lr=self.peak_lr, init_lr=self.init_lr, warmup_epochs=self.warmup_epochs,
                    decay=dict(self.decay), steps_per_epoch=self.steps_per_epoch)


class StepWarmupSchedule(tf.keras.optimizers.schedules.LearningRateSchedule):
    """DeepCAM's step-based schedules with the reference's linear warmup.

    Warmup (step <= warmup_steps), as the reference's schedulers: with
    warmup_factor 1 the LR rises linearly from 0 to start_lr; otherwise from
    start_lr to start_lr * warmup_factor. After warmup, from the LR reached
    (`peak`), either
      'multistep': peak * decay_rate ** (number of milestones m with
                   step >= warmup_steps + 1 + m); milestones count in steps
                   after warmup, as the reference shifts them;
      'cosine_annealing': eta_min + (peak - eta_min) * (1 + cos(pi * t / t_max)) / 2
                   with t = step - warmup_steps (periodic in 2 t_max, as torch).
    `step` is the optimizer step (0 for the first update).
    """

    def __init__(self, kind: str, start_lr: float, warmup_steps: int = 0, warmup_factor: float = 1.0,
                 milestones=(), decay_rate: float = 0.1, t_max: int = 1, eta_min: float = 0.0):
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

    def _warmup(self, step):
        fraction = step / self.warmup_steps
        if self.warmup_factor == 1.0:
            return self.start_lr * fraction
        return self.start_lr * ((self.warmup_factor - 1.0) * fraction + 1.0)

    def at_step(self, step: int) -> float:
        if self.warmup_steps and step <= self.warmup_steps:
            return self._warmup(step)
        t = step - self.warmup_steps
        if self.kind == "multistep":
            passed = sum(1 for m in self.milestones if t >= m + 1)
            return self.peak_lr * self.decay_rate ** passed
        return self.eta_min + (self.peak_lr - self.eta_min) * (1 + math.cos(math.pi * t / self.t_max)) / 2

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        t = step - self.warmup_steps
        if self.kind == "multistep":
            passed = tf.zeros([])
            for m in self.milestones:
                passed += tf.cast(t >= m + 1, tf.float32)
            after = self.peak_lr * tf.pow(self.decay_rate, passed)
        else:
            after = self.eta_min + (self.peak_lr - self.eta_min) * (1 + tf.cos(math.pi * t / self.t_max)) / 2
        if not self.warmup_steps:
            return after
        return tf.where(step <= self.warmup_steps, self._warmup(step), after)

    def get_config(self):
        return dict(kind=self.kind, start_lr=self.start_lr, warmup_steps=self.warmup_steps,
                    warmup_factor=self.warmup_factor, milestones=self.milestones,
                    decay_rate=self.decay_rate, t_max=self.t_max, eta_min=self.eta_min)
