"""Run under a launcher by test_horovod.py: exercises Distribution's collectives.

  dist_probe.py OUT_DIR

Distribution(group_sizes=(2,)) first, whose hvd.init registers the static sets of groups of 2; then,
the negative control, a Distribution() of a data-parallel job that declares no group size (its init
a no-op: Horovod keeps the first), whose group of 2 ranks is refused (unless 2 is the job) and whose
group is the whole job, Horovod's global set.

Each rank writes its results to OUT_DIR/rank-N.json (ranks' stdout lines can interleave).
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import horovod.tensorflow as hvd  # noqa: E402
import tensorflow as tf  # noqa: E402

import common  # noqa: E402,F401  (oneDNN on before TensorFlow loads: common/cpu.py)
from common.parallel.distribution import Distribution  # noqa: E402
from common.parallel.sync_batchnorm import GroupBatchNormalization  # noqa: E402


def group_of_two(dist: Distribution) -> dict:
    """Its group of 2 ranks (a static process set when the job is larger than 2), or why not and
    the whole job's group instead."""
    refused = None
    try:
        group = dist.rank_group(2)
    except RuntimeError as e:  # a job larger than 2 whose Distribution declared no group size
        refused = str(e)
        group = dist.rank_group(dist.size)
    # The group's process set as Horovod registered it (the global set's id is 0), asked before any
    # rank can have ended: a rank's exit shuts Horovod down on all, and its sets with it.
    ps = group.process_set
    return {
        "group_set": [ps.process_set_id, ps.ranks, ps.size()],
        "group_sum": group.sum(tf.constant([float(dist.rank)])).numpy().tolist(),
        "init": dist.describe(),
        "refused": refused,
        "group": group,
    }


dist = Distribution(group_sizes=(2,))
declared = group_of_two(dist)
group = declared.pop("group")
undeclared = group_of_two(Distribution())
undeclared.pop("group")
# Every rank feeds a batch filled with its rank: the group's mean is the pair's
# mean, so the normalized output is -1 on the lower rank and +1 on the upper.
bn = GroupBatchNormalization(group, epsilon=1e-6)
bn_out = tf.function(lambda x: bn(x, training=True))(tf.fill([2, 3, 3, 4], float(dist.rank)))
v = tf.Variable([float(dist.rank + 1)] * 3)
dist.broadcast_variables([v])
grads = dist.average_gradients([tf.constant([float(dist.rank)] * 2)])
dist.barrier()
# Horovod's own answer to whether its process sets are dynamic: a set of every rank is refused either
# way, as not dynamic or as the global set again (every rank asks, as a dynamic registration needs).
try:
    hvd.add_process_set(list(range(dist.size)))
    refusal = "none"
except ValueError as e:
    refusal = "not dynamic" if "HOROVOD_DYNAMIC_PROCESS_SETS" in str(e) else "duplicate"
dist.barrier()
Path(sys.argv[1], f"rank-{dist.rank}.json").write_text(
    json.dumps(
        {
            "rank": dist.rank,
            "size": dist.size,
            "local_rank": dist.local_rank,
            "nodes": dist.num_nodes,
            "mean": dist.allreduce_mean([dist.rank, 10.0]).tolist(),
            "max": dist.allreduce_max([dist.rank]).tolist(),
            "gathered": dist.allgather([dist.rank * 2.0]).tolist(),
            "object": dist.broadcast_object({"from": dist.rank}),
            "broadcast": v.numpy().tolist(),
            "grad": grads[0].numpy().tolist(),
            "group_bn": float(tf.reduce_mean(bn_out)),
            "process_set_refusal": refusal,
            **declared,
            "undeclared": undeclared,
        }
    )
)
