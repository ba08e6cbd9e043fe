"""What every benchmark's input bench (the table's `input_bench`, run by bench/input_pipeline.py) times with;
in common/ so that a benchmark package imports nothing from bench/.

A benchmark's input-bench module (`<name>/input_bench.py`) builds its own pipelines and times
them with these functions; bench/input_pipeline.py gives it a `Run` and its `Options`, and
turns the `Row`s it returns into the printed table and the JSON.
"""

import dataclasses
import statistics
import time
from pathlib import Path

import numpy as np
import tensorflow as tf

from common import cpu  # noqa: F401  (sets the oneDNN default before TensorFlow is imported)

CHECK_VARIANT = "the train step's NaN/Inf check alone (preprocessed batch in memory)"


@dataclasses.dataclass(frozen=True)
class Run:
    """The settings every benchmark's variants share (bench/input_pipeline.py's own flags).

    Attributes:
      data_dir: where the synthetic files go, in a folder per benchmark and size.
      stage_root: a temporary folder to stage into, removed after the bench.
      n_samples: training files written and read per pass.
      passes: passes over the files per timing.
      repeats: timings per variant; the median is reported.
      readers: files in flight (data.read_parallelism / data.readers).
    """

    data_dir: Path
    stage_root: Path
    n_samples: int
    passes: int
    repeats: int
    readers: int

    def n_batches(self, batch: int) -> int:
        """Batches of one timing: `passes` passes over the files, at least one batch."""
        return max(1, self.passes * self.n_samples // batch)


@dataclasses.dataclass(frozen=True)
class Row:
    """One variant's figure; bench/input_pipeline.py adds the benchmark, per core and MB/s.

    samples_per_s is the median of the timings, spread their (slowest, fastest) samples/s.
    """

    variant: str
    sample: str
    samples_per_s: float
    mb_per_file: float
    spread: tuple[float, float] = ()

    @classmethod
    def of(cls, variant: str, sample: str, rates: list[float], mb_per_file: float) -> "Row":
        """The row of a variant timed `len(rates)` times."""
        return cls(variant, sample, statistics.median(rates), mb_per_file, (min(rates), max(rates)))


def timings(
    ds, batch_size: int, n_batches: int, repeats: int, warmup_batches: int = 2
) -> list[float]:
    """samples/s of each of `repeats` timings of n_batches batches, one iterator (this VM's figures vary
    run to run: read their spread, not one of them)."""
    it = iter(ds)
    for _ in range(warmup_batches):
        next(it)
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(n_batches):
            next(it)
        rates.append(n_batches * batch_size / (time.perf_counter() - start))
    return rates


def warm_page_cache(files) -> None:
    """Reads the files once, so that every variant reads from the page cache, not the disk."""
    for f in files:
        with open(f, "rb") as fh:
            while fh.read(16 << 20):
                pass


def finite_check_row(x_shape, y_shape, batch, repeats, sample, n_batches: int = 10) -> Row:
    """samples/s of common.run.steps.all_finite, compiled, on one float32 batch (x, y) of these shapes."""
    from common.run.steps import all_finite

    x, y = tf.random.uniform((batch, *x_shape)), tf.zeros((batch, *y_shape))
    check = tf.function(lambda x, y: all_finite([x, y]))
    check(x, y).numpy()
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(n_batches):
            check(
                x, y
            ).numpy()  # reading the flag waits for the check, as the trainer's agreement does
        rates.append(n_batches * batch / (time.perf_counter() - start))
    return Row.of(CHECK_VARIANT, sample, rates, 4 * int(np.prod(x_shape)) / 1e6)
