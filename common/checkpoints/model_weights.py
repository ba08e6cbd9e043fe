"""Model-only checkpoint folders: a model's variables without optimizer or position.

Written by the import tools (a reference-trained model) and read by predict,
evaluation and fine-tuning: `FOLDER/ckpt.*` holds the model's variables under
the same object path as a training checkpoint ("model", common.checkpoints.checkpointer), so
a training checkpoint folder (checkpoints/step-NNNNNNNNNN) is read by the same function.
"""

import shutil
from pathlib import Path

import tensorflow as tf

from common.errors import InputError
from common.files import replace_folder

CONFIG_NAME = "config.yaml"


def save_model_weights(model, folder) -> Path:
    """Writes `model`'s variables to FOLDER/ckpt (temporary folder, then rename)."""
    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tf.train.Checkpoint(model=model).write(str(tmp / "ckpt"))
    replace_folder(tmp, folder)
    return folder


def holds_training_state(folder) -> bool:
    """Whether a checkpoint folder has an optimizer and epoch (training) or only a model (import)."""
    names = {name for name, _ in tf.train.list_variables(str(Path(folder) / "ckpt"))}
    return any(n.startswith("optimizer/") for n in names)


def restore_model_weights(model, folder) -> None:
    """Loads the model's variables from a training or model-only checkpoint folder.

    Every variable of `model` must be in the checkpoint with its shape; extra
    objects (optimizer, epoch) are ignored. Raises InputError naming the folder.
    """
    folder = Path(folder)
    if not (folder / "ckpt.index").is_file():
        raise InputError(f"{folder}: not a checkpoint folder (no ckpt.index)")
    try:
        status = tf.train.Checkpoint(model=model).read(str(folder / "ckpt"))
        status.expect_partial()
        status.assert_existing_objects_matched()
    except (AssertionError, ValueError) as e:  # a missing variable; a shape that differs
        first = str(e).splitlines()[0][:200]
        raise InputError(f"{folder}: checkpoint does not match the model ({first})") from None


def find_run_config(folder):
    """The config.yaml that describes a checkpoint folder: in it (import tools), or in
    the run directory two levels up (run/checkpoints/step-NNNNNNNNNN). None if absent."""
    folder = Path(folder)
    for candidate in (folder, folder.parent, folder.parent.parent):
        if (candidate / CONFIG_NAME).is_file():
            return candidate / CONFIG_NAME
    return None
