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
