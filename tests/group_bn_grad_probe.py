"""Run under a launcher by test_group_batchnorm_grad.py: the backward pass of
common.parallel.sync_batchnorm.GroupBatchNormalization over a group of all ranks.

Every rank holds its own batch x_r (shifted and scaled by the rank) and its own
cotangent c_r, and takes the gradient of its loss sum(c_r * BN(x_r)) with
respect to x_r, gamma and beta in training mode, inside a tf.function as the
train step does. Each rank writes OUT_DIR/rank-N.json with its x, c, output
and gradients; the test computes ordinary batch norm on the concatenated batch.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import common  # noqa: E402,F401  (oneDNN on before TensorFlow loads: common/cpu.py)
from common.parallel.distribution import Distribution  # noqa: E402
from common.parallel.sync_batchnorm import GroupBatchNormalization  # noqa: E402

SHAPE = (3, 2, 3, 4)  # per rank: batch, height, width, channels
EPSILON = 1e-3

dist = Distribution()
group = dist.rank_group(dist.size)
shared = np.random.default_rng(0)
gamma, beta = shared.uniform(0.5, 1.5, SHAPE[-1]), shared.uniform(-0.5, 0.5, SHAPE[-1])
own = np.random.default_rng(100 + dist.rank)
x = (own.standard_normal(SHAPE) * (1 + dist.rank) + 2.0 * dist.rank).astype(np.float32)
c = own.standard_normal(SHAPE).astype(np.float32)

layer = GroupBatchNormalization(group, epsilon=EPSILON, momentum=0.9)
layer.build(SHAPE)
layer.gamma.assign(gamma.astype(np.float32))
layer.beta.assign(beta.astype(np.float32))


@tf.function
def forward_backward(x, c):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x, training=True)
        loss = tf.reduce_sum(c * y)
    return (y, *tape.gradient(loss, [x, layer.gamma, layer.beta]))


y, dx, dgamma, dbeta = forward_backward(tf.constant(x), tf.constant(c))
Path(sys.argv[1], f"rank-{dist.rank}.json").write_text(
    json.dumps(
        {
            "rank": dist.rank,
            "size": dist.size,
            "group_size": group.size,
            "epsilon": EPSILON,
            "gamma": layer.gamma.numpy().tolist(),
            "beta": layer.beta.numpy().tolist(),
            "x": x.tolist(),
            "c": c.tolist(),
            "y": y.numpy().tolist(),
            "dx": dx.numpy().tolist(),
            "dgamma": dgamma.numpy().tolist(),
            "dbeta": dbeta.numpy().tolist(),
        }
    )
)
