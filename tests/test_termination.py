"""SIGTERM runs the callback even while the main thread is blocked in C code (common/termination.py)."""

import signal
import subprocess
import sys
import time

from tests import helpers

BLOCKED = """
import os, sys
from pathlib import Path
from common.termination import on_sigterm
import signal
on_sigterm(lambda: Path(sys.argv[1]).write_text("log closed"))
# The main thread blocked in C where no Python runs, as a rank inside a collective
# with a dead peer: SIGTERM masked here, so it never interrupts this thread.
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
print("ready", flush=True)
r, w = os.pipe()
os.read(r, 1)
"""


def test_sigterm_closes_the_books_while_the_main_thread_is_blocked(tmp_path):
    marker = tmp_path / "closed.txt"
    proc = subprocess.Popen([sys.executable, "-c", BLOCKED, str(marker)], env=helpers.env(),
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 128 + signal.SIGTERM
    assert marker.read_text() == "log closed"
