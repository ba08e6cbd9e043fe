"""Computes DATA/stats.h5 (per-channel min, max, mean, sqmean, count) from DATA/train.

  python -m deepcam.stats DATA [--workers 8]

Files are split among worker processes; each reduces its files to partial
sums, which are combined at the end, so a large training set is read once,
in parallel. The result is written under a temporary name, then renamed.
"""

import argparse
import multiprocessing
import os
import sys
import time
from pathlib import Path

import h5py
import numpy as np

from common.cli import tool_main
from common.errors import InputError
from common.reporting.console import Progress
from deepcam.layout import DATA_KEY, STATS_FILE, SUFFIXES


def _partial(files) -> dict:
    """min, max, sum, sum of squares and count per channel over some files (float64)."""
    acc = None
    for path in files:
        try:
            with h5py.File(path, "r") as f:
                x = f[DATA_KEY][...]
        except (OSError, KeyError) as e:
            raise InputError(
                f"{path}: cannot read {DATA_KEY} ({' '.join(str(e).split())[:200]})"
            ) from None
        if x.ndim != 3:
            raise InputError(
                f"{path}: {DATA_KEY} has shape {x.shape}, expected (height, width, channels)"
            )
        flat = x.reshape(-1, x.shape[-1]).astype(np.float64)
        part = {
            "min": flat.min(0),
            "max": flat.max(0),
            "sum": flat.sum(0),
            "sqsum": np.square(flat).sum(0),
            "count": np.full(flat.shape[1], flat.shape[0], np.float64),
        }
        acc = part if acc is None else _combine(acc, part)
    return acc


def _combine(a: dict, b: dict) -> dict:
    return {
        "min": np.minimum(a["min"], b["min"]),
        "max": np.maximum(a["max"], b["max"]),
        "sum": a["sum"] + b["sum"],
        "sqsum": a["sqsum"] + b["sqsum"],
        "count": a["count"] + b["count"],
    }


def compute_stats(data_dir, workers: int = 0, print_fn=None) -> Path:
    """Writes DATA/stats.h5 from the files in DATA/train; returns its path.

    `print_fn`: None prints on stdout (a line redrawn on a terminal, else a line every
    30 s, then the summary); a function of one line gets the lines instead.
    """
    # Here, not at the top: common.inputs.pipeline imports TensorFlow, and the workers, which import
    # this module for _partial, need only h5py and NumPy.
    from common.inputs.pipeline import list_files

    files = list_files(Path(data_dir) / "train", SUFFIXES)
    workers = min(workers or min(len(os.sched_getaffinity(0)), 16), len(files))
    # One task per file, handed out in chunks: the workers share the files as
    # they free up, and progress moves file by file instead of once per worker
    # at the very end.
    chunksize = max(1, len(files) // (workers * 16))
    start = time.perf_counter()
    total = None
    with (
        multiprocessing.get_context("spawn").Pool(workers) as pool,
        Progress("stats", len(files), unit="files", out=print_fn) as bar,
    ):
        for done, part in enumerate(
            pool.imap_unordered(_partial, [[path] for path in files], chunksize), 1
        ):
            total = part if total is None else _combine(total, part)
            bar.update(done)
    mean = total["sum"] / total["count"]
    sqmean = total["sqsum"] / total["count"]
    out = Path(data_dir) / STATS_FILE
    tmp = out.with_name(out.name + ".tmp")
    with h5py.File(tmp, "w") as f:
        g = f.create_group("climate")
        g["minval"], g["maxval"] = total["min"], total["max"]
        g["mean"], g["sqmean"], g["count"] = mean, sqmean, total["count"]
    os.replace(tmp, out)
    (print_fn or print)(
        f"[stats] {len(files)} files, {len(mean)} channels -> {out} "
        f"({time.perf_counter() - start:.1f} s)"
    )
    return out


@tool_main()
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", help="directory holding train/")
    parser.add_argument(
        "--workers", type=int, default=0, help="processes (default: cores, at most 16)"
    )
    args = parser.parse_args(argv)
    compute_stats(args.data_dir, args.workers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
