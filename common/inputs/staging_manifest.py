"""The staging manifest: what each staged file was made from, so a reused stage dir is trusted
only where it is fresh (common.inputs.staging).

The manifest is one small JSON entry per staged file, in a hidden tree beside
the data (STAGE/.manifest/train/NAME.json for STAGE/train/NAME), rather than
one file per stage dir or per rank: a staged file has exactly one writer (the
rank whose shard holds it), so its entry needs no lock and no merge; the entry
holds whatever the rank count or sharding of the run that made it; and it is
small enough to replace atomically (temporary name, then os.replace) after
every file, so a killed job loses at most the files in flight. Kept out of the
data folders, so that listing or globbing them finds only samples.
"""

import dataclasses
import json
import os
from pathlib import Path

MANIFEST_VERSION = 2  # bump when the entry's meaning changes: old entries then never match
MANIFEST_DIR = (
    ".manifest"  # in the stage dir: one entry per staged file, STAGE/.manifest/SPLIT/NAME.json
)


@dataclasses.dataclass(frozen=True)
class Entry:
    """What a staged file was made from, and what it looked like when made."""

    version: int
    source: str
    source_size: int
    source_mtime_ns: int
    conversion: str  # Conversion.name, '' for a plain copy
    source_sha256: str | None  # only when staged with verify on
    staged_size: int
    staged_mtime_ns: int


def manifest_path(dst: Path) -> Path:
    # dst is STAGE/SPLIT/NAME (common.inputs.staging._targets).
    return dst.parent.parent / MANIFEST_DIR / dst.parent.name / f"{dst.name}.json"


def partial_path(path: Path) -> Path:
    # Hidden, and never matched by a data file's glob (*.tfrecord, *.npy...).
    return path.with_name(f".{path.name.lstrip('.')}.partial")


def read_entry(dst: Path) -> Entry | None:
    try:
        return Entry(**json.loads(manifest_path(dst).read_text()))
    except (FileNotFoundError, ValueError, TypeError):  # none, torn by hand, or of another version
        return None


def source_of(staged) -> str | None:
    """The source a staged file was made from (its manifest entry), or None for a file not staged here."""
    entry = read_entry(Path(staged))
    return entry.source if entry else None


def write_entry(dst: Path, entry: Entry) -> None:
    path = manifest_path(dst)
    tmp = partial_path(path)
    try:
        tmp.write_text(json.dumps(dataclasses.asdict(entry)))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
