"""LR schedules against step-by-step simulations of the references' own schedulers.

The oracles below re-state, in plain Python, what the references execute:
CosmoFlow's Keras LearningRateScheduler calling utils/optimizers.py::_lr_schedule
with the 0-based epoch, and DeepCAM's PyTorch schedulers (utils/schedulers.py,
torch's MultiStepLR / CosineAnnealingLR) in their recursive ("chainable") form,
built as utils/optimizer_helpers.py builds them (last_epoch = start step 0, or
torch's default -1 for cosine annealing without warmup) and stepped once after
every optimizer step (driver/trainer.py).
"""

import math
from collections import Counter

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from common.optimizers import EpochWarmupStepDecay, StepWarmupSchedule, scale_lr


# ------------------------------------------------------------------ oracles
def reference_cosmoflow_lr(epoch, base_lr, peak_lr, n_warmup_epochs, decay_schedule):
    if epoch < n_warmup_epochs:
        return epoch * (peak_lr - base_lr) / n_warmup_epochs + base_lr
    decay_factor, decay_epoch = 1.0, 0
    for e, d in decay_schedule.items():
        if e >= decay_epoch and e < epoch:
            decay_epoch, decay_factor = e, d
    return peak_lr * decay_factor


def reference_deepcam_lrs(
    kind, start_lr, n_steps, warmup_steps=0, milestones=(), gamma=0.1, t_max=1, eta_min=0.0
):
    """The LR each of the first n_steps optimizer steps uses in the reference."""
    warm_milestones = Counter(m + warmup_steps + 1 for m in milestones)
    plain_milestones = Counter(milestones)

    def get_lr(k, lr):
        if warmup_steps and k <= warmup_steps:
            return start_lr * k / warmup_steps
        if kind == "multistep":
            table = warm_milestones if warmup_steps else plain_milestones
            return lr * gamma ** table[k] if k in table else lr
        t = k - warmup_steps
        if t == 0:
            return lr
        if (t - 1 - t_max) % (2 * t_max) == 0:
            return lr + (start_lr - eta_min) * (1 - math.cos(math.pi / t_max)) / 2
        return (1 + math.cos(math.pi * t / t_max)) / (1 + math.cos(math.pi * (t - 1) / t_max)) * (
            lr - eta_min
        ) + eta_min

    k = -1 if (kind == "cosine_annealing" and not warmup_steps) else 0  # last_epoch at construction
    k += 1  # the constructor's step
    lr = get_lr(k, start_lr)
    used = []
    for _ in range(n_steps):
        used.append(lr)  # optimizer.step() with the current LR ...
        k += 1  # ... then scheduler.step()
        lr = get_lr(k, lr)
    return np.array(used)


def tf_values(schedule, n_steps):
    return schedule(tf.range(n_steps, dtype=tf.int64)).numpy().astype(np.float64)


# ---------------------------------------------------------------- CosmoFlow
def test_cosmoflow_decay_acts_the_epoch_after_its_boundary():
    s = EpochWarmupStepDecay(
        0.008,
        0.001,
        warmup_epochs=4,
        boundaries=[32, 64],
        factors=[0.25, 0.125],
        steps_per_epoch=10,
    )
    expected = {
        0: 0.001,
        1: 0.001 + 0.007 / 4,
        3: 0.001 + 3 * 0.007 / 4,
        4: 0.008,
        32: 0.008,
        33: 0.002,
        64: 0.002,
        65: 0.001,
        127: 0.001,
    }
    for epoch, lr in expected.items():
        assert s.at_epoch(epoch) == pytest.approx(lr), epoch
    assert s.at_step(329) == pytest.approx(0.008) and s.at_step(330) == pytest.approx(0.002)


@pytest.mark.parametrize(
    "warmup, boundaries, factors",
    [
        (4, [32, 64], [0.25, 0.125]),
        (0, [3, 5], [0.5, 0.1]),
        (6, [19, 21, 22, 23], [0.5, 0.25, 0.125, 0.0625]),
        (2, [], []),
    ],
)
def test_cosmoflow_schedule_equals_the_reference_at_every_step(warmup, boundaries, factors):
    steps_per_epoch, epochs = 7, 40
    s = EpochWarmupStepDecay(0.006, 0.0015, warmup, boundaries, factors, steps_per_epoch)
    oracle = np.array(
        [
            reference_cosmoflow_lr(
                step // steps_per_epoch, 0.0015, 0.006, warmup, dict(zip(boundaries, factors))
            )
            for step in range(steps_per_epoch * epochs)
        ]
    )
    python = np.array([s.at_step(step) for step in range(steps_per_epoch * epochs)])
    np.testing.assert_allclose(python, oracle, rtol=1e-12)
    np.testing.assert_allclose(tf_values(s, steps_per_epoch * epochs), oracle, rtol=1e-6)


def test_scaling_rules():
    assert scale_lr(0.001, 512, 64, "linear") == pytest.approx(0.008)
    assert scale_lr(0.001, 256, 64, "sqrt") == pytest.approx(0.002)
    assert scale_lr(0.001, 256, 64, "none") == pytest.approx(0.001)
    with pytest.raises(ValueError):
        scale_lr(0.001, 256, 64, "cubic")


def test_optimizer_uses_the_schedule():
    s = EpochWarmupStepDecay(
        0.1, 0.01, warmup_epochs=1, boundaries=[], factors=[], steps_per_epoch=2
    )
    opt = tf_keras.optimizers.SGD(learning_rate=s)
    v = tf.Variable(1.0)
    lrs = []
    for _ in range(4):
        before = float(v.numpy())
        opt.apply_gradients([(tf.constant(1.0), v)])
        lrs.append(before - float(v.numpy()))
    np.testing.assert_allclose(lrs, [0.01, 0.01, 0.1, 0.1], rtol=1e-5)


# ------------------------------------------------------------------ DeepCAM
DEEPCAM_CASES = [
    dict(kind="multistep", start_lr=0.0055, warmup_steps=400, milestones=[800]),
    dict(kind="multistep", start_lr=0.004, warmup_steps=0, milestones=[30, 120, 120]),
    dict(kind="multistep", start_lr=0.002, warmup_steps=5, milestones=[0, 40], gamma=0.5),
    dict(kind="cosine_annealing", start_lr=0.00155, warmup_steps=0, t_max=90, eta_min=0.0),
    dict(kind="cosine_annealing", start_lr=0.002, warmup_steps=20, t_max=70, eta_min=1e-5),
]


@pytest.mark.parametrize(
    "case", DEEPCAM_CASES, ids=lambda c: f"{c['kind']}-warmup{c['warmup_steps']}"
)
def test_deepcam_schedule_equals_the_reference_at_every_step(case):
    n = 1300 if case["kind"] == "multistep" else 400  # cosine: more than two periods
    s = StepWarmupSchedule(
        case["kind"],
        case["start_lr"],
        case["warmup_steps"],
        1.0,
        milestones=case.get("milestones", ()),
        decay_rate=case.get("gamma", 0.1),
        t_max=case.get("t_max", 1),
        eta_min=case.get("eta_min", 0.0),
    )
    oracle = reference_deepcam_lrs(n_steps=n, **case)
    python = np.array([s.at_step(j) for j in range(n)])
    np.testing.assert_allclose(python, oracle, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(tf_values(s, n), oracle, rtol=2e-5, atol=1e-9)


def test_deepcam_first_update_already_warms_up():
    # last_step=0: optimizer step 0 runs at scheduler position 1.
    s = StepWarmupSchedule("multistep", 0.0055, warmup_steps=400, milestones=[800])
    assert s.at_step(0) == pytest.approx(0.0055 / 400)
    assert s.at_step(399) == pytest.approx(0.0055)
    assert s.at_step(400 + 800 - 1) == pytest.approx(0.0055)
    assert s.at_step(400 + 800) == pytest.approx(0.00055)
    # Without warmup the first milestone m decays from optimizer step m - 1 on.
    plain = StepWarmupSchedule("multistep", 0.002, milestones=[4096])
    assert plain.at_step(4094) == pytest.approx(0.002) and plain.at_step(4095) == pytest.approx(
        0.0002
    )


def test_warmup_factor_ramps_to_start_lr_times_factor():
    s = StepWarmupSchedule(
        "multistep", 0.001, warmup_steps=10, warmup_factor=2.0, milestones=[5], decay_rate=0.5
    )
    assert s.at_step(9) == pytest.approx(0.002)
    assert s.at_step(10 + 5) == pytest.approx(0.001)
    with pytest.raises(ValueError, match="cosine"):
        StepWarmupSchedule("poly", 0.1)
