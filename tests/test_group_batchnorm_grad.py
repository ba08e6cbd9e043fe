"""The backward pass of group batch norm (common.parallel.sync_batchnorm) on 2 real Horovod ranks.

A group's ranks normalize with the moments of their batches together, so the gradients
must be those of ordinary batch norm on the concatenated batch: with respect to a rank's
inputs, the gradient of the sum of all ranks' losses (the moments couple the ranks; the
allreduce's own gradient carries the other ranks' part back); with respect to gamma and
beta, the gradient of the rank's own loss, which the gradient allreduce then sums.
"""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from tests import helpers


def batchnorm_oracle(x, c, gamma, beta, eps, axes=(0, 1, 2)):
    """Training-mode batch norm y = gamma (x - mean) / sqrt(var + eps) + beta over `axes`
    (biased variance) and its gradients for the loss sum(c * y), in float64 NumPy:
    dL/dx = gamma / sqrt(var + eps) (c - mean(c) - xhat mean(c xhat)), per channel.
    Returns (y, dL/dx, c * xhat, c): the last two, summed over rows, are dL/dgamma, dL/dbeta."""
    x, c = np.asarray(x, np.float64), np.asarray(c, np.float64)
    mean, var = x.mean(axes), x.var(axes)
    xhat = (x - mean) / np.sqrt(var + eps)
    dx = gamma / np.sqrt(var + eps) * (c - c.mean(axes) - xhat * (c * xhat).mean(axes))
    return gamma * xhat + beta, dx, c * xhat, c


def test_the_oracle_is_keras_batch_norm():
    rng = np.random.default_rng(1)
    x, c = rng.normal(1.0, 2.0, (6, 2, 3, 4)), rng.standard_normal((6, 2, 3, 4))
    gamma, beta = rng.uniform(0.5, 1.5, 4), rng.uniform(-0.5, 0.5, 4)
    bn = tf_keras.layers.BatchNormalization(epsilon=1e-3, dtype="float64")
    bn.build(x.shape)
    bn.gamma.assign(gamma)
    bn.beta.assign(beta)
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        y = bn(xt, training=True)
        loss = tf.reduce_sum(c * y)
    dx, dgamma, dbeta = tape.gradient(loss, [xt, bn.gamma, bn.beta])
    y_o, dx_o, dgamma_rows, dbeta_rows = batchnorm_oracle(x, c, gamma, beta, 1e-3)
    np.testing.assert_allclose(y.numpy(), y_o, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dx.numpy(), dx_o, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dgamma.numpy(), dgamma_rows.sum((0, 1, 2)), rtol=1e-10)
    np.testing.assert_allclose(dbeta.numpy(), dbeta_rows.sum((0, 1, 2)), rtol=1e-10)


@pytest.fixture(scope="module")
def two_ranks(two_rank_probe):
    return helpers.two_ranks_json(two_rank_probe("group_bn_grad"))


def _close(got, expected, what):
    # float32 forward and backward (moments from E[x] and E[x^2] of O(1) data, a few
    # 12- and 24-term sums) against float64: errors of a few float32 ulps of the largest value.
    expected = np.asarray(expected)
    np.testing.assert_allclose(
        np.asarray(got), expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max(), err_msg=what
    )


def test_gradients_equal_batch_norm_of_the_concatenated_batch(two_ranks):
    r0, r1 = two_ranks
    assert (
        r0["size"] == r0["group_size"] == 2
        and r0["gamma"] == r1["gamma"]
        and r0["beta"] == r1["beta"]
    )
    gamma, beta, eps = np.array(r0["gamma"]), np.array(r0["beta"]), r0["epsilon"]
    x = np.concatenate([r0["x"], r1["x"]])
    c = np.concatenate([r0["c"], r1["c"]])
    n = len(r0["x"])
    y, dx, dgamma_rows, dbeta_rows = batchnorm_oracle(x, c, gamma, beta, eps)
    for r, rows in ((r0, slice(0, n)), (r1, slice(n, 2 * n))):
        rank = r["rank"]
        _close(r["y"], y[rows], f"rank {rank}: output")
        _close(r["dx"], dx[rows], f"rank {rank}: d loss / d inputs")
        _close(r["dgamma"], dgamma_rows[rows].sum((0, 1, 2)), f"rank {rank}: d own loss / d gamma")
        _close(r["dbeta"], dbeta_rows[rows].sum((0, 1, 2)), f"rank {rank}: d own loss / d beta")
    # Summed over ranks (the gradient allreduce): the concatenated batch's gamma and beta gradients.
    _close(np.add(r0["dgamma"], r1["dgamma"]), dgamma_rows.sum((0, 1, 2)), "sum of d gamma")
    _close(np.add(r0["dbeta"], r1["dbeta"]), dbeta_rows.sum((0, 1, 2)), "sum of d beta")


def test_per_rank_batch_norm_would_fail_this_oracle(two_ranks):
    """The ranks' data differ enough that batch norm over one rank's batch alone gives other
    outputs and input gradients: the test above tells group statistics from local ones."""
    r0, r1 = two_ranks
    gamma, beta, eps = np.array(r0["gamma"]), np.array(r0["beta"]), r0["epsilon"]
    _, dx, _, _ = batchnorm_oracle(
        np.concatenate([r0["x"], r1["x"]]), np.concatenate([r0["c"], r1["c"]]), gamma, beta, eps
    )
    for r, rows in ((r0, slice(0, 3)), (r1, slice(3, 6))):
        _, dx_local, _, _ = batchnorm_oracle(r["x"], r["c"], gamma, beta, eps)
        assert np.abs(dx_local - dx[rows]).max() > 0.1
