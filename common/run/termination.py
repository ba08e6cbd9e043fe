"""Stop requests (SIGUSR1, SIGTERM), the ranks' agreement to stop, and closing the books in time.

SIGUSR1 is the preemption notice (SLURM's `--signal=USR1@<grace>`): the ranks
agree at the next check (`agree`, a collective of the training loop),
write a checkpoint, close the MLPerf log as aborted with that checkpoint and
exit with ExitCode.PREEMPTED; nothing hurries them.

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
process with ExitCode.TERMINATED (143 = 128 + SIGTERM).
"""

import dataclasses
import os
import signal
import threading

import numpy as np

from common.errors import ExitCode

_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
_state = {"callback": None, "grace_s": 0.0, "requested": None, "started": False}
_stopped = threading.Event()  # the main thread finished its orderly stop: no deadline any more


def on_signals(on_sigterm, grace_s: float = 0.0) -> None:
    """Watches SIGTERM and SIGUSR1 from now on (call from the main thread).

    Args:
      on_sigterm: run on the watcher thread as soon as SIGTERM arrives, while the
        main thread may be anywhere: it must only do what is safe then (writing
        and closing a log is). A later call replaces it.
      grace_s: after SIGTERM, how long the main thread has to stop in order
        (`stopped()`) before the process exits with ExitCode.TERMINATED.
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
                        os._exit(ExitCode.TERMINATED)

    threading.Thread(target=watch, name="signal-watch", daemon=True).start()


def stop_requested() -> str | None:
    """'SIGUSR1' or 'SIGTERM' once one arrived in this process, else None."""
    return _state["requested"]


def stopped() -> None:
    """The main thread has stopped in order (checkpoint written): the SIGTERM deadline is off."""
    _stopped.set()


# "No bad step" in the agreement's allreduce_max of negated steps.
_NO_STEP = 2.0**62


@dataclasses.dataclass(frozen=True)
class Agreement:
    """What every rank learnt from one `agree`: the same on every rank but `bad_input_step`."""

    stop: bool  # some rank got SIGUSR1 or SIGTERM
    bad_input_rank: int | None  # the highest rank that read a non-finite batch
    bad_input_step: int | None  # this rank's first global step with a non-finite batch
    bad_loss_step: int | None  # the first global step whose loss was not finite on some rank


def agree(dist, first_step: int, losses: np.ndarray, inputs_finite: np.ndarray) -> Agreement:
    """A collective of every rank, every `train.stop_check_steps` steps: the stop request and the
    checks of the steps since the last call share one allreduce.

    Args:
      first_step: the global step of losses[0] and inputs_finite[0].
      losses: this rank's losses of those steps.
      inputs_finite: for each of those steps, whether this rank's batch was finite.
    """
    bad_batch = _first(~np.asarray(inputs_finite, bool))
    bad_loss = _first(~np.isfinite(np.asarray(losses, np.float64)))
    # [stop, 1 + the rank of a non-finite batch, minus the first global step with a non-finite loss]
    stop, culprit, loss_step = dist.allreduce_max(
        [
            1.0 if stop_requested() else 0.0,
            0.0 if bad_batch is None else dist.rank + 1.0,
            -_NO_STEP if bad_loss is None else -float(first_step + bad_loss),
        ]
    )
    return Agreement(
        stop=bool(stop > 0),
        bad_input_rank=int(culprit) - 1 if culprit else None,
        bad_input_step=None if bad_batch is None else first_step + bad_batch,
        bad_loss_step=int(-loss_step) if loss_step > -_NO_STEP else None,
    )


def agree_to_stop(dist) -> bool:
    """A collective: True on every rank once any rank got SIGUSR1 or SIGTERM."""
    flag = 1.0 if stop_requested() else 0.0
    return bool(dist.allreduce_max([flag])[0] > 0)


def _first(flags) -> int | None:
    """The index of the first True of a bool vector, or None."""
    hits = np.flatnonzero(flags)
    return int(hits[0]) if hits.size else None
