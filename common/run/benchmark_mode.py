"""Benchmark mode (train.benchmark_steps, --benchmark): throughput of the real loop, no MLPerf log;
and runtime.step_timing's timed steps (StepTimer).

The input pipeline alone first, then train.benchmark_steps steps of the real loop (staged
files, input pipeline, allreduce, events), timed after the warm-up steps.
"""

import time

import numpy as np

from common.reporting.events import StepInfo
from common.run.report import RunResult


def run_benchmark(trainer, train_ds) -> RunResult:
    """Every rank: the benchmark mode of a common.run.trainer.Trainer whose run() has built it."""
    t, dist = trainer.cfg.train, trainer.dist
    accumulation = t.gradient_accumulation_frequency
    # As many batches as the timed steps read, after the warm-up steps' worth.
    from common.run.characterization import pipeline_samples_per_s

    input_rate = pipeline_samples_per_s(
        iter(train_ds),
        trainer.shards.local_batch_size,
        t.benchmark_steps * accumulation,
        warmup_batches=t.benchmark_warmup_steps * accumulation,
    )
    train_iter = iter(train_ds)
    loss = None
    for _ in range(t.benchmark_warmup_steps):
        loss = trainer.train_step(train_iter).loss
    if loss is not None:
        float(loss)  # the warm-up steps are done before the clock starts
    dist.barrier()
    start = time.perf_counter()
    for step in range(1, t.benchmark_steps + 1):
        loss = trainer.train_step(train_iter).loss
        trainer.global_step += 1
        trainer.events.on_step(StepInfo(1, step, t.benchmark_steps, trainer.global_step))
    float(loss)
    seconds = float(dist.allreduce_max([time.perf_counter() - start])[0])
    # A spatial group's ranks train the same samples: the job's rate counts groups.
    per_group = t.benchmark_steps * trainer.shards.local_batch_size * accumulation / seconds
    total = per_group * trainer.mesh.groups
    throughput = {
        "steps": t.benchmark_steps,
        "warmup_steps": t.benchmark_warmup_steps,
        "seconds": seconds,
        "samples_per_s_per_rank": total / dist.size,
        "samples_per_s": total,
        "spatial_ranks": trainer.mesh.size,
        "input_samples_per_s_per_rank": float(dist.allreduce_mean([input_rate])[0]),
        "global_batch_size": trainer.info.global_batch_size,
        "local_batch_size": trainer.shards.local_batch_size,
        "gradient_accumulation": accumulation,
        "ranks": dist.size,
        "precision": trainer.precision,
    }
    return RunResult(status="benchmarked", throughput=throughput)


def benchmark_line(name: str, b: dict) -> str:
    """The [benchmark] line of run_benchmark's throughput figures `b`."""
    return (
        f"[benchmark] {name}: {b['steps']} steps after {b['warmup_steps']} warm-up, "
        f"{b['ranks']} rank(s), global batch {b['global_batch_size']}, {b['precision']}: "
        f"{b['samples_per_s_per_rank']:.2f} samples/s per rank, {b['samples_per_s']:.2f} "
        f"samples/s in total; input pipeline alone "
        f"{b['input_samples_per_s_per_rank']:.2f} samples/s per rank"
    )


class StepTimer:
    """runtime.step_timing: the training batches, and each step run on them waited for and timed,
    its wait for input (in next()) apart, for the [timing] line."""

    def __init__(self, iterator):
        self._iterator, self._waited = iterator, 0.0
        self.step_times, self.input_waits = [], []

    def __iter__(self):
        return self

    def __next__(self):
        start = time.perf_counter()
        try:
            return next(self._iterator)
        finally:
            self._waited += time.perf_counter() - start

    def run(self, train_step):
        """`train_step` on these batches, waited for (the measurement's cost, opted into)."""
        start, self._waited = time.perf_counter(), 0.0
        result = train_step(self)
        result.loss.numpy()
        self.step_times.append(time.perf_counter() - start - self._waited)
        self.input_waits.append(self._waited)
        return result

    def figures(self) -> dict:
        """The common.reporting.events.EpochTrain fields of the steps timed ({} if none)."""
        if not self.step_times:
            return {}
        return dict(
            first_step_s=self.step_times[0],
            median_step_s=float(np.median(self.step_times)),
            p90_step_s=float(np.percentile(self.step_times, 90)),
            first_input_wait_s=self.input_waits[0],
        )


def timing_line(train) -> str:
    """The [timing] line of an epoch's common.reporting.events.EpochTrain with StepTimer's figures."""
    first, median, p90 = train.first_step_s, train.median_step_s, train.p90_step_s
    return (
        f"[timing] first step {first:.3f} s, median {median:.3f} s ({first / median:.2f}x), "
        f"90th percentile {p90:.3f} s ({p90 / median:.2f}x) over the epoch's steps, each waited "
        f"for, without their wait for input; the first batch waited "
        f"{train.first_input_wait_s:.3f} s (cold reads, buffers filling); rank 0"
    )
