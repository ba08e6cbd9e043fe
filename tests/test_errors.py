"""common.errors: the one table of exit codes, atomic writes; common.cli: the tools' main wrapper."""

import os
import re
import subprocess
import sys

import pytest

from common.cli import tool_main
from common.errors import ExitCode, InputError, write_text_atomic
from tests.helpers import REPO


def test_exit_codes_are_distinct_and_the_sbatch_scripts_requeue_on_preempted():
    assert len(set(ExitCode)) == len(ExitCode.__members__)
    env_sh = (REPO / "slurm" / "env.sh").read_text()
    assert f"EXIT_PREEMPTED={int(ExitCode.PREEMPTED)}" in env_sh


def test_no_module_defines_an_exit_code_of_its_own():
    """Exit codes come from the table: no `EXIT_x = <number>` constants elsewhere."""
    own = re.compile(r"^EXIT_(?!FLOW_)[A-Z_]+ = \d", re.M)  # not Xception's exit flow
    found = [
        str(p.relative_to(REPO))
        for folder in ("common", "cosmoflow", "deepcam", "offline", "bench")
        for p in (REPO / folder).rglob("*.py")
        if own.search(p.read_text())
    ]
    assert not found, found
    assert own.search("EXIT_CRASH = 1\n")  # the check sees one


def test_tool_main_turns_an_input_error_into_one_line_and_exit_2(capsys):
    @tool_main(KeyError)
    def main(argv=None):
        raise InputError(f"{argv[0]}: truncated\n  (record 3)")

    assert main(["data/x.tfrecord"]) == ExitCode.INPUT_ERROR == 2
    err = capsys.readouterr().err
    assert err == "error: data/x.tfrecord: truncated (record 3)\n"


def test_tool_main_lets_other_exceptions_through():
    @tool_main()
    def main(argv=None):
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError):
        main([])


def test_a_tool_exits_2_with_one_error_line():
    """A real tool under the wrapper, in its own process: one `error:` line, no traceback."""
    proc = subprocess.run(
        [sys.executable, "-m", "offline.scoring", "/no/such/folder"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "/no/such/folder" in lines[0], (
        proc.stderr
    )


def test_atomic_write_replaces_syncs_and_leaves_nothing_behind(tmp_path, monkeypatch):
    target = tmp_path / "summary.json"
    target.write_text("old")
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    write_text_atomic(target, "new ✓")
    assert target.read_text(encoding="utf-8") == "new ✓"
    assert len(synced) == 2  # the data, then the directory entry
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


def test_a_rank_s_error_line_is_one_write(monkeypatch):
    """Under horovodrun stderr is unbuffered and Horovod's C++ threads log to it: a line written in two
    parts (print's text, then its newline) can have theirs between them (seen in CI)."""
    from common.run import trainer

    writes = []

    class Stderr:
        def write(self, text):
            writes.append(text)

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stderr", Stderr())
    trainer._error(" [rank 1]", "a bad\n  file")
    assert writes == ["error: [rank 1] a bad file\n"]
