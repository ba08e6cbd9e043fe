"""Which files each rank reads.

The file list is shuffled with a seed that all ranks share *before* it is cut
into shards, so the shards are disjoint and cover the selection exactly once.
Shards are contiguous by rank, and ranks are numbered node by node, so a
node's ranks read one contiguous block: that block is what the node stages.
A rank keeps its shard for the whole run and reads it in a new order every
epoch (common.inputs.epochs).

The references reshuffle across ranks instead. DeepCAM's (mlcommons/hpc
deepcam/src/deepCam/data/__init__.py b3ccbb3c, train.py 176c1089) samples with
torch's DistributedSampler, shuffle=True and set_epoch(epoch) before every
epoch: one permutation of the whole training set per epoch, the same on every
rank (seed and epoch), of which each rank takes every size-th sample.
CosmoFlow's (cosmoflow/data/cosmo.py 3b43dd57, the newest version read here)
shuffles the file list with reshuffle_each_iteration=True, then calls
data.shard(n_shards, index): shuffled before sharding, reshuffled every epoch;
its op takes no seed of its own, so the shards are disjoint only where every
rank's TensorFlow draws the same order. A rank that reads other files every
epoch needs every file on its node, so node-local staging means fixed shards:
the deviation the README declares.
"""

from pathlib import Path

import numpy as np

from common.errors import InputError


def list_files(directory, suffixes) -> list[str]:
    """Sorted files in `directory` whose names end with one of `suffixes`."""
    d = Path(directory)
    if not d.is_dir():
        raise InputError(f"data directory not found: {d}")
    files = sorted(str(p) for p in d.iterdir() if p.is_file() and p.name.endswith(tuple(suffixes)))
    if not files:
        raise InputError(f"no {'/'.join(suffixes)} files in data directory {d}")
    return files


def check_divisible(
    n_samples: int, size: int, batch_size: int, key: str, accumulation: int = 1
) -> None:
    """Every rank must run the same number of whole optimizer steps, or collectives deadlock;
    and an epoch must be one exact pass (CosmoFlow's reference divides n_train evenly)."""
    per_step = size * batch_size * accumulation
    if n_samples <= 0 or n_samples % per_step:
        factors = f"ranks x local batch{' x accumulation' if accumulation > 1 else ''}"
        values = f"{size} x {batch_size}{f' x {accumulation}' if accumulation > 1 else ''}"
        raise InputError(
            f"{key}={n_samples} is not divisible by {factors} = {values} = {per_step}; "
            f"use a multiple of {per_step}"
        )


def select_and_shard(
    files, n_samples: int, rank: int, size: int, seed: int, key: str, even: bool = True
) -> list[str]:
    """The `rank`-th of `size` disjoint shards of a seeded selection of `n_samples` files.

    With `even`, every shard has n_samples // size files (the caller checks divisibility);
    otherwise the first n_samples % size ranks get one file more (for a single evaluation
    pass, where ranks need not run in lockstep).
    """
    if n_samples > len(files):
        raise InputError(
            f"{key}={n_samples} but only {len(files)} files were found "
            f"in {Path(files[0]).parent if files else 'the data directory'}"
        )
    order = np.random.default_rng(seed).permutation(len(files))[:n_samples]
    selected = [files[i] for i in order]
    per_rank = n_samples // size
    if even:
        return selected[rank * per_rank : (rank + 1) * per_rank]
    extra = n_samples % size
    start = rank * per_rank + min(rank, extra)
    return selected[start : start + per_rank + (1 if rank < extra else 0)]
