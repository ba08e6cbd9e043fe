"""Where a resumed run starts (--resume, --checkpoint): a training checkpoint loaded into the model
and optimizer (this rank's part of a sharded one), or a model-only folder's weights. Imported by a
run that resumes only (common.run.trainer); the folders are common.checkpoints'.
"""

from pathlib import Path

import tensorflow as tf

from common.checkpoints import Checkpointer, ResumePoint, read_state
from common.errors import InputError
from common.inputs import pipeline


def resume_point(
    checkpointer: Checkpointer,
    source,
    *,
    model,
    rank: int,
    ranks: int,
    steps_per_epoch: int,
    accumulation: int,
    optimizer_shard=None,
) -> ResumePoint:
    """Loads `source` (a checkpoint folder, or None: the newest is wanted but there is none)
    into the model (and the optimizer: this rank's part of it with `optimizer_shard`); returns
    where the run goes on. InputError naming the folder when it cannot be resumed by this run."""
    if source is None:
        raise InputError(f"--resume: no checkpoint in {checkpointer.directory}")
    if not Path(source).is_dir():
        raise InputError(f"checkpoint not found: {source}")
    if not (Path(source) / "ckpt.index").is_file():
        raise InputError(f"{source}: not a checkpoint folder (no ckpt.index)")
    resolved = str(Path(source).resolve())
    names = [name for name, _ in tf.train.list_variables(str(Path(source) / "ckpt"))]
    if not any(n.startswith("optimizer/") for n in names):  # model-only: a new run, from epoch 0
        from common.model_folder import restore_model_weights

        restore_model_weights(model, source)
        return ResumePoint(
            resumed_from={"checkpoint": resolved, "epoch": 0, "weights_only": True},
            source=str(source),
        )
    shards, index = (
        (1, 0) if optimizer_shard is None else (optimizer_shard.size, optimizer_shard.index)
    )
    written = read_state(source).get("optimizer_shards", 1)
    if written != shards:
        raise InputError(
            f"{source}: its optimizer is sharded over {written} rank(s), this run's over {shards}; "
            f"resume with parallel.shard_optimizer and parallel.spatial_ranks as it was written"
        )
    state = checkpointer.restore(source, index)
    epoch, done, per_epoch = state["epoch"], state["steps_done"], state["steps_per_epoch"]
    if per_epoch != steps_per_epoch:
        raise InputError(
            f"{source}: written with {per_epoch} steps per epoch, this run has "
            f"{steps_per_epoch} (other samples, ranks or batch size)"
        )
    rank_state = None
    if done >= per_epoch:  # written after the epoch's end (statistics averaged, evaluated)
        position = pipeline.Position(epoch + 1, 0)
    else:
        if state["ranks"] != ranks:
            raise InputError(
                f"{source}: a mid-epoch checkpoint of {state['ranks']} ranks; resume it with "
                f"{state['ranks']} ranks, or from a checkpoint written at an epoch's end"
            )
        from common.rank_state import RankState  # a mid-epoch checkpoint's

        rank_state = RankState.read(source, rank)
        position = pipeline.Position(epoch, done * accumulation)
    return ResumePoint(
        position=position,
        global_step=state["global_step"],
        start_epoch=epoch,
        rank_state=rank_state,
        source=str(source),
        resumed_from={
            "checkpoint": resolved,
            "epoch": epoch,
            "step": done,
            "global_step": state["global_step"],
        },
    )
