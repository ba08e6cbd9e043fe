"""Warm-up before run_start (common.run.warmup): synthetic steps through the real steps, then every
variable they changed put back, so that a run with warm-up is the run without it, bit for bit."""

import json

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from common.checkpoints import random_generators
from common.errors import ConfigError
from common.run import device_placement
from common.run.steps import TrainStep, make_eval_step
from common.run.warmup import saved_values, state_variables, synthetic_batch, warm_up
from tests import helpers

SPECS = (tf.TensorSpec((4, 8, 8, 2), tf.int16), tf.TensorSpec((4, 3), tf.float32))


class _Mean:
    """The eval metric's part make_eval_step uses: per-batch sums of |error|."""

    def update(self, y, pred):
        return tf.reduce_sum(tf.abs(y - pred), axis=0)


def _mse(y, pred):
    return tf.reduce_mean(tf.square(y - tf.cast(pred, tf.float32)))


def _run_parts():
    """A model with every kind of state a step changes: weights, batch-norm statistics, a dropout
    generator; Adam's slots and step count; accumulated gradients (2 micro-batches a step)."""
    tf_keras.backend.experimental.enable_tf_random_generator()  # as common.runtime.configure does
    tf_keras.utils.set_random_seed(3)
    inputs = tf_keras.Input(SPECS[0].shape[1:])
    x = tf_keras.layers.Conv2D(4, 3, padding="same")(inputs)
    x = tf_keras.layers.BatchNormalization()(x)
    x = tf_keras.layers.Dropout(0.5)(x)
    outputs = tf_keras.layers.Dense(3)(tf_keras.layers.GlobalAveragePooling2D()(x))
    model = tf_keras.Model(inputs, outputs)
    optimizer = tf_keras.optimizers.Adam(0.01)

    def preprocess(x, y):
        return tf.math.log1p(tf.cast(x, tf.float32)), y

    step = TrainStep(
        model, optimizer, _mse, helpers.SingleProcess(), accumulation=2, preprocess=preprocess
    )
    step.trace(SPECS)
    eval_step = make_eval_step(model, _Mean(), preprocess=preprocess, loss_fn=_mse)
    return model, optimizer, step, eval_step


@pytest.fixture
def run_parts():
    return _run_parts()


def _values(variables) -> list:
    return [v.numpy().copy() for v in variables]


def test_warm_up_puts_back_every_variable_its_steps_changed(run_parts):
    model, optimizer, step, eval_step = run_parts
    variables = state_variables(model, optimizer, step)
    names = {v.name.split("/")[-1].split(":")[0] for v in variables}
    assert {
        "kernel",
        "moving_mean",
        "moving_variance",
        "iteration",
        "StateVar",
        "grad_sum",
    } <= names, names
    before = _values(variables)
    result = warm_up(step, eval_step, SPECS, variables, steps=2)
    assert result.steps == 2 and result.variables == len(variables) and result.seconds > 0
    for variable, value in zip(variables, before):
        assert np.array_equal(variable.numpy(), value), variable.name

    # The negative control: the same steps without putting the state back change all of it.
    batch = synthetic_batch(SPECS)
    for _ in range(2):
        step(iter([batch, batch]))
    step._accumulate(*batch)  # leaves a micro-batch in the sums, as a step half done would
    changed = {
        v.name for v, value in zip(variables, before) if not np.array_equal(v.numpy(), value)
    }
    assert changed == {v.name for v in variables}, sorted({v.name for v in variables} - changed)
    assert len(random_generators(model)) == 1


class _GpuVariable:
    """A stand-in for a variable on a GPU (none exists here): its device string and its values."""

    device = "/job:localhost/replica:0/task:0/device:GPU:0"

    def __init__(self, values):
        self._values = values

    def numpy(self):
        return self._values.copy()


def test_the_saved_state_leaves_a_gpus_memory_and_keeps_a_cpus_values():
    """A GPU's variables are saved to host memory (NumPy); a CPU's as tensors sharing their buffer,
    which an optimizer's update in place must not reach (copy-on-write)."""
    on_gpu, on_cpu = _GpuVariable(np.ones(4)), tf.Variable(tf.ones([4096]))
    gpu_saved, cpu_saved = saved_values([on_gpu, on_cpu])
    assert isinstance(gpu_saved, np.ndarray) and np.array_equal(gpu_saved, np.ones(4))
    assert isinstance(cpu_saved, tf.Tensor) and "CPU" in cpu_saved.device
    tf_keras.optimizers.SGD(1.0).apply_gradients(
        [(tf.ones([4096]), on_cpu)]
    )  # ResourceApplyGradientDescent
    assert np.all(on_cpu.numpy() == 0.0) and np.all(cpu_saved.numpy() == 1.0)


def test_synthetic_batches_have_the_specs_and_finite_values_in_range():
    x, y = synthetic_batch(SPECS)
    assert (x.shape, x.dtype, y.shape, y.dtype) == (
        SPECS[0].shape,
        tf.int16,
        SPECS[1].shape,
        tf.float32,
    )
    assert 0 <= int(tf.reduce_min(x)) and int(tf.reduce_max(x)) < 3
    assert np.isfinite(y.numpy()).all() and float(tf.reduce_max(y)) < 1.0


# A deterministic CosmoFlow run with warm-up ends as the one without it, bit for bit.
RUN = [
    "--n-train",
    "16",
    "--n-valid",
    "8",
    "--batch-size",
    "4",
    "--n-epochs",
    "2",
    "--deterministic",
    "--set",
    "model.dropout=0.5",
    "--set",
    "train.stop_at_target=false",
    "--set",
    "train.checkpoint_every=2",
    "--set",
    "target_mae=10",
]


def _final_weights(out) -> dict:
    folder = sorted((out / "checkpoints").iterdir())[-1]
    reader = tf.train.load_checkpoint(str(folder / "ckpt"))
    return {
        n: reader.get_tensor(n)
        for n in reader.get_variable_to_shape_map()
        if not n.startswith("_CHECKPOINT")
    }


def test_a_run_with_warm_up_ends_bitwise_as_one_without(cosmo_data, tiny_config, tmp_path):
    runs = {}
    for steps in (0, 3):
        out = tmp_path / f"warmup{steps}"
        # runtime.step_timing (the [timing] line) in one of them: a measurement changes no weight.
        timing = ["--set", "runtime.step_timing=true"] if steps else []
        proc = helpers.run(
            helpers.train_cmd(
                "cosmoflow",
                tiny_config,
                "--data-dir",
                cosmo_data,
                "--output-dir",
                out,
                *RUN,
                "--set",
                f"train.warmup_steps={steps}",
                *timing,
            )
        )
        assert proc.returncode == 0, helpers.failure_output(proc)
        runs[steps] = (proc.stdout, out)
    with_warmup, without = runs[3], runs[0]
    assert "[init] warm-up: 3 synthetic step(s) in" in with_warmup[0]
    assert "warm-up:" not in without[0]
    # The timed run times its first epoch's steps; the line and summary.json agree. The other times none.
    stdout, out = with_warmup
    history = json.loads((out / "summary.json").read_text())["history"]
    assert "first_step_s" in history[0] and "first_step_s" not in history[1]
    first = history[0]
    assert (
        f"[timing] first step {first['first_step_s']:.3f} s, median {first['median_step_s']:.3f} s"
        in stdout
    )
    assert f"90th percentile {first['p90_step_s']:.3f} s" in stdout
    assert first["median_step_s"] <= first["p90_step_s"]
    assert "[timing]" not in without[0]
    assert "first_step_s" not in json.loads((without[1] / "summary.json").read_text())["history"][0]
    want, got = _final_weights(without[1]), _final_weights(with_warmup[1])
    assert (
        want.keys() == got.keys()
        and any("optimizer" in n for n in want)
        and any("rng" in n for n in want)
    )
    unequal = [n for n in want if not np.array_equal(want[n], got[n])]
    assert not unequal, unequal


# What a GPU run would add to a step's placement: an op left on the CPU, reading a tensor copied
# from the GPU (tests/test_device_placement.py has the rule).
CPU, GPU = "/device:CPU:0", "/device:GPU:0"
FALLBACK = [
    device_placement.PlacedOp("pool/_0", "_Send", GPU, ("pool",), "edge_1_pool"),
    device_placement.PlacedOp("pool/_1", "_Recv", CPU, (), "edge_1_pool"),
    device_placement.PlacedOp("grad/MaxPool3DGrad", "MaxPool3DGrad", CPU, ("pool/_1",)),
]


def test_on_a_gpu_warm_up_ends_the_run_naming_an_op_left_on_the_cpu(monkeypatch):
    """With allow_cpu_ops (a GPU run's), warm-up collects the placement of the steps' first calls
    and ends the run on an op left on the CPU, unless allowed; a CPU run (None) collects nothing."""
    collected = []

    def placement_and_a_fallback(run):
        collected.append(real(run))
        return collected[-1] + FALLBACK

    real = device_placement.placement_of
    monkeypatch.setattr(device_placement, "placement_of", placement_and_a_fallback)
    model, optimizer, step, eval_step = _run_parts()
    variables = state_variables(model, optimizer, step)
    with pytest.raises(ConfigError, match=r"MaxPool3DGrad x1 \(e.g. grad/MaxPool3DGrad\)"):
        warm_up(step, eval_step, SPECS, variables, steps=1, allow_cpu_ops=())
    # The train step's ops (its gradients) and the eval step's (its metric's Abs) placed.
    assert any(op.name.startswith("gradient_tape/") for op in collected[0])
    assert "Abs" in {op.type for op in collected[0]}

    model, optimizer, step, eval_step = _run_parts()
    variables = state_variables(model, optimizer, step)
    before = _values(variables)
    assert warm_up(step, eval_step, SPECS, variables, 1, allow_cpu_ops=("MaxPool3DGrad",)).steps
    assert all(np.array_equal(v.numpy(), b) for v, b in zip(variables, before))
    assert len(collected) == 2
    # A CPU run: no collection, and the steps still ran for the first time.
    model, optimizer, step, eval_step = _run_parts()
    warm_up(step, eval_step, SPECS, state_variables(model, optimizer, step), 1)
    assert len(collected) == 2
    # Steps already run are not placed again: the check says so rather than pass.
    monkeypatch.undo()
    with pytest.raises(RuntimeError, match="no placement recorded"):
        warm_up(
            step, eval_step, SPECS, state_variables(model, optimizer, step), 1, allow_cpu_ops=()
        )
