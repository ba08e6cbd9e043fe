"""CosmoFlow throughput: train.py's benchmark mode, training and input-pipeline samples/s per precision mode.

  python bench/cosmoflow_throughput.py                      # 128^3 x 4, the reference model, fp32 and --amp
  python bench/cosmoflow_throughput.py --size 32 --config cosmoflow/configs/cosmoflow_synthetic_cpu.yaml
  python bench/cosmoflow_throughput.py --np 2 --modes fp32,amp,bf16   # 2 ranks under horovodrun, bf16 forced too

Writes synthetic samples in the public format (once, into --data-dir), then runs
`cosmoflow/train.py CONFIG --benchmark STEPS` once per mode (the real trainer: staging,
input pipeline, Horovod) and reads the figures from its summary.json:
  - input pipeline alone: the training pipeline (read, inflate, parse, int16
    batch; the config's cache setting) drawn without a model, per rank;
  - training: --steps steps of the training loop after --warmup-steps untimed ones,
    so the figure includes the input pipeline feeding each step and, with --np
    above 1, the allreduce of the gradients; per rank and in total.
Prints train.py's output, then a table naming the CPU.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import precision_modes  # noqa: E402


def main(argv=None) -> int:
    p = precision_modes.parser(
        __doc__,
        config="cosmoflow/configs/cosmoflow_closed_gbs512.yaml",
        data_dir="data/bench_cosmoflow",
        n_samples=32,
        batch_size=4,
        warmup_steps=3,
        steps=8,
    )
    p.add_argument(
        "--size", type=int, default=128, help="sample edge (must suit the config's model)"
    )
    args = p.parse_args(argv)
    modes = precision_modes.parse_modes(p, args.modes)
    n_valid_files = args.n_samples // 4
    n_train = precision_modes.whole_batches(args.n_samples, args)
    n_valid = precision_modes.whole_batches(
        n_valid_files, args
    )  # the trainer lists them: whole steps too
    if not n_valid:
        precision_modes.too_few_samples(p, args)

    from cosmoflow import synthetic

    data_dir = Path(args.data_dir) / f"size{args.size}"
    synthetic.generate(data_dir, args.size, args.n_samples, n_valid_files, seed=0)
    shape = (args.size,) * 3 + (4,)
    overrides = {
        "data.data_dir": data_dir,
        "data.sample_shape": ",".join(map(str, shape)),
        "data.batch_size": args.batch_size,
        "data.n_train": n_train,
        "data.n_valid": n_valid,
        # A closed config accepts its RCP global batch only; this one is not a result.
        "mlperf.division": "open",
    }
    overrides |= precision_modes.extra_overrides(p, args)
    runs = precision_modes.run_modes(
        "cosmoflow",
        args.config,
        overrides,
        modes,
        args.steps,
        args.warmup_steps,
        args.np,
        args.output_dir,
    )
    rows = precision_modes.rows(
        runs,
        "input pipeline alone (TFRecord -> int16 batches)",
        f"training (input pipeline{', allreduce' if args.np > 1 else ''}), "
        f"batch {args.batch_size}/rank",
    )
    precision_modes.report("CosmoFlow", str(shape), args, runs, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
