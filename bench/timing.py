"""Timing helpers shared by the throughput benchmarks in bench/."""

import itertools
import time


def train_samples_per_s(step, batch, batch_size: int, warmup_steps: int, steps: int) -> float:
    """Samples/s of a TrainStep on one batch held in memory (compute only; warm-up not timed)."""
    same_batch = itertools.repeat(batch)   # no input pipeline in the loop
    for _ in range(warmup_steps):
        step(same_batch)
    start = time.perf_counter()
    for _ in range(steps):
        loss = step(same_batch)
    float(loss)   # waits for the last step
    return steps * batch_size / (time.perf_counter() - start)


def pipeline_samples_per_s(iterator, batch_size: int, n_batches: int, warmup_batches: int = 2) -> float:
    """Samples/s drawn from a tf.data iterator (each batch materialized)."""
    for _ in range(warmup_batches):
        next(iterator)
    start = time.perf_counter()
    for _ in range(n_batches):
        next(iterator)[0].numpy()
    return n_batches * batch_size / (time.perf_counter() - start)


def print_table(title: str, results) -> None:
    print(f"\n{title}")
    print(f"{'measurement':58s} {'precision':16s} {'samples/s':>10s}")
    for what, precision, rate in results:
        print(f"{what:58s} {precision:16s} {rate:10.2f}")
