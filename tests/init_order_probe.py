"""Runs a benchmark's train.py (`common.run.trainer.main`) with a probe of its initialization order.

  horovodrun -np 4 python tests/init_order_probe.py [--op-first R] BENCH [train.py arguments ...]

The probe wraps common.runtime.configure, which the launcher must call before any TensorFlow
op, and prints on every rank whether TensorFlow's thread pools could still be set there:

  init-order probe: rank R device cpu thread pools set|refused

TensorFlow refuses to resize them once its first op has run (the op made its context), so
"refused" means an op ran before the runtime was configured: on a GPU that op would also have
initialized every visible GPU before the device was pinned. `set_visible_devices` itself is no
probe here: with an unchanged device list it does not raise on a CPU-only host.

--op-first R (a rank, or "all") makes that rank run an op before train.py's main: the negative
control, whose probe must say "refused".
"""

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

from common import benchmarks, runtime  # noqa: E402
from common.run.trainer import main  # noqa: E402

_configure = runtime.configure


def _probed_configure(runtime_config, dist):
    configured = _configure(runtime_config, dist)
    pools = "refused" if "TensorFlow was running before" in configured["threads_note"] else "set"
    print(
        f"init-order probe: rank {dist.rank} device {dist.device} thread pools {pools}", flush=True
    )
    return configured


def _rank() -> str:
    for key in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if key in os.environ:
            return os.environ[key]
    return "0"


if __name__ == "__main__":
    op_first = None
    if sys.argv[1] == "--op-first":
        op_first = sys.argv[2]
        del sys.argv[1:3]
    bench, argv = sys.argv[1], sys.argv[2:]
    if op_first in ("all", _rank()):
        import tensorflow as tf

        float(tf.constant(1.0) + 1.0)  # an op before main: TensorFlow's context exists from here on
    runtime.configure = (
        _probed_configure  # launch calls it through the module (runtime_lib.configure)
    )
    sys.argv = [str(REPO / bench / "train.py"), *argv]
    sys.exit(main(benchmarks.task_class(bench), argv))
