"""write_text_atomic: the whole new text or the old one, synced, no temporary left behind."""

import os

from common import files


def test_atomic_write_replaces_syncs_and_leaves_nothing_behind(tmp_path, monkeypatch):
    target = tmp_path / "summary.json"
    target.write_text("old")
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    files.write_text_atomic(target, "new ✓")
    assert target.read_text(encoding="utf-8") == "new ✓"
    assert len(synced) == 2  # the data, then the directory entry
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]
