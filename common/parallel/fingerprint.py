"""Whether every rank holds the same variables, checked with a cheap fingerprint.

Data-parallel ranks must end a run with identical variables: they start from
rank 0's broadcast and apply the same averaged gradients. Comparing every value
across ranks would move the whole model over the network; a fingerprint of
three numbers per rank, gathered once, is enough to catch the drift that matters.
"""

import numpy as np

# The random direction of the projection: fixed, so every rank draws the same one.
_PROBE_SEED = 1234


def fingerprint(variables) -> np.ndarray:
    """Three float64 numbers that change when any value of `variables` changes.

    The values are flattened in the given order and widened to float64, where
    a change of one float32 ulp in one element survives the summation (it is
    lost only if that element is below about 2^-29 of the sum of magnitudes).
    The sum sees most changes; the sum of magnitudes sees sign flips that keep
    the sum; a projection on a fixed random direction sees values that moved
    between elements (a permutation, two ranks' updates landing on swapped
    variables), which leave both sums unchanged.

    One variable at a time, on the host: a float64 copy of the whole model, its magnitudes and the
    direction (DeepCAM: 0.42 GiB each) raised a run's peak memory after its last step (DeepCAM at
    768 x 1152, one CPU rank: 9.25 GiB against the steps' 8.41), and on a GPU the concatenation
    took device memory. The direction is drawn piece by piece from one generator: the same
    numbers as one draw of the whole length.

    Args:
      variables: tf.Variables or arrays (e.g. `model.variables`), in the same
        order on every rank.
    Returns:
      [sum, sum of |values|, random projection], float64.
    """
    direction = np.random.default_rng(_PROBE_SEED)
    total = np.zeros(3)
    for variable in variables:
        w = np.asarray(
            variable, dtype=np.float64
        ).ravel()  # a tf.Variable's values come to the host
        total += [w.sum(), np.abs(w).sum(), float(w @ direction.standard_normal(w.size))]
    return total


def variables_in_sync(variables, dist) -> tuple[bool, int]:
    """Whether every rank holds the same `variables`, by their fingerprints (a collective).

    Pass all of a model's variables, not only the trainable ones: batch-norm
    running statistics that drifted apart (evaluation differs per rank, the
    checkpoint holds rank 0's) show up here. Fingerprints are compared exactly,
    as identical ranks compute identical ones (same values, same order, same
    arithmetic). Every rank must call this, with the same variables in the
    same order, and every rank gets the same answer.

    Args:
      variables: the variables to compare (e.g. `model.variables`).
      dist: the Distribution (common.parallel.distribution).
    Returns:
      (in sync, number of values compared on each rank).
    """
    values = fingerprint(variables)
    gathered = dist.allgather(values)
    n_values = sum(int(np.prod(v.shape)) for v in variables)
    return bool(np.all(gathered == gathered[0])), n_values
