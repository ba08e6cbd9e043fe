"""The public CosmoFlow TFRecord format, written side.

Each record is a `tf.train.Example` with
  x: bytes, the int16 particle counts of one sub-volume, C-order (N, N, N, 4);
  y: 4 float32 targets (the normalized cosmological parameters).
v1.0+ data is GZIP-compressed, v0.7 data is not; one sample per file.
"""

import os

import numpy as np
import tensorflow as tf


def encode_example(x: np.ndarray, y: np.ndarray) -> bytes:
    """Serializes one sample in the public layout."""
    x = np.ascontiguousarray(x, dtype=np.int16)
    feature = {
        "x": tf.train.Feature(bytes_list=tf.train.BytesList(value=[x.tobytes()])),
        "y": tf.train.Feature(
            float_list=tf.train.FloatList(value=np.asarray(y, np.float32).ravel())
        ),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_record_file(path, examples, gzip: bool, gzip_level: int = -1) -> None:
    """Writes serialized examples to `path` atomically (temporary name, then rename).

    Args:
      gzip_level: zlib level, -1 for zlib's default (6); any level reads back
        the same, only the size and the time to write differ.
    """
    tmp = f"{path}.tmp.{os.getpid()}"
    options = tf.io.TFRecordOptions(
        compression_type="GZIP" if gzip else "", compression_level=gzip_level if gzip else None
    )
    with tf.io.TFRecordWriter(tmp, options) as writer:
        for example in examples:
            writer.write(example)
    os.replace(tmp, path)
