"""Warm-up's placement check (common.run.device_placement): the check fed placements as a GPU run
would record them, and the placement TensorFlow records for a step, here all on the CPU."""

import dataclasses

import tensorflow as tf
import tf_keras

from common.run.device_placement import PlacedOp, cpu_fallbacks, fallback_message, placement_of
from common.run.steps import TrainStep
from tests import helpers

CPU = "/job:localhost/replica:0/task:0/device:CPU:0"
GPU = "/job:localhost/replica:0/task:0/device:GPU:0"

# A GPU run's placement, as graph collection gives it, in two partitions. The GPU's: a convolution,
# a Size (its output in host memory), and the pairs' sending ends: _Send copies out of the GPU's
# memory, _HostSend hands over what is already in host memory. The CPU's: the receiving ends, the
# Size made a float by Grappler on the host (pinned: it reads no GPU memory), and what belongs on
# the host (arguments, constants, the iterator, a dataset, Horovod's size).
GPU_RUN = [
    PlacedOp("model/conv3d/Conv3D", "Conv3D", GPU, ("x/_2",)),
    PlacedOp("model/conv3d/Conv3D/_0", "_Send", GPU, ("model/conv3d/Conv3D",), "edge_7_Conv3D"),
    PlacedOp("Size", "Size", GPU, ("model/conv3d/Conv3D",)),
    PlacedOp("Size/_4", "_HostSend", GPU, ("Size",), "edge_9_Size"),
    PlacedOp("x/_2", "_Recv", GPU, (), "edge_1_x"),
    PlacedOp("x", "_Arg", CPU),
    PlacedOp("x/_1", "_Send", CPU, ("x",), "edge_1_x"),
    PlacedOp("model/conv3d/Conv3D/_1", "_Recv", CPU, (), "edge_7_Conv3D"),
    PlacedOp("Size/_5", "_Recv", CPU, (), "edge_9_Size"),
    PlacedOp("Cast", "Cast", CPU, ("Size/_5",)),
    PlacedOp("Const_3", "Const", CPU),
    PlacedOp("NoOp", "NoOp", CPU),
    PlacedOp("HorovodSize", "HorovodSize", CPU),
    PlacedOp("IteratorGetNext", "IteratorGetNext", CPU, ("iterator",)),
    PlacedOp("TensorSliceDataset", "TensorSliceDataset", CPU, ("Const_3",)),
    PlacedOp("Identity", "Identity", CPU, ("model/conv3d/Conv3D/_1",)),
]
# An op left on the CPU: MaxPool3D's gradient (no float16 GPU kernel in some builds), reading the
# convolution's output copied from the GPU.
FALLBACK = PlacedOp(
    "gradient_tape/model/max_pooling3d/MaxPool3DGrad",
    "MaxPool3DGrad",
    CPU,
    ("model/conv3d/Conv3D/_1",),
)


def test_an_op_on_the_cpu_reading_the_gpus_memory_is_named_and_the_hosts_ops_pass():
    assert cpu_fallbacks(GPU_RUN) == []
    assert cpu_fallbacks([*GPU_RUN, FALLBACK]) == [FALLBACK]
    message = fallback_message([FALLBACK])
    assert "MaxPool3DGrad x1 (e.g. gradient_tape/model/max_pooling3d/MaxPool3DGrad)" in message
    assert "--set runtime.allow_cpu_ops=MaxPool3DGrad" in message
    assert cpu_fallbacks([*GPU_RUN, FALLBACK], allowed=("MaxPool3DGrad",)) == []
    # The same op reading what the GPU keeps in host memory: on the host on purpose.
    pinned = dataclasses.replace(FALLBACK, inputs=("Size/_5",))
    assert cpu_fallbacks([*GPU_RUN, pinned]) == []
    # A receive of another function's tensor of the same name is not this one's copy.
    elsewhere = dataclasses.replace(FALLBACK, function=1)
    assert cpu_fallbacks([*GPU_RUN, elsewhere]) == []
    # Horovod's allreduce of a build without GPU operations reads the gradients on the host.
    allreduce = PlacedOp("HorovodAllreduce_grad_0", "HorovodAllreduce", CPU, FALLBACK.inputs)
    assert cpu_fallbacks([*GPU_RUN, allreduce]) == [allreduce]
    assert "Horovod built without GPU operations" in fallback_message([allreduce])


def _step():
    """A one-convolution model's train step, traced and not yet run, and a batch for it."""
    tf_keras.utils.set_random_seed(1)
    model = tf_keras.Sequential(
        [
            tf_keras.Input((6, 6, 2)),
            tf_keras.layers.Conv2D(2, 3, name="probe_conv"),
            tf_keras.layers.Flatten(),
        ]
    )
    step = TrainStep(
        model,
        tf_keras.optimizers.SGD(0.1),
        tf_keras.losses.MeanSquaredError(),
        helpers.SingleProcess(),
    )
    batch = (tf.ones((2, 6, 6, 2)), tf.zeros((2, 32)))
    step.trace((tf.TensorSpec((2, 6, 6, 2)), tf.TensorSpec((2, 32))))
    return step, batch


def test_graph_collection_gives_the_steps_ops_as_placed_on_their_first_call():
    step, batch = _step()
    placed = placement_of(lambda: step(iter([batch])).loss.numpy())
    names = {op.name for op in placed}
    conv = [op for op in placed if "/probe_conv/" in op.name]
    assert conv and all(op.on_cpu for op in placed), placed
    # Each node's inputs name collected nodes: the check follows a copy from its _Recv by them.
    assert all(name in names for op in placed for name in op.inputs)
    assert any(op.inputs for op in conv)
    assert cpu_fallbacks(placed) == []  # nothing comes from a GPU here
    # A function already instantiated is not placed again: the check needs the steps' first calls.
    assert placement_of(lambda: step(iter([batch])).loss.numpy()) == []


def test_the_messages_override_sets_the_allowed_types():
    """What the one line tells a user to pass is a valid override of the config."""
    from common.config import load_config
    from cosmoflow.config import CosmoFlowConfig

    message = fallback_message([FALLBACK, PlacedOp("erf", "Erf", CPU)])
    key, value = message.split("--set ")[1].split(" ")[0].split("=")
    cfg = load_config(
        CosmoFlowConfig,
        helpers.REPO / "tests" / "configs" / "cosmoflow_tiny.yaml",
        {key: value, "data.data_dir": "/data"},
    )
    assert cfg.runtime.allow_cpu_ops == ("MaxPool3DGrad", "Erf")
