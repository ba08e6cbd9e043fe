"""Signals (common/run/termination.py): SIGTERM runs the callback even while the main thread is
blocked in C code, and ends the process after the grace time unless it stopped in order;
SIGUSR1 only asks for a stop."""

import signal
import subprocess
import sys
import time

from tests import helpers

BLOCKED = """
import os, sys
from pathlib import Path
from common.run import termination
import signal
termination.on_signals(lambda: Path(sys.argv[1]).write_text("log closed"), grace_s=float(sys.argv[2]))
# The main thread blocked in C where no Python runs, as a rank inside a collective
# with a dead peer: the signals masked here, so they never interrupt this thread.
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGUSR1})
print("ready", flush=True)
r, w = os.pipe()
os.read(r, 1)
"""

ORDERLY = """
import sys, time
from common.run import termination
termination.on_signals(lambda: print("log closed", flush=True), grace_s=30)
print("ready", flush=True)
while termination.stop_requested() is None:   # the training loop's step boundary
    time.sleep(0.01)
print("stop requested:", termination.stop_requested(), flush=True)
time.sleep(0.5)                                 # the checkpoint
termination.stopped()
time.sleep(0.2)
sys.exit(75)
"""


def _start(code, *args):
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *map(str, args)],
        env=helpers.env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.2)
    return proc


def test_sigterm_closes_the_books_while_the_main_thread_is_blocked(tmp_path):
    marker = tmp_path / "closed.txt"
    proc = _start(BLOCKED, marker, 0)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 128 + signal.SIGTERM
    assert marker.read_text() == "log closed"


def test_sigterm_waits_the_grace_time_for_an_orderly_stop_then_exits_143(tmp_path):
    marker = tmp_path / "closed.txt"
    proc = _start(BLOCKED, marker, 1.5)
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 128 + signal.SIGTERM
    assert 1.4 < time.monotonic() - start < 10
    assert marker.read_text() == "log closed"  # at once, not after the grace time


def test_sigusr1_asks_for_a_stop_and_nothing_more(tmp_path):
    proc = _start(BLOCKED, tmp_path / "closed.txt", 0)
    proc.send_signal(signal.SIGUSR1)
    time.sleep(1.0)
    assert proc.poll() is None and not (tmp_path / "closed.txt").exists()
    proc.kill()
    proc.wait()


def test_an_orderly_stop_within_the_grace_time_keeps_its_own_exit_code():
    for signum, name in ((signal.SIGUSR1, "SIGUSR1"), (signal.SIGTERM, "SIGTERM")):
        proc = _start(ORDERLY)
        proc.send_signal(signum)
        out = proc.communicate(timeout=20)[0]
        assert proc.returncode == 75, out
        assert f"stop requested: {name}" in out
        assert ("log closed" in out) == (signum == signal.SIGTERM)
