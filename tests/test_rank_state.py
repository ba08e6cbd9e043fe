"""common.checkpoints: each rank's part of a mid-epoch checkpoint, on disk and back."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from common.errors import InputError
from common.parallel.distribution import batchnorm_statistics
from common.rank_state import RankState, rank_file


def _model(bn_layers: int = 2, width: int = 3):
    layers = [tf_keras.Input((width,))]
    for _ in range(bn_layers):
        layers += [tf_keras.layers.Dense(width), tf_keras.layers.BatchNormalization()]
    return tf_keras.Sequential(layers)


def _set_statistics(model, seed: int) -> list:
    rng = np.random.default_rng(seed)
    values = [rng.standard_normal(v.shape).astype(np.float32) for v in batchnorm_statistics(model)]
    for v, value in zip(batchnorm_statistics(model), values):
        v.assign(value)
    return values


def test_a_ranks_state_comes_back_as_it_was_written_into_the_file_of_that_rank(tmp_path):
    model = _model()
    written = _set_statistics(model, seed=1)
    losses = [tf.constant(0.5), tf.constant(0.25), tf.constant(0.125)]
    RankState.of(model, losses).write(tmp_path, rank=3)
    assert (
        sorted(p.name for p in tmp_path.iterdir()) == [rank_file(3)] == ["rank-00003.npz"]
    )  # no .tmp left
    # The format other tools read: named arrays, the statistics in batchnorm_statistics' order.
    with np.load(tmp_path / "rank-00003.npz") as f:
        assert sorted(f.files) == ["bn_0", "bn_1", "bn_2", "bn_3", "losses"]
        np.testing.assert_array_equal(f["bn_3"], written[3])

    other = _model()
    _set_statistics(other, seed=2)
    assert not np.array_equal(
        batchnorm_statistics(other)[0].numpy(), written[0]
    )  # the control differs
    state = RankState.read(tmp_path, rank=3)
    np.testing.assert_array_equal(state.losses, np.array([0.5, 0.25, 0.125], np.float32))
    state.restore_batchnorm(other, "ckpt")
    for v, value in zip(batchnorm_statistics(other), written):
        np.testing.assert_array_equal(v.numpy(), value)


def test_no_losses_yet_is_an_empty_array():
    assert RankState.of(_model(), []).losses.shape == (0,)


def test_a_missing_truncated_or_incomplete_file_is_an_error_naming_it(tmp_path):
    with pytest.raises(InputError, match=r"rank 1's state is missing \(rank-00001.npz\)"):
        RankState.read(tmp_path, rank=1)
    RankState.of(_model(), [tf.constant(1.0)]).write(tmp_path, rank=0)
    path = tmp_path / rank_file(0)
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(InputError, match=r"rank-00000.npz: unreadable"):
        RankState.read(tmp_path, rank=0)
    np.savez(path, losses=np.zeros(1, np.float32), bn_0=np.zeros(3), bn_2=np.zeros(3))
    with pytest.raises(InputError, match=r"rank-00000.npz: no 'bn_1' array"):
        RankState.read(tmp_path, rank=0)
    np.savez(path, bn_0=np.zeros(3))
    with pytest.raises(InputError, match=r"rank-00000.npz: no 'losses' array"):
        RankState.read(tmp_path, rank=0)


def test_statistics_of_another_model_are_refused(tmp_path):
    RankState.of(_model(bn_layers=2), []).write(tmp_path, rank=0)
    state = RankState.read(tmp_path, rank=0)
    with pytest.raises(
        InputError, match=r"ckpt: holds 4 batch-norm statistics per rank, the model has 2"
    ):
        state.restore_batchnorm(_model(bn_layers=1), "ckpt")
    with pytest.raises(
        InputError, match=r"ckpt: batch-norm statistic 0 .* has shape \(3,\), the model's is \(4,\)"
    ):
        state.restore_batchnorm(_model(bn_layers=2, width=4), "ckpt")
