"""User-facing errors, the table of exit codes, and the `main` wrapper of the command-line tools.

An `InputError` is a problem with what the user gave us (a file, a directory, a
config key, a sample count). The launcher and every tool print it as one line
naming the culprit and exit non-zero, without a traceback: the traceback would
point at our code, while the fault is in the input.
"""

import enum
import functools
import signal
import sys


class ExitCode(enum.IntEnum):
    """Every exit code of train.py and the tools (docs/running.md#exit-codes; slurm/env.sh repeats
    PREEMPTED, since the sbatch scripts requeue on it without Python)."""

    OK = 0  # the target reached, or --evaluate / --benchmark / a tool done
    CRASH = 1  # an unexpected exception (traceback above); a tool's own failure verdict
    INPUT_ERROR = 2  # an InputError, or a sample holding NaN or Inf: one `error:` line names it
    NOT_CONVERGED = 3  # every epoch ran without reaching the target
    NON_FINITE_LOSS = (
        4  # the loss became NaN or Inf with every input finite (diverged); checkpoint kept
    )
    # sysexits.h EX_TEMPFAIL: stopped on SIGUSR1/SIGTERM after writing a checkpoint; run again with
    # --resume (the sbatch scripts requeue the job on this code)
    PREEMPTED = 75
    INTERRUPTED = 128 + int(signal.SIGINT)  # Ctrl-C
    TERMINATED = 128 + int(signal.SIGTERM)  # SIGTERM and no checkpoint in time


class InputError(Exception):
    """Bad input: a corrupt file, a missing key, an indivisible sample count..."""


class ConfigError(InputError):
    """An unknown, missing or ill-typed configuration key."""


def error_line(error: BaseException) -> str:
    """The one line a person reads for `error`: its text with line breaks and runs of spaces folded."""
    return "error: " + " ".join(str(error).split())


def tool_main(*also: type):
    """Decorates a tool's `main(argv=None) -> int`: an InputError (or one of the exception types
    `also`) becomes one `error:` line on stderr and ExitCode.INPUT_ERROR, instead of a traceback."""
    caught = (InputError, *also)

    def decorate(main):
        @functools.wraps(main)
        def wrapped(argv=None) -> int:
            try:
                return main(argv)
            except caught as e:
                print(error_line(e), file=sys.stderr)
                return ExitCode.INPUT_ERROR

        return wrapped

    return decorate
