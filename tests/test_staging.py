import collections
import errno
import gzip
import os
import re
import threading

import pytest

from common.errors import InputError
from common.inputs import staging, staging_layouts, staging_manifest
from common.inputs.staging import stage_files
from common.inputs.staging_layouts import GUNZIP


def make(tmp_path, n=3, size=1000):
    src = tmp_path / "src" / "train"
    src.mkdir(parents=True, exist_ok=True)
    files = []
    for i in range(n):
        p = src / f"f{i}.tfrecord"
        p.write_bytes(os.urandom(size + i))
        files.append(str(p))
    return files


def rewrite(path, data, mtime_ns=None):
    """New content; the mtime set explicitly, as the kernel's clock may not tick between two writes."""
    st = os.stat(path)
    with open(path, "wb") as f:
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9 if mtime_ns is None else mtime_ns))


def read(path):
    with open(path, "rb") as f:
        return f.read()


EXPECTED_IN_STAGE = re.compile(
    r"[^/]+/[^/.][^/]*\.tfrecord"  # SPLIT/NAME
    rf"|{re.escape(staging_manifest.MANIFEST_DIR)}/[^/]+/[^/]+\.tfrecord\.json"
)  # its entry


def leftovers(stage):
    """Files in a stage dir other than staged data and manifest entries (temporary files...)."""
    relative = (p.relative_to(stage).as_posix() for p in stage.rglob("*") if p.is_file())
    return [name for name in relative if not EXPECTED_IN_STAGE.fullmatch(name)]


def test_copies_then_skips_what_is_staged(tmp_path):
    files = make(tmp_path)
    calls = []
    staged, stats = stage_files(files, tmp_path / "stage", progress=lambda *a: calls.append(a))
    assert [os.path.basename(p) for p in staged] == [os.path.basename(p) for p in files]
    assert all(p.startswith(str(tmp_path / "stage" / "train")) for p in staged)
    for s, d in zip(files, staged):
        assert read(s) == read(d)
    assert stats.files == 3 and stats.skipped == 0 and stats.bytes == 3000 + 0 + 1 + 2
    assert stats.gb_per_s > 0
    assert calls and calls[-1] == (3, 3, 3003)
    assert leftovers(tmp_path / "stage") == []
    assert sorted(os.listdir(tmp_path / "stage" / "train")) == [
        "f0.tfrecord",
        "f1.tfrecord",
        "f2.tfrecord",
    ]
    assert len(os.listdir(tmp_path / "stage" / staging_manifest.MANIFEST_DIR / "train")) == 3
    mtimes = [os.stat(p).st_mtime_ns for p in staged]
    calls.clear()
    _, again = stage_files(files, tmp_path / "stage", progress=lambda *a: calls.append(a))
    assert again.skipped == 3 and again.bytes == 0
    assert [os.stat(p).st_mtime_ns for p in staged] == mtimes  # not rewritten
    assert calls == [(3, 3, 0)]


def test_regenerated_source_of_same_size_is_staged_again(tmp_path):
    files = make(tmp_path)
    staged, _ = stage_files(files, tmp_path / "stage")
    new = os.urandom(1001)
    rewrite(files[1], new)
    _, stats = stage_files(files, tmp_path / "stage")
    assert stats.skipped == 2 and stats.bytes == 1001
    assert read(staged[1]) == new


def test_source_from_another_directory_is_staged_again(tmp_path):
    files = make(tmp_path, n=1)
    staged, _ = stage_files(files, tmp_path / "stage")
    other = tmp_path / "other" / "train" / "f0.tfrecord"  # same parent name and file name
    other.parent.mkdir(parents=True)
    other.write_bytes(os.urandom(1000))
    os.utime(other, ns=(os.stat(files[0]).st_atime_ns, os.stat(files[0]).st_mtime_ns))
    _, stats = stage_files([str(other)], tmp_path / "stage")
    assert stats.skipped == 0 and read(staged[0]) == read(other)


def test_verify_detects_content_changed_under_same_size_and_mtime(tmp_path):
    files = make(tmp_path, n=2)
    staged, _ = stage_files(files, tmp_path / "stage", verify=True)
    st = os.stat(files[0])
    new = os.urandom(1000)
    rewrite(files[0], new, mtime_ns=st.st_mtime_ns)
    assert (
        os.stat(files[0]).st_mtime_ns == st.st_mtime_ns and os.stat(files[0]).st_size == st.st_size
    )
    _, blind = stage_files(files, tmp_path / "stage")  # size and mtime alone cannot see it
    assert blind.skipped == 2 and read(staged[0]) != new
    _, verified = stage_files(files, tmp_path / "stage", verify=True)
    assert verified.skipped == 1 and verified.bytes == 1000 and read(staged[0]) == new


def test_verify_restages_what_was_staged_without_a_checksum(tmp_path):
    files = make(tmp_path, n=2)
    stage_files(files, tmp_path / "stage")
    _, first = stage_files(files, tmp_path / "stage", verify=True)
    assert first.skipped == 0
    _, second = stage_files(files, tmp_path / "stage", verify=True)
    assert second.skipped == 2


@pytest.mark.parametrize("foreign", [b"short", None], ids=["other size", "same size"])
def test_a_file_without_manifest_entry_is_replaced(tmp_path, foreign):
    files = make(tmp_path, n=1)
    dst = tmp_path / "stage" / "train" / "f0.tfrecord"
    dst.parent.mkdir(parents=True)
    dst.write_bytes(foreign or os.urandom(1000))
    staged, stats = stage_files(files, tmp_path / "stage")
    assert stats.skipped == 0 and read(staged[0]) == read(files[0])


def test_a_staged_file_changed_after_staging_is_replaced(tmp_path):
    files = make(tmp_path, n=1)
    staged, _ = stage_files(files, tmp_path / "stage")
    rewrite(staged[0], os.urandom(1000))  # same size, manifest entry still there
    _, stats = stage_files(files, tmp_path / "stage")
    assert stats.skipped == 0 and read(staged[0]) == read(files[0])


def test_disk_full_while_copying_leaves_no_partial_file(tmp_path, monkeypatch):
    files = make(tmp_path, n=4)
    stage = tmp_path / "stage"
    real_copy = staging_layouts.copy_file

    def copy_until_disk_full(src, tmp, verify):
        if src.name != "f2.tfrecord":
            return real_copy(src, tmp, verify)
        with open(tmp, "wb") as f:
            f.write(b"x" * 100)  # some bytes made it before the disk filled up
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp))

    monkeypatch.setattr(staging_layouts, "copy_file", copy_until_disk_full)
    for threads in (1, 4):
        with pytest.raises(InputError) as e:
            stage_files(files, stage, threads=threads)
        message = str(e.value)
        assert "\n" not in message
        assert f"into {stage}: No space left on device" in message
        assert "bytes needed" in message and "bytes free" in message
        if threads == 1:  # f0 and f1 done: f2 and f3 remain
            assert f"({1002 + 1003:,} bytes needed" in message
        assert leftovers(stage) == []
        assert not (stage / "train" / "f2.tfrecord").exists()
        assert not (stage / staging_manifest.MANIFEST_DIR / "train" / "f2.tfrecord.json").exists()


def test_too_little_free_space_fails_before_copying(tmp_path, monkeypatch):
    files = make(tmp_path, n=2)
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(staging.shutil, "disk_usage", lambda path: usage(10**6, 10**6 - 500, 500))
    expected = f"into {tmp_path / 'stage'}: 2,001 bytes needed, 500 bytes free"
    with pytest.raises(InputError, match=re.escape(expected)):
        stage_files(files, tmp_path / "stage")
    assert list((tmp_path / "stage" / "train").iterdir()) == []


def test_one_and_four_threads_stage_the_same_bytes(tmp_path, monkeypatch):
    files = make(tmp_path, n=12, size=3000)
    one, stats_one = stage_files(files, tmp_path / "one", threads=1)
    # Two copies must be in flight at once with 4 threads, else the barrier breaks.
    both_running = threading.Barrier(2, timeout=10)
    real_copy = staging_layouts.copy_file

    def copy(src, tmp, verify):
        if src.name in ("f0.tfrecord", "f1.tfrecord"):
            both_running.wait()
        return real_copy(src, tmp, verify)

    monkeypatch.setattr(staging_layouts, "copy_file", copy)
    calls = []
    four, stats_four = stage_files(
        files, tmp_path / "four", threads=4, progress=lambda *a: calls.append(a)
    )
    assert [read(p) for p in one] == [read(p) for p in four] == [read(p) for p in files]
    assert [os.path.basename(p) for p in four] == [os.path.basename(p) for p in files]
    assert stats_one.bytes == stats_four.bytes and calls[-1][0] == 12


def test_decompresses_gzip(tmp_path):
    src = tmp_path / "src" / "validation"
    src.mkdir(parents=True)
    payload = os.urandom(5000)
    (src / "a.tfrecord").write_bytes(gzip.compress(payload))
    staged, stats = stage_files([str(src / "a.tfrecord")], tmp_path / "stage", conversion=GUNZIP)
    assert read(staged[0]) == payload and stats.bytes == 5000


def test_decompressed_files_are_checked_for_freshness_too(tmp_path):
    src = tmp_path / "src" / "train" / "a.tfrecord"
    src.parent.mkdir(parents=True)
    # Stored (level 0) blocks: the compressed size depends only on the payload's length.
    old, new = os.urandom(5000), os.urandom(5000)
    src.write_bytes(gzip.compress(old, compresslevel=0, mtime=0))
    staged, _ = stage_files([str(src)], tmp_path / "stage", conversion=GUNZIP, verify=True)
    _, unchanged = stage_files([str(src)], tmp_path / "stage", conversion=GUNZIP, verify=True)
    assert unchanged.skipped == 1 and read(staged[0]) == old
    rewrite(src, gzip.compress(new, compresslevel=0, mtime=0), mtime_ns=os.stat(src).st_mtime_ns)
    _, verified = stage_files([str(src)], tmp_path / "stage", conversion=GUNZIP, verify=True)
    assert verified.skipped == 0 and read(staged[0]) == new
    rewrite(src, gzip.compress(old, compresslevel=0, mtime=0))
    _, regenerated = stage_files([str(src)], tmp_path / "stage", conversion=GUNZIP)
    assert regenerated.skipped == 0 and read(staged[0]) == old
    _, compressed = stage_files([str(src)], tmp_path / "stage")  # decompression turned off
    assert compressed.skipped == 0 and read(staged[0]) == read(src)


def test_truncated_gzip_and_missing_file_name_the_file(tmp_path):
    src = tmp_path / "src" / "train"
    src.mkdir(parents=True)
    bad = src / "bad.tfrecord"
    bad.write_bytes(gzip.compress(os.urandom(5000))[:-200])
    with pytest.raises(InputError, match=f"cannot stage {bad}"):
        stage_files([str(bad)], tmp_path / "stage", conversion=GUNZIP)
    assert not list((tmp_path / "stage" / "train").iterdir())  # no leftover temporary file
    with pytest.raises(InputError, match="missing.tfrecord: file not found"):
        stage_files([str(src / "missing.tfrecord")], tmp_path / "stage")


def test_two_sources_with_one_staged_path_are_refused(tmp_path):
    a, b = tmp_path / "a" / "train" / "x.tfrecord", tmp_path / "b" / "train" / "x.tfrecord"
    for p in (a, b):
        p.parent.mkdir(parents=True)
        p.write_bytes(b"data")
    with pytest.raises(InputError, match="both would be staged as"):
        stage_files([str(a), str(b)], tmp_path / "stage")
