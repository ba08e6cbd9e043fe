"""Run under a launcher by test_fingerprint.py: common.parallel.distribution.variables_in_sync on ranks
whose variables are identical, then differ in one place.

Every rank builds the same small model (Dense, BatchNormalization, Dense) and takes rank 0's
variables. Then, case by case, rank 1 alone changes one thing, every rank asks whether the
ranks are in sync, and rank 1 puts the thing back. Each rank writes OUT_DIR/rank-N.json with,
per case, its answer, the number of values compared and the fingerprints of all ranks.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

import common  # noqa: E402,F401  (oneDNN on before TensorFlow loads: common/cpu.py)
from common.parallel.distribution import (  # noqa: E402
    Distribution,  # noqa: E402
    fingerprint,
    variables_in_sync,
)

dist = Distribution()
tf_keras.utils.set_random_seed(3)
inputs = tf_keras.Input((6,))
hidden = tf_keras.layers.Dense(5, name="dense_a")(inputs)
hidden = tf_keras.layers.BatchNormalization(momentum=0.5, name="bn")(hidden)
model = tf_keras.Model(inputs, tf_keras.layers.Dense(3, name="dense_b")(hidden))
dist.broadcast_variables(model.variables)
# Non-trivial running statistics, the same on every rank (shared data).
model(tf.constant(np.random.default_rng(0).standard_normal((16, 6)), tf.float32), training=True)
kernel, bn = model.get_layer("dense_a").kernel, model.get_layer("bn")

results = {}


def check(case: str, variables=None) -> None:
    variables = model.variables if variables is None else variables
    in_sync, n_values = variables_in_sync(variables, dist)
    results[case] = {
        "in_sync": in_sync,
        "n_values": n_values,
        "fingerprints": dist.allgather(fingerprint(variables)).tolist(),
    }


def on_rank_1(variable, change) -> np.ndarray:
    """Rank 1 replaces `variable` by change(copy of its value); returns the original value."""
    original = variable.numpy()
    if dist.rank == 1:
        changed = original.copy()
        change(changed)
        assert not np.array_equal(changed, original)
        variable.assign(changed)
    return original


def one_ulp_up(a: np.ndarray) -> None:
    a[2, 1] = np.nextafter(a[2, 1], np.float32(np.inf), dtype=np.float32)


def one_ulp_down(a: np.ndarray) -> None:
    a[1] = np.nextafter(a[1], np.float32(0), dtype=np.float32)


def swap_two(a: np.ndarray) -> None:
    a[0, 0], a[3, 2] = a[3, 2].copy(), a[0, 0].copy()


check("identical")
original = on_rank_1(kernel, one_ulp_up)
check("kernel_one_ulp")
kernel.assign(original)
check("restored")

original = on_rank_1(kernel, swap_two)
check("kernel_two_values_swapped")
kernel.assign(original)

original = on_rank_1(bn.moving_variance, one_ulp_down)
check("moving_variance_one_ulp")
bn.moving_variance.assign(original)

# Each rank's own training-mode pass: the running statistics drift apart, the weights do not.
model(
    tf.constant(np.random.default_rng(10 + dist.rank).standard_normal((16, 6)), tf.float32),
    training=True,
)
check("own_data")
check("own_data_trainable_only", model.trainable_variables)

Path(sys.argv[1], f"rank-{dist.rank}.json").write_text(
    json.dumps(
        {
            "rank": dist.rank,
            "size": dist.size,
            "n_variables": int(sum(np.prod(v.shape) for v in model.variables)),
            "kernel_value": float(kernel.numpy()[2, 1]),
            "results": results,
        }
    )
)
