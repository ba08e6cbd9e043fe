import numpy as np
import pytest
import tensorflow as tf

from common.lr_schedules import EpochWarmupStepDecay, StepWarmupSchedule, scale_lr


def test_reference_closed_schedule_values():
    # Closed division: base LR 0.001 at batch 64, global batch 512 -> peak 0.008.
    peak = scale_lr(0.001, 512, 64, "linear")
    assert peak == pytest.approx(0.008)
    s = EpochWarmupStepDecay(peak, 0.001, warmup_epochs=4, decay={32: 0.25, 64: 0.125}, steps_per_epoch=10)
    expected = {0: 0.001, 1: 0.001 + 0.007 / 4, 3: 0.001 + 3 * 0.007 / 4, 4: 0.008, 31: 0.008,
                32: 0.002, 63: 0.002, 64: 0.001, 127: 0.001}
    for epoch, lr in expected.items():
        assert s.at_epoch(epoch) == pytest.approx(lr), epoch
    assert s.at_step(39) == pytest.approx(s.at_epoch(3))
    assert s.at_step(40) == pytest.approx(0.008)


def test_sqrt_and_none_scaling():
    assert scale_lr(0.001, 256, 64, "sqrt") == pytest.approx(0.002)
    assert scale_lr(0.001, 256, 64, "none") == pytest.approx(0.001)
    with pytest.raises(ValueError):
        scale_lr(0.001, 256, 64, "cubic")


def test_tensorflow_form_matches_python_form_step_by_step():
    s = EpochWarmupStepDecay(0.04, 0.004, warmup_epochs=3, decay={5: 0.5, 7: 0.1}, steps_per_epoch=4)
    steps = np.arange(0, 40)
    tf_values = np.array([float(s(tf.constant(step, tf.int64))) for step in steps])
    py_values = np.array([s.at_step(int(step)) for step in steps])
    np.testing.assert_allclose(tf_values, py_values, rtol=1e-6)
    assert len(set(np.round(py_values, 8))) == 5  # 3 warmup values, peak/2, peak/10


def test_optimizer_uses_the_schedule():
    s = EpochWarmupStepDecay(0.1, 0.01, warmup_epochs=1, decay={}, steps_per_epoch=2)
    opt = tf.keras.optimizers.SGD(learning_rate=s)
    v = tf.Variable(1.0)
    lrs = []
    for _ in range(4):
        before = float(v.numpy())
        opt.apply_gradients([(tf.constant(1.0), v)])
        lrs.append(before - float(v.numpy()))
    np.testing.assert_allclose(lrs, [0.01, 0.01, 0.1, 0.1], rtol=1e-5)


def test_deepcam_multistep_with_warmup_step_by_step():
    s = StepWarmupSchedule("multistep", 0.0055, warmup_steps=400, warmup_factor=1.0, milestones=[800],
                           decay_rate=0.1)
    assert s.at_step(0) == 0.0
    assert s.at_step(200) == pytest.approx(0.00275)
    assert s.at_step(400) == pytest.approx(0.0055)
    # Milestones count after warmup, shifted by one as the reference's scheduler.
    assert s.at_step(400 + 800) == pytest.approx(0.0055)
    assert s.at_step(400 + 801) == pytest.approx(0.00055)
    factor = StepWarmupSchedule("multistep", 0.001, warmup_steps=10, warmup_factor=2.0, milestones=[5, 10],
                                decay_rate=0.5)
    assert factor.at_step(0) == pytest.approx(0.001)        # from start_lr ...
    assert factor.at_step(10) == pytest.approx(0.002)       # ... to start_lr x factor
    assert factor.at_step(16) == pytest.approx(0.001) and factor.at_step(21) == pytest.approx(0.0005)
    for sched in (s, factor):
        for step in (0, 1, 199, 400, 401, 1200, 1201, 5000):
            assert float(sched(step)) == pytest.approx(sched.at_step(step), rel=1e-5, abs=1e-12)


def test_deepcam_cosine_annealing_with_warmup():
    s = StepWarmupSchedule("cosine_annealing", 0.002, warmup_steps=100, t_max=1000, eta_min=1e-5)
    assert s.at_step(50) == pytest.approx(0.001)
    assert s.at_step(100) == pytest.approx(0.002)
    assert s.at_step(600) == pytest.approx(1e-5 + (0.002 - 1e-5) / 2)
    assert s.at_step(1100) == pytest.approx(1e-5)
    for step in (0, 77, 100, 101, 600, 1100, 1700):
        assert float(s(step)) == pytest.approx(s.at_step(step), rel=1e-5)
    with pytest.raises(ValueError, match="cosine"):
        StepWarmupSchedule("poly", 0.1)
