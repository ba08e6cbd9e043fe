"""fp16 mixed precision on CPU: dynamic loss scaling (common.runtime.wrap_optimizer) in TrainStep.

The model is one Dense layer, so the float16 step can be checked against the float32
step exactly where the maths says they agree exactly, and within a derived rounding
bound elsewhere. The layer keeps float32 variables and computes in float16 (the Keras
mixed policy); TrainStep scales the loss by the loss scale S before the backward pass
and divides the gradients by S before applying them.

Then CosmoFlow, whose closed configs run --amp (fp16 on a GPU), on the trainer's own path: the
gradients handed to the allreduce are unscaled (a negative control leaves them scaled), an Inf
arriving with the averaged gradients skips the update and halves S, and S doubles after Keras'
growth steps of good steps. Last, what --amp picks from those configs and how [init] names it.
"""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from common.run.steps import TrainStep
from common.runtime import wrap_optimizer
from tests import helpers

LR = 0.01
S0 = 2.0**15  # Keras' initial dynamic loss scale
U16 = 2.0**-11  # unit roundoff of float16 (11 significant bits)
U32 = 2.0**-24


def mse(y, pred):
    return tf.reduce_mean(tf.square(y - tf.cast(pred, tf.float32)))


@pytest.fixture(autouse=True)
def float32_afterwards():
    """Whatever a test does to the global policy, the next test starts from float32."""
    try:
        yield
    finally:
        tf_keras.mixed_precision.set_global_policy("float32")


def build(policy: str, kernel, bias) -> tf_keras.Model:
    """Dense(1) made under the global policy `policy`, with these weights."""
    tf_keras.mixed_precision.set_global_policy(policy)
    try:
        model = tf_keras.Sequential([tf_keras.Input((kernel.shape[0],)), tf_keras.layers.Dense(1)])
    finally:
        tf_keras.mixed_precision.set_global_policy("float32")
    model.layers[0].set_weights([np.asarray(kernel, np.float32), np.asarray(bias, np.float32)])
    return model


def step(policy: str, kernel, bias, x, y):
    """One TrainStep of SGD(LR) under `policy`; returns (model, optimizer, loss)."""
    model = build(policy, kernel, bias)
    optimizer = wrap_optimizer(tf_keras.optimizers.SGD(LR), policy)
    loss = TrainStep(model, optimizer, mse, helpers.SingleProcess())(
        iter([(tf.constant(x, tf.float32), tf.constant(y, tf.float32))])
    ).loss
    return model, optimizer, float(loss)


def weights(model) -> list:
    return [v.numpy() for v in model.trainable_variables]


def test_only_float16_policies_get_a_loss_scale_optimizer():
    for policy in ("mixed_float16", tf_keras.mixed_precision.Policy("mixed_float16")):
        sgd = tf_keras.optimizers.SGD(LR)
        wrapped = wrap_optimizer(sgd, policy)
        assert isinstance(wrapped, tf_keras.mixed_precision.LossScaleOptimizer)
        assert (
            wrapped.inner_optimizer is sgd and wrapped.dynamic and float(wrapped.loss_scale) == S0
        )
    for policy in ("float32", "mixed_bfloat16", tf_keras.mixed_precision.Policy("mixed_bfloat16")):
        sgd = tf_keras.optimizers.SGD(LR)
        assert (
            wrap_optimizer(sgd, policy) is sgd
        )  # bf16 has float32's exponent range: nothing overflows


def test_a_step_whose_fp16_gradients_overflow_is_skipped_and_halves_the_loss_scale():
    kernel, bias = np.full((4, 1), 0.25), np.zeros(1)
    x, y = np.full((8, 4), 64.0), np.zeros((8, 1))
    # pred = 64 and the loss 4096 are finite in float16, but dLoss/dpred x S = 2/8 x 64 x 2^15
    # = 2^19 is beyond float16's largest value (65504): the backward pass overflows.
    model, opt, loss = step("mixed_float16", kernel, bias, x, y)
    assert model.layers[0].compute_dtype == "float16" and model.layers[0].kernel.dtype == tf.float32
    assert loss == 4096.0
    assert float(opt.loss_scale) == S0 / 2
    np.testing.assert_array_equal(weights(model)[0], kernel.astype(np.float32))  # not updated
    np.testing.assert_array_equal(weights(model)[1], bias.astype(np.float32))
    assert int(opt.iterations) == 1  # Keras counts the skipped step: the LR schedule moves on
    # The same step in float32 has finite gradients and moves every weight.
    ref, ref_opt, ref_loss = step("float32", kernel, bias, x, y)
    assert ref_loss == 4096.0 and int(ref_opt.iterations) == 1
    np.testing.assert_allclose(
        weights(ref)[0], np.full((4, 1), 0.25 - LR * 2 / 8 * 8 * 64 * 64), rtol=1e-6
    )


def test_a_normal_step_with_values_exact_in_fp16_equals_the_fp32_step_bit_for_bit():
    # Inputs in {-1, -0.5, 0, 0.5, 1}, weights multiples of 1/4, targets 1/8 off the
    # prediction: every product and partial sum of the forward and backward pass is a
    # multiple of a power of two with a few significant bits, the scaled gradients stay
    # below 2^15 < 65504, and S is a power of two: float16 computes all of it exactly,
    # so the update must be the float32 one, bit for bit.
    rng = np.random.default_rng(0)
    x = rng.integers(-2, 3, (8, 4)) / 2.0
    kernel, bias = rng.integers(-4, 5, (4, 1)) / 4.0, np.array([0.5])
    y = x @ kernel + bias + rng.integers(-4, 5, (8, 1)) / 8.0
    model, opt, loss = step("mixed_float16", kernel, bias, x, y)
    ref, _, ref_loss = step("float32", kernel, bias, x, y)
    assert float(opt.loss_scale) == S0 and int(opt.iterations) == 1  # applied, no overflow
    assert loss == ref_loss
    assert not np.array_equal(
        weights(ref)[0], kernel.astype(np.float32)
    )  # the step moved the weights
    for got, expected in zip(weights(model), weights(ref)):
        np.testing.assert_array_equal(got, expected)


def test_a_normal_step_on_random_values_is_the_fp32_step_within_the_fp16_rounding_bound():
    rng = np.random.default_rng(1)
    B, F = 8, 4
    x = rng.uniform(-0.5, 0.5, (B, F))
    kernel, bias = rng.uniform(-1, 1, (F, 1)), rng.uniform(-1, 1, 1)
    y = x @ kernel + bias + rng.uniform(-0.5, 0.5, (B, 1))  # |dLoss/dpred| x S < 2^13: no overflow
    model, opt, _ = step("mixed_float16", kernel, bias, x, y)
    ref, _, _ = step("float32", kernel, bias, x, y)
    assert float(opt.loss_scale) == S0 and int(opt.iterations) == 1

    # Forward error analysis of the float16 step (x, kernel and bias rounded to float16,
    # an (F+1)-term dot product, the output rounded), gamma_k = k u / (1 - k u):
    #   |pred16 - pred| <= e_b = gamma_{F+3} (sum_f |x_bf w_f| + |c|)
    # dLoss/dpred = 2/B (pred - y) times S is rounded to float16 (S exact, a power of two),
    # then the B-term sums of the kernel and bias gradients: with r_b = |pred_b - y_b|,
    #   |g16_f - g_f| <= 2/B sum_b |x_bf| (e_b + gamma_{B+4} (r_b + e_b)),
    # the bias likewise with |x_bf| = 1. The float32 step has the same terms with 2^-24.
    def gamma(k, u):
        return k * u / (1 - k * u)

    w, c = kernel[:, 0], bias[0]
    dot = np.abs(x * w).sum(1) + abs(c)
    r = np.abs(x @ w + c - y[:, 0])
    bound = []
    for u in (U16, U32):
        e = gamma(F + 3, u) * dot
        per_sample = e + gamma(B + 4, u) * (r + e)
        bound.append((2 / B * (np.abs(x).T @ per_sample), 2 / B * per_sample.sum()))
    kernel_bound = LR * (bound[0][0] + bound[1][0])[:, None] * (1 + 1e-3)  # plus float32's own
    bias_bound = LR * (bound[0][1] + bound[1][1]) * (1 + 1e-3)  # rounding of w - lr g

    (k16, b16), (k32, b32) = weights(model), weights(ref)
    start_k, start_b = kernel.astype(np.float32), bias.astype(np.float32)
    kernel_err = np.abs((k16 - start_k).astype(np.float64) - (k32 - start_k))
    bias_err = np.abs((b16 - start_b).astype(np.float64) - (b32 - start_b))
    # Plus the rounding of the stored float32 weights, which the differences above include.
    stored = 2 * np.spacing(np.float32(max(np.abs(k32).max(), np.abs(b32).max())))
    assert np.all(kernel_err <= kernel_bound + stored), (kernel_err, kernel_bound)
    assert np.all(bias_err <= bias_bound + stored), (bias_err, bias_bound)
    # It did compute in float16: the update differs from float32's, by about float16's precision.
    update = np.abs(k32 - start_k).astype(np.float64)
    assert 1e-5 < (kernel_err / update).max() < 20 * U16, kernel_err / update


# ------------------------------------------------------------------ CosmoFlow under fp16
# The closed configs run --amp, which is fp16 on a GPU. The tests above prove the loss scaling on one
# Dense layer; these run the trainer's own path for CosmoFlow (common.run.trainer._build: the model
# under common.runtime.dtype_policy, the task's SGD with momentum, wrap_optimizer, TrainStep with the
# task's preprocessing) on a small CosmoFlow model, and look at what reaches the allreduce.

# The tests' tiny config, smaller still: 16^3 x 4 samples, two conv layers of 4 and 8 filters.
COSMO_OVERRIDES = {
    "data.data_dir": "unused",
    "data.sample_shape": "16,16,16,4",
    "data.batch_size": "4",
    "train.global_batch_size": "4",
    "model.conv_size": "4",
    "model.n_conv_layers": "2",
}
# Norm-wise relative error of each fp16 gradient against the fp32 one. fp16's rounding moved the first
# conv layer's gradients by 3.7% here (sums of 11-bit products over 4 x 16^3 positions); a gradient
# left scaled is off by S0 - 1, one unscaled by a wrong power of two by at least 50%.
GRAD_TOLERANCE = 0.1


class RecordingDistribution(helpers.SingleProcess):
    """One process that keeps a copy of the gradients TrainStep hands to the allreduce, and can make
    the "averaged" gradients hold an Inf, as the sum would when another rank's fp16 step overflowed."""

    def __init__(self, variables, inject_inf: bool = False):
        self.seen = [tf.Variable(tf.zeros_like(v), trainable=False) for v in variables]
        self._inject_inf = inject_inf

    def average_gradients(self, grads, compression="none", grouped=False):
        for slot, g in zip(self.seen, grads):
            slot.assign(g)
        if self._inject_inf:
            grads = [grads[0] + np.inf, *grads[1:]]
        return grads


@pytest.fixture(scope="module")
def cosmoflow_start():
    """(task, initial weights, one batch as the input pipeline yields it: int16 counts, float32 targets)."""
    from common.config import load_config
    from cosmoflow.config import CosmoFlowConfig
    from cosmoflow.task import CosmoFlowTask

    task = CosmoFlowTask(
        load_config(
            CosmoFlowConfig, helpers.REPO / "tests/configs/cosmoflow_tiny.yaml", COSMO_OVERRIDES
        )
    )
    weights = task.build_model(None).get_weights()
    rng = np.random.default_rng(3)
    x = rng.poisson(4.0, (4, 16, 16, 16, 4)).astype(np.int16)
    y = rng.uniform(-1, 1, (4, 4)).astype(np.float32)
    return task, weights, (tf.constant(x), tf.constant(y))


def cosmoflow_train_step(
    start, policy: str, inject_inf: bool = False, skip_unscaling: bool = False
):
    """CosmoFlow's TrainStep under `policy`, from the start's weights, built as the trainer builds it;
    returns (step, model, optimizer, distribution). `skip_unscaling` leaves the gradients scaled (the
    negative control). XLA-compiled, as on a GPU (TensorFlow has no float16 MaxPool3D kernel for the
    CPU; XLA has)."""
    from common.runtime import dtype_policy

    task, weights, _ = start
    with dtype_policy(policy):
        model = task.build_model(None)
    model.set_weights(weights)
    optimizer, _ = task.build_optimizer(4, 1)
    optimizer.jit_compile = True  # TrainStep's update as a GPU runs it: one XLA-compiled function
    optimizer = wrap_optimizer(optimizer, policy)
    if skip_unscaling:
        optimizer.get_unscaled_gradients = lambda grads: grads
    dist = RecordingDistribution(model.trainable_variables, inject_inf)
    step = TrainStep(
        model, optimizer, task.build_losses(), dist, xla=True, preprocess=task.preprocess_batch
    )
    return step, model, optimizer, dist


def cosmoflow_step(start, policy: str, **kwargs):
    """One step of cosmoflow_train_step(start, policy, **kwargs) on the start's batch: (model, optimizer, distribution)."""
    step, model, optimizer, dist = cosmoflow_train_step(start, policy, **kwargs)
    step(iter([start[2]]))
    return model, optimizer, dist


def relative_errors(grads, reference) -> list:
    """Per variable, ||g - g_ref|| / ||g_ref||."""
    return [
        float(np.linalg.norm(g.numpy() - r.numpy()) / np.linalg.norm(r.numpy()))
        for g, r in zip(grads, reference)
    ]


def test_cosmoflow_fp16_gradients_reach_the_allreduce_unscaled(cosmoflow_start):
    _, fp32_opt, fp32_dist = cosmoflow_step(cosmoflow_start, "float32")
    model, opt, dist = cosmoflow_step(cosmoflow_start, "mixed_float16")
    assert (
        model.get_layer("conv1").compute_dtype == "float16"
        and model.get_layer("conv1").kernel.dtype == tf.float32
    )
    assert (
        isinstance(opt, tf_keras.mixed_precision.LossScaleOptimizer)
        and opt.inner_optimizer.momentum == 0.9
    )
    assert float(opt.loss_scale) == S0 and int(opt.iterations) == 1  # applied: no overflow at S0
    assert not isinstance(fp32_opt, tf_keras.mixed_precision.LossScaleOptimizer)
    errors = relative_errors(dist.seen, fp32_dist.seen)
    assert max(errors) < GRAD_TOLERANCE, errors
    assert min(errors) > U32, errors  # it did compute in float16
    assert any(not np.array_equal(w, w0) for w, w0 in zip(model.get_weights(), cosmoflow_start[1]))
    # Negative control: the same step with the unscaling left out hands S0 x the gradients to the
    # allreduce, and the comparison above fails.
    _, _, scaled = cosmoflow_step(cosmoflow_start, "mixed_float16", skip_unscaling=True)
    errors = relative_errors(scaled.seen, fp32_dist.seen)
    assert min(errors) > GRAD_TOLERANCE and np.allclose(errors, S0 - 1, rtol=GRAD_TOLERANCE), errors


def test_cosmoflow_fp16_step_with_an_inf_after_the_allreduce_is_skipped_and_lowers_the_loss_scale(
    cosmoflow_start,
):
    model, opt, dist = cosmoflow_step(cosmoflow_start, "mixed_float16", inject_inf=True)
    assert np.all(
        np.isfinite(dist.seen[0].numpy())
    )  # finite on this rank: the Inf came with the sum
    for w, w0 in zip(model.get_weights(), cosmoflow_start[1]):
        np.testing.assert_array_equal(w, w0)  # not updated
    momenta = opt.inner_optimizer.momentums
    assert len(momenta) == len(model.trainable_variables) and not any(
        m.numpy().any() for m in momenta
    )
    assert float(opt.loss_scale) == S0 / 2 and int(opt.dynamic_counter) == 0
    assert (
        int(opt.iterations) == 1
    )  # counted, as every rank skips the same step (the Inf is in every sum)


def test_cosmoflow_fp16_loss_scale_grows_after_its_growth_steps_of_good_steps(cosmoflow_start):
    # Keras doubles the scale after dynamic_growth_steps (2000) finite steps in a row. The count is
    # started 2 below that here, so that two steps show whether TrainStep's updates drive it.
    step, _, opt, _ = cosmoflow_train_step(cosmoflow_start, "mixed_float16")
    opt.dynamic_counter.assign(opt.dynamic_growth_steps - 2)
    step(iter([cosmoflow_start[2]]))
    assert float(opt.loss_scale) == S0 and int(opt.dynamic_counter) == opt.dynamic_growth_steps - 1
    step(iter([cosmoflow_start[2]]))
    assert (
        float(opt.loss_scale) == 2 * S0
        and int(opt.dynamic_counter) == 0
        and int(opt.iterations) == 2
    )


@pytest.mark.parametrize(
    "device, native_bf16, expected",
    [("gpu", False, "mixed_float16"), ("cpu", True, "mixed_bfloat16"), ("cpu", False, "float32")],
)
def test_the_closed_cosmoflow_configs_run_amp_and_the_init_line_names_its_precision(
    device, native_bf16, expected
):
    from common import benchmarks
    from common.config import load_config
    from common.reporting.console import runtime_lines
    from common.runtime import choose_precision
    from cosmoflow.config import CosmoFlowConfig

    for path in benchmarks.closed_configs("cosmoflow"):
        runtime = load_config(CosmoFlowConfig, path, {"data.data_dir": "unused"}).runtime
        assert runtime.amp and runtime.amp_dtype == "auto", path
        precision, why = choose_precision(runtime, device, native_bf16=native_bf16)
        assert precision == expected
        lines = runtime_lines(
            "1 rank", {"device": device, "precision": precision, "precision_note": why}
        )
        # Named on the runtime line whichever it is; the fallback to fp32 also says why, on a line of its own.
        assert f"'precision': '{expected}'" in lines[0] and "precision_note" not in lines[0]
        assert lines[1:] == ([why] if expected == "float32" else []) and bool(why) is (
            expected == "float32"
        )
