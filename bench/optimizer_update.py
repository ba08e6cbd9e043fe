"""DeepCAM's optimizer update (LAMB) per training step: kernels launched and time, on this CPU as it
runs it and with XLA forced as a GPU runs it.

  python bench/optimizer_update.py        # the full model (closed config), 96x144, batch 1
  python bench/optimizer_update.py --config deepcam/configs/deepcam_synthetic_cpu.yaml \\
      --height 128 --width 192 --batch 8  # the small CPU model

Keras compiles an optimizer's update with XLA only where a GPU exists (the optimizer's
`jit_compile`); set on a CPU, the flag gives the CPU the GPU's graph, run by XLA's CPU backend.
Each mode builds DeepCAM's model and LAMB from the config and common.run.steps.TrainStep on one
process (no Horovod; the batch enters as the model's input, random), then:
  - counts the work of --updates updates (TrainStep's update after the allreduce: finiteness check,
    global-norm clip, LAMB) in a TensorFlow profiler trace: ops TensorFlow's executor ran, XLA
    executables launched, and XLA kernels those ran (the CPU runtime's thunks), per update;
  - times the update alone and the whole step (forward, backward, update): medians of --steps.
Modes: 'cpu' (jit_compile as Keras sets it here) and 'xla' (jit_compile forced). It measures the
checkout it lies in: copied into another checkout's bench/, it measures that one (a before).
Prints a line per mode, then the CPU (lscpu's model name, AVX flags) and the load average.
"""

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import common  # noqa: E402,F401  (sets TensorFlow's oneDNN switch before TensorFlow loads)
from common.cli import tool_main  # noqa: E402

MODES = ("cpu", "xla")


def _profile_counts(logdir: str, updates: int) -> dict:
    """Per update: TensorFlow ops run, XLA executables launched, XLA kernels run."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    counts = dict.fromkeys(("tf_ops", "xla_launches", "xla_kernels"), 0)
    for path in Path(logdir).rglob("*.xplane.pb"):
        space = xplane_pb2.XSpace()
        space.ParseFromString(path.read_bytes())
        for plane in space.planes:
            names, stats = plane.event_metadata, plane.stat_metadata
            for line in plane.lines:
                for event in line.events:
                    label = names[event.metadata_id].name
                    if any(stats[s.metadata_id].name == "hlo_op" for s in event.stats):
                        counts["xla_kernels"] += 1
                    elif label == "CpuExecutable::ExecuteAsyncOnStream":
                        counts["xla_launches"] += 1
                    elif ":" in label and "::" not in label and not label.startswith("end:"):
                        counts["tf_ops"] += 1  # 'scope/name:Type', as the executor traces an op
    return {k: v / updates for k, v in counts.items()}


def measure(args, mode: str) -> dict:
    import numpy as np
    import tensorflow as tf
    import tf_keras

    from common.config import load_config
    from common.run.steps import TrainStep
    from deepcam.config import DeepCAMConfig
    from deepcam.task import DeepCAMTask

    class OneProcess:
        size = 1

        @staticmethod
        def average_gradients(grads, compression="none", grouped=False):
            return grads

    tf_keras.backend.clear_session()
    overrides = {"data.data_dir": "unused", "data.height": args.height, "data.width": args.width}
    overrides |= {"data.local_batch_size": args.batch, "runtime.amp": False}
    task = DeepCAMTask(
        load_config(DeepCAMConfig, args.config, overrides | {"mlperf.division": "open"})
    )
    model = task.build_model(None)
    optimizer, _ = task.build_optimizer(1, 1)
    if mode == "xla":
        optimizer.jit_compile = True  # as Keras sets it where a GPU exists
    step = TrainStep(model, optimizer, task.build_losses(), OneProcess())
    rng = np.random.default_rng(0)
    x = tf.constant(rng.random((args.batch, args.height, args.width, 16), dtype=np.float32))
    y = tf.constant(rng.integers(0, 3, (args.batch, args.height, args.width), dtype=np.int32))
    batches = itertools.repeat((x, y))
    grads = [tf.constant(rng.normal(0, 1e-3, v.shape), v.dtype) for v in model.trainable_variables]
    update = tf.function(step._apply)

    def timed(run) -> float:
        start = time.perf_counter()
        run()
        float(tf.reduce_sum(model.trainable_variables[-1]))  # waits for the update
        return time.perf_counter() - start

    for _ in range(2):  # traces and compiles
        float(step(batches).loss)
        update(grads)
    step_s = statistics.median(timed(lambda: step(batches)) for _ in range(args.steps))
    update_s = statistics.median(timed(lambda: update(grads)) for _ in range(args.steps))
    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        for _ in range(args.updates):
            update(grads)
        float(tf.reduce_sum(model.trainable_variables[-1]))
        tf.profiler.experimental.stop()
        counts = _profile_counts(logdir, args.updates)
    sizes = [v.shape.num_elements() for v in model.trainable_variables]
    return {
        "mode": mode,
        "variables": len(sizes),
        "parameters": sum(sizes),
        **counts,
        "update_ms": round(update_s * 1e3, 1),
        "step_ms": round(step_s * 1e3, 1),
    }


def machine() -> str:
    model, flags = "unknown", set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = {flag for flag in value.split() if flag.startswith("avx")}
                break
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{model} ({os.cpu_count()} CPUs; {' '.join(sorted(flags))}); load average {load}"


@tool_main()
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(REPO / "deepcam/configs/deepcam_closed_gbs128.yaml"))
    p.add_argument("--height", type=int, default=96)
    p.add_argument("--width", type=int, default=144)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=3, help="timed steps (and updates) per mode")
    p.add_argument("--updates", type=int, default=2, help="profiled updates per mode")
    p.add_argument("--modes", default=",".join(MODES), help=f"some of {', '.join(MODES)}")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    modes = args.modes.split(",")
    if not set(modes) <= set(MODES):
        p.error(f"--modes {args.modes}: choose from {', '.join(MODES)}")
    for mode in modes:
        row = measure(args, mode)
        print(json.dumps(row) if args.json else " ".join(f"{k}={v}" for k, v in row.items()))
    print(f"[bench] {REPO}: {machine()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
