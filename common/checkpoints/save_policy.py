"""When a run saves, and what each rank writes (the save policy; common.checkpoints.checkpointer does the writing).

A run saves
  - every `train.checkpoint_steps` optimizer steps, mid-epoch included;
  - after every `train.checkpoint_every`-th epoch;
  - when the ranks agreed to stop (SIGUSR1/SIGTERM, common.run.termination), waiting for the write;
  - at the end of a run that saves at all (the final state, unless just saved).
A mid-epoch checkpoint also holds each rank's own state (common.checkpoints.rank_state),
written by every rank before rank 0 publishes the folder; an optimizer sharded over the spatial
group, the parts of the first group's other ranks (common.checkpoints.checkpointer.SHARD_FILE).
"""

import numpy as np

from common.checkpoints.checkpointer import Checkpointer, random_generators
from common.checkpoints.rank_state import RankState


class CheckpointSaver:
    """Every rank's side of the run's checkpoints.

    Args:
      directory: the run's checkpoints/ folder.
      model, optimizer: what a checkpoint holds.
      dist: the Distribution (a mid-epoch save is a collective).
      train: the config's train section (checkpoint_every, checkpoint_steps, keep_checkpoints).
      steps_per_epoch: optimizer steps of one epoch (saved, and checked on a resume).
      benchmark: the benchmark's name (saved in state.json).
      optimizer_shard: the ShardedUpdate of an optimizer sharded over the spatial group, else None.
    """

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
        if (
            self.dist.is_root
        ):  # before any rank writes a part of a new checkpoint (collectives follow)
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
        """Every rank: checkpoints the state after `steps_done` steps of `epoch` (a collective mid-epoch).

        epoch_losses: this rank's losses of the epoch so far (kept by a mid-epoch checkpoint).
        wait: rank 0 returns once the checkpoint is on disk (a stop, a failure).
        """
        if self.saved_at == global_step:
            if wait and self.dist.is_root:
                self.checkpointer.wait()
            return
        mid_epoch, shards = steps_done < self.steps_per_epoch, self.optimizer_shard
        if mid_epoch:
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
