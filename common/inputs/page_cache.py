"""Dropping input files from the OS page cache, so that a timed run reads them cold.

MLPerf logs `cache_clear`: whether caches were cleared before the run. Dropping
the whole page cache needs root (/proc/sys/vm/drop_caches); what a rank can do
is tell the kernel it will not need the pages of the files it is about to
read (posix_fadvise DONTNEED), after flushing any it wrote itself (staging).
"""

import os


def drop_from_page_cache(paths) -> tuple[int, int]:
    """Evicts each file's cached pages; returns (files done, files that could not be).

    Dirty pages (a file just staged) cannot be dropped, so each file is synced
    first. A file system without page cache (some parallel file systems) ignores
    the advice, which is harmless.
    """
    done = failed = 0
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            failed += 1
            continue
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            done += 1
        except OSError:
            failed += 1
        finally:
            os.close(fd)
    return done, failed
