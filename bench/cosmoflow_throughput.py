"""CosmoFlow throughput: training samples/s and input-pipeline samples/s, fp32 and --amp.

  python bench/cosmoflow_throughput.py                      # 128^3 x 4, the reference model
  python bench/cosmoflow_throughput.py --size 32 --config cosmoflow/configs/cosmoflow_synthetic_cpu.yaml

Writes synthetic samples in the public format (once, into --data-dir), then
  - input pipeline: reads, decompresses, parses and log-transforms batches with
    the training pipeline, no model;
  - training: the compiled train step of the trainer on batches held in memory,
    so the figure is compute only; warm-up steps are not timed.
Prints one line per measurement and a table at the end.
"""

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import common  # noqa: E402,F401  (oneDNN on before TensorFlow loads: common/cpu.py)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="cosmoflow/configs/cosmoflow_closed_gbs512.yaml")
    p.add_argument("--size", type=int, default=128, help="sample edge (must suit the config's model)")
    p.add_argument("--data-dir", default="data/bench_cosmoflow")
    p.add_argument("--n-samples", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--modes", default="fp32,amp", help="comma-separated: fp32, amp (what --amp picks here), bf16 (forced)")
    args = p.parse_args(argv)

    import tensorflow as tf

    from bench.timing import print_table, training_rates
    from common import runtime
    from common.config import load_config
    from common.distribution import Distribution
    from common.profiling import pipeline_samples_per_s
    from cosmoflow import data, synthetic
    from cosmoflow.task import TASK

    data_dir = Path(args.data_dir) / f"size{args.size}"
    synthetic.generate(data_dir, args.size, args.n_samples, 0, seed=0)
    files = sorted(str(f) for f in (data_dir / "train").glob("*.tfrecord"))
    shape = (args.size,) * 3 + (4,)
    dist = Distribution()
    base = load_config(TASK.config_class, args.config, {"data.data_dir": str(data_dir)})
    device = runtime.configure(base.runtime, dist)["device"]
    results = []

    # Input pipeline alone (no cache: every sample is read, inflated and parsed).
    ds = data.make_dataset(files, shape, args.batch_size, "GZIP", training=True, seed=0)
    it = iter(ds)
    rate = pipeline_samples_per_s(it, args.batch_size, max(1, (2 * args.n_samples) // args.batch_size))
    print(f"[bench] input pipeline {shape}: {rate:.1f} samples/s", flush=True)
    results.append(("input pipeline (gzip TFRecord -> log1p batches)", "-", rate))

    overrides = {"data.data_dir": str(data_dir), "data.sample_shape": ",".join(map(str, shape)),
                 "data.batch_size": args.batch_size}
    results += training_rates(TASK, args.config, overrides, dist, device, next(it), args.batch_size,
                              args.modes.split(","), args.warmup_steps, args.steps, label=str(shape))

    print_table(f"CosmoFlow throughput on {os.cpu_count()} CPU core(s), sample {shape}, "
                f"TensorFlow {tf.__version__}", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
