"""Benchmark mode (train.benchmark_steps, --benchmark): throughput of the real loop, no MLPerf log;
and the input waits runtime.step_timing tells apart from its steps' times (TimedBatches).

The input pipeline alone first, then train.benchmark_steps steps of the real loop (staged
files, input pipeline, allreduce, events), timed after the warm-up steps.
"""

import time

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


class TimedBatches:
    """The training iterator, counting the seconds its callers wait in next() (for input), so that
    a step's own time can be told apart."""

    def __init__(self, iterator):
        self._iterator = iterator
        self._waited = 0.0

    def __iter__(self):
        return self

    def __next__(self):
        start = time.perf_counter()
        try:
            return next(self._iterator)
        finally:
            self._waited += time.perf_counter() - start

    def take_wait(self) -> float:
        """The seconds waited since the last call."""
        taken, self._waited = self._waited, 0.0
        return taken
