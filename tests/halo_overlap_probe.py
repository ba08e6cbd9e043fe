"""Run under horovodrun -np 2 by tests/test_halo_overlap.py: one split convolution traced by
TensorFlow's profiler on rank 0, with and without the overlap of its halo exchange.

  horovodrun -np 2 python tests/halo_overlap_probe.py --out DIR

Per variant (overlap: parallel.halo_overlap=true; exchange-first: false) rank 0 writes
DIR/VARIANT.json, from one forward pass: "alltoall", [begin, end] in microseconds of the
exchange in flight (its asynchronous kernel started, then done), and "convolutions", each
convolution kernel's op name in the layer (after grappler's fusions: the exchange-first
convolution is fused with its bias into the op named BiasAdd) and [begin, end].

Rank 1 enters that pass DELAY_S late, so rank 0's alltoall stays in flight at least that long:
on 2 shared cores a window of a few milliseconds could open and close between two ops, while
one of seconds shows plainly whether the interior convolution ran inside it.
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

from common.parallel.distribution import Distribution  # noqa: E402
from common.parallel.spatial import SpatialConv3D  # noqa: E402
from tests import tf_profile  # noqa: E402

DELAY_S = 3.0  # 1 s was once too short for the interior, with another pytest worker on the 2 cores
SLAB = (1, 32, 64, 64, 8)  # [B, Zs, Y, X, C]: an interior of some milliseconds' compute
VARIANTS = {"overlap": True, "exchange-first": False}
LAYER = "conv1"


def trace_intervals(logdir: str, layer: str) -> dict:
    """The layer's alltoall and convolutions in the profile under `logdir` (see the module's doc)."""
    ops, kernels = tf_profile.read(logdir)
    found = {"alltoall": [None, None], "convolutions": {}}
    for kernel in kernels:
        if kernel.kind == "HorovodAlltoall" and kernel.name.startswith(layer + "/"):
            found["alltoall"][kernel.done] = kernel.time
    for op in ops:
        if (
            op.name.startswith(layer + "/") and "Conv3D" in op.kind
        ):  # "conv1/interior:_MklNativeFusedConv3D"
            found["convolutions"][op.name[len(layer) + 1 :]] = [op.begin, op.end]
    return found


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist = Distribution(group_sizes=(2,))
    mesh = dist.spatial_mesh(2)
    x = tf.constant(np.random.default_rng(dist.rank).normal(size=SLAB).astype(np.float32))
    for variant, overlap in VARIANTS.items():
        tf_keras.backend.clear_session()  # the layer is conv1 in both variants
        conv = SpatialConv3D(16, 3, mesh, overlap=overlap, name=LAYER)
        forward = tf.function(conv)
        forward(x)  # traced and run once: the profiled pass runs kernels only
        dist.barrier()
        if dist.rank == 1:
            time.sleep(DELAY_S)
            forward(x).numpy()
        else:
            with tempfile.TemporaryDirectory() as logdir:
                tf.profiler.experimental.start(logdir)
                forward(x).numpy()
                # The alltoall's completion event is recorded as Horovod's done callback returns,
                # which can be after the result reached this thread: let it land in the profile.
                time.sleep(0.5)
                tf.profiler.experimental.stop()
                intervals = trace_intervals(logdir, LAYER)
            (Path(args.out) / f"{variant}.json").write_text(json.dumps(intervals, indent=1))
        dist.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
