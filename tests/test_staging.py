import gzip
import os

import pytest

from common.errors import InputError
from common.staging import stage_files


def make(tmp_path, n=3, size=1000):
    src = tmp_path / "src" / "train"
    src.mkdir(parents=True)
    files = []
    for i in range(n):
        p = src / f"f{i}.tfrecord"
        p.write_bytes(os.urandom(size + i))
        files.append(str(p))
    return files


def test_copies_then_skips_what_is_staged(tmp_path):
    files = make(tmp_path)
    calls = []
    staged, stats = stage_files(files, tmp_path / "stage", progress=lambda *a: calls.append(a))
    assert [os.path.basename(p) for p in staged] == [os.path.basename(p) for p in files]
    assert all(p.startswith(str(tmp_path / "stage" / "train")) for p in staged)
    for s, d in zip(files, staged):
        assert open(s, "rb").read() == open(d, "rb").read()
    assert stats.files == 3 and stats.skipped == 0 and stats.bytes == 3000 + 0 + 1 + 2
    assert calls and calls[-1][0] == 3
    assert not list((tmp_path / "stage" / "train").glob("*.tmp.*"))
    _, again = stage_files(files, tmp_path / "stage")
    assert again.skipped == 3 and again.bytes == 0


def test_a_partial_copy_of_other_size_is_replaced(tmp_path):
    files = make(tmp_path, n=1)
    (tmp_path / "stage" / "train").mkdir(parents=True)
    (tmp_path / "stage" / "train" / "f0.tfrecord").write_bytes(b"short")
    staged, stats = stage_files(files, tmp_path / "stage")
    assert stats.skipped == 0 and open(staged[0], "rb").read() == open(files[0], "rb").read()


def test_decompresses_gzip(tmp_path):
    src = tmp_path / "src" / "validation"
    src.mkdir(parents=True)
    payload = os.urandom(5000)
    (src / "a.tfrecord").write_bytes(gzip.compress(payload))
    staged, stats = stage_files([str(src / "a.tfrecord")], tmp_path / "stage", decompress_gzip=True)
    assert open(staged[0], "rb").read() == payload and stats.bytes == 5000


def test_truncated_gzip_and_missing_file_name_the_file(tmp_path):
    src = tmp_path / "src" / "train"
    src.mkdir(parents=True)
    bad = src / "bad.tfrecord"
    bad.write_bytes(gzip.compress(os.urandom(5000))[:-200])
    with pytest.raises(InputError, match=f"cannot stage {bad}"):
        stage_files([str(bad)], tmp_path / "stage", decompress_gzip=True)
    assert not list((tmp_path / "stage" / "train").iterdir())  # no leftover temporary file
    with pytest.raises(InputError, match="missing.tfrecord: file not found"):
        stage_files([str(src / "missing.tfrecord")], tmp_path / "stage")
