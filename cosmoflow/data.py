"""The public CosmoFlow TFRecords: their format and the reader (cosmoflow.prepare writes them).

Each record is a `tf.train.Example` with
  x: bytes, the int16 particle counts of one sub-volume, C-order (N, N, N, 4);
  y: 4 float32 targets (the normalized cosmological parameters).
v1.0+ data is GZIP-compressed, v0.7 data is not; one sample per file.

The input pipeline hands over the int16 particle counts as stored: half the
bytes of float32 through tf.data, its cache and the host-to-device copy. The
normalization (`TRANSFORMS`, log(1 + x) since v1.0) is applied to whole
batches inside the compiled train and eval steps (CosmoFlowTask.preprocess_batch),
on the accelerator when there is one, where the CPU cores of a node would
otherwise cast and log1p 8.4 M values (34 MB of float32) per sample.
"""

import tensorflow as tf

from common.inputs import pipeline

SUFFIXES = (".tfrecord", ".tfrecords", ".tfrecord.gz")
_GZIP_MAGIC = b"\x1f\x8b"


def detect_compression(path) -> str:
    """'GZIP' if the file starts with the gzip magic bytes, else '' (uncompressed)."""
    with tf.io.gfile.GFile(path, "rb") as f:
        return "GZIP" if f.read(2) == _GZIP_MAGIC else ""


def resolve_compression(setting: str, files) -> str:
    if setting == "auto":
        return detect_compression(files[0])
    return "GZIP" if setting == "GZIP" else ""


def parse_example(serialized, sample_shape):
    """One serialized Example -> (int16 volume of `sample_shape`, float32 targets [4])."""
    features = tf.io.parse_single_example(
        serialized,
        {
            "x": tf.io.FixedLenFeature([], tf.string),
            "y": tf.io.FixedLenFeature([4], tf.float32),
        },
    )
    x = tf.reshape(tf.io.decode_raw(features["x"], tf.int16), sample_shape)
    return x, features["y"]


def slab_of(x, slab):
    """The z-slab `slab` = (index, count) of one sample [N, ...] (all of it when slab is None)."""
    if slab is None:
        return x
    index, count = slab
    planes = x.shape[0] // count
    return x[index * planes : (index + 1) * planes]


def log_transform(x):
    """v1.0+ normalization: log(1 + counts), of a batch [B, N, N, N, C] or one sample."""
    return tf.math.log1p(tf.cast(x, tf.float32))


def mean_normalize(x):
    """v0.7 normalization: each sample's counts divided by that sample's mean count (x: a batch [B, ...])."""
    x = tf.cast(x, tf.float32)
    return x / tf.reduce_mean(x, axis=list(range(1, x.shape.rank)), keepdims=True)


TRANSFORMS = {"log": log_transform, "mean": mean_normalize}


def make_dataset(
    files,
    sample_shape,
    batch_size: int,
    compression: str = "",
    training: bool = True,
    seed: int = 0,
    cache: bool = False,
    parallelism: int = 4,
    prefetch: int = 4,
    batches_per_epoch: int | None = None,
    start: pipeline.Position = pipeline.Position(),
    deterministic: bool = False,
    slab=None,
) -> tf.data.Dataset:
    """The input pipeline of one rank.

    Args:
      files: this rank's shard (one sample per file, as in the public data).
      training: a new order every epoch (common.inputs.pipeline.training_dataset), endless,
        each epoch one pass over the shard giving `batches_per_epoch` full batches
        (default: all), from `start`; else one ordered pass.
      cache: keep decoded int16 samples in memory after the first pass.
      deterministic: read files in order although several are in flight (exact resume).
      slab: (index, count): keep only that z-slab of each sample (a rank of a spatial
        group reading whole samples; staged slab files are read with their own shape).
    Returns:
      Batches (x int16 counts [B, *sample_shape], or the slab's, y float32 [B, 4]), full batches only;
      a TRANSFORMS entry makes the model's input of x.
    """
    sample_shape = tuple(int(s) for s in sample_shape)
    files = list(files)

    def read(paths: tf.data.Dataset) -> tf.data.Dataset:
        # One sample per file: an empty (or multi-record) file fails the read, so that
        # the trainer names it (sample_files.find_bad_file), instead of a short epoch passing silently.
        ds = paths.interleave(
            lambda f: tf.data.TFRecordDataset(f, compression_type=compression).apply(
                tf.data.experimental.assert_cardinality(1)
            ),
            cycle_length=max(1, parallelism),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=deterministic or not training,
        )

        def parse(serialized):
            x, y = parse_example(serialized, sample_shape)
            return slab_of(x, slab), y

        return ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE)

    if training:
        n_batches = batches_per_epoch if batches_per_epoch is not None else len(files) // batch_size
        ds = pipeline.training_dataset(
            files,
            read,
            batch_size=batch_size,
            n_batches=n_batches,
            seed=seed,
            cache=cache,
            start=start,
            deterministic=deterministic,
        )
    else:
        ds = read(tf.data.Dataset.from_tensor_slices(tf.constant(files, dtype=tf.string)))
        if cache:
            ds = ds.cache()
        ds = ds.batch(batch_size, drop_remainder=True)
    return ds.prefetch(prefetch)
