"""Run under a launcher by test_horovod.py: exercises Distribution's collectives, prints JSON."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tensorflow as tf  # noqa: E402

from common.distribution import Distribution  # noqa: E402

dist = Distribution()
v = tf.Variable([float(dist.rank + 1)] * 3)
dist.broadcast_variables([v])
grads = dist.average_gradients([tf.constant([float(dist.rank)] * 2)])
dist.barrier()
print(json.dumps({
    "rank": dist.rank, "size": dist.size, "local_rank": dist.local_rank, "nodes": dist.num_nodes,
    "mean": dist.allreduce_mean([dist.rank, 10.0]).tolist(),
    "max": dist.allreduce_max([dist.rank]).tolist(),
    "gathered": dist.allgather([dist.rank * 2.0]).tolist(),
    "object": dist.broadcast_object({"from": dist.rank}),
    "broadcast": v.numpy().tolist(),
    "grad": grads[0].numpy().tolist(),
}), flush=True)
