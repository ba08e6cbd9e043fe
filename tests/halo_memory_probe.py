"""Run by test_halo_memory.py in one process (Horovod on one rank): the ops of a halo exchange's
forward and backward, as traced, that make TensorFlow keep memory of the halo's or the slab's size
between steps. Writes the JSON given as argv[1]: per construction, its ZerosLike ops and the
largest number of tensors an AddN sums, and the gradient."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import common  # noqa: E402,F401  (oneDNN on before TensorFlow loads: common/cpu.py)
from common.parallel.spatial_mesh import SpatialMesh  # noqa: E402

HALO = 2
hvd.init()
# One rank: both faces of the sample, its alltoall sent to itself and both halo slots zeroed.
mesh = SpatialMesh(size=1, process_set=hvd.global_process_set)
x = tf.Variable(tf.random.stateless_uniform([1, 8, 6, 4], seed=[1, 2]))


def exchange(slab):
    planes = mesh.neighbour_planes(slab, HALO, name="exchange.alltoall")
    return tf.concat([planes.below, planes.above], axis=1)


def sliced_and_where(slab):
    # The control, neighbour_planes's construction until now without the alltoall: the boundary
    # rows as two slices (backward adds each slice's gradient to the slab's: a sum of three, which
    # grappler turns into an accumulator initialised from a zeros_like) and the faces zeroed by
    # tf.where against a zeros_like. TensorFlow folds a zeros_like of a static shape into a
    # constant the graph keeps between steps.
    send = tf.concat([slab[:, :HALO], slab[:, slab.shape[1] - HALO :]], axis=1)
    keep = np.zeros([1, 2 * HALO, 1, 1], bool)
    return tf.where(tf.constant(keep), send, tf.zeros_like(send))


def traced_ops(construction) -> dict:
    @tf.function
    def step():
        with tf.GradientTape() as tape:
            # The slab is read once, then by the layer's own convolution too (here a square): its
            # gradient is that one plus what the exchange sends back.
            slab = x.read_value()
            loss = tf.reduce_sum(tf.square(slab)) + tf.reduce_sum(construction(slab) * 3.0)
        return tape.gradient(loss, x)

    ops = step.get_concrete_function().graph.get_operations()
    # tf.zeros_like of a static shape traces as a Fill (or a Const) named after it.
    return {
        "zeros_like": sum(op.type == "ZerosLike" or "zeros_like" in op.name for op in ops),
        "addn_inputs": max([len(op.inputs) for op in ops if op.type == "AddN"], default=0),
        "gradient": step().numpy().tolist(),
    }


out = {c.__name__: traced_ops(c) for c in (exchange, sliced_and_where)}
Path(sys.argv[1]).write_text(json.dumps(out))
