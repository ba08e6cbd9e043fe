"""Run under horovodrun -np 2 by tests/test_gradient_overlap.py: CosmoFlow's train step with each
way of averaging gradients, from the same start on the same batches, and a Horovod timeline of one
step of each.

  horovodrun -np 2 python tests/overlap_probe.py --out DIR

Per variant (DIR/VARIANT/rank-NNNNN.npz: the weights after 3 steps; rank 0 also writes, of the third
step, DIR/VARIANT/timeline.json, Horovod's timeline, and DIR/VARIANT/profile.json, from TensorFlow's
profiler: when the executor launched each allreduce ("launches", op name -> us) and when backward's
ops ran ("backward": [first begin, last end], the ops under the tape's gradient_tape/ scope)):
  overlap:       an allreduce per gradient (runtime.gradient_allreduce=overlap, the default)
  grouped:       one grouped allreduce after backward (runtime.gradient_allreduce=grouped)
  overlap-fp16:  overlap with fp16 compression on the wire: the negative control, whose
                 weights must differ from the others'
"""

import argparse
import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

from common.config import load_config  # noqa: E402
from common.parallel.distribution import Distribution  # noqa: E402
from common.run.steps import TrainStep  # noqa: E402
from cosmoflow.task import CosmoFlowTask  # noqa: E402
from tests import tf_profile  # noqa: E402

VARIANTS = {"overlap": (False, "none"), "grouped": (True, "none"), "overlap-fp16": (False, "fp16")}
# 64^3: backward long enough (tens of ms) that its gradients come apart even on loaded cores.
EDGE, BATCH, STEPS = 64, 2, 3


@contextlib.contextmanager
def _profiled(out: Path):
    """TensorFlow's profiler around the block; its launches and backward written to `out`."""
    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        try:
            yield
        finally:
            tf.profiler.experimental.stop()
        ops, kernels = tf_profile.read(logdir)
    backward = [op for op in ops if op.name.startswith("gradient_tape/")]
    out.write_text(
        json.dumps(
            {
                "launches": {
                    k.name: k.time for k in kernels if k.kind.startswith("Horovod") and not k.done
                },
                "backward": [min(op.begin for op in backward), max(op.end for op in backward)],
            },
            indent=1,
        )
    )


def _run(dist, grouped: bool, compression: str, timeline: Path | None) -> dict:
    tf_keras.backend.clear_session()
    tf_keras.utils.set_random_seed(1)  # the same start on every rank and variant
    cfg = load_config(
        CosmoFlowTask.config_class,
        Path(__file__).parent / "configs" / "cosmoflow_tiny.yaml",
        {
            "data.data_dir": "/unused",
            "data.batch_size": BATCH,
            "data.sample_shape": f"{EDGE},{EDGE},{EDGE},4",
        },
    )
    task = CosmoFlowTask(cfg)
    model = task.build_model(None)
    optimizer, _ = task.build_optimizer(BATCH * dist.size, steps_per_epoch=10)
    step = TrainStep(
        model,
        optimizer,
        task.build_losses(),
        dist,
        compression,
        preprocess=task.preprocess_batch,
        grouped_allreduce=grouped,
    )
    data = np.random.default_rng(100 + dist.rank)  # each rank its own batches
    batches = [
        (
            tf.constant(data.poisson(2.0, (BATCH, EDGE, EDGE, EDGE, 4)).astype(np.int16)),
            tf.constant(data.uniform(-1, 1, (BATCH, 4)).astype(np.float32)),
        )
        for _ in range(STEPS)
    ]
    for i, batch in enumerate(batches):
        if timeline is not None and i == STEPS - 1:
            profile = (
                _profiled(timeline.with_name("profile.json"))
                if dist.is_root
                else contextlib.nullcontext()
            )
            with (
                profile,
                dist.timeline(timeline),
            ):  # the timeline stopped first: reading the profile takes a while
                float(step(iter([batch])).loss)
        else:
            float(step(iter([batch])).loss)
    return {f"weight_{i}": v.numpy() for i, v in enumerate(model.trainable_variables)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    tf.config.experimental.enable_op_determinism()
    os.environ["HOROVOD_TIMELINE"] = (
        "DYNAMIC"  # read at hvd.init: timelines started and stopped at will
    )
    # A cycle (ms) well below backward's time here, so that the gradients produced apart meet in
    # different cycles (at the default too, on this model; set so a fast CPU cannot make it one).
    os.environ["HOROVOD_CYCLE_TIME"] = "1"
    dist = Distribution()
    for name, (grouped, compression) in VARIANTS.items():
        out = Path(args.out) / name
        out.mkdir(parents=True, exist_ok=True)
        weights = _run(
            dist, grouped, compression, out / "timeline.json" if compression == "none" else None
        )
        np.savez(out / f"rank-{dist.rank:05d}.npz", **weights)
        dist.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
