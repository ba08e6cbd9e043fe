"""Node-local staging: copy the files a node's ranks will read to fast local storage.

Each rank copies exactly the files of its own shard, so the local ranks of a
node copy disjoint parts of the node's block in parallel and no file is copied
twice; within a rank, a small thread pool keeps several copies in flight, as a
single stream rarely draws a parallel file system's bandwidth. A `Conversion`
may change each file's layout on the way, which trades local disk for less CPU
work on every epoch: GZIP TFRecords inflated (`staging_layouts.GUNZIP`), or a benchmark's own
(DeepCAM writes HDF5 samples as raw arrays that TensorFlow reads without h5py).

What is fresh: a staged file is reused only if its manifest entry says it was
made from the source as it is now (same path, size and mtime, same
conversion, and with `verify` the same SHA-256 of the source bytes) and the
staged file itself still has the size and mtime recorded when it was made.
Anything else (no entry, a foreign file under the same name, data regenerated
in place) is staged again, so a reused stage dir never trains on stale samples.
The digest for `verify` is SHA-256: CRC-32, twice as fast, cannot see every
change, as a gzip file carries the CRC-32 of its payload and CRC is linear (the
CRC-32 of a gzip file of stored blocks is the same for every payload of one
length). SHA-256 hashes 1.5 GB/s per core on AMD EPYC, whose SHA extensions
recent Intel and Arm server cores share, against 0.7 GB/s for blake2b.

The manifest (common.inputs.staging_manifest) records what each staged file was made from.

No partial file is ever trusted or left behind: every file is written under a
temporary name in its final directory and renamed when complete; the old
entry is removed before a file is rewritten and the new one written only
after the rename, so a crash in between leaves a file without an entry, which
the next run stages again. A full disk (checked up front, and caught while
writing) is a one-line InputError that names the stage dir and the bytes
needed against the bytes free.
"""

import concurrent.futures
import dataclasses
import functools
import gzip
import os
import shutil
import time
import zlib
from pathlib import Path

from common.errors import ConfigError, InputError
from common.inputs import staging_layouts
from common.inputs import staging_manifest as manifest
from common.inputs.staging_layouts import Conversion


@dataclasses.dataclass(frozen=True)
class StageStats:
    """What staging did: of one stage_files call, or of all ranks (stage_shards)."""

    files: int = 0  # files asked for
    skipped: int = 0  # of those, already staged and fresh
    bytes: int = 0  # bytes written into the stage dir
    seconds: float = 0.0

    @property
    def gb_per_s(self) -> float:
        """Bytes written per second over the whole call (freshness checks included)."""
        return self.bytes / 1e9 / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict:
        """What summary.json says of it (gb_per_s included)."""
        return dataclasses.asdict(self) | {"gb_per_s": self.gb_per_s}

    def line(self) -> str:
        """What rank 0's console says of it."""
        return (
            f"[staging] {self.files} files ({self.skipped} already staged), "
            f"{self.bytes / 1e9:.3f} GB in {self.seconds:.2f} s = {self.gb_per_s:.3f} GB/s "
            f"(all ranks)"
        )


@dataclasses.dataclass(frozen=True)
class _Job:
    src: Path
    dst: Path
    source: os.stat_result
    fresh: bool
    size_hint: int = 0  # bytes the staged file will take (0 when fresh)
    replaces: int = 0  # bytes of the stale staged file it replaces (freed on rename)


def stage_files(
    files,
    stage_dir,
    conversion: Conversion | None = None,
    progress=None,
    *,
    verify: bool = False,
    threads: int = 4,
) -> tuple[list[str], StageStats]:
    """Copies `files` into `stage_dir`, keeping each file's parent folder name.

    Args:
      files: source paths (this rank's shard).
      stage_dir: node-local destination (e.g. /tmp or a local NVMe mount).
      conversion: the layout to write (e.g. GUNZIP); None copies each file as is.
      progress: optional callable(done, total, bytes) called now and then, always
        from the calling thread; `done` counts skipped files too.
      verify: also compare a SHA-256 of each source with the one recorded when it
        was staged. Reads every source on every call, even when nothing changed.
      threads: files staged at once; 1 stages them one after another.

    Returns:
      The staged paths (in the order of `files`) and the statistics.

    Raises:
      InputError: a missing or corrupt source, two sources with the same staged
        path, or a stage dir without room (naming the bytes needed and free).
    """
    if threads < 1:
        raise ConfigError(f"staging.threads must be at least 1, got {threads}")
    start = time.perf_counter()
    stage_dir = Path(stage_dir)
    sources = [Path(f) for f in files]
    targets = _targets(
        sources, stage_dir, conversion.staged_name if conversion else (lambda name: name)
    )
    try:
        for folder in dict.fromkeys(t.parent for t in targets):
            folder.mkdir(parents=True, exist_ok=True)
            (stage_dir / manifest.MANIFEST_DIR / folder.name).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"cannot create the stage dir {stage_dir}: {_one_line(e)}") from None

    written_total = 0
    plan = functools.partial(_plan, conversion=conversion, verify=verify)
    stage = functools.partial(_stage_one, conversion=conversion, verify=verify)
    report_every = max(1, len(sources) // 10)
    with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="stage") as pool:
        jobs = _run_all(pool, plan, list(zip(sources, targets)), on_error=_source_error)
        stale = [job for job in jobs if not job.fresh]
        skipped = len(jobs) - len(stale)
        # Each rename frees the stale copy it replaces, so only the growth must fit.
        need = sum(job.size_hint for job in stale) - sum(job.replaces for job in stale)
        free = shutil.disk_usage(stage_dir).free if stale else 0
        if need > free:
            raise InputError(
                f"cannot stage {len(stale)} files into {stage_dir}: "
                f"{need:,} bytes needed, {free:,} bytes free"
            )
        done = skipped
        if not stale and progress is not None and sources:
            progress(done, len(sources), 0)

        def finished(job, written):
            nonlocal done, need, written_total
            done += 1
            need -= written - job.replaces
            written_total += written
            if progress is not None and (done % report_every == 0 or done == len(sources)):
                progress(done, len(sources), written_total)

        def write_error(job, error):
            return _write_error(job, error, stage_dir, need)

        _run_all(pool, stage, stale, on_error=write_error, on_done=finished)
    stats = StageStats(
        files=len(sources),
        skipped=skipped,
        bytes=written_total,
        seconds=time.perf_counter() - start,
    )
    return [str(t) for t in targets], stats


def _targets(sources: list[Path], stage_dir: Path, staged_name) -> list[Path]:
    targets, seen = [], {}
    for src in sources:
        dst = stage_dir / src.parent.name / staged_name(src.name)
        if dst in seen:
            # Two writers on one staged path would interleave; the data set layout is wrong.
            raise InputError(
                f"cannot stage both {seen[dst]} and {src}: both would be staged as {dst}"
            )
        seen[dst] = src
        targets.append(dst)
    return targets


def _run_all(pool, fn, jobs, on_error, on_done=None) -> list:
    """Runs fn(job) for every job on `pool`; results in job order.

    on_done(job, result) runs in this thread, so callers' counters and progress
    callbacks need no lock. On the first failure the jobs not yet started are
    cancelled and the running ones awaited (each cleans up after itself), so no
    temporary file outlives the error raised: on_error(job, exception).
    """
    futures = {pool.submit(fn, job): i for i, job in enumerate(jobs)}
    results = [None] * len(jobs)
    failed = None
    try:
        for future in concurrent.futures.as_completed(futures):
            i = futures[future]
            try:
                results[i] = future.result()
            except Exception as e:
                failed = (jobs[i], e)
                break
            if on_done is not None:
                on_done(jobs[i], results[i])
    finally:
        # However we leave early (a failed job, Ctrl-C), start no more jobs:
        # the pool's exit would otherwise run every queued one first.
        for future in futures:
            future.cancel()
    if failed is not None:
        concurrent.futures.wait(futures)
        raise on_error(*failed) from None
    return results


def _plan(pair: tuple[Path, Path], conversion: Conversion | None, verify: bool) -> _Job:
    src, dst = pair
    source = src.stat()
    entry = manifest.read_entry(dst)
    try:
        staged = dst.stat()
    except FileNotFoundError:
        staged = None
    name = conversion.name if conversion else ""
    fresh = (
        entry is not None
        and staged is not None
        and (
            entry.version,
            entry.source,
            entry.source_size,
            entry.source_mtime_ns,
            entry.conversion,
        )
        == (
            manifest.MANIFEST_VERSION,
            os.path.abspath(src),
            source.st_size,
            source.st_mtime_ns,
            name,
        )
        and (entry.staged_size, entry.staged_mtime_ns) == (staged.st_size, staged.st_mtime_ns)
    )
    if fresh and verify:
        # Last, as it reads the whole source; an entry made without verify cannot vouch.
        fresh = (
            entry.source_sha256 is not None
            and staging_layouts.sha256_of(src) == entry.source_sha256
        )
    if fresh:
        return _Job(src, dst, source, fresh=True)
    hint = conversion.size_hint(src, source.st_size) if conversion else source.st_size
    return _Job(
        src,
        dst,
        source,
        fresh=False,
        size_hint=hint,
        replaces=staged.st_size if staged is not None else 0,
    )


def _stage_one(job: _Job, conversion: Conversion | None, verify: bool) -> int:
    """Writes job.dst from job.src (and then its manifest entry); returns the bytes written."""
    # The old entry must not vouch for whatever is at dst until the new copy is complete.
    manifest.manifest_path(job.dst).unlink(missing_ok=True)
    tmp = manifest.partial_path(job.dst)
    try:
        write = conversion.write if conversion else staging_layouts.copy_file
        digest = write(job.src, tmp, verify)
        os.replace(tmp, job.dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    staged = job.dst.stat()
    # The source's stat from before the copy: if it changed meanwhile, the next run sees a mismatch.
    entry = manifest.Entry(
        manifest.MANIFEST_VERSION,
        os.path.abspath(job.src),
        job.source.st_size,
        job.source.st_mtime_ns,
        conversion.name if conversion else "",
        digest,
        staged.st_size,
        staged.st_mtime_ns,
    )
    manifest.write_entry(job.dst, entry)
    return staged.st_size


def _source_error(job: tuple, error: Exception) -> Exception:
    src = job[0]
    if isinstance(error, FileNotFoundError) and error.filename == str(src):
        return InputError(f"cannot stage {src}: file not found")
    if isinstance(error, OSError):
        return InputError(f"cannot stage {src}: {_one_line(error)}")
    return error


def _write_error(job: _Job, error: Exception, stage_dir: Path, need: int) -> Exception:
    if isinstance(error, InputError):  # a conversion's own message, naming the source
        return error
    if isinstance(error, FileNotFoundError) and error.filename == str(job.src):
        return InputError(f"cannot stage {job.src}: file not found")
    if isinstance(
        error, (EOFError, zlib.error, gzip.BadGzipFile)
    ):  # a corrupt source, not a disk problem
        return InputError(f"cannot stage {job.src}: {_one_line(error)}")
    if isinstance(error, OSError):
        return InputError(
            f"cannot stage {job.src} into {stage_dir}: {error.strerror or _one_line(error)} "
            f"({max(need, 0):,} bytes needed, {_free_bytes(stage_dir)} bytes free)"
        )
    return error


def _free_bytes(stage_dir: Path) -> str:
    try:
        return f"{shutil.disk_usage(stage_dir).free:,}"
    except OSError:  # the stage dir itself is gone
        return "unknown"


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())


def stage_shards(cfg, dist, shards, progress=None, conversion: Conversion | None = None):
    """Every rank: stages its shard into the node-local staging.stage_dir (in `conversion`'s layout,
    or copied); (the Shards with the staged paths, StageStats of all ranks).

    MLPerf HPC lets staging sit outside the timed region: the trainer runs it after init_stop and
    before run_start (`staging_start`/`staging_stop` in the log), and builds its datasets once,
    from the staged paths.
    """
    s = cfg.staging
    # '{node}' / '{host}' in the path name a directory per node, for nodes
    # that share a file system (or several "nodes" on one machine).
    stage_dir = Path(
        s.stage_dir.replace("{node}", str(dist.node_rank)).replace("{host}", dist.hostname)
    )
    start = time.perf_counter()
    options = dict(verify=s.verify, threads=s.threads)
    train, st = stage_files(shards.train_files, stage_dir, conversion, progress, **options)
    valid, sv = stage_files(shards.valid_files, stage_dir, conversion, progress, **options)
    seconds = time.perf_counter() - start
    # Staging ends when the slowest rank is done; bytes add up over ranks.
    nbytes, nfiles, nskipped = dist.allreduce_sum(
        [st.bytes + sv.bytes, st.files + sv.files, st.skipped + sv.skipped]
    )
    seconds = float(dist.allreduce_max([seconds])[0])
    stats = StageStats(files=int(nfiles), skipped=int(nskipped), bytes=int(nbytes), seconds=seconds)
    return dataclasses.replace(shards, train_files=train, valid_files=valid), stats
