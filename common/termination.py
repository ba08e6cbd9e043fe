"""Stop requests (SIGUSR1, SIGTERM) and closing the books when the end is near.

SIGUSR1 is the preemption notice (SLURM's `--signal=USR1@<grace>`): the ranks
agree at the next check (`stop_requested` in a collective, common.trainer),
write a checkpoint, close the MLPerf log as aborted with that checkpoint and
exit with EXIT_PREEMPTED; nothing hurries them.

SIGTERM is the kill notice: scancel, a preemption without notice, or a
launcher ending the other ranks after one died (horovodrun, mpirun and
`srun --kill-on-bad-exit` send SIGTERM, then SIGKILL a few seconds later). A
surviving rank is then often blocked inside a collective that will never
complete (MPI does not notice the dead peer), and Python runs signal handlers
only between bytecodes of the main thread: a plain handler would never run.
So a small thread takes the signals instead: Python's C-level handler writes
the signal number to a wakeup file descriptor, the thread reads it. On
SIGTERM it runs the callback at once (close the MLPerf log as aborted: SIGKILL
may follow any moment), requests a stop like SIGUSR1, and gives the main
thread `grace_s` seconds to reach it and write the checkpoint; then it ends the
process with EXIT_TERMINATED (143 = 128 + SIGTERM).
"""

import os
import signal
import threading

EXIT_TERMINATED = 128 + int(signal.SIGTERM)
# sysexits.h EX_TEMPFAIL: stopped on request after writing a checkpoint; run it
# again with --resume (the sbatch scripts requeue the job on this code).
EXIT_PREEMPTED = 75

_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
_state = {"callback": None, "grace_s": 0.0, "requested": None, "started": False}
_stopped = threading.Event()   # the main thread finished its orderly stop: no deadline any more


def on_signals(on_sigterm, grace_s: float = 0.0) -> None:
    """Watches SIGTERM and SIGUSR1 from now on (call from the main thread).

    Args:
      on_sigterm: run on the watcher thread as soon as SIGTERM arrives, while the
        main thread may be anywhere: it must only do what is safe then (writing
        and closing a log is). A later call replaces it.
      grace_s: after SIGTERM, how long the main thread has to stop in order
        (`stopped()`) before the process exits with EXIT_TERMINATED.
    """
    _state["callback"], _state["grace_s"] = on_sigterm, float(grace_s)
    if _state["started"]:
        return
    _state["started"] = True
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    # A Python-level handler must be installed for the wakeup descriptor to get the byte.
    for signum in _SIGNALS:
        signal.signal(signum, lambda s, frame: None)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

    def watch():
        while True:
            received = os.read(read_fd, 64)
            if int(signal.SIGUSR1) in received and _state["requested"] is None:
                _state["requested"] = "SIGUSR1"
            if int(signal.SIGTERM) in received:
                _state["requested"] = "SIGTERM"
                try:
                    _state["callback"]()
                finally:
                    if not _stopped.wait(_state["grace_s"]):
                        os._exit(EXIT_TERMINATED)

    threading.Thread(target=watch, name="signal-watch", daemon=True).start()


def stop_requested() -> str | None:
    """'SIGUSR1' or 'SIGTERM' once one arrived in this process, else None."""
    return _state["requested"]


def stopped() -> None:
    """The main thread has stopped in order (checkpoint written): the SIGTERM deadline is off."""
    _stopped.set()
