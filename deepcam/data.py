"""Reader for the public DeepCAM layout: one HDF5 file per sample.

  DATA/train/*.h5, DATA/validation/*.h5, DATA/stats.h5
  sample: climate/data     float32 [768, 1152, 16]  (height, width, channels)
          climate/labels_0 [768, 1152], 0 background, 1 cyclone, 2 river (float or int)
  stats:  climate/minval, climate/maxval (also mean, sqmean, count), per channel

The pipeline hands over the fields as stored and the labels as uint8; the reference's
(x - min) / (max - min) runs inside the compiled steps (DeepCAMTask.preprocess_batch). Each file is
read inside tf.data straight into a reused, aligned batch buffer (BatchBuffers), with readinto,
which releases the GIL: staged raw files and contiguous HDF5 datasets from their offset; other HDF5
layouts (chunked, compressed) through h5py, whose global lock makes its readers take turns.
"""

import os
import sys
import threading
from pathlib import Path

import h5py
import numpy as np
import tensorflow as tf

from common.errors import InputError
from common.inputs import pipeline
from deepcam.config import N_CLASSES
from deepcam.layout import DATA_KEY, LABEL_KEY, RAW_SUFFIX, STATS_FILE


def load_normalization(data_dir, channels) -> tuple[np.ndarray, np.ndarray]:
    """(shift, scale) per selected channel from DATA/stats.h5: x -> (x - shift) * scale."""
    path = Path(data_dir) / STATS_FILE
    if not path.is_file():
        raise InputError(
            f"statistics file not found: {path} (compute it with "
            f"python -m deepcam.stats {data_dir})"
        )
    try:
        with h5py.File(path, "r") as f:
            lo, hi = f["climate/minval"][...], f["climate/maxval"][...]
    except KeyError as e:
        # h5py raises KeyError for a missing name and for a damaged object header alike.
        raise InputError(
            f"{path}: cannot read climate/minval and climate/maxval "
            f"({first_line(e.args[0] if e.args else 'missing')})"
        ) from None
    except OSError as e:
        raise InputError(f"{path}: unreadable HDF5 file ({first_line(e)})") from None
    idx = list(channels)
    if lo.shape != hi.shape or lo.ndim != 1 or max(idx) >= lo.shape[0]:
        raise InputError(
            f"{path}: climate/minval and climate/maxval must be vectors over the channels, "
            f"got shapes {lo.shape} and {hi.shape}"
        )
    lo, hi = lo[idx].astype(np.float32), hi[idx].astype(np.float32)
    for key, values in (("climate/minval", lo), ("climate/maxval", hi)):
        if not np.isfinite(values).all():
            bad = [c for c, v in zip(idx, values) if not np.isfinite(v)]
            raise InputError(
                f"{path}: {key} holds NaN or Inf (channels {bad}); recompute it with "
                f"python -m deepcam.stats {data_dir}"
            )
    # A constant channel would divide by zero; it normalizes to 0 instead.
    span = np.where(hi > lo, hi - lo, 1.0).astype(np.float32)
    return lo, (1.0 / span).astype(np.float32)


def normalize(x, shift, scale):
    """(x - min) / (max - min) per channel, in float32 (x: a batch or a sample, channels last)."""
    return (tf.cast(x, tf.float32) - shift) * scale


def labels_as_uint8(y, path):
    """The labels as uint8, or an InputError naming `path` if one is not a class 0..N_CLASSES-1.

    A label out of range would make the cross-entropy NaN on a GPU (an unnamed op error on a CPU);
    a fractional one (float labels, damaged) would be truncated silently.
    """
    whole = np.issubdtype(y.dtype, np.integer) or np.array_equal(y, np.round(y))  # no copy for ints
    if y.size and not (y.min() >= 0 and y.max() < N_CLASSES and whole):
        raise InputError(
            f"{path}: {LABEL_KEY} holds values that are not the classes 0..{N_CLASSES - 1}"
        )
    return y.astype(np.uint8, copy=False)


def read_fields_into(path, channels, height, width, x_out, y_out, first_row: int = 0) -> None:
    """One HDF5 sample into x_out (float32 [R, W, len(channels)]) and y_out (uint8 [R, W]), labels checked:
    its rows [first_row, first_row + R), R = len(x_out) (all H by default; a slab of a height split).

    h5py serializes its calls behind one lock (a read releases the GIL, not that lock), so a
    rank's h5py readers take turns. A dataset stored as one contiguous block of native values
    (no chunks, filters or external files, as h5py writes by default and the synthetic samples
    are) is therefore read from its offset in the file with readinto, which holds neither: the
    fields (57 of a sample's 60 MB at 768x1152x16, float32 labels) go straight into the batch.
    h5py only opens the file and says where the values lie; other layouts are read through it.
    Rows lie contiguous in either: a slab is one byte range of each dataset.
    """
    rows = slice(first_row, first_row + len(x_out))
    with h5py.File(path, "r") as f:
        data, labels = checked_datasets(f, path, channels, height, width)
        all_channels = _all_channels(channels, data.shape[2])
        data_at = _contiguous_offset(data) if data.dtype == x_out.dtype else None
        labels_at = _contiguous_offset(labels)
        if data_at is None:
            if all_channels:
                data.read_direct(
                    x_out, source_sel=np.s_[rows]
                )  # HDF5 writes straight into the batch
            else:
                x_out[...] = data[rows][..., list(channels)]
        stored = (len(x_out),) + data.shape[1:]
        row_bytes = (
            data.shape[1] * data.shape[2] * data.dtype.itemsize,
            labels.shape[1] * labels.dtype.itemsize,
        )
        y = (
            labels[rows]
            if labels_at is None
            else np.empty((len(x_out),) + labels.shape[1:], labels.dtype)
        )
    if data_at is not None or labels_at is not None:
        with open(path, "rb", buffering=0) as raw:
            if data_at is not None:
                whole = x_out if all_channels else np.empty(stored, x_out.dtype)
                _read_at(raw, data_at + first_row * row_bytes[0], whole, path)
                if not all_channels:
                    np.take(whole, list(channels), axis=2, out=x_out)
            if labels_at is not None:
                _read_at(raw, labels_at + first_row * row_bytes[1], y, path)
    y_out[...] = labels_as_uint8(y, path)


def _contiguous_offset(dataset) -> int | None:
    """Where `dataset`'s values start in its file when they lie there as numpy holds them: one
    contiguous, allocated block of native-endian numbers, unfiltered and in the file itself; else None."""
    plist = dataset.id.get_create_plist()
    if (
        plist.get_layout() != h5py.h5d.CONTIGUOUS
        or plist.get_nfilters()
        or plist.get_external_count()
        or dataset.dtype.kind not in "biuf"
        or not dataset.dtype.isnative
        or dataset.id.get_storage_size() != dataset.nbytes
    ):
        return None
    return (
        dataset.id.get_offset()
    )  # from the file's start, a user block included (None if unallocated)


def _read_at(f, offset: int, out: np.ndarray, path) -> None:
    """out's bytes from `offset` of the open file `f`, or an InputError naming `path` if it ends first."""
    f.seek(offset)
    if not _readinto(f, out):
        raise InputError(f"{path}: HDF5 sample shorter than its header says (truncated?)")


def _readinto(f, out: np.ndarray) -> bool:
    """Fills the C-contiguous `out` from the file's position with readinto (which releases the GIL
    while the kernel copies); False if the file ends first."""
    view = memoryview(out).cast("B")
    while view:
        n = f.readinto(view)
        if not n:
            return False
        view = view[n:]
    return True


def read_raw_into(path, x_out, y_out, height: int | None = None, first_row: int = 0) -> None:
    """One staged raw sample (layout.RAW_SUFFIX) into x_out and y_out (C-contiguous), with no copy in between:
    rows [first_row, first_row + R) of a sample of `height` rows (default: all R = len(x_out)).

    readinto releases the GIL while the kernel copies, so a rank's readers run on every core.
    """
    height = height or len(x_out)
    rows = len(x_out)
    expected = (x_out.nbytes + y_out.nbytes) // rows * height
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        if size != expected:
            raise InputError(f"{path}: staged raw sample of {size:,} bytes, expected {expected:,}")
        # The fields' rows, then the labels' (after all of the fields).
        for out, at in (
            (x_out, first_row * (x_out.nbytes // rows)),
            (y_out, x_out.nbytes // rows * height + first_row * (y_out.nbytes // rows)),
        ):
            f.seek(at)
            if not _readinto(f, out):
                raise InputError(
                    f"{path}: staged raw sample shorter than {expected:,} bytes while read"
                )


def check_shapes(path, channels, height, width) -> None:
    """InputError naming `path` unless it holds the fields and labels of these shapes (its header
    read, no data)."""
    try:
        with h5py.File(path, "r") as f:
            checked_datasets(f, path, channels, height, width)
    except OSError as e:
        raise InputError(f"{path}: unreadable HDF5 file ({first_line(e)})") from None


def checked_datasets(f, path, channels, height, width):
    """The (fields, labels) datasets of an open sample file, after checking names and shapes."""
    try:
        data, labels = f[DATA_KEY], f[LABEL_KEY]
    except KeyError as e:
        raise InputError(
            f"{path}: cannot read {DATA_KEY} and {LABEL_KEY} "
            f"({first_line(e.args[0] if e.args else 'missing')})"
        ) from None
    if data.ndim != 3 or data.shape[:2] != (height, width) or max(channels) >= data.shape[2]:
        raise InputError(
            f"{path}: {DATA_KEY} has shape {data.shape}, expected "
            f"({height}, {width}, >{max(channels)}) (height, width, channels)"
        )
    if labels.shape != (height, width):
        raise InputError(
            f"{path}: {LABEL_KEY} has shape {labels.shape}, expected ({height}, {width})"
        )
    return data, labels


def _all_channels(channels, n_stored) -> bool:
    return list(channels) == list(range(n_stored))


def raw_sample_bytes(n_channels, height, width) -> int:
    """Bytes of one staged raw sample: float32 fields and uint8 labels."""
    return height * width * (4 * n_channels + 1)


def is_raw(files) -> bool:
    """Whether `files` are staged raw samples (all of them) or HDF5 (none); a mix is refused."""
    raw = [str(f) for f in files if str(f).endswith(RAW_SUFFIX)]
    if raw and len(raw) != len(files):
        other = next(str(f) for f in files if not str(f).endswith(RAW_SUFFIX))
        raise InputError(f"a shard mixes raw staged samples ({raw[0]}) and other files ({other})")
    return bool(raw)


def make_dataset(
    files,
    *,
    channels,
    height,
    width,
    batch_size,
    training,
    seed=0,
    readers=4,
    prefetch=2,
    cache=False,
    batches_per_epoch=None,
    start: pipeline.Position = pipeline.Position(),
    deterministic=False,
    slab=None,
) -> tf.data.Dataset:
    """Batches of (x [B, H, W, C] float32 as stored, y [B, H, W] uint8) from HDF5 or staged raw files.

    x is not normalized: `normalize` does it inside the compiled step.

    Training: a new order every epoch (common.inputs.pipeline.training_dataset), endless,
    full batches only, each epoch one pass over the shard giving
    `batches_per_epoch` batches (default: all), from `start`; `deterministic`
    reads in order although several files are in flight (exact resume).
    Validation: one pass in file order; the last batch may be partial.
    With `cache`, decoded samples stay in memory after the first pass.
    About `readers` files are in flight at once (each up to 57 MB).
    `slab` (index, K): a rank of a height split reads (and caches) only rows
    [index * H / K, (index + 1) * H / K) of every sample.
    """
    channels = tuple(int(c) for c in channels)
    raw = is_raw(files)
    rows = _Rows(height, *slab) if slab is not None else _Rows(height)
    if cache:
        # Samples are kept one by one, so they are read one by one.
        read, read_batches = _sample_reader(raw, channels, rows, width, readers), None
    else:
        read, read_batches = (
            None,
            _batch_reader(
                raw,
                channels,
                rows,
                width,
                batch_size,
                readers,
                prefetch,
                batch_dim=batch_size if training else None,
            ),
        )
    if training:
        n_batches = batches_per_epoch if batches_per_epoch is not None else len(files) // batch_size
        ds = pipeline.training_dataset(
            files,
            read,
            read_batches=read_batches,
            batch_size=batch_size,
            n_batches=n_batches,
            seed=seed,
            cache=cache,
            start=start,
            deterministic=deterministic,
        )
    else:
        # dtype given: a rank may hold no validation file, and [] would not be strings.
        paths = tf.data.Dataset.from_tensor_slices(
            tf.constant([str(f) for f in files], dtype=tf.string)
        )
        if cache:
            ds = read(paths).cache().batch(batch_size)
        else:
            ds = read_batches(paths.batch(batch_size))
    return ds.prefetch(prefetch)


class _Rows:
    """The rows of each sample a reader fills: all `height`, or slab `index` of `k` (height / k rows)."""

    def __init__(self, height: int, index: int = 0, k: int = 1):
        self.height, self.count = height, height // k
        self.first = index * self.count


def _batch_reader(raw, channels, rows, width, batch_size, readers, prefetch, batch_dim):
    """Dataset of path batches -> Dataset of (x, y) batches, each filled in place in a reused buffer.

    Each file is read straight into its slot of the batch (common.inputs.pipeline): no
    per-sample array, no batching copy, no fresh memory to fault in per batch. Staged raw
    files and contiguous HDF5 datasets are read with readinto, which releases the GIL, so
    reads run on every core (read_fields_into); other HDF5 layouts go through h5py, which
    serializes its calls behind one lock, so those reads take turns.
    """
    n_ch = len(channels)
    in_flight = max(1, -(-readers // batch_size))  # batches being read at once: ~`readers` files
    # Alive at once: the batches being read, those in map's and prefetch's buffers, the one in use.
    buffers = BatchBuffers(
        [((rows.count, width, n_ch), np.float32), ((rows.count, width), np.uint8)],
        batch_size,
        max_buffers=2 * in_flight + prefetch + 2,
    )

    read_into = _file_reader(raw, channels, rows, width)

    def fill(paths):
        x, y = buffers.take(len(paths))
        for i, path in enumerate(paths):
            read_into(path.decode(), x[i], y[i])
        return x, y

    def load(paths):
        x, y = tf.numpy_function(fill, [paths], (tf.float32, tf.uint8), stateful=False)
        x.set_shape((batch_dim, rows.count, width, n_ch))
        y.set_shape((batch_dim, rows.count, width))
        return x, y

    return lambda path_batches: path_batches.map(load, num_parallel_calls=in_flight)


def _file_reader(raw, channels, rows: _Rows, width):
    """(path, x_out, y_out) -> None: `rows` of one sample file, staged raw or HDF5, read into the arrays given."""
    if raw:
        return lambda path, x_out, y_out: read_raw_into(path, x_out, y_out, rows.height, rows.first)
    return lambda path, x_out, y_out: read_fields_into(
        path, channels, rows.height, width, x_out, y_out, rows.first
    )


def _sample_reader(raw, channels, rows: _Rows, width, readers):
    """Dataset of paths -> Dataset of (x, y) samples, each in its own aligned arrays (cached runs keep them)."""
    n_ch = len(channels)
    read_into = _file_reader(raw, channels, rows, width)

    def read_one(path):
        # Aligned: TensorFlow takes them without a copy (common.inputs.pipeline).
        x, y = (
            aligned_empty((rows.count, width, n_ch), np.float32),
            aligned_empty((rows.count, width), np.uint8),
        )
        read_into(path.decode(), x, y)
        return x, y

    def load(path):
        x, y = tf.numpy_function(read_one, [path], (tf.float32, tf.uint8), stateful=False)
        x.set_shape((rows.count, width, n_ch))
        y.set_shape((rows.count, width))
        return x, y

    return lambda paths: paths.map(load, num_parallel_calls=readers)


def first_line(e) -> str:
    """An exception or message as one line of at most 200 characters."""
    text = " ".join(str(e).split())
    return text[:200]


# Batch buffers reused instead of allocated per batch (a fresh 115 MB batch costs 28,000 page
# faults). tf.numpy_function hands a 64-byte aligned ndarray to TensorFlow without a copy, and the
# tensor holds a reference to it until freed: an array only the pool references is free to refill.
# Beyond `max_buffers` batches, and for a short batch, the pool allocates unpooled ones.
ALIGNMENT = 64  # tensorflow::Allocator::kAllocatorAlignment


def aligned_empty(shape, dtype, alignment: int = ALIGNMENT) -> np.ndarray:
    """An uninitialized C-contiguous array whose data starts on an `alignment`-byte boundary."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + alignment, np.uint8)
    offset = (-raw.ctypes.data) % alignment
    return raw[offset : offset + nbytes].view(dtype).reshape(shape)


class BatchBuffers:
    """A pool of batch arrays, one per field ((per-sample shape, dtype) in `fields`), reused once
    TensorFlow has released them; at most `max_buffers` batches of `batch_size` pooled."""

    def __init__(self, fields, batch_size: int, max_buffers: int):
        self._fields = [(tuple(int(s) for s in shape), np.dtype(dtype)) for shape, dtype in fields]
        self._batch_size = int(batch_size)
        self._max_buffers = int(max_buffers)
        self._pool: list[list[np.ndarray]] = []
        self._lock = threading.Lock()
        # The references an idle pooled array and its memory's owner have, counted the same way
        # on an array kept as the pool keeps its own (a slot list).
        self._idle = _slot_refs([aligned_empty((1,), np.uint8)])[0]

    def take(self, n: int) -> tuple[np.ndarray, ...]:
        """Arrays for a batch of n samples, one per field, not referenced by anything else."""
        if not 0 < n <= self._batch_size:
            raise ValueError(f"a batch of {n} samples does not fit buffers of {self._batch_size}")
        if n < self._batch_size:
            return self._new(n)
        with self._lock:
            for slot in self._pool:
                if all(
                    now <= idle for refs in _slot_refs(slot) for now, idle in zip(refs, self._idle)
                ):
                    # The tuple returned references the arrays before the lock is released.
                    return tuple(slot)
            slot = self._new(n)
            if len(self._pool) < self._max_buffers:
                self._pool.append(list(slot))
            return slot

    def _new(self, n: int) -> tuple[np.ndarray, ...]:
        return tuple(aligned_empty((n, *shape), dtype) for shape, dtype in self._fields)

    @property
    def pooled(self) -> int:
        """Batches the pool holds now (for tests and benchmarks)."""
        return len(self._pool)


def _slot_refs(slot) -> list[tuple[int, int]]:
    """Reference counts of each array of a slot and of its memory's owner."""
    return [(sys.getrefcount(a), sys.getrefcount(a.base)) for a in slot]
