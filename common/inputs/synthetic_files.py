"""Writes a synthetic data set with worker processes: progress, idempotence.

Each benchmark's generator makes a list of jobs (one file each) and a
function that writes one job; this runs them in a spawn pool, prints
progress, and leaves a marker so that asking again for the same data set
returns at once. It sits in common/ because the benchmark packages'
generators (cosmoflow.synthetic, deepcam.synthetic) import it, and nothing a
benchmark package imports may live in offline/.
"""

import json
import multiprocessing
import os
from pathlib import Path

from common.reporting.console import Progress

MARKER = ".synthetic.json"


def already_written(output_dir, spec: dict) -> bool:
    marker = Path(output_dir) / MARKER
    return marker.exists() and marker.read_text() == json.dumps(spec, sort_keys=True)


def write_files(
    output_dir,
    spec: dict,
    jobs: list,
    write_one,
    workers: int = 0,
    progress=None,
    chunksize: int = 8,
) -> None:
    """Runs write_one(job) -> bytes written for every job, then writes the marker.

    Args:
      output_dir: the data set's root; the marker (spec as JSON) goes there last,
        so an interrupted run is redone, not trusted.
      spec: everything that determines the files (sizes, seed, version).
      jobs: picklable arguments, one per file.
      write_one: a module-level function (it runs in the workers).
      progress: None prints on stdout (a line redrawn on a terminal, else a line every
        30 s, then a summary line); a function of one line gets those lines instead.
    """
    if already_written(output_dir, spec):
        (progress or print)(f"[synthetic] {output_dir} already holds this data set; nothing to do")
        return
    workers = workers or min(len(os.sched_getaffinity(0)), 8)
    total_bytes = 0
    # 'spawn': the workers import TensorFlow themselves instead of inheriting a
    # forked copy of the parent's TensorFlow runtime (which can deadlock).
    with (
        multiprocessing.get_context("spawn").Pool(workers) as pool,
        Progress("synthetic", len(jobs), unit="samples", out=progress) as bar,
    ):
        for done, nbytes in enumerate(
            pool.imap_unordered(write_one, jobs, chunksize=chunksize), start=1
        ):
            total_bytes += nbytes
            bar.update(done, extra=f"{total_bytes / 2**20:.1f} MiB")
    (Path(output_dir) / MARKER).write_text(json.dumps(spec, sort_keys=True))
