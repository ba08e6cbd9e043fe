"""Run under horovodrun -np 2 by tests/test_sharded_optimizer.py: LAMB (with its global-norm clip
active) over one spatial group of 2 ranks, sharded (parallel.shard_optimizer) and not, from the same
start on the same batches; then a checkpoint of the sharded run resumed.

  horovodrun -np 2 python tests/sharded_optimizer_probe.py --out DIR

Writes DIR/rank-NNNNN.npz (each rank), arrays named VARIANT/weight_I, and DIR/rank-NNNNN.json with
the slot elements each optimizer holds and the variables this rank owns. Variants, CosmoFlow's tiny
model at 32^3 (not split: each rank its own batch, as data parallelism) trained STEPS steps:
  whole:      the optimizer unsharded
  sharded:    sharded over the 2 ranks
  whole-xla, sharded-xla: the same with the update XLA-compiled as one function, as on a GPU
  no-share:   sharded without the allgather of the updated variables: the negative control, whose
              weights must differ on the variables the other rank owns
  resumed:    `sharded` checkpointed after SAVED steps, restored into a new model and optimizer (each
              rank its part) and trained the rest: equal to `sharded`
  slots-lost: the same resume, then rank 1's slots set to zero (its part of the checkpoint as if
              not read): the negative control of `resumed`
"""

import argparse
import json
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

from common import optimizers  # noqa: E402
from common.checkpoints import CheckpointSaver  # noqa: E402
from common.config import load_config  # noqa: E402
from common.parallel.distribution import Distribution  # noqa: E402
from common.parallel.sharded_optimizer import ShardedUpdate  # noqa: E402
from common.resume import resume_point  # noqa: E402
from common.run.steps import TrainStep  # noqa: E402
from cosmoflow.task import CosmoFlowTask  # noqa: E402

EDGE, BATCH, STEPS, SAVED = 32, 2, 4, 2


def _build(dist, mesh, sharded: bool, compiled: bool = False):
    tf_keras.utils.set_random_seed(1)  # the same start on every rank and variant
    cfg = load_config(
        CosmoFlowTask.config_class,
        Path(__file__).parent / "configs" / "cosmoflow_tiny.yaml",
        {"data.data_dir": "/unused", "data.batch_size": BATCH},
    )
    task = CosmoFlowTask(cfg)
    model = task.build_model(None)
    # A clip well below the gradients' norm, so that it scales them: a clip over only the gradients a
    # rank owns (a smaller norm) would scale them otherwise, and the weights would differ.
    optimizer = optimizers.build_optimizer(
        "LAMB", learning_rate=0.01, weight_decay=0.01, max_grad_norm=0.05
    )
    optimizer.jit_compile = (
        compiled  # Keras' flag, set where a GPU exists: TrainStep compiles its update
    )
    shard = (
        ShardedUpdate(
            model.trainable_variables,
            mesh.index,
            mesh.size,
            lambda flat: mesh.allgather(flat, "probe.sharded_weights"),
        )
        if sharded
        else None
    )
    step = TrainStep(
        model, optimizer, task.build_losses(), dist, preprocess=task.preprocess_batch, shard=shard
    )
    return model, optimizer, step, shard


def _batches(rank: int):
    data = np.random.default_rng(100 + rank)  # each rank its own batches
    return [
        (
            tf.constant(data.poisson(2.0, (BATCH, EDGE, EDGE, EDGE, 4)).astype(np.int16)),
            tf.constant(data.uniform(-1, 1, (BATCH, 4)).astype(np.float32)),
        )
        for _ in range(STEPS)
    ]


def _saver(out: Path, model, optimizer, dist, shard) -> CheckpointSaver:
    """The run's saver, saving at each epoch's end (here: after SAVED steps)."""
    train = types.SimpleNamespace(keep_checkpoints=0, checkpoint_every=1, checkpoint_steps=0)
    return CheckpointSaver(
        out / "checkpoints",
        model,
        optimizer,
        dist,
        train,
        steps_per_epoch=SAVED,
        benchmark="probe",
        optimizer_shard=shard,
    )


def _weights(model) -> dict:
    return {f"weight_{i}": v.numpy() for i, v in enumerate(model.trainable_variables)}


def _slot_elements(optimizer) -> int:
    return int(sum(v.shape.num_elements() for v in optimizer.variables if v.shape.rank))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    out = Path(args.out)
    tf.config.experimental.enable_op_determinism()
    dist = Distribution(group_sizes=(2,))
    mesh = dist.spatial_mesh(2)
    batches = _batches(dist.rank)
    arrays, facts = {}, {}

    for variant in ("whole", "sharded", "no-share", "whole-xla", "sharded-xla"):
        tf_keras.backend.clear_session()
        model, optimizer, step, shard = _build(
            dist, mesh, sharded=not variant.startswith("whole"), compiled=variant.endswith("xla")
        )
        if variant == "no-share":
            shard.share = lambda: None
        for i, batch in enumerate(batches):
            float(step(iter([batch])).loss)
            if variant == "sharded" and i + 1 == SAVED:
                saver = _saver(out, model, optimizer, dist, shard)
                saver.save(epoch=0, steps_done=SAVED, global_step=SAVED, wait=True)
                dist.barrier()  # rank 0 has published it
                folder = saver.folder(SAVED)
        arrays |= {f"{variant}/{k}": v for k, v in _weights(model).items()}
        facts[variant] = {
            "slot_elements": _slot_elements(optimizer),
            "owned": shard.owned if shard is not None else None,
        }

    for variant in ("resumed", "slots-lost"):
        tf_keras.backend.clear_session()
        model, optimizer, step, shard = _build(dist, mesh, sharded=True)
        point = resume_point(
            _saver(out, model, optimizer, dist, shard).checkpointer,
            folder,
            model=model,
            rank=dist.rank,
            ranks=dist.size,
            steps_per_epoch=SAVED,
            accumulation=1,
            optimizer_shard=shard,
        )
        facts[variant] = {"global_step": point.global_step}
        if (
            variant == "slots-lost" and shard.index > 0
        ):  # this rank's part as if it had not been read
            for v in optimizer.variables:
                if v.shape.rank:
                    v.assign(tf.zeros_like(v))
        for batch in batches[SAVED:]:
            float(step(iter([batch])).loss)
        arrays |= {f"{variant}/{k}": v for k, v in _weights(model).items()}

    np.savez(out / f"rank-{dist.rank:05d}.npz", **arrays)
    (out / f"rank-{dist.rank:05d}.json").write_text(json.dumps(facts))
    dist.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
