"""DeepCAM's input pipelines alone, for bench/input_pipeline.py (the table's `input_bench`) and
offline/measure_model_costs.py (`one_core_reader`).

  python bench/input_pipeline.py --benchmark deepcam --deepcam-height 768 --deepcam-width 1152

Variants, at the size and batch of `Options` (bench/input_pipeline.py's --deepcam-<field> flags):
HDF5 through h5py (tf.numpy_function: the readers take turns on the GIL), a sample at a time,
normalized in numpy there (the reader before staging.convert); staged raw layout, read_file +
decode_raw a sample at a time, then batched (the staged reader before batch buffers); HDF5, each
file read into its place in a reused batch buffer: unstaged runs now; staged raw layout, readinto
a reused batch buffer: staged runs now.
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
    from deepcam import data, synthetic
    from deepcam.config import N_CHANNELS

    h, w, n, batch = options.height, options.width, run.n_samples, options.batch
    data_dir = Path(run.data_dir) / f"deepcam{h}x{w}"
    synthetic.generate(data_dir, h, w, n, 4, seed=0)
    files = sorted(str(p) for p in (data_dir / "train").glob("*.h5"))[:n]
    channels = tuple(range(N_CHANNELS))
    staged, _ = stage_files(files, run.stage_root / "deepcam", data.raw_layout(channels, h, w))
    sample = f"{h}x{w}x16, batch {batch}"
    out = []
    for label, paths, former in (("HDF5 through h5py, normalized in numpy (before)", files, former_hdf5_pipeline),
                                 ("staged raw, read_file + decode_raw, then batched (before)", staged,
                                  former_raw_pipeline),
                                 ("HDF5, read into reused batch buffers (unstaged runs)", files, None),
                                 ("staged raw (staging.convert), readinto reused batch buffers", staged, None)):
        bench_timing.warm_page_cache(paths)
        if former:
            ds = former(paths, data, data_dir, channels, h, w, batch, run.readers)
        else:
            ds = data.make_dataset(paths, channels=channels, height=h, width=w, batch_size=batch,
                                   training=True, seed=0, readers=run.readers)
        rate = bench_timing.samples_per_s(ds, batch, run.n_batches(batch), run.repeats)
        out.append(Row(label, sample, rate, os.path.getsize(paths[0]) / 1e6))
    out.append(bench_timing.finite_check_row((h, w, len(channels)), (h, w), batch, run.repeats, sample))
    return out


def former_hdf5_pipeline(paths, data, data_dir, channels, h, w, batch, readers):
    """The reader before staging.convert: h5py in tf.numpy_function, normalized there in numpy."""
    import tensorflow as tf
    shift, scale = data.load_normalization(data_dir, channels)

    def load(path):
        x, y = tf.numpy_function(lambda p: data.read_sample(p.decode(), channels, shift, scale, h, w), [path],
                                 (tf.float32, tf.int32), stateful=False)
        return tf.ensure_shape(x, (h, w, len(channels))), tf.ensure_shape(y, (h, w))

    return per_sample_pipeline(paths, load, batch, readers)


def former_raw_pipeline(paths, data, data_dir, channels, h, w, batch, readers):
    """The staged reader before batch buffers: TensorFlow's own ops a sample at a time, then tf.data's batch."""
    import tensorflow as tf
    data_bytes = h * w * len(channels) * 4

    def load(path):
        content = tf.io.read_file(path)
        x = tf.reshape(tf.io.decode_raw(content, tf.float32, fixed_length=data_bytes), (h, w, len(channels)))
        y = tf.io.decode_raw(tf.strings.substr(content, data_bytes, h * w), tf.uint8)
        return x, tf.reshape(y, (h, w))

    return per_sample_pipeline(paths, load, batch, readers)


def per_sample_pipeline(paths, load, batch, readers):
    """The former pipelines' shape: `load` a sample at a time, `readers` in flight, then tf.data's batch."""
    from common.inputs import epochs
    return epochs.training_dataset(paths, lambda ds: ds.map(load, num_parallel_calls=readers), batch_size=batch,
                                   n_batches=len(paths) // batch, seed=0, deterministic=False).prefetch(2)


def one_core_reader(cfg, workdir: Path, n: int):
    """DeepCAM's reader, batch 1, one reader, on n synthetic HDF5 samples of the config's size."""
    from deepcam import data, synthetic
    d = cfg.data
    synthetic.generate(workdir, d.height, d.width, n, 1, workers=1, progress=lambda line: None)
    files = sorted(str(p) for p in (workdir / "train").glob("*.h5"))
    return data.make_dataset(files, channels=d.channels, height=d.height, width=d.width,
                             batch_size=1, training=False, readers=1, prefetch=1)
