"""Weak scaling: the model instances of a set start their timed runs together.

The set's score, time_to_train_all, runs from the first instance's run_start to the last one's
run_stop (offline.scoring). An instance that reaches run_start late (a slower start-up, staging
or warm-up on a loaded node) adds its delay to the score, and one that starts after another has
finished does not train beside it at all. The instances are separate Horovod jobs with no
collective in common, so they meet in a directory they all see (mlperf.start_barrier_dir, set by
offline.weak_scaling and slurm/weak_scaling.sbatch):

- rank 0 of each instance writes instance_<i>.ready there once its instance is ready to start
  (initialized, warmed up, data staged, page cache cleared);
- it waits until every instance has written its file or has ended (instance_<i>.gone, written by
  the launcher when an instance's job ends, so a crashed instance does not hold the others), or
  until mlperf.start_barrier_timeout_s has passed;
- then the instance's ranks meet, and run_start is logged.

A resumed instance finds the files of its first start and does not wait.
"""

import dataclasses
import time
from pathlib import Path

from common.errors import write_text_atomic

READY, GONE = "ready", "gone"
POLL_S = 0.05


def marker(directory, instance_id: int, kind: str) -> Path:
    """The file that says instance `instance_id` is `kind` (READY or GONE)."""
    return Path(directory) / f"instance_{instance_id}.{kind}"


def write_marker(directory, instance_id: int, kind: str) -> None:
    """Writes the marker, holding the time it was written (a reader never sees half of it)."""
    path = marker(directory, instance_id, kind)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, f"{time.time():.6f}\n")


@dataclasses.dataclass(frozen=True)
class Meeting:
    """How the instances met: rank 0's wait, the instances that ended before they were ready,
    and those neither ready nor ended when the wait timed out."""

    waited_s: float
    gone: tuple = ()
    missing: tuple = ()

    def line(self) -> str:
        """What rank 0's console says of it."""
        gone = f"; ended before they were ready: {list(self.gone)}" if self.gone else ""
        missing = (
            f"; not ready after the timeout, started without them: {list(self.missing)}"
            if self.missing
            else ""
        )
        return (
            f"[weak-scaling] this instance waited {self.waited_s:.2f} s for the others to be "
            f"ready{gone}{missing}"
        )


def wait_for_instances(directory, number: int, timeout_s: float, poll_s: float = POLL_S) -> Meeting:
    """Waits until each of instances 0..number-1 is ready or gone, or until `timeout_s`."""
    start = time.monotonic()
    while True:
        ready = {i for i in range(number) if marker(directory, i, READY).exists()}
        gone = {i for i in range(number) if i not in ready and marker(directory, i, GONE).exists()}
        missing = tuple(i for i in range(number) if i not in ready and i not in gone)
        waited = time.monotonic() - start
        if not missing or waited >= timeout_s:
            return Meeting(waited, tuple(sorted(gone)), missing)
        time.sleep(poll_s)


def meet_the_other_instances(mlperf, dist) -> Meeting | None:
    """Every rank: returns once this instance may start (None when no start barrier is set)."""
    if not mlperf.start_barrier_dir:
        return None
    meeting = None
    if dist.rank == 0:
        write_marker(mlperf.start_barrier_dir, mlperf.instance_id, READY)
        meeting = wait_for_instances(
            mlperf.start_barrier_dir, mlperf.number_of_instances, mlperf.start_barrier_timeout_s
        )
    dist.barrier()  # the instance's other ranks wait for its rank 0
    return meeting
