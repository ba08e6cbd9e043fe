"""Horovod's cycle time: the value its background loop runs with, read from the environment as Horovod reads it.

Horovod's background thread (horovod/common/operations.cc, 0.28.1: BackgroundThreadLoop and
RunLoopOnce) starts one negotiation cycle every HOROVOD_CYCLE_TIME milliseconds, sleeping for
what is left of the period after the last cycle's work, and every cycle coordinates the ranks
whether or not a tensor waits. A collective submitted between cycles waits for the next one, so
a chain of collectives each depending on the last (group batch norm's: a layer after another,
forward then backward) pays up to a cycle apiece on top of its transfer (docs/figures.md).

The thread reads the variable once, as hvd.init starts it (hvd.init returns after that), so a
value set later changes nothing: it must come from the launch environment (slurm/env.sh, the
docs' `export`, horovodrun's --cycle-time-ms) or be set before Distribution() is made
(`set_for_batchnorm_groups`). No Python API reports the value, so `read` mirrors Horovod's own
reading: 1 ms by default, 0 when HOROVOD_ENABLE_XLA_OPS is set, then HOROVOD_CYCLE_TIME parsed
with C's strtof (milliseconds, fractions allowed; text that is not a number reads as 0), and
left to Horovod's autotuner (1-100 ms) when HOROVOD_AUTOTUNE is on and no value is given.

Standard library only: it is read before Horovod starts.
"""

import dataclasses
import os
import re

ENV = "HOROVOD_CYCLE_TIME"
DEFAULT_MS = 1.0  # operations.cc: SetCycleTimeMs(1)
# For runs with batch-norm groups, whose two collectives per layer each wait for a cycle. On 2 Gloo
# ranks of a 2-core AMD EPYC shared with other jobs, DeepCAM's step at reference depth with groups
# of 2 took 0.98 s at 0.1 ms against 2.38 s at 1 ms (0.22-0.32 s without the collectives); 0 ms,
# a loop that never sleeps, did no better than 1 ms there (docs/figures.md).
BATCHNORM_GROUP_MS = 0.1

# The value set_for_batchnorm_groups put into the environment (None: it set nothing), for the report.
_set_here = None
_read_at_init = None  # what at_init read after the process's first hvd.init
_FLOAT_PREFIX = re.compile(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_INT_PREFIX = re.compile(r"\s*[+-]?\d+")


@dataclasses.dataclass(frozen=True)
class CycleTime:
    """Horovod's cycle time as it reads it at init.

    Attributes:
      ms: the period in milliseconds (<= 0: no wait between cycles); the autotuner's start when `autotuned`.
      source: who chose it: "Horovod's default", "HOROVOD_CYCLE_TIME=0.1", ...
      autotuned: Horovod's autotuner varies it during the run.
    """

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


def at_init(first: bool) -> CycleTime:
    """`read()` right after hvd.init: read now when that init was the process's first (`first`), else the
    value read then, since a later hvd.init does nothing and Horovod's thread never reads the variable again."""
    global _read_at_init
    if first or _read_at_init is None:
        _read_at_init = read()
    return _read_at_init


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
