"""DeepCAM throughput: training samples/s at full size (fp32 and --amp) and HDF5 reader samples/s.

  python bench/deepcam_throughput.py                   # 768x1152x16, the reference model, batch 1
  python bench/deepcam_throughput.py --height 128 --width 192 --config deepcam/configs/deepcam_synthetic_cpu.yaml

Writes synthetic full-size sample files in the public layout (once, into --data-dir), then
  - reader: the training input pipeline (h5py in tf.data, --readers files in
    flight, normalization), no model, no cache;
  - training: the trainer's compiled step (LAMB, weighted loss) on one batch held
    in memory, so the figure is compute only; warm-up steps are not timed.
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
    p.add_argument("--config", default="deepcam/configs/deepcam_closed_gbs1024.yaml")
    p.add_argument("--height", type=int, default=768)
    p.add_argument("--width", type=int, default=1152)
    p.add_argument("--data-dir", default="data/bench_deepcam")
    p.add_argument("--n-samples", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--readers", type=int, default=4)
    p.add_argument("--warmup-steps", type=int, default=2)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--modes", default="fp32,amp", help="comma-separated: fp32, amp (what --amp picks here), bf16 (forced)")
    args = p.parse_args(argv)

    import tensorflow as tf

    from bench.timing import print_table, training_rates
    from common import runtime
    from common.config import load_config
    from common.distribution import Distribution
    from common.profiling import pipeline_samples_per_s
    from deepcam import data, synthetic
    from deepcam.task import TASK

    data_dir = Path(args.data_dir) / f"{args.height}x{args.width}"
    synthetic.generate(data_dir, args.height, args.width, args.n_samples, 0, seed=0)
    files = sorted(str(f) for f in (data_dir / "train").glob("*.h5"))
    dist = Distribution()
    size = {"data.data_dir": str(data_dir), "data.height": args.height, "data.width": args.width,
            "data.local_batch_size": args.batch_size}
    base = load_config(TASK.config_class, args.config, size)
    device = runtime.configure(base.runtime, dist)["device"]
    results = []

    ds = data.make_dataset(files, data_dir=data_dir, channels=base.data.channels, height=args.height,
                           width=args.width, batch_size=args.batch_size, training=True, seed=0,
                           readers=args.readers)
    it = iter(ds)
    rate = pipeline_samples_per_s(it, args.batch_size, max(1, (2 * args.n_samples) // args.batch_size))
    mb = os.path.getsize(files[0]) / 1e6
    print(f"[bench] reader ({args.readers} files in flight): {rate:.2f} samples/s, {rate * mb:.0f} MB/s", flush=True)
    results.append((f"HDF5 reader, {args.readers} readers, {mb:.1f} MB/sample", "-", rate))

    results += training_rates(TASK, args.config, size, dist, device, next(it), args.batch_size,
                              args.modes.split(","), args.warmup_steps, args.steps,
                              label=f"{args.height}x{args.width}")

    print_table(f"DeepCAM throughput on {os.cpu_count()} CPU core(s), sample {args.height}x{args.width}x"
                f"{len(base.data.channels)}, device {device}, TensorFlow {tf.__version__}", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
