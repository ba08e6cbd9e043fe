"""Horovod's cycle time, read from the environment as Horovod 0.28.1 reads it (operations.cc).

Horovod's background thread starts a negotiation cycle every HOROVOD_CYCLE_TIME ms; a chain of
collectives each depending on the last (group batch norm's) pays up to a cycle apiece
(docs/figures.md). The thread reads the variable once, in hvd.init: it must come from the launch
environment or be set before Distribution() (`set_for_batchnorm_groups`). Standard library only.
"""

import dataclasses
import os
import re

ENV = "HOROVOD_CYCLE_TIME"
DEFAULT_MS = 1.0  # operations.cc: SetCycleTimeMs(1)
# For runs with batch-norm groups, whose two collectives per layer each wait for a cycle: DeepCAM's
# step with groups of 2 took half as long as at 1 ms (docs/figures.md).
BATCHNORM_GROUP_MS = 0.1

# The value set_for_batchnorm_groups put into the environment (None: it set nothing), for the report.
_set_here = None
_FLOAT_PREFIX = re.compile(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_INT_PREFIX = re.compile(r"\s*[+-]?\d+")


@dataclasses.dataclass(frozen=True)
class CycleTime:
    """Horovod's cycle time as it reads it at init: the period in ms (<= 0: no wait), who chose it
    ("Horovod's default", "HOROVOD_CYCLE_TIME=0.1", ...), whether its autotuner varies it."""

    ms: float
    source: str
    autotuned: bool = False

    def describe(self) -> str:
        """'cycle time 1 ms (Horovod's default)', for the [init] line."""
        value = "tuned by Horovod's autotuner" if self.autotuned else f"{self.ms:g} ms"
        return f"cycle time {value} ({self.source})"


def read(environ=None) -> CycleTime:
    """The cycle time Horovod 0.28's background loop takes from `environ` (default: os.environ)."""
    env = os.environ if environ is None else environ
    ms, source = DEFAULT_MS, "Horovod's default"
    if _strtol(env.get("HOROVOD_ENABLE_XLA_OPS")) > 0:
        ms, source = 0.0, "Horovod's default with HOROVOD_ENABLE_XLA_OPS"
    if ENV in env:
        who = (
            ", set by the launcher for batch-norm groups"
            if _set_here is not None and env[ENV] == _set_here
            else ""
        )
        return CycleTime(_strtof(env[ENV]), f"{ENV}={env[ENV]}{who}")
    return CycleTime(ms, source, autotuned=_strtol(env.get("HOROVOD_AUTOTUNE")) > 0)


def set_for_batchnorm_groups(group_size: int, environ=None) -> bool:
    """Sets HOROVOD_CYCLE_TIME to BATCHNORM_GROUP_MS for a run with batch-norm groups (before hvd.init).

    A value already in the environment (the site's, the user's) is kept, and so is the autotuner's
    choice. Returns whether it set the variable.
    """
    global _set_here
    env = os.environ if environ is None else environ
    if group_size <= 1 or ENV in env or _strtol(env.get("HOROVOD_AUTOTUNE")) > 0:
        return False
    env[ENV] = _set_here = f"{BATCHNORM_GROUP_MS:g}"
    return True


def _strtof(text: str) -> float:
    """C's strtof on `text` for the decimal forms: the longest number at its start, 0.0 if none."""
    match = _FLOAT_PREFIX.match(text)
    return float(match.group(0)) if match else 0.0


def _strtol(text) -> int:
    """C's strtol(text, nullptr, 10): the integer at the start of `text`, 0 if none (or `text` is None)."""
    match = _INT_PREFIX.match(text or "")
    return int(match.group(0)) if match else 0
