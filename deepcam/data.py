"""Reader for the public DeepCAM layout: one HDF5 file per sample.

  DATA/train/*.h5, DATA/validation/*.h5, DATA/stats.h5
  sample: climate/data     float32 [768, 1152, 16]  (height, width, channels)
          climate/labels_0 [768, 1152], 0 background, 1 cyclone, 2 river (float or int)
  stats:  climate/minval, climate/maxval (also mean, sqmean, count), per channel

Inputs are normalized as (x - min) / (max - min) per channel, as the
reference. h5py runs inside tf.data (several files in flight per rank), so
reading overlaps training.
"""

from pathlib import Path

import h5py
import numpy as np
import tensorflow as tf

from common import epochs
from common.errors import InputError
from deepcam.layout import DATA_KEY, LABEL_KEY, STATS_FILE


def load_normalization(data_dir, channels) -> tuple[np.ndarray, np.ndarray]:
    """(shift, scale) per selected channel from DATA/stats.h5: x -> (x - shift) * scale."""
    path = Path(data_dir) / STATS_FILE
    if not path.is_file():
        raise InputError(f"statistics file not found: {path} (compute it with "
                         f"python -m deepcam.stats {data_dir})")
    try:
        with h5py.File(path, "r") as f:
            lo, hi = f["climate/minval"][...], f["climate/maxval"][...]
    except KeyError as e:
        # h5py raises KeyError for a missing name and for a damaged object header alike.
        raise InputError(f"{path}: cannot read climate/minval and climate/maxval "
                         f"({_first_line(e.args[0] if e.args else 'missing')})") from None
    except OSError as e:
        raise InputError(f"{path}: unreadable HDF5 file ({_first_line(e)})") from None
    idx = list(channels)
    if lo.shape != hi.shape or lo.ndim != 1 or max(idx) >= lo.shape[0]:
        raise InputError(f"{path}: climate/minval and climate/maxval must be vectors over the channels, "
                         f"got shapes {lo.shape} and {hi.shape}")
    lo, hi = lo[idx].astype(np.float32), hi[idx].astype(np.float32)
    # A constant channel would divide by zero; it normalizes to 0 instead.
    span = np.where(hi > lo, hi - lo, 1.0).astype(np.float32)
    return lo, (1.0 / span).astype(np.float32)


def read_sample(path, channels, shift, scale, height, width):
    """One normalized sample: (x float32 [H, W, len(channels)], y int32 [H, W]).

    Raises InputError naming the file on a missing key or a wrong shape.
    """
    with h5py.File(path, "r") as f:
        try:
            data, labels = f[DATA_KEY], f[LABEL_KEY]
        except KeyError as e:
            raise InputError(f"{path}: cannot read {DATA_KEY} and {LABEL_KEY} "
                             f"({_first_line(e.args[0] if e.args else 'missing')})") from None
        if data.ndim != 3 or data.shape[:2] != (height, width) or max(channels) >= data.shape[2]:
            raise InputError(f"{path}: {DATA_KEY} has shape {data.shape}, expected "
                             f"({height}, {width}, >{max(channels)}) (height, width, channels)")
        if labels.shape != (height, width):
            raise InputError(f"{path}: {LABEL_KEY} has shape {labels.shape}, expected ({height}, {width})")
        x = data[...]
        y = labels[...]
    if len(channels) != x.shape[2] or list(channels) != list(range(x.shape[2])):
        x = x[..., list(channels)]
    x = (x.astype(np.float32) - shift) * scale
    return x, y.astype(np.int32)


def find_bad_file(files, channels, height, width) -> str | None:
    """The first file that cannot be read as a sample, with the reason; None if all are fine."""
    zeros = np.zeros(len(channels), np.float32)
    for path in files:
        try:
            read_sample(path, channels, zeros, zeros + 1, height, width)
        except InputError as e:
            return str(e)
        except (OSError, ValueError, TypeError) as e:
            return f"{path}: unreadable HDF5 sample ({_first_line(e)})"
    return None


def make_dataset(files, *, data_dir, channels, height, width, batch_size, training, seed=0,
                 readers=4, prefetch=2, cache=False, batches_per_epoch=None,
                 start: epochs.Position = epochs.Position(), deterministic=False) -> tf.data.Dataset:
    """Batches of (x [B, H, W, C] float32, y [B, H, W] int32) from HDF5 sample files.

    Training: a new order every epoch (common.epochs.training_dataset), endless,
    full batches only, each epoch one pass over the shard giving
    `batches_per_epoch` batches (default: all), from `start`; `deterministic`
    reads in order although several files are in flight (exact resume).
    Validation: one pass in file order; the last batch may be partial.
    With `cache`, decoded samples stay in memory after the first pass.
    """
    shift, scale = load_normalization(data_dir, channels)
    channels = tuple(int(c) for c in channels)
    n_ch = len(channels)

    def read_one(path):
        return read_sample(path.decode(), channels, shift, scale, height, width)

    def load(path):
        x, y = tf.numpy_function(read_one, [path], (tf.float32, tf.int32), stateful=False)
        x.set_shape((height, width, n_ch))
        y.set_shape((height, width))
        return x, y

    def read(paths: tf.data.Dataset) -> tf.data.Dataset:
        return paths.map(load, num_parallel_calls=readers)

    if training:
        n_batches = batches_per_epoch if batches_per_epoch is not None else len(files) // batch_size
        ds = epochs.training_dataset(files, read, batch_size=batch_size, n_batches=n_batches, seed=seed,
                                     cache=cache, start=start, deterministic=deterministic)
    else:
        # dtype given: a rank may hold no validation file, and [] would not be strings.
        ds = read(tf.data.Dataset.from_tensor_slices(tf.constant([str(f) for f in files], dtype=tf.string)))
        if cache:
            ds = ds.cache()
        ds = ds.batch(batch_size)
    return ds.prefetch(prefetch)


def _first_line(e) -> str:
    """An exception or message as one line of at most 200 characters."""
    text = " ".join(str(e).split())
    return text[:200]
