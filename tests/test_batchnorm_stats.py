"""Batch-norm running statistics averaged over ranks after each epoch (as the MLCommons DeepCAM reference)."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from common.parallel.distribution import (
    RankGroup,
    average_batchnorm_statistics,
    batchnorm_statistics,
)
from common.parallel.sync_batchnorm import GroupBatchNormalization
from tests import helpers


class RecordingDistribution:
    """Stands in for Distribution: records the collective instead of making it."""

    def __init__(self):
        self.calls = []

    def average_variables(self, variables):
        self.calls.append([v.name for v in variables])


def test_statistics_of_nested_and_subclassed_layers_in_layer_order():
    inner = tf_keras.Sequential(
        [
            tf_keras.layers.Dense(3, name="d2"),
            GroupBatchNormalization(RankGroup(1, None), name="gbn"),
        ],
        name="inner",
    )
    inputs = tf_keras.Input((5,))
    x = tf_keras.layers.BatchNormalization(name="bn1")(tf_keras.layers.Dense(4, name="d1")(inputs))
    model = tf_keras.Model(inputs, inner(tf_keras.layers.LayerNormalization(name="ln")(x)))
    dist = RecordingDistribution()
    assert average_batchnorm_statistics(model, dist) == 2
    # LayerNormalization keeps no running statistics; every trainable variable stays out.
    assert dist.calls == [
        ["bn1/moving_mean:0", "bn1/moving_variance:0", "gbn/moving_mean:0", "gbn/moving_variance:0"]
    ]


def test_model_without_batch_norm_makes_no_collective():
    from cosmoflow.model import build_model

    dist = RecordingDistribution()
    model = build_model((16, 16, 16, 4), conv_size=2, n_conv_layers=2, fc1_size=8, fc2_size=4)
    assert batchnorm_statistics(model) == []
    assert average_batchnorm_statistics(model, dist) == 0 and dist.calls == []


def test_deepcam_model_hands_over_every_batch_norm_layer():
    from common.config import load_config
    from deepcam.task import DeepCAMTask

    cfg = load_config(
        DeepCAMTask.config_class,
        helpers.REPO / "tests" / "configs" / "deepcam_tiny.yaml",
        {"data.data_dir": "unused"},
    )
    model = DeepCAMTask(cfg).build_model(RankGroup(1, None))
    stats = batchnorm_statistics(model)
    n_bn = sum(isinstance(layer, tf_keras.layers.BatchNormalization) for layer in model.submodules)
    assert n_bn > 10 and len(stats) == 2 * n_bn
    assert {id(v) for v in stats} == {id(v) for v in model.non_trainable_variables}


# ------------------------------------------------------------------ two ranks
def _eval_oracle(weights: dict, x: np.ndarray) -> np.ndarray:
    """The probe model in inference mode, in NumPy (tests/bn_probe.py: Dense, BN, ReLU, Dense, BN)."""

    def bn(h, name):
        mean, var = (
            np.array(weights[f"{name}/moving_mean:0"]),
            np.array(weights[f"{name}/moving_variance:0"]),
        )
        gamma, beta = np.array(weights[f"{name}/gamma:0"]), np.array(weights[f"{name}/beta:0"])
        return gamma * (h - mean) / np.sqrt(var + 1e-3) + beta

    def dense(h, name):
        return h @ np.array(weights[f"{name}/kernel:0"]) + np.array(weights[f"{name}/bias:0"])

    return bn(dense(np.maximum(bn(dense(x, "dense_a"), "bn_a"), 0.0), "dense_b"), "bn_b")


@pytest.fixture(scope="module")
def two_ranks(two_rank_probe):
    return helpers.two_ranks_json(two_rank_probe("bn"))


STATS = [
    "bn_a/moving_mean:0",
    "bn_a/moving_variance:0",
    "bn_b/moving_mean:0",
    "bn_b/moving_variance:0",
]


def test_rank_local_statistics_differ_then_equal_their_mean(two_ranks):
    r0, r1 = two_ranks
    assert r0["layers"] == r1["layers"] == 2
    for name in STATS:
        a, b = np.array(r0["before"][name]), np.array(r1["before"][name])
        assert np.abs(a - b).max() > 1e-3, name  # each rank saw its own data
        assert r0["after"][name] == r1["after"][name], name
        np.testing.assert_allclose(r0["after"][name], (a + b) / 2, rtol=1e-6, err_msg=name)
    # Only the running statistics move: weights were the same and stay the same.
    for name in set(r0["before"]) - set(STATS):
        assert r0["before"][name] == r1["before"][name] == r0["after"][name] == r1["after"][name], (
            name
        )


def test_evaluation_uses_the_averaged_statistics(two_ranks):
    r0, r1 = two_ranks
    probe = np.array(r0["probe"])
    assert r0["probe"] == r1["probe"]
    assert np.abs(np.array(r0["eval_before"]) - np.array(r1["eval_before"])).max() > 0.1
    assert r0["eval_after"] == r1["eval_after"]
    mean_stats = {
        name: (np.array(r0["before"][name]) + np.array(r1["before"][name])) / 2 for name in STATS
    }
    expected = _eval_oracle(r0["before"] | mean_stats, probe)
    np.testing.assert_allclose(r0["eval_after"], expected, rtol=1e-5, atol=1e-5)
    # The oracle is the model: before averaging it reproduces each rank's own output.
    for r in (r0, r1):
        np.testing.assert_allclose(
            r["eval_before"], _eval_oracle(r["before"], probe), rtol=1e-5, atol=1e-5
        )


@pytest.mark.parametrize("fused", [False, True], ids=["group-bn", "keras-fused"])
def test_running_variance_takes_the_unbiased_batch_variance(fused):
    # PyTorch's BatchNorm2d (and TF's fused kernel) update running_var with the
    # unbiased variance n / (n - 1) x biased; GroupBatchNormalization must agree.
    x = np.random.default_rng(0).normal(2.0, 3.0, (2, 3, 3, 4)).astype(np.float32)
    kwargs = dict(momentum=0.9, epsilon=1e-5)
    bn = (
        tf_keras.layers.BatchNormalization(**kwargs)
        if fused
        else GroupBatchNormalization(RankGroup(1, None), **kwargs)
    )
    tf.function(lambda t: bn(t, training=True))(tf.constant(x))
    flat = x.reshape(-1, 4)
    np.testing.assert_allclose(bn.moving_mean.numpy(), 0.1 * flat.mean(0), rtol=1e-5)
    np.testing.assert_allclose(
        bn.moving_variance.numpy(), 0.9 + 0.1 * flat.var(0, ddof=1), rtol=1e-5
    )
