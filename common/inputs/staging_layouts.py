"""How a file is written into the stage dir: copied as is, GZIP inflated (`GUNZIP`), or in a
benchmark's own `Conversion` (DeepCAM's raw arrays); with `verify`, the SHA-256 of the source
read on the way.
"""

import dataclasses
import gzip
import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

_CHUNK = 16 << 20  # copy buffer: large reads suit parallel file systems
_GZIP_READ_BUFFER = 1 << 20  # GzipFile reads 8 KiB at a time; buffer the file below it
_GZIP_MAGIC = b"\x1f\x8b"


@dataclasses.dataclass(frozen=True)
class Conversion:
    """A change of layout on a file's way into the stage dir.

    name: recorded in each staged file's manifest entry; a run asking for another
      name stages the file again, so a name spells every parameter of the layout.
    staged_name: the staged file's name from the source's name.
    write(src, tmp, verify): writes the staged file at tmp; with verify returns the
      SHA-256 of the source's bytes, else None. A source it cannot read raises
      InputError naming src, or zlib.error / EOFError / gzip.BadGzipFile, which
      stage_files turns into one.
    size_hint(src, size): bytes the staged file will take (the free-space check).
    """

    name: str
    write: Callable[[Path, Path, bool], str | None]
    size_hint: Callable[[Path, int], int]
    staged_name: Callable[[str], str] = lambda name: name


def copy_file(src: Path, tmp: Path, verify: bool) -> str | None:
    """Copies src to tmp; with verify, returns the SHA-256 of the bytes copied (one read)."""
    if not verify:
        shutil.copyfile(src, tmp)  # in-kernel copy (sendfile) on Linux
        return None
    digest, buf = hashlib.sha256(), bytearray(_CHUNK)
    view = memoryview(buf)
    # A buffered writer: a raw write may write less than asked and say so only in its result.
    with open(src, "rb", buffering=0) as fin, open(tmp, "wb") as fout:
        while n := fin.readinto(buf):
            digest.update(view[:n])
            fout.write(view[:n])
    return digest.hexdigest()


def _gunzip(src: Path, tmp: Path, verify: bool) -> str | None:
    """Decompresses src into tmp (copies it when not gzip); with verify, returns the SHA-256 of src."""
    if not _is_gzip(src):
        return copy_file(src, tmp, verify)
    with open(src, "rb", buffering=_GZIP_READ_BUFFER) as raw, open(tmp, "wb") as fout:
        reader = _HashingReader(raw) if verify else raw
        with gzip.GzipFile(fileobj=reader, mode="rb") as fin:
            shutil.copyfileobj(fin, fout, _CHUNK)
        if verify:
            while reader.read(
                _CHUNK
            ):  # bytes past the last member, so the digest covers the whole file
                pass
            return reader.digest.hexdigest()
    return None


class _HashingReader:
    """A read-only file object that hashes every byte read through it."""

    def __init__(self, f):
        self._f = f
        self.digest = hashlib.sha256()

    def read(self, size=-1) -> bytes:
        data = self._f.read(size)
        self.digest.update(data)
        return data


def sha256_of(path) -> str:
    """The SHA-256 of a file's bytes (a Conversion's `verify` reads its source with it)."""
    with open(path, "rb", buffering=0) as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _is_gzip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == _GZIP_MAGIC


def _gunzip_size_hint(src: Path, size: int) -> int:
    """Bytes the staged file will take: for gzip, the ISIZE trailer of its (last) member.

    ISIZE is the uncompressed size modulo 2**32 and covers only the last member,
    so this is an estimate for files over 4 GiB or of several members; the
    up-front check is then approximate, and a full disk is still caught while writing.
    """
    if size < 18:  # 18: the smallest gzip file (header + trailer)
        return size
    with open(src, "rb") as f:
        if f.read(2) != _GZIP_MAGIC:
            return size
        f.seek(-4, os.SEEK_END)
        return int.from_bytes(f.read(4), "little")


# GZIP TFRecords inflated, other files copied: a staged TFRecord is read without
# zlib on every epoch (the name is kept: readers tell gzip by its magic bytes).
GUNZIP = Conversion("gunzip", write=_gunzip, size_hint=_gunzip_size_hint)
