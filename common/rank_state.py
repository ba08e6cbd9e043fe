"""One rank's part of a mid-epoch checkpoint (rank-NNNNN.npz in the checkpoint's folder,
common.checkpoints): its step losses of the epoch so far and its batch-norm statistics, which differ
between ranks until the epoch's end.
"""

import dataclasses
import os
import zipfile
from pathlib import Path

import numpy as np
import tensorflow as tf

from common.errors import InputError
from common.parallel.distribution import batchnorm_statistics

_LOSSES = "losses"
_BATCHNORM = "bn_{}"


def rank_file(rank: int) -> str:
    """The file name of `rank`'s state in a checkpoint folder."""
    return f"rank-{rank:05d}.npz"


@dataclasses.dataclass(frozen=True)
class RankState:
    """One rank's part of a mid-epoch checkpoint: its step losses of the epoch so far (float32) and
    the model's batch-norm statistics, in batchnorm_statistics' order (arrays `losses`, `bn_<i>`)."""

    losses: np.ndarray
    batchnorm: tuple

    @classmethod
    def of(cls, model, epoch_losses) -> "RankState":
        """This rank's state now: `epoch_losses` (scalar tensors or floats) and `model`'s statistics."""
        losses = tf.stack(epoch_losses).numpy() if len(epoch_losses) else np.zeros(0, np.float32)
        return cls(losses=losses, batchnorm=tuple(v.numpy() for v in batchnorm_statistics(model)))

    def write(self, folder, rank: int) -> None:
        """Writes FOLDER/rank-NNNNN.npz (temporary name, then rename: a killed write leaves no file)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / (rank_file(rank) + ".tmp")
        arrays = {_LOSSES: self.losses} | {
            _BATCHNORM.format(i): v for i, v in enumerate(self.batchnorm)
        }
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, folder / rank_file(rank))

    @classmethod
    def read(cls, folder, rank: int) -> "RankState":
        """`rank`'s state in a checkpoint folder; InputError naming the file when missing or unreadable."""
        path = Path(folder) / rank_file(rank)
        if not path.is_file():
            raise InputError(f"{folder}: rank {rank}'s state is missing ({rank_file(rank)})")
        try:
            with np.load(path) as f:
                arrays = {k: f[k] for k in f.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:  # truncated or not an .npz
            raise InputError(f"{path}: unreadable ({str(e).splitlines()[0][:200]})") from None
        try:
            return cls(
                losses=arrays[_LOSSES],
                batchnorm=tuple(arrays[_BATCHNORM.format(i)] for i in range(len(arrays) - 1)),
            )
        except KeyError as e:
            raise InputError(f"{path}: no {e} array") from None

    def restore_batchnorm(self, model, source="") -> None:
        """Sets `model`'s batch-norm statistics to this rank's; InputError when they are not the model's."""
        variables = batchnorm_statistics(model)
        if len(variables) != len(self.batchnorm):
            raise InputError(
                f"{source}: holds {len(self.batchnorm)} batch-norm statistics per rank, "
                f"the model has {len(variables)}"
            )
        for i, (v, value) in enumerate(zip(variables, self.batchnorm)):
            if tuple(v.shape) != value.shape:
                raise InputError(
                    f"{source}: batch-norm statistic {i} ({v.name}) has shape {value.shape}, "
                    f"the model's is {tuple(v.shape)}"
                )
            v.assign(value)
