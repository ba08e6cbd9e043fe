"""Runs a benchmark's train.py with a probe of the step values the timed loop reads.

  python tests/inflight_probe.py BENCH [train.py arguments ...]

From run_start on, each training step runs as it is but hands back 1e6 + n as its loss, n its
launch's count; every read of a tensor to the host (EagerTensor._numpy, which .numpy(), float()
and np.asarray all go through) whose values all lie in [1e6, 1e6 + 1e5) is a read of step values.
For each, the probe prints the newest step read, the newest launched, and whether the read came
from the epoch's end (Trainer._end_epoch, after the epoch's last launch):

  inflight probe: read 7 launched 9 epoch-end 0

A read 0 or 1 behind outside an epoch's end waited for a step that may still run: on a GPU it
empties the queue the steps are launched into.
"""

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.python.framework import ops  # noqa: E402

from common import benchmarks  # noqa: E402
from common.run import steps  # noqa: E402
from common.run.trainer import Trainer, main  # noqa: E402

BASE, SPAN = 1e6, 1e5
state = {"running": False, "launched": 0, "epoch_end": False}

_call, _run, _end_epoch, _numpy = (
    steps.TrainStep.__call__,
    Trainer.train,
    Trainer._end_epoch,
    ops._EagerTensorBase._numpy,
)


def probed_call(self, batches):
    result = _call(self, batches)
    if not state["running"]:  # warm-up's steps, before run_start
        return result
    state["launched"] += 1
    return steps.StepResult(tf.constant(BASE + state["launched"], tf.float32), result.inputs_finite)


def probed_run(self, *args):
    state["running"] = True
    try:
        return _run(self, *args)
    finally:
        state["running"] = False


def probed_end_epoch(self, *args):
    state["epoch_end"] = True
    try:
        return _end_epoch(self, *args)
    finally:
        state["epoch_end"] = False


def probed_numpy(self):
    value = _numpy(self)
    if not (state["running"] and self.dtype.is_floating):
        return value
    values = np.asarray(value, np.float64).ravel()
    if values.size and np.all((values >= BASE) & (values < BASE + SPAN)):
        print(
            f"inflight probe: read {int(values.max() - BASE)} launched {state['launched']} "
            f"epoch-end {int(state['epoch_end'])}",
            flush=True,
        )
    return value


steps.TrainStep.__call__ = probed_call
Trainer.train = probed_run
Trainer._end_epoch = probed_end_epoch
ops._EagerTensorBase._numpy = probed_numpy

if __name__ == "__main__":
    bench, argv = sys.argv[1], sys.argv[2:]
    sys.argv = [str(REPO / bench / "train.py"), *argv]
    sys.exit(main(benchmarks.task_class(bench), argv))
