"""DeepCAM's input pipelines alone, for bench/input_pipeline.py (the table's `input_bench`) and
offline/measure_model_costs.py (`one_core_reader`).

  python bench/input_pipeline.py --benchmark deepcam --deepcam-height 768 --deepcam-width 1152

Variants, at the size and batch of `Options` (bench/input_pipeline.py's --deepcam-<field> flags):
HDF5 through h5py (tf.numpy_function: the readers take turns on h5py's lock), a sample at a time,
normalized in numpy there (the reader before staging.convert); staged raw layout, read_file +
decode_raw a sample at a time, then batched (the staged reader before batch buffers); HDF5 read
by h5py (read_direct) into its place in a reused batch buffer, the readers taking turns on h5py's
lock (the unstaged reader before contiguous datasets were read past h5py), followed by the HDF5
files read alone by 1 and 2 threads, h5py's read_direct and readinto past h5py (what the pipeline
rows differ by); HDF5, each file's contiguous datasets read with readinto (neither h5py's lock nor
the GIL held) into a reused batch buffer: unstaged runs now; staged raw layout, readinto a reused
batch buffer: staged runs now.
"""

import dataclasses
import os
from pathlib import Path

from common.inputs import bench_timing
from common.inputs.bench_timing import Row, Run


@dataclasses.dataclass(frozen=True)
class Options:
    """This benchmark's own flags of bench/input_pipeline.py (--deepcam-height, -width, -batch)."""

    height: int = dataclasses.field(default=768, metadata={"help": "sample height"})
    width: int = dataclasses.field(default=1152, metadata={"help": "sample width"})
    batch: int = dataclasses.field(default=2, metadata={"help": "batch of every variant"})


def variants(run: Run, options: Options) -> list[Row]:
    """The figures of every variant, then of the train step's NaN/Inf check on one batch."""
    from common.inputs.staging import stage_files
    from deepcam import data, sample_files, synthetic
    from deepcam.config import N_CHANNELS

    h, w, n, batch = options.height, options.width, run.n_samples, options.batch
    data_dir = Path(run.data_dir) / f"deepcam{h}x{w}"
    synthetic.generate(data_dir, h, w, n, 4, seed=0)
    files = sorted(str(p) for p in (data_dir / "train").glob("*.h5"))[:n]
    channels = tuple(range(N_CHANNELS))
    staged, _ = stage_files(
        files, run.stage_root / "deepcam", sample_files.raw_layout(channels, h, w)
    )
    sample = f"{h}x{w}x16, batch {batch}"
    out = []
    for label, paths, former in (
        ("HDF5 through h5py, normalized in numpy (before)", files, former_hdf5_pipeline),
        ("staged raw, read_file + decode_raw, then batched (before)", staged, former_raw_pipeline),
        (
            "HDF5, h5py read_direct into reused batch buffers (before)",
            files,
            former_hdf5_buffers_pipeline,
        ),
        ("HDF5, readinto past h5py into reused batch buffers (unstaged runs)", files, None),
        ("staged raw (staging.convert), readinto reused batch buffers", staged, None),
    ):
        bench_timing.warm_page_cache(paths)
        if former:
            ds = former(paths, data, data_dir, channels, h, w, batch, run.readers)
        else:
            ds = data.make_dataset(
                paths,
                channels=channels,
                height=h,
                width=w,
                batch_size=batch,
                training=True,
                seed=0,
                readers=run.readers,
            )
        rates = bench_timing.timings(ds, batch, run.n_batches(batch), run.repeats)
        out.append(Row.of(label, sample, rates, os.path.getsize(paths[0]) / 1e6))
        if former is former_hdf5_buffers_pipeline:  # why the next row differs: the readers alone
            out += reader_thread_rows(files, data, channels, h, w, run.repeats)
    out.append(
        bench_timing.finite_check_row((h, w, len(channels)), (h, w), batch, run.repeats, sample)
    )
    return out


def reader_thread_rows(files, data, channels, h, w, repeats) -> list[Row]:
    """HDF5 files read by 1 and by 2 Python threads at once, each into its own buffer, no tf.data: h5py's
    read_direct, then read_fields_into (readinto past h5py). h5py serializes its calls behind one lock,
    so a second h5py reader waits for the first; readinto holds neither that lock nor the GIL."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    from deepcam.data import aligned_empty

    buffers = [
        (aligned_empty((h, w, len(channels)), np.float32), aligned_empty((h, w), np.uint8))
        for _ in range(2)
    ]
    readers = (
        ("h5py read_direct", lambda path, x, y: h5py_read_into(path, data, x, y)),
        (
            "readinto past h5py",
            lambda path, x, y: data.read_fields_into(path, channels, h, w, x, y),
        ),
    )
    out = []
    for name, read_into in readers:
        for threads in (1, 2):

            def work(k, threads=threads, read_into=read_into):
                for path in files[k::threads]:
                    read_into(path, *buffers[k])

            rates = []
            for _ in range(repeats):
                start = time.perf_counter()
                with ThreadPoolExecutor(threads) as pool:
                    list(pool.map(work, range(threads)))
                rates.append(len(files) / (time.perf_counter() - start))
            out.append(
                Row.of(
                    f"HDF5 files alone, {name}, {threads} reader thread(s)",
                    f"{h}x{w}x16",
                    rates,
                    os.path.getsize(files[0]) / 1e6,
                )
            )
    return out


def h5py_read_into(path, data, x_out, y_out) -> None:
    """The unstaged reader's body before contiguous datasets were read past h5py: h5py reads the fields
    straight into x_out (read_direct), the labels into an array checked into y_out."""
    import h5py

    from deepcam.layout import DATA_KEY, LABEL_KEY

    with h5py.File(path, "r") as f:
        f[DATA_KEY].read_direct(x_out)
        y_out[...] = data.labels_as_uint8(f[LABEL_KEY][...], path)


def former_hdf5_pipeline(paths, data, data_dir, channels, h, w, batch, readers):
    """The reader before staging.convert: h5py in tf.numpy_function, normalized there in numpy."""
    import tensorflow as tf

    from deepcam import sample_files

    shift, scale = data.load_normalization(data_dir, channels)

    def load(path):
        x, y = tf.numpy_function(
            lambda p: sample_files.read_sample(p.decode(), channels, shift, scale, h, w),
            [path],
            (tf.float32, tf.int32),
            stateful=False,
        )
        return tf.ensure_shape(x, (h, w, len(channels))), tf.ensure_shape(y, (h, w))

    return per_sample_pipeline(paths, load, batch, readers)


def former_raw_pipeline(paths, data, data_dir, channels, h, w, batch, readers):
    """The staged reader before batch buffers: TensorFlow's own ops a sample at a time, then tf.data's batch."""
    import tensorflow as tf

    data_bytes = h * w * len(channels) * 4

    def load(path):
        content = tf.io.read_file(path)
        x = tf.reshape(
            tf.io.decode_raw(content, tf.float32, fixed_length=data_bytes), (h, w, len(channels))
        )
        y = tf.io.decode_raw(tf.strings.substr(content, data_bytes, h * w), tf.uint8)
        return x, tf.reshape(y, (h, w))

    return per_sample_pipeline(paths, load, batch, readers)


def former_hdf5_buffers_pipeline(paths, data, data_dir, channels, h, w, batch, readers):
    """The unstaged reader before contiguous datasets were read past h5py: the same batches, buffers and
    batches in flight as data.make_dataset's, each file read by h5py (read_direct): the readers take turns."""
    del data_dir
    import numpy as np
    import tensorflow as tf

    from common.inputs import pipeline
    from deepcam.data import BatchBuffers

    in_flight = max(1, -(-readers // batch))
    buffers = BatchBuffers(
        [((h, w, len(channels)), np.float32), ((h, w), np.uint8)],
        batch,
        max_buffers=2 * in_flight + 2 + 2,
    )

    def fill(batch_paths):
        x, y = buffers.take(len(batch_paths))
        for i, path in enumerate(batch_paths):
            h5py_read_into(path.decode(), data, x[i], y[i])
        return x, y

    def load(batch_paths):
        x, y = tf.numpy_function(fill, [batch_paths], (tf.float32, tf.uint8), stateful=False)
        return tf.ensure_shape(x, (batch, h, w, len(channels))), tf.ensure_shape(y, (batch, h, w))

    return pipeline.training_dataset(
        paths,
        read_batches=lambda ds: ds.map(load, num_parallel_calls=in_flight),
        batch_size=batch,
        n_batches=len(paths) // batch,
        seed=0,
        deterministic=False,
    ).prefetch(2)


def per_sample_pipeline(paths, load, batch, readers):
    """The former pipelines' shape: `load` a sample at a time, `readers` in flight, then tf.data's batch."""
    from common.inputs import pipeline

    return pipeline.training_dataset(
        paths,
        lambda ds: ds.map(load, num_parallel_calls=readers),
        batch_size=batch,
        n_batches=len(paths) // batch,
        seed=0,
        deterministic=False,
    ).prefetch(2)


def one_core_reader(cfg, workdir: Path, n: int):
    """DeepCAM's reader, batch 1, one reader, on n synthetic HDF5 samples of the config's size."""
    from deepcam import data, synthetic

    d = cfg.data
    synthetic.generate(workdir, d.height, d.width, n, 1, workers=1, progress=lambda line: None)
    files = sorted(str(p) for p in (workdir / "train").glob("*.h5"))
    return data.make_dataset(
        files,
        channels=d.channels,
        height=d.height,
        width=d.width,
        batch_size=1,
        training=False,
        readers=1,
        prefetch=1,
    )
