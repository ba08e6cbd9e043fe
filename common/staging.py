"""Node-local staging: copy the files a node's ranks will read to fast local storage.

Each rank copies exactly the files of its own shard, so the local ranks of a
node copy disjoint parts of the node's block in parallel and no file is copied
twice. Each copy goes to a temporary name and is renamed when complete, so a
killed job never leaves a half-written file that a later run would trust.
Files already staged with the same size are skipped (a rerun on the same
allocation stages nothing). GZIP TFRecords may be decompressed on the way,
which trades local disk for less CPU work on every epoch.
"""

import dataclasses
import gzip
import os
import shutil
import time
import zlib
from pathlib import Path

from common.errors import InputError

_CHUNK = 16 << 20


@dataclasses.dataclass
class StageStats:
    files: int = 0
    skipped: int = 0
    bytes: int = 0
    seconds: float = 0.0


def stage_files(files, stage_dir, decompress_gzip: bool = False, progress=None) -> tuple[list[str], StageStats]:
    """Copies `files` into `stage_dir`, keeping each file's parent folder name.

    Args:
      files: source paths (this rank's shard).
      stage_dir: node-local destination (e.g. /tmp or a local NVMe mount).
      decompress_gzip: write gzip files uncompressed (TFRecord GZIP -> plain).
      progress: optional callable(done, total, bytes) called now and then.

    Returns:
      The staged paths (in the order of `files`) and the statistics.
    """
    stats = StageStats()
    start = time.perf_counter()
    staged = []
    report_every = max(1, len(files) // 10)
    for i, src in enumerate(files):
        src = Path(src)
        dst_dir = Path(stage_dir) / src.parent.name
        dst_dir.mkdir(parents=True, exist_ok=True)
        dst = dst_dir / src.name
        try:
            if decompress_gzip:
                copied = _decompress(src, dst)
            else:
                copied = _copy(src, dst)
        except FileNotFoundError:
            raise InputError(f"cannot stage {src}: file not found") from None
        except (EOFError, OSError, zlib.error) as e:
            raise InputError(f"cannot stage {src}: {' '.join(str(e).split())}") from None
        stats.files += 1
        stats.bytes += copied
        stats.skipped += copied == 0
        staged.append(str(dst))
        if progress is not None and ((i + 1) % report_every == 0 or i + 1 == len(files)):
            progress(i + 1, len(files), stats.bytes)
    stats.seconds = time.perf_counter() - start
    return staged, stats


def _copy(src: Path, dst: Path) -> int:
    size = src.stat().st_size
    if dst.exists() and dst.stat().st_size == size:
        return 0
    tmp = dst.with_name(f"{dst.name}.tmp.{os.getpid()}")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)
    return size


def _decompress(src: Path, dst: Path) -> int:
    # The decompressed size is unknown in advance; the atomic rename makes
    # existence alone a proof of completeness.
    if dst.exists():
        return 0
    tmp = dst.with_name(f"{dst.name}.tmp.{os.getpid()}")
    with open(src, "rb") as f:
        is_gzip = f.read(2) == b"\x1f\x8b"
    try:
        if not is_gzip:
            shutil.copyfile(src, tmp)
        else:
            with gzip.open(src, "rb") as fin, open(tmp, "wb") as fout:
                shutil.copyfileobj(fin, fout, _CHUNK)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, dst)
    return dst.stat().st_size
