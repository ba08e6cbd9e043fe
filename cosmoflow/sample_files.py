"""Sample files read whole, one by one, off the training path: the search for the bad file that a
failed run, prediction and the data tools name.
"""

import re

import numpy as np
import tensorflow as tf

from cosmoflow import data


def find_bad_file(files, sample_shape, transform: str = "log"):
    """Reads `files` one by one; returns 'PATH: reason' for the first bad one, else None.

    Bad: unreadable, not one record, a wrong size of 'x', a target 'y' holding NaN or Inf, or
    counts 'x' that the `transform` (a data.TRANSFORMS name) turns into NaN or Inf (a negative count
    under log(1 + x), an all-zero sample under x / mean): what the train step's finite check
    (common.run.steps) would catch.
    """
    expected = int(np.prod(sample_shape)) * 2
    for path in files:
        try:
            compression = data.detect_compression(path)
            n = 0
            for record in tf.data.TFRecordDataset(path, compression_type=compression):
                n += 1
                features = tf.io.parse_single_example(
                    record,
                    {
                        "x": tf.io.FixedLenFeature([], tf.string),
                        "y": tf.io.FixedLenFeature([4], tf.float32),
                    },
                )
                got = len(features["x"].numpy())
                if got != expected:
                    return (
                        f"{path}: sample 'x' holds {got // 2} int16 values, expected "
                        f"{expected // 2} for shape {list(sample_shape)}"
                    )
                y = features["y"].numpy()
                if not np.isfinite(y).all():
                    return f"{path}: target 'y' holds NaN or Inf ({y.tolist()})"
                x = tf.io.decode_raw(features["x"], tf.int16)
                if not bool(tf.reduce_all(tf.math.is_finite(data.TRANSFORMS[transform](x[None])))):
                    return (
                        f"{path}: sample 'x' gives NaN or Inf under the '{transform}' transform "
                        f"({int(tf.reduce_sum(tf.cast(x < 0, tf.int32)))} negative counts, "
                        f"{int(tf.reduce_sum(tf.cast(x != 0, tf.int32)))} non-zero)"
                    )
            if n != 1:
                return f"{path}: {n or 'no'} records, expected one sample per file"
        except tf.errors.NotFoundError:
            return f"{path}: file not found"
        except tf.errors.OpError as e:
            return f"{path}: unreadable TFRecord ({tf_reason(e)})"
    return None


def tf_reason(error) -> str:
    """The human part of a TensorFlow error message (no op names or device strings)."""
    text = re.sub(r"\{\{.*?\}\}", "", error.message.splitlines()[0])
    text = re.sub(r"\s*\[Op:.*$", "", text)
    return " ".join(text.split()) or type(error).__name__
