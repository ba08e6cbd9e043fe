"""Writing files so that a reader never sees half of one, even after a crash of the machine."""

import os
import shutil
from pathlib import Path


def write_text_atomic(path, text: str) -> None:
    """Writes `text` under a temporary name in the same directory, then renames it to `path`.

    The data is flushed to disk before the rename and the directory after it, so a
    node that loses power leaves the old file or the new one, never an empty one
    (a rename can reach the disk before the data it names). The pid in the
    temporary name keeps processes writing the same file apart.
    """
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def replace_folder(tmp: Path, folder: Path) -> None:
    """Publishes a complete folder under its final name, replacing one already there."""
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(tmp, folder)
