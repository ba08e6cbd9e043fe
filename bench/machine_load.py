"""Whether this machine is quiet enough for a bench to print figures.

A step shares the cores with whatever else runs: above half a core's worth of other work per
core (the 1-minute load average), the figures say more about that work than about the step.
"""

import os
import time

QUIET_PER_CORE = 0.5


def per_core() -> float:
    """The 1-minute load average per core."""
    return os.getloadavg()[0] / (os.cpu_count() or 1)


def refusal(allow: bool = False) -> str | None:
    """The `error:` line a bench prints before exiting with status 2 when the machine is busy;
    None when it may measure: the load is at most QUIET_PER_CORE per core, or `allow` (a smoke run,
    whose table then says the load)."""
    load = per_core()
    if load <= QUIET_PER_CORE or allow:
        return None
    return (
        f"error: load average {load:.2f} per core (above {QUIET_PER_CORE}): other work on the cores would "
        f"make the figures meaningless; run on a quiet machine"
    )


def settle(max_wait_s: float = 180.0, poll_s: float = 5.0, sleep=time.sleep) -> float:
    """Waits until the 1-minute load per core is at most QUIET_PER_CORE, or `max_wait_s` has passed;
    returns the load then. A bench's own earlier row stays in the 1-minute average for a minute or
    two after it ends: without the wait its next row would be measured, and labelled, as if the
    machine were busy."""
    waited = 0.0
    while per_core() > QUIET_PER_CORE and waited < max_wait_s:
        sleep(poll_s)
        waited += poll_s
    return per_core()
