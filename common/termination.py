"""Closing the books when a launcher ends the job with SIGTERM.

When one rank dies, horovodrun, mpirun and `srun --kill-on-bad-exit` send
SIGTERM to the others, and SIGKILL a few seconds later. A surviving rank is
then often blocked inside a collective that will never complete (MPI does not
notice the dead peer), and Python runs signal handlers only between bytecodes
of the main thread: a plain handler would never run. So a small thread takes
the signal instead: Python's C-level handler writes the signal number to a
wakeup file descriptor, the thread reads it, runs the callback (close the
MLPerf log as aborted) and ends the process with 143 (128 + SIGTERM).
"""

import os
import signal
import threading

EXIT_TERMINATED = 128 + int(signal.SIGTERM)


_callback = []   # the current callback; the watcher thread is started once per process


def on_sigterm(callback) -> None:
    """Runs `callback()` then exits the process with EXIT_TERMINATED when SIGTERM arrives.

    Call from the main thread. The callback runs on another thread while the
    main thread may be anywhere: it must only do what is safe then (writing and
    closing a log is). A later call replaces the callback.
    """
    if _callback:
        _callback[0] = callback
        return
    _callback.append(callback)
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    # A Python-level handler must be installed for the wakeup descriptor to get the byte.
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

    def watch():
        while True:
            if int(signal.SIGTERM) in os.read(read_fd, 64):
                try:
                    _callback[0]()
                finally:
                    os._exit(EXIT_TERMINATED)

    threading.Thread(target=watch, name="sigterm-watch", daemon=True).start()
