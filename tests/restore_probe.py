"""Restores a training checkpoint into the model and optimizer its run's config builds, then writes
them out again, so that what this TensorFlow restored can be compared tensor by tensor with what
the writer saved (tests/test_older_stack.py runs it under each stack's Python).

  python tests/restore_probe.py BENCH CHECKPOINT OUT [--fresh]

BENCH: cosmoflow or deepcam; CHECKPOINT: a run's checkpoints/step-NNNNNNNNNN; OUT: a folder, which
gets OUT/checkpoints/step-NNNNNNNNNN (the same step). --fresh writes the model as built, not
restored: the negative control. The model and optimizer are built as the trainer builds them
(Task.build_model, Task.build_optimizer, optimizer.build), restored by the trainer's own
Checkpointer, whose read asserts that every object of this model was in the checkpoint.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import common  # noqa: E402,F401  (TF_USE_LEGACY_KERAS, oneDNN: before TensorFlow loads)
from common import benchmarks  # noqa: E402
from common.checkpoints.checkpointer import Checkpointer, random_generators, read_state  # noqa: E402
from common.checkpoints.model_weights import find_run_config  # noqa: E402
from common.config_loading import load_config  # noqa: E402
import tensorflow as tf  # noqa: E402


def main(bench: str, checkpoint: str, out: str, fresh: bool) -> None:
    task_class = benchmarks.task_class(bench)
    cfg = load_config(task_class.config_class, find_run_config(checkpoint))
    task = task_class(cfg)
    state = read_state(checkpoint)
    # As common.runtime.configure does before the trainer builds the model: dropout draws from
    # tf.random.Generator objects, whose states the checkpoint holds (rng/).
    tf.keras.backend.experimental.enable_tf_random_generator()
    model = task.build_model(None)   # one rank: no batch-norm group
    optimizer, _ = task.build_optimizer(task.local_batch_size, state["steps_per_epoch"])
    optimizer.build(model.trainable_variables)
    checkpointer = Checkpointer(Path(out) / "checkpoints", model, optimizer, keep=0,
                                generators=random_generators(model))
    if not fresh:
        checkpointer.restore(checkpoint)
    checkpointer.save(int(Path(checkpoint).name.split("-")[1]), state)
    checkpointer.wait()


if __name__ == "__main__":
    args = sys.argv[1:]
    main(*args[:3], fresh="--fresh" in args[3:])
