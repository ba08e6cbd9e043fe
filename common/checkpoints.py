"""Training checkpoints: complete or absent, written while training goes on.

A checkpoint is a folder `checkpoints/step-NNNNNNNNNN/` (optimizer steps done) holding
  ckpt.*               model, optimizer and random generators (tf.train.Checkpoint, rank 0);
  state.json           where the run stood: epoch, steps done in it, ranks;
  rank-NNNNN.npz       mid-epoch only: each rank's common.rank_state.RankState (its losses of
                       the epoch and batch-norm statistics, which differ between ranks until the
                       epoch's end);
  optimizer-shard-N.*  with parallel.shard_optimizer, the optimizer of spatial-group rank N >= 1.
It is written to `step-N.tmp/` and renamed once complete (docs/checkpoints.md).
"""

import concurrent.futures
import contextlib
import dataclasses
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import tensorflow as tf

from common.errors import write_text_atomic
from common.inputs import pipeline

if TYPE_CHECKING:  # a mid-epoch checkpoint's part only
    from common.rank_state import RankState

_NAME = re.compile(r"^step-(\d{10})$")
STATE_FILE = "state.json"
SHARD_FILE = "optimizer-shard-{}"


class Checkpointer:
    """Saves and restores the training state of one run in `directory` (its checkpoints/), keeping
    the newest `keep` checkpoints (0: all); `generators` (dropout) are saved with the model."""

    def __init__(self, directory, model, optimizer, keep: int = 2, generators=()):
        self.directory = Path(directory)
        self.keep = keep
        parts = dict(model=model, optimizer=optimizer)
        if generators:
            parts["rng"] = [g.state for g in generators]
        self._ckpt = tf.train.Checkpoint(**parts)
        # A sharded optimizer's part of another rank: its own file, read instead of ckpt's optimizer.
        self._optimizer_only = tf.train.Checkpoint(optimizer=optimizer)
        self._without_optimizer = tf.train.Checkpoint(
            **{k: v for k, v in parts.items() if k != "optimizer"}
        )
        self._writer = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="checkpoint"
        )
        self._pending = None
        self.last_save = {}  # figures of the newest completed save: seconds blocked, written, bytes

    def folder(self, global_step: int) -> Path:
        return self.directory / f"step-{global_step:010d}"

    def staging_folder(self, global_step: int) -> Path:
        """Where the ranks put a checkpoint's parts before rank 0 publishes it."""
        return self.directory / f"step-{global_step:010d}.tmp"

    def all(self) -> list[Path]:
        if not self.directory.is_dir():
            return []
        return sorted(p for p in self.directory.iterdir() if p.is_dir() and _NAME.match(p.name))

    def latest(self):
        found = self.all()
        return found[-1] if found else None

    def remove_partial(self) -> None:
        """Removes folders a killed save left behind (rank 0, before any save of this run)."""
        if self.directory.is_dir():
            for p in self.directory.glob("step-*.tmp"):
                shutil.rmtree(p, ignore_errors=True)

    def prepare(self) -> None:
        """Does the one-off work of the first async saves now, at init (seconds for DeepCAM,
        docs/checkpoints.md). Private API of the pinned TensorFlow; without it saves cost more."""
        with contextlib.suppress(AttributeError):  # another TensorFlow
            helper = self._ckpt._async_checkpointer()
            helper._ensure_initialized()
            helper._copy_to_cpu()  # traced and run once (its first run also optimizes the graph)

    def save(self, global_step: int, state: dict) -> float:
        """Rank 0, once every rank's part is written: starts writing the checkpoint after
        `global_step` steps, published when complete; returns the seconds the caller was blocked."""
        start = time.perf_counter()
        self.wait()
        folder, tmp = self.folder(global_step), self.staging_folder(global_step)
        tmp.mkdir(parents=True, exist_ok=True)
        for old in tmp.glob("ckpt*"):  # not the ranks' files
            old.unlink()
        self._ckpt.write(
            str(tmp / "ckpt"),
            options=tf.train.CheckpointOptions(experimental_enable_async_checkpoint=True),
        )
        blocked = time.perf_counter() - start
        self._pending = self._writer.submit(self._publish, tmp, folder, dict(state), blocked, start)
        return blocked

    def write_optimizer_shard(self, global_step: int, index: int) -> None:
        """Ranks 1..K-1 of the first spatial group: their optimizer shard into the staging folder."""
        tmp = self.staging_folder(global_step)
        tmp.mkdir(parents=True, exist_ok=True)
        self._optimizer_only.write(str(tmp / SHARD_FILE.format(index)))

    def _publish(self, tmp: Path, folder: Path, state: dict, blocked: float, start: float) -> None:
        self._ckpt.sync()  # the background write of the variables has finished
        for part in tmp.iterdir():  # on disk before the name says the checkpoint is complete
            fd = os.open(part, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        write_text_atomic(tmp / STATE_FILE, json.dumps(state, indent=1))
        shutil.rmtree(folder, ignore_errors=True)  # the same step written again
        os.replace(tmp, folder)
        for old in self.all()[: -self.keep] if self.keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
        self.last_save = {
            "path": str(folder),
            "blocked_s": blocked,
            "seconds": time.perf_counter() - start,
            "bytes": sum(p.stat().st_size for p in folder.iterdir()),
        }

    def wait(self) -> None:
        """Waits for the save in flight, if any; raises its error."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def restore(self, path, shard_index: int = 0) -> dict:
        """Loads a checkpoint folder (with optimizer shard `shard_index`) and returns its state.json."""
        path = Path(path)
        if shard_index == 0:
            self._ckpt.read(str(path / "ckpt")).assert_existing_objects_matched()
        else:
            self._without_optimizer.read(
                str(path / "ckpt")
            ).expect_partial().assert_existing_objects_matched()
            self._optimizer_only.read(
                str(path / SHARD_FILE.format(shard_index))
            ).assert_existing_objects_matched()
        return read_state(path)


def random_generators(model) -> list:
    """The tf.random.Generator of every random layer of `model` (dropout), in layer order: Keras
    keeps them out of `model.variables`, and a resumed run needs their state."""
    found = []
    for layer in model.submodules:
        generator = getattr(getattr(layer, "_random_generator", None), "_generator", None)
        if isinstance(generator, tf.random.Generator):
            found.append(generator)
    return found


def read_state(folder) -> dict:
    return json.loads((Path(folder) / STATE_FILE).read_text())


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    """Where a run starts: from scratch (the default), a training checkpoint or model-only weights."""

    position: pipeline.Position = pipeline.Position()  # the next local batch this rank reads
    global_step: int = 0  # optimizer steps done over the whole run
    start_epoch: int = 0  # the epoch the checkpoint was written in
    rank_state: "RankState | None" = None  # this rank's part of a mid-epoch checkpoint
    # {"checkpoint", "epoch", "step", "global_step"}, or {"checkpoint", "epoch": 0,
    # "weights_only": True} from model-only weights; as the MLPerf log and summary.json say it.
    resumed_from: dict | None = None
    source: str | None = None  # the folder as it was named


class CheckpointSaver:
    """Every rank's side of the run's checkpoints, saved every train.checkpoint_steps steps
    (mid-epoch included), after every train.checkpoint_every-th epoch, on an agreed stop, and at
    the end of a run that saves at all. `optimizer_shard`: the ShardedUpdate of a sharded optimizer."""

    def __init__(
        self,
        directory,
        model,
        optimizer,
        dist,
        train,
        steps_per_epoch: int,
        benchmark: str,
        optimizer_shard=None,
    ):
        self.checkpointer = Checkpointer(
            directory,
            model,
            optimizer,
            keep=train.keep_checkpoints,
            generators=random_generators(model),
        )
        self.optimizer_shard = optimizer_shard
        self.model, self.dist, self.benchmark = model, dist, benchmark
        self.every_epochs, self.every_steps = train.checkpoint_every, train.checkpoint_steps
        self.steps_per_epoch = steps_per_epoch
        self.saved_at = None  # global step of the newest checkpoint this run wrote
        self.blocked_s = []  # rank 0: seconds each save held the step up

    @property
    def enabled(self) -> bool:
        return bool(self.every_epochs or self.every_steps)

    def prepare(self) -> None:
        """Rank 0, at init: removes what a killed save left, and does the first saves' one-off work."""
        if self.dist.is_root:  # before any rank writes a part of a new checkpoint
            self.checkpointer.remove_partial()
            if self.enabled:
                self.checkpointer.prepare()

    def due_mid_epoch(self, global_step: int) -> bool:
        return bool(self.every_steps) and global_step % self.every_steps == 0

    def due_after_epoch(self, epoch: int, global_step: int) -> bool:
        return bool(self.every_epochs and epoch % self.every_epochs == 0) or self.due_mid_epoch(
            global_step
        )

    def save(
        self, epoch: int, steps_done: int, global_step: int, epoch_losses=(), wait: bool = False
    ) -> None:
        """Every rank: checkpoints the state after `steps_done` steps of `epoch` (a collective
        mid-epoch, keeping `epoch_losses`); with `wait`, rank 0 returns once it is on disk."""
        if self.saved_at == global_step:
            if wait and self.dist.is_root:
                self.checkpointer.wait()
            return
        mid_epoch, shards = steps_done < self.steps_per_epoch, self.optimizer_shard
        if mid_epoch:
            from common.rank_state import RankState  # a mid-epoch checkpoint's

            RankState.of(self.model, epoch_losses).write(
                self.checkpointer.staging_folder(global_step), self.dist.rank
            )
        if shards is not None and 0 < self.dist.rank < shards.size:  # the first group's other ranks
            self.checkpointer.write_optimizer_shard(global_step, shards.index)
        if mid_epoch or shards is not None:
            self.dist.barrier()  # every rank's part is on disk before rank 0 publishes the folder
        if self.dist.is_root:
            state = {
                "global_step": global_step,
                "epoch": epoch,
                "steps_done": steps_done,
                "steps_per_epoch": self.steps_per_epoch,
                "ranks": self.dist.size,
                "benchmark": self.benchmark,
                "optimizer_shards": shards.size if shards else 1,
            }
            self.blocked_s.append(self.checkpointer.save(global_step, state))
            if wait:
                self.checkpointer.wait()
        self.saved_at = global_step

    def wait(self) -> None:
        """Rank 0: no save left in flight (its error raised here)."""
        if self.dist.is_root and self.saved_at is not None:
            self.checkpointer.wait()

    def figures(self) -> dict:
        """Rank 0, after `wait`: the last save's figures and the blocked times over all saves ({} if none)."""
        if not (self.dist.is_root and self.saved_at is not None):
            return {}
        return dict(
            self.checkpointer.last_save,
            saves=len(self.blocked_s),
            blocked_max_s=max(self.blocked_s),
            blocked_mean_s=float(np.mean(self.blocked_s)),
            interval_steps=self.every_steps or None,
        )

    def folder(self, global_step: int) -> str:
        """The absolute path of the checkpoint after `global_step` steps."""
        return str(self.checkpointer.folder(global_step).resolve())
