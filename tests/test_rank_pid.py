"""helpers._rank_pid, which the kill and signal tests use to find the rank they hit: only a Python of
the test's own run, never another run's rank or a launcher. CI runs two test files at once; a search
by "/train.py" alone once killed the other file's ranks and its srun."""

import os
import subprocess
import sys
import time

import pytest

from tests import helpers


@pytest.fixture
def processes(tmp_path):
    started = []

    def start(argv, rank):
        proc = subprocess.Popen(
            [str(a) for a in argv], env=dict(os.environ, HOROVOD_RANK=str(rank))
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def _settle(*procs):
    """Until each has exec'd (its /proc cmdline is its own argv, not its parent's)."""
    deadline = time.monotonic() + 10
    for proc in procs:
        while b"sleep" not in open(f"/proc/{proc.pid}/cmdline", "rb").read():
            assert time.monotonic() < deadline
            time.sleep(0.01)


def test_the_rank_of_this_run_is_found_and_nothing_else(tmp_path, processes):
    mine, other = tmp_path / "run", tmp_path / "run2"
    sleeper = "import time; time.sleep(60)"
    rank1 = processes([sys.executable, "-c", sleeper, "--output-dir", mine], 1)
    rank0 = processes([sys.executable, "-c", sleeper, "--output-dir", mine], 0)
    elsewhere = processes([sys.executable, "-c", sleeper, "--output-dir", other], 1)  # another run
    launcher = processes(
        ["bash", "-c", "sleep 60; true", "srun", "--output-dir", mine], 1
    )  # not a Python
    _settle(rank1, rank0, elsewhere, launcher)
    assert helpers._rank_pid(1, mine) == rank1.pid
    assert helpers._rank_pid(0, mine) == rank0.pid
    assert helpers._rank_pid(1, other) == elsewhere.pid
    rank1.kill()
    rank1.wait()
    # Negative control: with its own rank 1 gone, neither the other run's rank 1 (a prefix of whose
    # folder is this run's) nor the bash launcher holding this run's folder is taken.
    assert helpers._rank_pid(1, mine) is None
