"""Run on 2 ranks by test_horovod_timeline.py: a collective that rank 1 submits before rank 0 has
started the timeline, recorded through Distribution.timeline and, as the control, through Horovod's
start and stop alone. Rank 0 writes OUT/<variant>.json, the tensors' activities as read by
bench/horovod_timeline.py."""

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import horovod.tensorflow as hvd  # noqa: E402
import tensorflow as tf  # noqa: E402

import common  # noqa: E402,F401  (oneDNN on before TensorFlow loads: common/cpu.py)
from bench.horovod_timeline import activities  # noqa: E402
from common.parallel.distribution import Distribution  # noqa: E402

os.environ["HOROVOD_TIMELINE"] = "DYNAMIC"  # read at hvd.init
dist = Distribution()
out = Path(sys.argv[1])


def late_allreduce(name: str) -> None:
    # Traced: an eager collective goes by its op's name (HorovodAllreduce) whatever it is given.
    tf.function(lambda: hvd.allreduce(tf.constant([1.0]), op=hvd.Sum, name=name))().numpy()


def bare(path):
    hvd.start_timeline(str(path), mark_cycles=False)
    try:
        late_allreduce("late_bare")
    finally:
        hvd.stop_timeline()


for variant in ("distribution", "bare"):
    path = out / f"{variant}.timeline.json"
    dist.barrier()
    if dist.rank == 0:
        time.sleep(1.0)  # rank 1's request reaches rank 0's background thread first
    if variant == "bare":
        bare(path)
    else:
        with dist.timeline(path):
            late_allreduce("late_distribution")
    dist.barrier()
    if dist.rank == 0:
        (out / f"{variant}.json").write_text(json.dumps(activities(path)))
