"""Run under a launcher by test_batchnorm_stats.py: batch-norm running statistics around
common.parallel.distribution.average_batchnorm_statistics.

Every rank builds the same tiny model (Dense, BatchNormalization, and a nested
sub-model with a GroupBatchNormalization of one rank), runs a few training-mode
forward passes on data of its own (shifted and scaled by the rank), then averages
the statistics. Each rank writes OUT_DIR/rank-N.json with its variables and the
eval-mode output on a probe input shared by all ranks, before and after.
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
    Distribution,
    RankGroup,
    average_batchnorm_statistics,  # noqa: E402
)
from common.parallel.sync_batchnorm import GroupBatchNormalization  # noqa: E402

N_IN, N_HIDDEN, N_OUT = 6, 4, 3


def build_model() -> tf_keras.Model:
    # A low momentum moves the running statistics far from (0, 1) in a few steps.
    inner = tf_keras.Sequential(
        [
            tf_keras.layers.Dense(N_OUT, name="dense_b"),
            GroupBatchNormalization(RankGroup(1, None), momentum=0.5, epsilon=1e-3, name="bn_b"),
        ],
        name="inner",
    )
    inputs = tf_keras.Input((N_IN,))
    x = tf_keras.layers.Dense(N_HIDDEN, name="dense_a")(inputs)
    x = tf_keras.layers.BatchNormalization(momentum=0.5, epsilon=1e-3, name="bn_a")(x)
    x = tf_keras.layers.ReLU(name="relu")(x)
    return tf_keras.Model(inputs, inner(x), name="tiny_bn")


def variables(model) -> dict:
    return {v.name: v.numpy().tolist() for v in model.variables}


dist = Distribution()
tf_keras.utils.set_random_seed(5)
model = build_model()
dist.broadcast_variables(model.variables)
rng = np.random.default_rng(100 + dist.rank)
for _ in range(3):
    batch = rng.standard_normal((8, N_IN)) * (1 + dist.rank) + 3.0 * dist.rank
    model(tf.constant(batch, tf.float32), training=True)
probe = np.random.default_rng(0).standard_normal((5, N_IN)).astype(np.float32)

before = variables(model)
eval_before = model(probe, training=False).numpy().tolist()
n_layers = average_batchnorm_statistics(model, dist)
Path(sys.argv[1], f"rank-{dist.rank}.json").write_text(
    json.dumps(
        {
            "rank": dist.rank,
            "layers": n_layers,
            "probe": probe.tolist(),
            "before": before,
            "eval_before": eval_before,
            "after": variables(model),
            "eval_after": model(probe, training=False).numpy().tolist(),
        }
    )
)
