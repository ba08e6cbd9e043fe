"""Before run_start each rank evicts its input files from the page cache (common.inputs.pipeline),
so that the MLPerf log's cache_clear is true to what happened. Residency is read with
mincore(2), the kernel's own answer."""

import ctypes
import mmap
import os

import pytest

from common.inputs.pipeline import drop_from_page_cache

_PAGE = mmap.PAGESIZE


def resident_fraction(path) -> float:
    """The fraction of a file's pages in the page cache (mincore over a read-only mapping)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = os.path.getsize(path)
    pages = (size + _PAGE - 1) // _PAGE
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        vec = ctypes.create_string_buffer(pages)
        try:
            assert libc.mincore(addr, size, vec) == 0, os.strerror(ctypes.get_errno())
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)
    return sum(b & 1 for b in vec.raw) / pages


def test_input_files_leave_the_page_cache(tmp_path):
    files = []
    for i in range(3):
        path = tmp_path / f"sample-{i}.bin"
        path.write_bytes(os.urandom(4 << 20))
        path.read_bytes()  # written and read: in the page cache
        files.append(path)
    before = [resident_fraction(p) for p in files]
    if min(before) < 0.9:
        pytest.skip(f"this file system does not keep the files in the page cache ({before})")
    done, failed = drop_from_page_cache(files + [tmp_path / "missing.bin"])
    assert (done, failed) == (3, 1)
    after = [resident_fraction(p) for p in files]
    print(f"resident before {before}, after {after}")
    assert max(after) < 0.1
