"""Input pipelines alone, at full sample size: samples/s per rank and per CPU core, before and after staging.

  python bench/input_pipeline.py                          # both benchmarks, every variant
  python bench/input_pipeline.py --benchmark cosmoflow --n-samples 32 --json out.json

A GPU node feeds each of its devices from its CPU cores: an H100 consumes ~206
CosmoFlow or ~82 DeepCAM samples/s (published v3.0 logs), so 4 devices need
~820 or ~330 samples/s from the node. The figure to read is samples/s per core:
multiply it by the cores a node gives each device.

Each variant is the pipeline a training run builds (the benchmark's make_dataset,
training order, cache off so that every sample is read again), drawn without a
model, on files in the page cache (one untimed pass first), the median of --repeats timings.
The consumer takes each batch and drops it, as a train step would after using it
(x.numpy() would copy it into fresh memory: a cost of the bench, not of the pipeline):
  CosmoFlow  gzip TFRecords read in place, float32 log1p per sample in tf.data (the
             pipeline before int16 input: what the figures were measured against);
             gzip in place, int16 out (the transform runs in the compiled step);
             staged (staging.convert: GZIP inflated), int16 out: the default when staging.
  DeepCAM    HDF5 through h5py (tf.numpy_function: the readers take turns on the GIL),
             a sample at a time, normalized in numpy there (the reader before staging.convert);
             staged raw layout, read_file + decode_raw a sample at a time, then batched
             (the staged reader before batch buffers);
             HDF5, each file read into its place in a reused batch buffer: unstaged runs now;
             staged raw layout, readinto a reused batch buffer: staged runs now.
Staging runs once per variant before the clock (its own figure is bench/staging_throughput.py).

Last, per benchmark, the train step's check for NaN and Inf (common.run.steps.all_finite) alone,
on one preprocessed batch in memory (float32, the model's input shape), timed as the step
runs it: it lives in the compiled step, not in the pipeline, so the readers' rows do not
include it; the printout says what it would cost beside the readers, as a share of each
current reader's time per sample.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import cpu  # noqa: E402  (sets the oneDNN default before TensorFlow is imported)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from common import benchmarks  # noqa: E402
from common.inputs import epochs
from common.inputs.staging import stage_files  # noqa: E402
from common.inputs.staging_layouts import GUNZIP  # noqa: E402


def samples_per_s(ds, batch_size: int, n_batches: int, repeats: int, warmup_batches: int = 2) -> float:
    """The median over `repeats` timings of n_batches batches (this VM's figures vary run to run)."""
    it = iter(ds)
    for _ in range(warmup_batches):
        next(it)
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(n_batches):
            next(it)
        rates.append(n_batches * batch_size / (time.perf_counter() - start))
    return statistics.median(rates)


def warm_page_cache(files) -> None:
    for f in files:
        with open(f, "rb") as fh:
            while fh.read(16 << 20):
                pass


def cosmoflow_variants(args, stage_root: Path) -> list[dict]:
    from cosmoflow import data, synthetic

    size, n = args.cosmoflow_size, args.n_samples
    data_dir = Path(args.data_dir) / f"cosmoflow{size}"
    synthetic.generate(data_dir, size, n, 4, seed=0)
    files = sorted(str(p) for p in (data_dir / "train").iterdir())[:n]
    shape = (size, size, size, 4)
    staged, _ = stage_files(files, stage_root / "cosmoflow", GUNZIP)
    batch = args.cosmoflow_batch
    n_batches = max(1, args.passes * n // batch)

    def pipeline(paths, compression, float_in_pipeline):
        if not float_in_pipeline:
            return data.make_dataset(paths, shape, batch, compression, training=True, seed=0,
                                     parallelism=args.readers)

        # The former pipeline: the same reader, then cast + log1p per sample inside tf.data.
        def read(ds):
            ds = ds.interleave(lambda f: tf.data.TFRecordDataset(f, compression_type=compression),
                               cycle_length=args.readers, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
            return ds.map(lambda s: data.parse_example(s, shape), num_parallel_calls=tf.data.AUTOTUNE)
        return epochs.training_dataset(paths, read, batch_size=batch, n_batches=len(paths) // batch, seed=0,
                                       transform=lambda x, y: (data.log_transform(x), y),
                                       deterministic=False).prefetch(4)

    mb = os.path.getsize(files[0]) / 1e6
    mb_staged = os.path.getsize(staged[0]) / 1e6
    variants = [("gzip in place, float32 log1p in tf.data (before)", files, "GZIP", True, mb),
                ("gzip in place, int16 out", files, "GZIP", False, mb),
                ("staged, inflated (staging.convert), int16 out", staged, "", False, mb_staged)]
    out = []
    for label, paths, compression, float_in_pipeline, file_mb in variants:
        warm_page_cache(paths)
        rate = samples_per_s(pipeline(paths, compression, float_in_pipeline), batch, n_batches, args.repeats)
        out.append(row("cosmoflow", label, rate, file_mb, f"{size}^3x4, batch {batch}"))
    out.append(finite_check_row("cosmoflow", shape, (4,), batch, args.repeats, f"{size}^3x4, batch {batch}"))
    return out


def deepcam_variants(args, stage_root: Path) -> list[dict]:
    from deepcam import data, synthetic
    from deepcam.config import N_CHANNELS

    h, w, n = args.deepcam_height, args.deepcam_width, args.n_samples
    data_dir = Path(args.data_dir) / f"deepcam{h}x{w}"
    synthetic.generate(data_dir, h, w, n, 4, seed=0)
    files = sorted(str(p) for p in (data_dir / "train").glob("*.h5"))[:n]
    channels = tuple(range(N_CHANNELS))
    staged, _ = stage_files(files, stage_root / "deepcam", data.raw_layout(channels, h, w))
    batch = args.deepcam_batch
    n_batches = max(1, args.passes * n // batch)
    out = []
    for label, paths, former in (("HDF5 through h5py, normalized in numpy (before)", files, former_hdf5_pipeline),
                                 ("staged raw, read_file + decode_raw, then batched (before)", staged,
                                  former_raw_pipeline),
                                 ("HDF5, read into reused batch buffers (unstaged runs)", files, None),
                                 ("staged raw (staging.convert), readinto reused batch buffers", staged, None)):
        warm_page_cache(paths)
        if former:
            ds = former(paths, data, data_dir, channels, h, w, batch, args.readers)
        else:
            ds = data.make_dataset(paths, channels=channels, height=h, width=w, batch_size=batch,
                                   training=True, seed=0, readers=args.readers)
        rate = samples_per_s(ds, batch, n_batches, args.repeats)
        out.append(row("deepcam", label, rate, os.path.getsize(paths[0]) / 1e6, f"{h}x{w}x16, batch {batch}"))
    out.append(finite_check_row("deepcam", (h, w, len(channels)), (h, w), batch, args.repeats,
                                f"{h}x{w}x16, batch {batch}"))
    return out


CHECK_VARIANT = "the train step's NaN/Inf check alone (preprocessed batch in memory)"


def finite_check_row(benchmark, x_shape, y_shape, batch, repeats, sample, n_batches: int = 10) -> dict:
    """samples/s of common.run.steps.all_finite, compiled, on one float32 batch (x, y) of these shapes."""
    from common.run.steps import all_finite
    x, y = tf.random.uniform((batch, *x_shape)), tf.zeros((batch, *y_shape))
    check = tf.function(lambda x, y: all_finite([x, y]))
    check(x, y).numpy()
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(n_batches):
            check(x, y).numpy()   # reading the flag waits for the check, as the trainer's agreement does
        rates.append(n_batches * batch / (time.perf_counter() - start))
    return row(benchmark, CHECK_VARIANT, statistics.median(rates), 4 * int(np.prod(x_shape)) / 1e6, sample)


def former_hdf5_pipeline(paths, data, data_dir, channels, h, w, batch, readers):
    """The reader before staging.convert: h5py in tf.numpy_function, normalized there in numpy."""
    shift, scale = data.load_normalization(data_dir, channels)

    def load(path):
        x, y = tf.numpy_function(lambda p: data.read_sample(p.decode(), channels, shift, scale, h, w), [path],
                                 (tf.float32, tf.int32), stateful=False)
        return tf.ensure_shape(x, (h, w, len(channels))), tf.ensure_shape(y, (h, w))

    return per_sample_pipeline(paths, load, batch, readers)


def former_raw_pipeline(paths, data, data_dir, channels, h, w, batch, readers):
    """The staged reader before batch buffers: TensorFlow's own ops a sample at a time, then tf.data's batch."""
    data_bytes = h * w * len(channels) * 4

    def load(path):
        content = tf.io.read_file(path)
        x = tf.reshape(tf.io.decode_raw(content, tf.float32, fixed_length=data_bytes), (h, w, len(channels)))
        y = tf.io.decode_raw(tf.strings.substr(content, data_bytes, h * w), tf.uint8)
        return x, tf.reshape(y, (h, w))

    return per_sample_pipeline(paths, load, batch, readers)


def per_sample_pipeline(paths, load, batch, readers):
    """The former DeepCAM pipelines' shape: `load` a sample at a time, `readers` in flight, then tf.data's batch."""
    return epochs.training_dataset(paths, lambda ds: ds.map(load, num_parallel_calls=readers), batch_size=batch,
                                   n_batches=len(paths) // batch, seed=0, deterministic=False).prefetch(2)


def row(benchmark, variant, rate, file_mb, sample) -> dict:
    return {"benchmark": benchmark, "variant": variant, "sample": sample, "samples_per_s": rate,
            "samples_per_s_per_core": rate / cpu.cores(), "mb_per_file": file_mb, "mb_per_s": rate * file_mb}


def print_rows(rows) -> None:
    print(f"\n{'benchmark':10s} {'variant':62s} {'sample':22s} {'samples/s':>10s} {'per core':>9s} {'MB/s':>8s}")
    for r in rows:
        print(f"{r['benchmark']:10s} {r['variant']:62s} {r['sample']:22s} {r['samples_per_s']:10.1f} "
              f"{r['samples_per_s_per_core']:9.1f} {r['mb_per_s']:8.0f}")
    by = {}
    for r in rows:
        by.setdefault(r["benchmark"], []).append(r)
    for name, rs in by.items():
        readers = [r for r in rs if r["variant"] != CHECK_VARIANT]
        print(f"{name}: last variant / first = {readers[-1]['samples_per_s'] / readers[0]['samples_per_s']:.2f}x")
        for check in (r for r in rs if r["variant"] == CHECK_VARIANT):
            for reader in readers[-2:]:   # the current unstaged and staged readers
                print(f"{name}: the NaN/Inf check takes {reader['samples_per_s'] / check['samples_per_s']:.1%} of "
                      f"the time per sample of '{reader['variant']}' (were it run beside it on these cores)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--benchmark", choices=(*benchmarks.names_with("input_bench"), "all"), default="all")
    p.add_argument("--data-dir", default="data/bench_input")
    p.add_argument("--n-samples", type=int, default=32, help="training files written and read per pass")
    p.add_argument("--passes", type=int, default=2, help="passes over the files per timing")
    p.add_argument("--repeats", type=int, default=3, help="timings per variant; the median is reported")
    p.add_argument("--readers", type=int, default=4, help="files in flight (data.read_parallelism / data.readers)")
    p.add_argument("--cosmoflow-size", type=int, default=128)
    p.add_argument("--cosmoflow-batch", type=int, default=4)
    p.add_argument("--deepcam-height", type=int, default=768)
    p.add_argument("--deepcam-width", type=int, default=1152)
    p.add_argument("--deepcam-batch", type=int, default=2)
    p.add_argument("--json", help="also write the rows and the machine here")
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_input.") as stage_root:
        for name in benchmarks.names_with("input_bench"):
            if args.benchmark in (name, "all"):
                rows += benchmarks.load(benchmarks.get(name).input_bench)(args, Path(stage_root))
    facts = cpu.describe()
    print(f"\nInput pipelines alone, {cpu.cores()} core(s): CPU {facts['cpu']} ({facts['isa']}), "
          f"TensorFlow {tf.__version__}, files in page cache, cache off")
    print_rows(rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": facts | {"cores": cpu.cores()}, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
