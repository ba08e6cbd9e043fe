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


def print_table(title: str, results) -> None:
    print(f"\n{title}")
    print(f"{'measurement':58s} {'precision (mode)':24s} {'samples/s':>10s}")
    for what, precision, rate in results:
        print(f"{what:58s} {precision:24s} {rate:10.2f}")


def training_rates(task, config_path, overrides: dict, dist, device: str, batch, batch_size: int, modes,
                   warmup_steps: int, steps: int, label: str) -> list:
    """Training samples/s of `task`'s compiled step for each mode; table rows.

    Modes: 'fp32'; 'amp' (what --amp picks on this machine: fp32 on a CPU without
    native bf16); 'bf16' (mixed bf16 forced, emulated where the CPU lacks it).
    """
    import numpy as np
    import tensorflow as tf

    from common import runtime
    from common.config import load_config
    from common.steps import TrainStep

    rows = []
    for mode in modes:
        amp = {"runtime.amp": mode in ("amp", "bf16"), "runtime.amp_dtype": "bfloat16" if mode == "bf16" else "auto"}
        cfg = load_config(task.config_class, config_path, dict(overrides) | amp)
        precision, why = runtime.choose_precision(cfg.runtime, device)
        if why:
            print(f"[bench] {why}", flush=True)
        runtime.set_precision(precision)
        model = task.build_model(cfg, dist.rank_group(1))
        optimizer = runtime.wrap_optimizer(task.build_optimizer(cfg, batch_size, 100)[0])
        step = TrainStep(model, optimizer, task.loss(cfg), dist)
        rate = train_samples_per_s(step, batch, batch_size, warmup_steps, steps)
        params = int(sum(np.prod(v.shape) for v in model.trainable_variables))
        print(f"[bench] training {label}, {params:,} params, {precision}: {rate:.3f} samples/s", flush=True)
        rows.append((f"training, batch {batch_size}, {params:,} params", f"{precision} ({mode})", rate))
        tf.keras.backend.clear_session()
    return rows
