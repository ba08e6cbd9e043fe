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
