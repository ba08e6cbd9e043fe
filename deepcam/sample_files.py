"""Sample files read whole into fresh arrays, off the training path: prediction's `read_sample`,
staging's raw layout (`raw_layout`) and the search for the bad file a failed run names
(`find_bad_file`). Training reads into its batches (deepcam.data).
"""

from pathlib import Path

import h5py
import numpy as np

from common.errors import InputError
from deepcam import data
from deepcam.layout import DATA_KEY, RAW_SUFFIX


def read_sample(path, channels, shift, scale, height, width):
    """One normalized sample: (x float32 [H, W, len(channels)], y int32 [H, W]).

    Raises InputError naming the file on a missing key, a wrong shape or a label
    that is not a class.
    """
    x, y = read_fields(path, channels, height, width)
    x = (x.astype(np.float32) - shift) * scale
    return x, data.labels_as_uint8(y, path).astype(np.int32)


def read_fields(path, channels, height, width):
    """One sample as stored: (the selected channels [H, W, len(channels)], labels [H, W]), file dtypes."""
    with h5py.File(path, "r") as f:
        fields, labels = data.checked_datasets(f, path, channels, height, width)
        x = fields[...]
        y = labels[...]
    if list(channels) != list(range(x.shape[2])):
        x = x[..., list(channels)]
    return x, y


def raw_layout(channels, height, width):
    """The staged layout (a common.inputs.staging_layouts.Conversion): each HDF5 sample written once
    as raw arrays (see layout.RAW_SUFFIX)."""
    from common.inputs.staging_layouts import Conversion, sha256_of  # a run that stages only

    channels = tuple(int(c) for c in channels)
    # Every parameter in the name: a run with other channels or sizes stages again.
    name = f"deepcam-raw-v1:{height}x{width}:channels={','.join(map(str, channels))}"
    nbytes = data.raw_sample_bytes(len(channels), height, width)

    def write(src, tmp, verify):
        # verify hashes the source before it is converted: a change between the two reads shows
        # as a new mtime (or, same mtime, as a digest that no longer matches) on the next run.
        digest = sha256_of(src) if verify else None
        try:
            x, y = read_fields(src, channels, height, width)
            y = data.labels_as_uint8(y, src)
        except InputError as e:
            raise InputError(f"cannot stage {e}") from None
        except (OSError, RuntimeError, KeyError, ValueError) as e:  # h5py's, for damaged files
            raise InputError(
                f"cannot stage {src}: unreadable HDF5 sample ({data.first_line(e)})"
            ) from None
        with open(tmp, "wb") as f:
            f.write(memoryview(np.ascontiguousarray(x, dtype="<f4")))  # no extra 57 MB copy
            f.write(memoryview(np.ascontiguousarray(y)))
        return digest

    return Conversion(
        name,
        write=write,
        size_hint=lambda src, size: nbytes,
        staged_name=lambda n: (n[: -len(".h5")] if n.endswith(".h5") else n) + RAW_SUFFIX,
    )


def find_bad_file(files, channels, height, width) -> str | None:
    """The first file that cannot be read as a sample, or whose fields hold NaN or Inf, with the
    reason; None if all are fine."""
    zeros = np.zeros(len(channels), np.float32)
    expected = data.raw_sample_bytes(len(channels), height, width)
    for path in files:
        if str(path).endswith(RAW_SUFFIX):
            try:
                size = Path(path).stat().st_size
            except OSError as e:
                return f"{path}: unreadable staged sample ({data.first_line(e)})"
            if size != expected:
                return (
                    f"{path}: staged raw sample of {size:,} bytes, expected {expected:,} for "
                    f"{height}x{width} with {len(channels)} channels"
                )
            x, y = (
                np.empty((height, width, len(channels)), np.float32),
                np.empty((height, width), np.uint8),
            )
            try:
                data.read_raw_into(path, x, y)
            except (OSError, InputError) as e:
                return f"{path}: unreadable staged sample ({data.first_line(e)})"
        else:
            try:
                x, _ = read_sample(path, channels, zeros, zeros + 1, height, width)
            except InputError as e:
                return str(e)
            except (OSError, RuntimeError, KeyError, ValueError, TypeError) as e:
                return f"{path}: unreadable HDF5 sample ({data.first_line(e)})"
        if not np.isfinite(x).all():
            return f"{path}: {DATA_KEY} holds {_non_finite(x, channels)}"
    return None


def _non_finite(x, channels) -> str:
    """'2 NaN and 1 Inf values (channels [3], first at height 5, width 7)' of fields [H, W, C]."""
    nan, inf = int(np.isnan(x).sum()), int(np.isinf(x).sum())
    h, w, c = np.argwhere(~np.isfinite(x))[0]
    bad = sorted({int(channels[i]) for i in np.flatnonzero(~np.isfinite(x).all(axis=(0, 1)))})
    return f"{nan} NaN and {inf} Inf values (channels {bad}, first at height {h}, width {w}, channel {channels[c]})"
