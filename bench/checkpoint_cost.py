"""Checkpoint cost: what common.checkpoints.Checkpointer's save costs training, at closed-division model size.

  python bench/checkpoint_cost.py                                  # 5 saves of each model, temporary dir
  python bench/checkpoint_cost.py --saves 3 --dir /scratch/ckpt --cosmoflow-step-s 0.9 --deepcam-step-s 2.1 \
      --json runs/bench/checkpoint_cost.json

A save blocks the training step while the variables (model, optimizer slots,
step count) are copied to host memory; a background thread then writes, fsyncs
and publishes the folder (TensorFlow's async checkpointing). What a save costs
the steps must stay under 10% of the checkpoint interval, so this measures, for
each benchmark's model and optimizer built as training builds them (closed configs):
  - seconds of Checkpointer.prepare(), which the trainer calls at init: the
    host copies and the trace of TensorFlow's copy function, which the 1st and
    2nd save would otherwise pay mid-run;
  - blocked seconds of save(): the 1st, the 2nd and the median of the others
    (the steady cost of every later save);
  - the step after a save: on CPU the "copy" shares the variables' buffers, so
    the first update after a save pays for new ones (copy-on-write); measured as
    an update of every variable right after a save minus one right before it
    (1st save apart: its new buffers are fresh pages; then the median);
  - complete-write seconds (save() to published folder, fsync included), median,
    and the write rate in GB/s of the folder's bytes;
  - the smallest train.checkpoint_steps keeping (steady blocked + after-save)
    seconds under 10% of the interval, given the step time (--cosmoflow-step-s,
    --deepcam-step-s); without one the rule is printed in seconds of training.
Only rank 0's part is measured: mid-epoch checkpoints also hold each rank's npz.
"""

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import common  # noqa: E402,F401  (oneDNN on before TensorFlow loads: common/cpu.py)
from common import benchmarks  # noqa: E402

# Those whose table entry names a full-size config to build the model and optimizer from.
MEASURABLE = benchmarks.names_with("full_model_config")


def build(name: str, config_path: str, device: str):
    """(model, optimizer, precision) as common.run.trainer builds them, without data or Horovod."""
    import tf_keras

    from common import runtime
    from common.config import load_model_config
    from common.parallel.distribution import RankGroup

    task_class = benchmarks.task_class(name)
    task = task_class(load_model_config(task_class.config_class, config_path))
    cfg = task.cfg
    precision, _ = runtime.choose_precision(cfg.runtime, device)
    tf_keras.backend.experimental.enable_tf_random_generator()  # as common.runtime.configure
    with runtime.dtype_policy(precision):
        model = task.build_model(RankGroup(1, None))
    batch = (
        cfg.train.global_batch_size
    )  # steps per epoch: DeepCAM's n_train 0 (all files) is unused
    optimizer, _ = task.build_optimizer(batch, max(1, cfg.data.n_train // batch))
    optimizer = runtime.wrap_optimizer(optimizer, precision)
    optimizer.build(model.trainable_variables)
    return model, optimizer, precision


def measure(name: str, config_path: str, device: str, saves: int, folder: Path, step_s) -> dict:
    import numpy as np
    import tensorflow as tf
    import tf_keras

    from common.checkpoints import Checkpointer, random_generators

    model, optimizer, precision = build(name, config_path, device)
    params = int(sum(np.prod(v.shape) for v in model.trainable_variables))
    variables = model.variables + optimizer.variables

    @tf.function
    def touch(zero):  # an in-place update of every checkpointed variable, as a training step does
        for v in variables:  # zero is an argument: Grappler would drop the add of a constant 0
            v.assign_add(tf.cast(zero, v.dtype) * v)

    def timed_touch() -> float:
        start = time.perf_counter()
        touch(tf.constant(0.0))
        float(tf.reduce_sum(variables[0]))  # waits for it
        return time.perf_counter() - start

    timed_touch()  # traced here, not in the figures
    ckpt = Checkpointer(folder, model, optimizer, keep=2, generators=random_generators(model))
    start = time.perf_counter()
    ckpt.prepare()  # as the trainer does at init, outside the timed run
    prepare_s = time.perf_counter() - start
    print(f"[bench] {name} prepare (at init): {prepare_s:.3f} s", flush=True)
    blocked, after, written = [], [], []
    for i in range(saves):
        before = timed_touch()
        blocked.append(
            ckpt.save((i + 1) * 100, {"epoch": 0, "steps_in_epoch": (i + 1) * 100, "ranks": 1})
        )
        ckpt.wait()
        after.append(timed_touch() - before)
        last = ckpt.last_save
        written.append(last["seconds"])
        print(
            f"[bench] {name} save {i + 1}/{saves}: blocked {blocked[-1]:.3f} s, next update +{after[-1]:.3f} s, "
            f"complete {last['seconds']:.3f} s, {last['bytes'] / 1e6:.1f} MB",
            flush=True,
        )
    row = {
        "benchmark": name,
        "config": config_path,
        "precision": precision,
        "params": params,
        "variables_in_checkpoint": len(variables),
        "bytes": ckpt.last_save["bytes"],
        "saves": saves,
        "prepare_at_init_s": prepare_s,
        "blocked_first_s": blocked[0],
        "blocked_second_s": blocked[1],
        "blocked_steady_s": statistics.median(blocked[2:]),
        "after_save_first_s": after[0],
        "after_save_s": max(0.0, statistics.median(after[1:])),
        "write_median_s": statistics.median(written),
        "blocked_s": blocked,
        "after_save_extra_s": after,
        "write_s": written,
        "step_s": step_s,
    }
    row["write_gb_per_s"] = row["bytes"] / row["write_median_s"] / 1e9
    row["cost_per_save_s"] = row["blocked_steady_s"] + row["after_save_s"]
    row["min_checkpoint_steps"] = (
        math.ceil(10 * row["cost_per_save_s"] / step_s) if step_s else None
    )
    del ckpt, model, optimizer
    tf_keras.backend.clear_session()
    return row


def print_table(title: str, rows) -> None:
    print(f"\n{title}")
    print(
        f"{'benchmark':10s} {'precision':10s} {'params':>11s} {'ckpt MB':>8s} {'blocked 1st/2nd/steady s':>25s} "
        f"{'after-save 1st/steady s':>23s} {'write s':>8s} {'GB/s':>6s}  checkpoint interval"
    )
    for r in rows:
        blocked = f"{r['blocked_first_s']:.3f} / {r['blocked_second_s']:.3f} / {r['blocked_steady_s']:.3f}"
        after = f"{r['after_save_first_s']:.3f} / {r['after_save_s']:.3f}"
        if r["min_checkpoint_steps"]:
            rule = f"train.checkpoint_steps >= {r['min_checkpoint_steps']} (step {r['step_s']:g} s)"
        else:
            rule = f"interval must be >= {10 * r['cost_per_save_s']:.2f} s of training (10 x steady cost)"
        print(
            f"{r['benchmark']:10s} {r['precision']:10s} {r['params']:11,d} {r['bytes'] / 1e6:8.1f} {blocked:>25s} "
            f"{after:>23s} {r['write_median_s']:8.3f} {r['write_gb_per_s']:6.3f}  {rule}"
        )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--saves", type=int, default=5, help="saves per benchmark (>= 3)")
    p.add_argument(
        "--dir", default=None, help="where to write the checkpoints (default: a temporary dir)"
    )
    p.add_argument(
        "--benchmarks",
        default=",".join(MEASURABLE),
        help="comma-separated, of " + ", ".join(MEASURABLE),
    )
    for name in MEASURABLE:
        p.add_argument(
            f"--{name}-step-s",
            type=float,
            default=None,
            help=f"seconds of one {name} training step",
        )
    p.add_argument("--json", default=None, help="also write the figures to this file")
    args = p.parse_args(argv)
    if args.saves < 3:
        p.error("--saves must be >= 3: the 1st and 2nd saves are one-offs")
    unknown = sorted(set(args.benchmarks.split(",")) - set(MEASURABLE))
    if unknown:
        p.error(f"--benchmarks: {', '.join(unknown)} not among {', '.join(MEASURABLE)}")

    import tensorflow as tf

    from common import cpu
    from common.errors import write_text_atomic

    machine = cpu.describe()
    device = "gpu" if tf.config.list_physical_devices("GPU") else "cpu"
    print(
        f"[bench] CPU {machine['cpu']} ({machine['isa']}, bf16 {machine['bf16']}, oneDNN {machine['onednn']}), "
        f"{os.cpu_count()} core(s), device {device}, TensorFlow {tf.__version__}",
        flush=True,
    )
    rows = []
    Path(args.dir or tempfile.gettempdir()).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(
        dir=args.dir, prefix="checkpoint_cost."
    ) as tmp:  # removed at the end
        for name in args.benchmarks.split(","):
            rows.append(
                measure(
                    name,
                    benchmarks.get(name).full_model_config,
                    device,
                    args.saves,
                    Path(tmp) / name,
                    getattr(args, f"{name}_step_s"),
                )
            )
    print_table(
        f"Checkpoint cost on {machine['cpu']}, {os.cpu_count()} core(s), device {device}, "
        f"{args.saves} saves into {args.dir or 'a temporary dir'}, TensorFlow {tf.__version__}",
        rows,
    )
    if args.json:
        machine |= {"cores": os.cpu_count(), "device": device, "dir": args.dir}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(Path(args.json), json.dumps({"machine": machine, "rows": rows}, indent=2))
        print(f"\n[bench] figures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
