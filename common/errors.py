"""User-facing errors, exit codes and atomic file writes, shared by train.py and every tool (whose
`main` wrapper is common.cli.tool_main).

An `InputError` is a fault in what the user gave (a file, a config key, a sample count): it is
printed as one `error:` line naming the culprit, without a traceback, and the exit is non-zero.
"""

import enum
import os
import signal
from pathlib import Path


class ExitCode(enum.IntEnum):
    """Every exit code of train.py and the tools (docs/running.md#exit-codes; slurm/env.sh repeats
    PREEMPTED, since the sbatch scripts requeue on it without Python)."""

    OK = 0  # the target reached, or --evaluate / --benchmark / a tool done
    CRASH = 1  # an unexpected exception (traceback above); a tool's own failure verdict
    INPUT_ERROR = 2  # an InputError, or a sample holding NaN or Inf: one `error:` line names it
    NOT_CONVERGED = 3  # every epoch ran without reaching the target
    NON_FINITE_LOSS = 4  # the loss became NaN or Inf with every input finite; checkpoint kept
    PREEMPTED = 75  # EX_TEMPFAIL: stopped on SIGUSR1/SIGTERM after a checkpoint; run with --resume
    INTERRUPTED = 128 + int(signal.SIGINT)  # Ctrl-C
    TERMINATED = 128 + int(signal.SIGTERM)  # SIGTERM and no checkpoint in time


class InputError(Exception):
    """Bad input: a corrupt file, a missing key, an indivisible sample count..."""


class ConfigError(InputError):
    """An unknown, missing or ill-typed configuration key."""


def write_text_atomic(path, text: str) -> None:
    """Writes `text` to `path` so that a reader, even after a power loss, sees the old file or the
    new one: a temporary name (with the pid) in the same directory, fsync, rename, fsync of the
    directory."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
