"""Staging throughput: GB/s of common.inputs.staging.stage_files with 1, 2 and 4 threads.

  python bench/staging_throughput.py                            # 64 files of 16 MB: copy
  python bench/staging_throughput.py --cosmoflow 64 --repeats 3 # and CosmoFlow gzip TFRecords: copy, gunzip

Each measurement stages every source file into a fresh stage dir, so nothing is
skipped, then a rerun into the same dir measures the freshness check alone
(stat and manifest; with --verify rows also the SHA-256 of every source).
Page cache: before each measurement the sources are written back and dropped
from the page cache with posix_fadvise(DONTNEED) (no root, no global drop), so
they are read from the disk; the staged files are written into the page cache
and not synced inside the timing, as staging does not sync either (training
reads them back soon). Between measurements os.sync() flushes the previous
writes, so their writeback does not slow the next one. Best of --repeats.
Prints one line per measurement and a table at the end; name the machine with it.
"""

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.inputs.staging import stage_files  # noqa: E402
from common.inputs.staging_layouts import GUNZIP  # noqa: E402

THREAD_COUNTS = (1, 2, 4)


def make_random_files(folder: Path, count: int, size: int) -> list[Path]:
    """Incompressible bytes: a plain copy moves them as they are."""
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for i in range(count):
        path = folder / f"random_{i:05d}.tfrecord"
        if not path.exists() or path.stat().st_size != size:
            path.write_bytes(os.urandom(size))
        files.append(path)
    return files


def make_cosmoflow_files(folder: Path, count: int, size: int) -> list[Path]:
    """Gzip TFRecords as the public CosmoFlow data (one sample per file), reused when present."""
    from cosmoflow.synthetic import generate

    generate(folder, size=size, n_train=count, n_valid=0, gzip=True, progress=print)
    return sorted((folder / "train").glob("*.tfrecord"))


def evict_from_page_cache(files) -> None:
    """Writes the files back and drops their cached pages, so the next read goes to the disk."""
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)  # dirty pages are not dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident_fraction(files) -> str:
    """How much of the files is in the page cache, by util-linux fincore where installed."""
    if not shutil.which("fincore"):
        return "unknown (no fincore)"
    out = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--output", "RES,SIZE", *map(str, files)],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    resident, total = sum(map(int, out[0::2])), sum(map(int, out[1::2]))
    return f"{resident / total:.0%}" if total else "n/a"


def measure(files, stage_root: Path, threads: int, gunzip: bool, verify: bool) -> dict:
    stage_dir = Path(tempfile.mkdtemp(prefix="stage-", dir=stage_root))
    try:
        os.sync()
        evict_from_page_cache(files)
        cached = resident_fraction(files)
        _, first = stage_files(
            files, stage_dir, GUNZIP if gunzip else None, verify=verify, threads=threads
        )
        os.sync()
        evict_from_page_cache(files)
        _, rerun = stage_files(
            files, stage_dir, GUNZIP if gunzip else None, verify=verify, threads=threads
        )
        assert first.skipped == 0 and rerun.skipped == len(files)
    finally:
        shutil.rmtree(stage_dir)
    read_bytes = sum(os.path.getsize(f) for f in files)
    return dict(
        read=read_bytes,
        written=first.bytes,
        seconds=first.seconds,
        rerun_seconds=rerun.seconds,
        cached=cached,
    )


def run_set(label: str, files, stage_root: Path, gunzip: bool, verify: bool, repeats: int) -> list:
    rows = []
    for threads in THREAD_COUNTS:
        best = min(
            (measure(files, stage_root, threads, gunzip, verify) for _ in range(repeats)),
            key=lambda r: r["seconds"],
        )
        row = dict(label=label, threads=threads, files=len(files), **best)
        print(
            f"{label:28s} threads={threads}  {row['written'] / 1e9:.2f} GB in {row['seconds']:.2f} s "
            f"= {row['written'] / 1e9 / row['seconds']:.2f} GB/s written; rerun {row['rerun_seconds']:.3f} s; "
            f"sources cached before: {row['cached']}",
            flush=True,
        )
        rows.append(row)
    return rows


def print_table(rows) -> None:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    print(
        f"\nstage_files throughput on {cpu}, {os.cpu_count()} cores (best of repeats; "
        "sources read from disk, staged files written to the page cache)"
    )
    print(
        f"{'mode':28s} {'threads':>7s} {'files':>6s} {'read GB':>8s} {'written GB':>10s} {'s':>7s} "
        f"{'read GB/s':>9s} {'written GB/s':>12s} {'rerun s':>8s}"
    )
    for r in rows:
        read_gb, written_gb = r["read"] / 1e9, r["written"] / 1e9
        print(
            f"{r['label']:28s} {r['threads']:7d} {r['files']:6d} {read_gb:8.2f} {written_gb:10.2f} "
            f"{r['seconds']:7.2f} {read_gb / r['seconds']:9.2f} {written_gb / r['seconds']:12.2f} "
            f"{r['rerun_seconds']:8.3f}"
        )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n-files", type=int, default=64, help="random files to copy (0: none)")
    p.add_argument("--file-mb", type=int, default=16)
    p.add_argument(
        "--cosmoflow",
        type=int,
        default=0,
        metavar="N",
        help="also N CosmoFlow gzip TFRecords, copied and decompressed",
    )
    p.add_argument(
        "--cosmoflow-size", type=int, default=128, help="sample edge (128: 16 MiB uncompressed)"
    )
    p.add_argument("--data-dir", default="data/bench_staging", help="sources (kept between runs)")
    p.add_argument(
        "--stage-root", default=None, help="where stage dirs are made (default: the temp dir)"
    )
    p.add_argument("--verify", action="store_true", help="also measure with verify on")
    p.add_argument("--repeats", type=int, default=1)
    args = p.parse_args(argv)

    data_dir = Path(args.data_dir)
    stage_root = Path(args.stage_root or tempfile.gettempdir())
    stage_root.mkdir(parents=True, exist_ok=True)
    rows = []
    verify_modes = (False, True) if args.verify else (False,)
    if args.n_files:
        start = time.perf_counter()
        files = make_random_files(data_dir / "random" / "train", args.n_files, args.file_mb << 20)
        print(f"[bench] {len(files)} random files ready in {time.perf_counter() - start:.1f} s")
        for verify in verify_modes:
            rows += run_set(
                f"copy {args.file_mb} MB random" + (" +verify" if verify else ""),
                files,
                stage_root,
                gunzip=False,
                verify=verify,
                repeats=args.repeats,
            )
    if args.cosmoflow:
        files = make_cosmoflow_files(
            data_dir / f"cosmoflow{args.cosmoflow_size}", args.cosmoflow, args.cosmoflow_size
        )
        for gunzip in (False, True):
            for verify in verify_modes:
                label = (
                    ("gunzip" if gunzip else "copy")
                    + " CosmoFlow gz"
                    + (" +verify" if verify else "")
                )
                rows += run_set(
                    label, files, stage_root, gunzip=gunzip, verify=verify, repeats=args.repeats
                )
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
