"""Stop requests, the ranks' agreement to stop, and why a run could not go on (`Failure`, raised
on every rank alike by common.run.failures).

SIGUSR1 (SLURM's `--signal=USR1@<grace>`) asks for a stop: the ranks agree at the next check,
checkpoint, close the MLPerf log as aborted and exit with ExitCode.PREEMPTED. SIGTERM (scancel, a
launcher ending the ranks after one died) may find the main thread blocked in a collective that
never completes, where Python runs no handler: a thread reads the signal from a wakeup fd, closes
the log at once, requests a stop, and ends the process with ExitCode.TERMINATED if the main thread
has not stopped in order within `grace_s`.
"""

import contextlib
import dataclasses
import os
import signal
import threading

import numpy as np
import tensorflow as tf

from common.errors import ExitCode, InputError

_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
_state = {"callback": None, "grace_s": 0.0, "requested": None, "started": False}
_stopped = threading.Event()  # the main thread finished its orderly stop: no deadline any more


def on_signals(on_sigterm, grace_s: float = 0.0) -> None:
    """Watches SIGTERM and SIGUSR1 from now on (call from the main thread). `on_sigterm` runs on the
    watcher thread when SIGTERM arrives (a later call replaces it); the main thread then has
    `grace_s` seconds to call `stopped()` before the process exits with ExitCode.TERMINATED."""
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
    """A collective, every `train.stop_check_steps` steps: the stop request and the checks of this
    rank's `losses` and `inputs_finite` of the steps since the last call (from global step
    `first_step`) share one allreduce."""
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


# Bad input names its file: a read or parse error (`naming_bad_files`) on the rank that hit it, a
# batch with NaN or Inf on every rank (common.run.failures, which raises RunFailed).
NON_FINITE_INPUT = "non-finite input"
NON_FINITE_LOSS = "non-finite loss"

# summary.json's "failure" has, in this order, the keys of its reason (None values kept): an input
# failure names no loss or checkpoint, a loss failure no input file.
_SUMMARY_KEYS = {
    NON_FINITE_INPUT: ("reason", "exit_code", "input_file", "step_num", "message"),
    NON_FINITE_LOSS: ("reason", "exit_code", "step_num", "loss", "checkpoint", "message"),
}


@dataclasses.dataclass(frozen=True)
class Failure:
    """Why a run could not go on, the same on every rank (the MLPerf log's run_stop, the console, summary.json)."""

    reason: str  # NON_FINITE_INPUT or NON_FINITE_LOSS
    exit_code: int  # common.errors: the process's exit code
    message: str  # the launcher's `error:` line
    step_num: int  # the global step of the bad batch or loss (for validation: the run's step)
    loss: str | None = None  # non-finite loss: the global loss of that step, as text ("nan", "inf")
    # Non-finite input: the file (its source when staged); None if none was found.
    input_file: str | None = None
    checkpoint: str | None = None  # non-finite loss: the last finite state; None if none written

    def as_dict(self) -> dict:
        """What summary.json says of it: the keys of its reason."""
        return {key: getattr(self, key) for key in _SUMMARY_KEYS[self.reason]}


class RunFailed(Exception):
    """Every rank agreed that the run cannot go on; raised on every rank at the same point."""

    def __init__(self, failure: Failure):
        super().__init__(failure.message)
        self.failure = failure


@contextlib.contextmanager
def naming_bad_files(task, files):
    """Turns a TensorFlow read/parse error into an InputError naming the bad file of `files`."""
    try:
        yield
    except tf.errors.OpError:
        found = task.find_bad_file(files)
        if found:
            raise InputError(found) from None
        raise
