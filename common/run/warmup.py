"""Warm-up before run_start: `train.warmup_steps` steps and one eval step on synthetic batches of
the traced shapes, then every variable the steps changed put back (tests/test_warmup.py: bitwise).

The first step that runs pays the compile, autotuning and the first collectives' negotiation, which
the MLPerf rules put before run_start, touching no training data (as NVIDIA's v3.0 code). It is also
where an op without a kernel for the device and dtype, or (on a GPU) an op left on the CPU
(common.run.device_placement), ends the run with one line and exit 2.
"""

import dataclasses
import time

import numpy as np
import tensorflow as tf

from common.checkpoints import random_generators
from common.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class WarmupResult:
    steps: int  # optimizer steps run (each of `accumulation` micro-batches)
    seconds: float  # wall time of the steps and of putting the state back
    variables: int  # variables put back


def state_variables(model, optimizer, train_step) -> list:
    """Every variable a train or eval step can change, each once: the model's (weights, batch-norm
    statistics), the optimizer's (slots, iterations, a loss scale), the dropout generators' states,
    the train step's accumulation sums."""
    found, seen = [], set()
    for variable in (
        list(model.variables)
        + list(optimizer.variables)
        + train_step.state_variables()
        + [g.state for g in random_generators(model)]
    ):
        if variable.ref() not in seen:
            seen.add(variable.ref())
            found.append(variable)
    return found


def synthetic_batch(specs, seed: int = 0) -> tuple:
    """Tensors of the specs' shapes and dtypes, finite and in range for every task's preprocessing:
    integers in [0, 3) (counts, class ids of DeepCAM's 3 classes), floats in [0, 1). NumPy's own
    generator makes them, so TensorFlow's random state is not touched."""
    rng = np.random.default_rng(seed)
    batch = []
    for spec in specs:
        dtype = spec.dtype.as_numpy_dtype
        shape = tuple(spec.shape)
        values = rng.integers(0, 3, shape) if spec.dtype.is_integer else rng.random(shape)
        batch.append(tf.constant(values.astype(dtype)))
    return tuple(batch)


def saved_values(variables) -> list:
    """The variables' values now: a GPU's in host memory (not in the device's peak), a CPU's as a
    tensor sharing the buffer (copy-on-write: no second copy of the state in RSS)."""
    return [v.numpy() if "GPU" in v.device.upper() else tf.identity(v) for v in variables]


def warm_up(
    train_step, eval_step, specs, variables, steps: int, allow_cpu_ops=None
) -> WarmupResult:
    """Every rank: `steps` optimizer steps and one eval step on a synthetic batch, then `variables`
    (state_variables) set back. With `allow_cpu_ops` (a GPU run's runtime.allow_cpu_ops, else
    None), an op of the steps left on the CPU and not allowed ends the run (ConfigError)."""
    if steps <= 0:
        return WarmupResult(0, 0.0, 0)
    start = time.perf_counter()
    saved = saved_values(variables)
    batch = synthetic_batch(specs)

    def batches():
        while True:
            yield batch

    full = tf.constant(batch[0].shape[0])  # the eval step's n: a full batch, no padding

    def run_steps():
        feed = batches()
        loss = None
        for _ in range(steps):
            loss = train_step(feed).loss
        eval_step(*batch, full).numpy()
        float(loss)  # the steps are done before the state goes back

    try:
        if allow_cpu_ops is None:
            run_steps()
        else:  # a GPU run's check
            from common.run.device_placement import run_without_fallbacks

            run_without_fallbacks(run_steps, allow_cpu_ops)
    except (tf.errors.InvalidArgumentError, tf.errors.NotFoundError) as e:
        from common.run.device_placement import missing_kernel  # a failing warm-up only

        missing = missing_kernel(e.message)
        if missing is None:
            raise
        raise ConfigError(missing) from None
    for variable, value in zip(variables, saved):
        variable.assign(value)
    return WarmupResult(steps, time.perf_counter() - start, len(variables))
