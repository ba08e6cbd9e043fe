"""DeepCAM throughput: train.py's benchmark mode at full size, training and HDF5 reader samples/s per precision mode.

  python bench/deepcam_throughput.py                   # 768x1152x16, the reference model, batch 1, fp32 and --amp
  python bench/deepcam_throughput.py --height 128 --width 192 --config deepcam/configs/deepcam_synthetic_cpu.yaml
  python bench/deepcam_throughput.py --np 2 --modes fp32,amp,bf16   # 2 ranks under horovodrun, bf16 forced too

Writes synthetic sample files in the public layout (once, into --data-dir), then runs
`deepcam/train.py CONFIG --benchmark STEPS` once per mode (the real trainer: staging,
input pipeline, Horovod) and reads the figures from its summary.json:
  - reader alone: the training input pipeline (h5py in tf.data, --readers files
    in flight, normalization; the config's cache setting) drawn without a model,
    per rank, also in MB/s of sample files;
  - training: --steps steps of the training loop (LAMB, weighted loss) after
    --warmup-steps untimed ones, so the figure includes the reader feeding each
    step and, with --np above 1, the allreduce of the gradients; per rank and in total.
Prints train.py's output, then a table naming the CPU.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import precision_modes  # noqa: E402


def main(argv=None) -> int:
    p = precision_modes.parser(
        __doc__,
        config="deepcam/configs/deepcam_closed_gbs1024.yaml",
        data_dir="data/bench_deepcam",
        n_samples=16,
        batch_size=1,
        warmup_steps=2,
        steps=4,
    )
    p.add_argument("--height", type=int, default=768)
    p.add_argument("--width", type=int, default=1152)
    p.add_argument("--readers", type=int, default=4, help="files in flight per rank (data.readers)")
    args = p.parse_args(argv)
    modes = precision_modes.parse_modes(p, args.modes)
    n_train = precision_modes.whole_batches(args.n_samples, args)
    # Every rank takes part in the (unread) validation set, so it lists a file at least.
    if not n_train or args.n_samples // 4 < args.np:
        precision_modes.too_few_samples(p, args)

    from deepcam import synthetic

    data_dir = Path(args.data_dir) / f"{args.height}x{args.width}"
    synthetic.generate(
        data_dir, args.height, args.width, args.n_samples, args.n_samples // 4, seed=0
    )
    overrides = {
        "data.data_dir": data_dir,
        "data.height": args.height,
        "data.width": args.width,
        "data.local_batch_size": args.batch_size,
        "data.readers": args.readers,
        "data.n_train": n_train,
        "data.n_valid": 0,
        # A closed config accepts its RCP global batch only; this one is not a result.
        "mlperf.division": "open",
    }
    overrides |= precision_modes.extra_overrides(p, args)
    runs = precision_modes.run_modes(
        "deepcam",
        args.config,
        overrides,
        modes,
        args.steps,
        args.warmup_steps,
        args.np,
        args.output_dir,
    )
    mb = os.path.getsize(next((data_dir / "train").glob("*.h5"))) / 1e6
    reader_rate = runs[0][1]["throughput"]["input_samples_per_s_per_rank"]
    print(
        f"[bench] reader alone ({args.readers} files in flight, {mb:.1f} MB/sample): {reader_rate:.2f} samples/s, "
        f"{reader_rate * mb:.0f} MB/s per rank ({modes[0]} run)"
    )
    rows = precision_modes.rows(
        runs,
        f"HDF5 reader alone, {args.readers} readers, {mb:.1f} MB/sample",
        f"training (reader{', allreduce' if args.np > 1 else ''}), batch {args.batch_size}/rank",
    )
    precision_modes.report("DeepCAM", f"{args.height}x{args.width}", args, runs, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
