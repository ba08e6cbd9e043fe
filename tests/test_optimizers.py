"""Adam (PyTorch L2 semantics), LAMB (apex semantics) and gradient accumulation, against NumPy."""

import itertools
import types

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from common.optimizers import LAMB, AdamL2
from common.run.steps import TrainStep
from tests import helpers


def lamb_numpy(w, grads, lr, b1, b2, eps, wd, max_norm, bias_correction=True, trust_ratio=True):
    """apex FusedLAMB in float64 from weights `w` over the steps' gradients; `bias_correction` and
    `trust_ratio` False drop those terms (the negative controls)."""
    w = [x.copy() for x in w]
    m = [np.zeros_like(x) for x in w]
    v = [np.zeros_like(x) for x in w]
    for t, g in enumerate(grads, 1):
        norm = np.sqrt(sum((x**2).sum() for x in g))
        g = [x * min(1.0, max_norm / norm) for x in g]
        c1, c2 = (1 - b1**t, 1 - b2**t) if bias_correction else (1.0, 1.0)
        for i in range(len(w)):
            m[i] = b1 * m[i] + (1 - b1) * g[i]
            v[i] = b2 * v[i] + (1 - b2) * g[i] ** 2
            update = (m[i] / c1) / (np.sqrt(v[i] / c2) + eps) + wd * w[i]
            ratio = np.linalg.norm(w[i]) / np.linalg.norm(update) if trust_ratio else 1.0
            w[i] = w[i] - lr * ratio * update
    return w


def _update_terms_without_the_gradient(optimizer) -> list:
    """The ops of a traced update whose output has the variable's shape and that do not depend on
    the gradient: a graph runs them as soon as the step starts, and holds them until the gradient
    arrives, through forward and backward."""
    variable = tf.Variable(tf.ones((64, 32)))

    @tf.function(input_signature=[tf.TensorSpec((64, 32))])
    def apply(gradient):
        optimizer.apply_gradients([(gradient, variable)])

    graph = apply.get_concrete_function().graph
    [gradient] = [
        op for op in graph.get_operations() if op.type == "Placeholder" and op.name == "gradient"
    ]
    downstream, todo = {gradient.name}, [gradient]
    while todo:  # everything reached from the gradient by data or control edges
        op = todo.pop()
        for child in [c for t in op.outputs for c in t.consumers()] + list(op._control_outputs):
            if child.name not in downstream:
                downstream.add(child.name)
                todo.append(child)
    return [
        op.name
        for op in graph.get_operations()
        if op.type not in ("ReadVariableOp", "Identity", "Placeholder", "Const")
        and op.name not in downstream
        and any(t.shape == variable.shape for t in op.outputs)
    ]


def test_lamb_computes_no_variable_sized_term_before_the_gradient_arrives():
    assert _update_terms_without_the_gradient(LAMB(weight_decay_rate=0.01)) == []
    # The negative control: Keras' SGD with momentum computes momentum x slot from the slot alone.
    assert _update_terms_without_the_gradient(tf_keras.optimizers.SGD(0.1, momentum=0.9))


# LAMB as DeepCAM's configs set it, the clip active (gradient norms > 1) and weight decay on (so the
# trust ratio is), over 5 steps.
_LAMB = dict(learning_rate=0.01, beta_1=0.9, beta_2=0.999, epsilon=1e-6, max_grad_norm=1.0)
_DECAY = 0.01


def _lamb_float32(w0, grads, path: str) -> list:
    """The float32 weights after LAMB's steps from w0, applied by `path`: 'keras', Keras' update of one
    variable at a time (LAMB.apply_gradients); 'step', TrainStep's update as a CPU runs it; 'xla',
    TrainStep's update as one XLA-compiled function over every variable, as a GPU runs it."""
    variables = [tf.Variable(x, dtype=tf.float32) for x in w0]
    optimizer = LAMB(weight_decay_rate=_DECAY, **_LAMB)
    if path == "keras":
        apply = lambda g: optimizer.apply_gradients(zip(g, variables))  # noqa: E731
    else:
        optimizer.jit_compile = path == "xla"  # what Keras sets where a GPU exists
        # The update reads no more of the model than its variables.
        model = types.SimpleNamespace(trainable_variables=variables)
        apply = tf.function(TrainStep(model, optimizer, None, helpers.SingleProcess())._apply)
    for g in grads:
        apply([tf.constant(x, tf.float32) for x in g])
    return [v.numpy() for v in variables]


def test_lamb_in_float32_is_as_close_to_a_float64_numpy_lamb_as_keras_one_variable_at_a_time():
    rng = np.random.default_rng(0)
    shapes = [(3, 4), (5,), (64, 32), (7, 3, 3)]
    # Values float32 holds exactly: the error is the update's, not the inputs' rounding.
    exact = lambda x: x.astype(np.float32).astype(np.float64)  # noqa: E731
    w0 = [exact(rng.standard_normal(s)) for s in shapes]
    grads = [[exact(3.0 * rng.standard_normal(s)) for s in shapes] for _ in range(5)]
    args = (_LAMB["learning_rate"], _LAMB["beta_1"], _LAMB["beta_2"], _LAMB["epsilon"], _DECAY, 1.0)

    def error(path, **broken):
        expected = lamb_numpy(w0, grads, *args, **broken)
        return max(
            float(np.abs(w - e).max()) for w, e in zip(_lamb_float32(w0, grads, path), expected)
        )

    # Keras' per-variable update (what TrainStep ran before its update was one function): 3.9e-7, a
    # few float32 roundings of weights up to 3.4 in size.
    keras = error("keras")
    assert keras < 1e-6
    for path in ("step", "xla"):  # no worse, but for a float32 rounding another ISA may add
        assert error(path) <= keras + float(np.spacing(np.float32(4.0))), path
    # The negative controls: the NumPy LAMB without its bias correction, or without its trust
    # ratio, is 3-4 orders of magnitude away.
    assert error("xla", bias_correction=False) > 1000 * keras
    assert error("xla", trust_ratio=False) > 1000 * keras


def test_adam_weight_decay_is_added_to_the_gradient_as_in_pytorch():
    w = tf.Variable([1.0, -2.0], dtype=tf.float64)
    g = np.array([0.5, 0.1])
    AdamL2(l2=0.1, learning_rate=0.01, epsilon=1e-6).apply_gradients([(tf.constant(g), w)])
    # The first Adam step moves each weight by -lr * sign(g + wd * w): for the second
    # weight g + wd * w = 0.1 - 0.2 < 0, so it rises, where decoupled decay would lower it.
    np.testing.assert_allclose(w.numpy(), [1.0 - 0.01, -2.0 + 0.01], rtol=1e-5)


def _mlp_numpy(weights, x):
    """The test's Dense(3, tanh) -> Dense(1) in float64 NumPy."""
    k1, b1, k2, b2 = (np.asarray(w, np.float64) for w in weights)
    return np.tanh(np.asarray(x, np.float64) @ k1 + b1) @ k2 + b2


@pytest.mark.parametrize("n", [2, 4])
def test_gradient_accumulation_equals_one_step_on_the_whole_batch(n):
    tf_keras.utils.set_random_seed(0)
    x = tf.random.normal([8, 5])
    y = tf.random.normal([8, 1])

    def fresh():
        tf_keras.utils.set_random_seed(1)
        return tf_keras.Sequential(
            [
                tf_keras.Input((5,)),
                tf_keras.layers.Dense(3, activation="tanh"),
                tf_keras.layers.Dense(1),
            ]
        )

    loss = lambda yt, yp: tf.reduce_mean(tf.square(yt - yp))  # noqa: E731
    whole, split = fresh(), fresh()
    w0 = [v.numpy() for v in split.trainable_variables]
    whole_loss = TrainStep(whole, tf_keras.optimizers.SGD(0.1), loss, helpers.SingleProcess())(
        itertools.repeat((x, y))
    ).loss
    parts = [(x[i::n], y[i::n]) for i in range(n)]
    step = TrainStep(
        split, tf_keras.optimizers.SGD(0.1), loss, helpers.SingleProcess(), accumulation=n
    )
    mean_loss = step(iter(parts)).loss
    for a, b in zip(whole.trainable_variables, split.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7)
    # The step returns the mean of its micro-batches' losses, each taken before the update
    # (the weights w0 are applied only once all n gradients are summed). The parts have
    # equal sizes, so that mean is the whole batch's MSE at w0: computed in float64 here, it
    # differs from TensorFlow's float32 forward pass (5- and 3-term dot products, tanh, an
    # 8-term mean of O(1) squares) by a few float32 roundings, ~1e-6 relative: rel=1e-5.
    # (The loss after the update is lower by several percent.)
    x64, y64 = x.numpy().astype(np.float64), y.numpy().astype(np.float64)
    oracle = float(
        np.mean([np.mean((y64[i::n] - _mlp_numpy(w0, x64[i::n])) ** 2) for i in range(n)])
    )
    assert oracle == pytest.approx(float(np.mean((y64 - _mlp_numpy(w0, x64)) ** 2)), rel=1e-12)
    assert float(mean_loss) == pytest.approx(oracle, rel=1e-5)
    assert float(whole_loss) == pytest.approx(oracle, rel=1e-5)
