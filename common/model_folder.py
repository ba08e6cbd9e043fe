"""Model-only folders (FOLDER/ckpt holding the model's variables, and its config.yaml): what the
import tools write, predict reads, and a run may start from (train.resume_from).
"""

import os
import shutil
from pathlib import Path

import tensorflow as tf

from common.errors import InputError

CONFIG_NAME = "config.yaml"


def save_model_weights(model, folder) -> Path:
    """Writes `model`'s variables to FOLDER/ckpt (temporary folder, then rename)."""
    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tf.train.Checkpoint(model=model).write(str(tmp / "ckpt"))
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    return folder


def restore_model_weights(model, folder) -> None:
    """Loads the model's variables from a training or model-only checkpoint folder (others are
    ignored); InputError naming the folder when one of the model's is missing or of another shape."""
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
