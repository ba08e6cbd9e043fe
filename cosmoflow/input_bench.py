"""CosmoFlow's input pipelines alone, for bench/input_pipeline.py (the table's `input_bench`) and
offline/measure_model_costs.py (`one_core_reader`).

  python bench/input_pipeline.py --benchmark cosmoflow --cosmoflow-size 128 --cosmoflow-batch 4

Variants, at the size and batch of `Options` (bench/input_pipeline.py's --cosmoflow-<field> flags):
gzip TFRecords read in place, float32 log1p per sample in tf.data (the pipeline before int16
input: what the figures were measured against); gzip in place, int16 out (the transform runs in
the compiled step); staged (staging.convert: GZIP inflated), int16 out: the default when staging.
"""

import dataclasses
import os
from pathlib import Path

from common.inputs import bench_timing
from common.inputs.bench_timing import Row, Run


@dataclasses.dataclass(frozen=True)
class Options:
    """This benchmark's own flags of bench/input_pipeline.py (--cosmoflow-size, --cosmoflow-batch)."""

    size: int = dataclasses.field(
        default=128, metadata={"help": "sample edge (size^3 x 4 volumes)"}
    )
    batch: int = dataclasses.field(default=4, metadata={"help": "batch of every variant"})


def variants(run: Run, options: Options) -> list[Row]:
    """The figures of every variant, then of the train step's NaN/Inf check on one batch."""
    import tensorflow as tf

    from common.inputs import pipeline
    from common.inputs.staging import stage_files
    from common.inputs.staging_layouts import GUNZIP
    from cosmoflow import data, synthetic

    size, n, batch = options.size, run.n_samples, options.batch
    data_dir = Path(run.data_dir) / f"cosmoflow{size}"
    synthetic.generate(data_dir, size, n, 4, seed=0)
    files = sorted(str(p) for p in (data_dir / "train").iterdir())[:n]
    shape = (size, size, size, 4)
    staged, _ = stage_files(files, run.stage_root / "cosmoflow", GUNZIP)
    sample = f"{size}^3x4, batch {batch}"

    def make_pipeline(paths, compression, float_in_pipeline):
        if not float_in_pipeline:
            return data.make_dataset(
                paths, shape, batch, compression, training=True, seed=0, parallelism=run.readers
            )

        # The former pipeline: the same reader, then cast + log1p per sample inside tf.data.
        def read(ds):
            ds = ds.interleave(
                lambda f: tf.data.TFRecordDataset(f, compression_type=compression),
                cycle_length=run.readers,
                num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=False,
            )
            return ds.map(
                lambda s: data.parse_example(s, shape), num_parallel_calls=tf.data.AUTOTUNE
            )

        return pipeline.training_dataset(
            paths,
            read,
            batch_size=batch,
            n_batches=len(paths) // batch,
            seed=0,
            transform=lambda x, y: (data.log_transform(x), y),
            deterministic=False,
        ).prefetch(4)

    mb = os.path.getsize(files[0]) / 1e6
    mb_staged = os.path.getsize(staged[0]) / 1e6
    out = []
    for label, paths, compression, float_in_pipeline, file_mb in (
        ("gzip in place, float32 log1p in tf.data (before)", files, "GZIP", True, mb),
        ("gzip in place, int16 out", files, "GZIP", False, mb),
        ("staged, inflated (staging.convert), int16 out", staged, "", False, mb_staged),
    ):
        bench_timing.warm_page_cache(paths)
        rates = bench_timing.timings(
            make_pipeline(paths, compression, float_in_pipeline),
            batch,
            run.n_batches(batch),
            run.repeats,
        )
        out.append(Row.of(label, sample, rates, file_mb))
    out.append(bench_timing.finite_check_row(shape, (4,), batch, run.repeats, sample))
    return out


def one_core_reader(cfg, workdir: Path, n: int):
    """CosmoFlow's reader, batch 1, one reader, on n synthetic gzip TFRecords of the config's size."""
    from cosmoflow import data, synthetic

    synthetic.generate(
        workdir, cfg.data.sample_shape[0], n, 1, workers=1, progress=lambda line: None
    )
    files = sorted(str(p) for p in (workdir / "train").glob("*.tfrecord"))
    return data.make_dataset(
        files,
        cfg.data.sample_shape,
        1,
        compression="GZIP",
        training=False,
        parallelism=1,
        prefetch=1,
    )
