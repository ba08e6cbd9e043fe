"""Checkpoints that are either complete or absent.

Rank 0 writes `checkpoints/epoch-NNNNN.tmp/`, then renames it to
`checkpoints/epoch-NNNNN/`: a job killed mid-write leaves only a .tmp folder,
which `latest` ignores. The epoch is in the name and in the checkpoint.
"""

import os
import re
import shutil
from pathlib import Path

import tensorflow as tf

_NAME = re.compile(r"^epoch-(\d{5})$")


class Checkpointer:
    def __init__(self, directory, model, optimizer, keep: int = 2):
        self.directory = Path(directory)
        self.keep = keep
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        self._ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=self.epoch)

    def save(self, epoch: int) -> Path:
        """Writes the state after `epoch` (call on rank 0 only: it does no collective)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.directory / f"epoch-{epoch:05d}"
        tmp = self.directory / f"epoch-{epoch:05d}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        self.epoch.assign(epoch)
        self._ckpt.write(str(tmp / "ckpt"))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        for old in self.all()[:-self.keep] if self.keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def all(self) -> list[Path]:
        if not self.directory.is_dir():
            return []
        return sorted(p for p in self.directory.iterdir() if p.is_dir() and _NAME.match(p.name))

    def latest(self):
        found = self.all()
        return found[-1] if found else None

    def restore(self, path) -> int:
        """Loads a checkpoint folder; returns the epoch it was written after."""
        self._ckpt.read(str(Path(path) / "ckpt")).assert_existing_objects_matched()
        return int(self.epoch.numpy())


# ------------------------------------------------------------ model-only folders
# Written by the import tools (a reference-trained model) and read by predict,
# evaluation and fine-tuning: `FOLDER/ckpt.*` holds the model's variables under
# the same object path as a training checkpoint ("model"), so a training
# checkpoint folder (checkpoints/epoch-NNNNN) is read by the same function.
CONFIG_NAME = "config.yaml"


def save_model_weights(model, folder) -> Path:
    """Writes `model`'s variables to FOLDER/ckpt (temporary folder, then rename)."""
    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tf.train.Checkpoint(model=model).write(str(tmp / "ckpt"))
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(tmp, folder)
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
    from common.errors import InputError
    folder = Path(folder)
    if not (folder / "ckpt.index").is_file():
        raise InputError(f"{folder}: not a checkpoint folder (no ckpt.index)")
    try:
        status = tf.train.Checkpoint(model=model).read(str(folder / "ckpt"))
        status.expect_partial()
        status.assert_existing_objects_matched()
    except (AssertionError, ValueError) as e:   # a missing variable; a shape that differs
        first = str(e).splitlines()[0][:200]
        raise InputError(f"{folder}: checkpoint does not match the model ({first})") from None


def find_run_config(folder):
    """The config.yaml that describes a checkpoint folder: in it (import tools), or in
    the run directory two levels up (run/checkpoints/epoch-NNNNN). None if absent."""
    folder = Path(folder)
    for candidate in (folder, folder.parent, folder.parent.parent):
        if (candidate / CONFIG_NAME).is_file():
            return candidate / CONFIG_NAME
    return None
