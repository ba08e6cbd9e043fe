"""common.parallel.distribution: the end-of-run check that every rank holds the same variables."""

import tracemalloc

import numpy as np
import pytest
import tensorflow as tf

from common.parallel.distribution import fingerprint, variables_in_sync
from tests import helpers


def test_fingerprint_is_sum_abs_sum_and_a_fixed_random_projection_in_float64():
    a = tf.Variable(np.random.default_rng(0).standard_normal((3, 4)), dtype=tf.float32)
    b = tf.Variable([-1.5, 2.0], dtype=tf.float32)
    w = np.concatenate([a.numpy().ravel(), b.numpy()]).astype(np.float64)
    got = fingerprint([a, b])
    assert got.dtype == np.float64 and got.shape == (3,)
    assert got[0] == pytest.approx(w.sum(), rel=1e-15) and got[1] == pytest.approx(
        np.abs(w).sum(), rel=1e-15
    )
    # The direction is fixed (the same on every rank and in every run), not drawn anew.
    np.testing.assert_array_equal(fingerprint([a, b]), got)
    assert got[2] == pytest.approx(
        w @ np.random.default_rng(1234).standard_normal(w.size), rel=1e-12
    )


def test_fingerprint_holds_one_variable_at_a_time():
    """Its memory (NumPy's, traced) follows the largest variable, not the model: 16 variables of 1 MiB
    against the same values as one variable, whose fingerprint is the same three numbers."""
    pieces = [np.random.default_rng(i).standard_normal(2**18).astype(np.float32) for i in range(16)]
    whole = [np.concatenate(pieces)]

    def peak_bytes(variables):
        tracemalloc.start()
        try:
            got = fingerprint(variables)
            return got, tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    (by_piece, piece_peak), (at_once, whole_peak) = peak_bytes(pieces), peak_bytes(whole)
    np.testing.assert_allclose(by_piece, at_once, rtol=1e-12)
    one_in_float64 = 2**18 * 8
    assert piece_peak <= 4 * one_in_float64, piece_peak
    assert whole_peak >= 16 * 2 * one_in_float64, (
        whole_peak
    )  # the control: a copy and the direction, 16x


class _OneRank:
    """Distribution of size 1: allgather stacks this rank's vector."""

    @staticmethod
    def allgather(values):
        return np.asarray(values, np.float64)[None, ...]


def test_one_rank_is_in_sync_with_itself_and_counts_every_value():
    variables = [tf.Variable(tf.zeros((2, 3))), tf.Variable(tf.ones(4)), tf.Variable(7.0)]
    assert variables_in_sync(variables, _OneRank()) == (True, 11)


@pytest.fixture(scope="module")
def two_ranks(two_rank_probe):
    return helpers.two_ranks_json(two_rank_probe("fingerprint"))


def _answers(two_ranks, case):
    """Both ranks' (in sync, values compared) for a case; every rank must give the same answer."""
    r0, r1 = (r["results"][case] for r in two_ranks)
    assert r0 == r1, case  # answer, count and the gathered fingerprints
    return r0


def test_identical_ranks_are_in_sync(two_ranks):
    r0 = two_ranks[0]
    for case in ("identical", "restored"):
        answer = _answers(two_ranks, case)
        assert (
            answer["in_sync"] is True
            and answer["n_values"] == r0["n_variables"] == 6 * 5 + 5 + 4 * 5 + 5 * 3 + 3
        )
        assert answer["fingerprints"][0] == answer["fingerprints"][1]


@pytest.mark.parametrize(
    "case", ["kernel_one_ulp", "kernel_two_values_swapped", "moving_variance_one_ulp", "own_data"]
)
def test_one_changed_value_on_one_rank_is_out_of_sync(two_ranks, case):
    answer = _answers(two_ranks, case)
    assert answer["in_sync"] is False, answer
    f0, f1 = (np.array(f) for f in answer["fingerprints"])
    if case == "kernel_one_ulp":
        # One float32 ulp of a value of ordinary size, seen by the float64 sum itself.
        value = two_ranks[0]["kernel_value"]
        ulp = float(np.spacing(np.float32(abs(value))))
        assert 0.01 < abs(value) and f1[0] - f0[0] == pytest.approx(ulp, rel=1e-6)
    if case == "kernel_two_values_swapped":
        # The same values in other places: both sums are unchanged; only the projection sees it.
        assert f0[0] == f1[0] and f0[1] == f1[1] and f0[2] != f1[2]


def test_drifted_running_statistics_are_caught_only_by_comparing_all_variables(two_ranks):
    assert _answers(two_ranks, "own_data")["in_sync"] is False
    trainable = _answers(two_ranks, "own_data_trainable_only")
    assert trainable["in_sync"] is True and trainable["n_values"] < two_ranks[0]["n_variables"]
