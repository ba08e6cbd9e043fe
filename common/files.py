"""Writing files so that a reader never sees half of one."""

import os
from pathlib import Path


def write_text_atomic(path, text: str) -> None:
    """Writes `text` under a temporary name in the same directory, then renames it to `path`.

    The pid in the temporary name keeps processes writing the same file apart.
    """
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)
