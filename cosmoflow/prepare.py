"""Raw CosmoFlow universes (HDF5) -> TFRecords in the public layout; the writer of that layout, and
staging's slab layout for a rank of a spatial group.

Each raw file holds one simulated universe:
  full:    (N, N, N, 4) int16 particle counts at 4 redshifts,
  unitPar: (4,) float32 normalized cosmological parameters.
It is cut into (N / S)^3 sub-volumes of S^3 x 4 (S = 128 for the real model),
one TFRecord file each. Whole universes go to either train/ or validation/, so
no universe is seen in both splits.

  python -m cosmoflow.prepare --input-dir RAW --output-dir DATA --valid-fraction 0.1 --workers 8
"""

import argparse
import multiprocessing
import os
import sys
import zlib
from pathlib import Path

import numpy as np

from common.cli import tool_main
from common.errors import InputError
from common.reporting.console import Progress


def encode_example(x: np.ndarray, y: np.ndarray) -> bytes:
    """Serializes one sample in the public layout."""
    import tensorflow as tf

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
    import tensorflow as tf

    tmp = f"{path}.tmp.{os.getpid()}"
    options = tf.io.TFRecordOptions(
        compression_type="GZIP" if gzip else "", compression_level=gzip_level if gzip else None
    )
    with tf.io.TFRecordWriter(tmp, options) as writer:
        for example in examples:
            writer.write(example)
    os.replace(tmp, path)


def slab_conversion(index: int, count: int, sample_shape):
    """Staging's layout (a common.inputs.staging_layouts.Conversion) for a rank of a spatial group:
    its z-slab of each sample, uncompressed.

    A rank then reads 1/count of each sample's bytes every epoch instead of
    inflating and parsing the whole volume (1 GiB of int16 at 512^3) to keep a slab.
    """
    import tensorflow as tf

    from common.inputs.staging_layouts import Conversion, sha256_of
    from cosmoflow.data import detect_compression, parse_example, slab_of
    from cosmoflow.sample_files import tf_reason

    sample_shape = tuple(int(s) for s in sample_shape)

    def write(src: Path, tmp: Path, verify: bool):
        try:
            records = list(
                tf.data.TFRecordDataset(str(src), compression_type=detect_compression(src))
            )
        except tf.errors.OpError as e:
            raise InputError(f"{src}: unreadable TFRecord ({tf_reason(e)})") from None
        if len(records) != 1:
            raise InputError(f"{src}: {len(records) or 'no'} records, expected one sample per file")
        x, y = parse_example(records[0], sample_shape)
        with tf.io.TFRecordWriter(str(tmp)) as writer:
            writer.write(encode_example(slab_of(x, (index, count)).numpy(), y.numpy()))
        return sha256_of(src) if verify else None

    def size_hint(src: Path, size: int) -> int:
        del src, size
        return int(np.prod(sample_shape)) * 2 // count + 1024

    return Conversion(
        f"cosmoflow-slab-{index}-of-{count}-{'x'.join(map(str, sample_shape))}",
        write=write,
        size_hint=size_hint,
        staged_name=lambda name: f"{name}.slab{index}of{count}",
    )


def split_universe(full: np.ndarray, sub: int):
    """Yields the sub-volumes of a (N, N, N, C) array, in C order of their corners."""
    n = full.shape[0]
    if full.ndim != 4 or full.shape[:3] != (n, n, n) or n % sub:
        raise ValueError(
            f"'full' has shape {full.shape}: expected (N, N, N, C) with N divisible by {sub}"
        )
    k = n // sub
    for i in range(k):
        for j in range(k):
            for m in range(k):
                yield full[
                    i * sub : (i + 1) * sub, j * sub : (j + 1) * sub, m * sub : (m + 1) * sub
                ]


def assign_split(name: str, valid_fraction: float) -> str:
    """A stable split by universe name (the same on every run and machine)."""
    return "validation" if (zlib.crc32(name.encode()) % 10000) < valid_fraction * 10000 else "train"


def _prepare_one(job):
    import h5py

    path, out_dir, sub, gzip = job
    try:
        with h5py.File(path, "r") as f:
            if "full" not in f or "unitPar" not in f:
                missing = "full" if "full" not in f else "unitPar"
                return path, 0, f"missing dataset '{missing}'"
            full = f["full"][()]
            y = np.asarray(f["unitPar"][()], np.float32).ravel()
    except OSError as e:
        return path, 0, f"unreadable HDF5 ({' '.join(str(e).split())})"
    if y.shape != (4,):
        return path, 0, f"'unitPar' has {y.size} values, expected 4"
    try:
        count = 0
        for count, cube in enumerate(split_universe(full, sub), start=1):
            out = Path(out_dir) / f"{Path(path).stem}_{count - 1:03d}.tfrecord"
            write_record_file(out, [encode_example(cube, y)], gzip=gzip)
    except ValueError as e:
        return path, 0, str(e)
    return path, count, None


def prepare(
    input_dir,
    output_dir,
    sub: int = 128,
    valid_fraction: float = 0.1,
    gzip: bool = True,
    workers: int = 0,
    progress=None,
) -> dict:
    """Converts every *.h5/*.hdf5 in input_dir; returns {'train': n, 'validation': n}.

    `progress`: None prints on stdout (a line redrawn on a terminal, else a line every
    30 s, then a summary line); a function of one line gets the lines instead.
    """
    src = Path(input_dir)
    if not src.is_dir():
        raise InputError(f"input directory not found: {src}")
    files = sorted(str(p) for p in src.iterdir() if p.suffix in (".h5", ".hdf5"))
    if not files:
        raise InputError(f"no .h5/.hdf5 universe files in {src}")
    split_of = {path: assign_split(Path(path).stem, valid_fraction) for path in files}
    jobs = []
    for path in files:
        split_dir = Path(output_dir) / split_of[path]
        split_dir.mkdir(parents=True, exist_ok=True)
        jobs.append((path, str(split_dir), sub, gzip))
    counts = {"train": 0, "validation": 0}
    workers = workers or min(len(os.sched_getaffinity(0)), len(jobs))
    with (
        multiprocessing.get_context("spawn").Pool(workers) as pool,
        Progress("prepare", len(jobs), unit="universes", out=progress) as bar,
    ):
        for done, (path, n, error) in enumerate(pool.imap_unordered(_prepare_one, jobs), start=1):
            if error:
                pool.terminate()
                raise InputError(f"{path}: {error}")
            counts[split_of[path]] += n
            bar.update(done, extra=f"{sum(counts.values())} samples")
    return counts


@tool_main()
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input-dir", required=True)
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--sub-size", type=int, default=128, help="edge of the sub-volumes")
    parser.add_argument("--valid-fraction", type=float, default=0.1)
    parser.add_argument("--no-gzip", action="store_true")
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args(argv)
    counts = prepare(
        args.input_dir,
        args.output_dir,
        args.sub_size,
        args.valid_fraction,
        not args.no_gzip,
        args.workers,
    )
    print(
        f"[prepare] wrote {counts['train']} train and {counts['validation']} validation samples "
        f"to {args.output_dir}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
