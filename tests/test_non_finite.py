"""NaN and Inf: in a sample, a target or stats.h5 they are bad input (exit 2, the file named);
a loss that diverges with every input finite ends the run with exit 4 and a finite checkpoint."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from common.run.steps import TrainStep
from tests import helpers


def _mse(y, pred):
    return tf.reduce_mean(tf.square(pred - y))


def _first_feature_model():
    """A model that reads only the first of its 3 input features: a NaN in the others leaves the loss finite."""
    inputs = tf_keras.Input((3,))
    outputs = tf_keras.layers.Dense(1)(inputs[:, :1])
    return tf_keras.Model(inputs, outputs)


@pytest.mark.parametrize("accumulation", [1, 2])
def test_the_step_flags_a_non_finite_input_even_when_the_loss_is_finite(accumulation):
    step = TrainStep(
        _first_feature_model(),
        tf_keras.optimizers.SGD(0.1),
        _mse,
        helpers.SingleProcess(),
        accumulation=accumulation,
    )
    x, y = np.ones((4, 3), np.float32), np.ones((4, 1), np.float32)
    clean = step(iter([(x, y)] * accumulation))
    x[2, 2] = np.nan  # a feature the model never reads
    spoiled = step(iter([(x, y)] * accumulation))
    assert bool(clean.inputs_finite) and np.isfinite(clean.loss.numpy())
    assert not bool(spoiled.inputs_finite) and np.isfinite(spoiled.loss.numpy())


@pytest.mark.parametrize("compiled", [False, True], ids=["cpu", "xla"])
def test_an_update_with_non_finite_gradients_is_skipped_and_still_counted(compiled):
    model = tf_keras.Sequential([tf_keras.Input((3,)), tf_keras.layers.Dense(1)])
    optimizer = tf_keras.optimizers.SGD(0.1, momentum=0.9)
    # Compiled: the update as one XLA function, as Keras' jit_compile has it where a GPU exists.
    optimizer.jit_compile = compiled
    step = TrainStep(model, optimizer, _mse, helpers.SingleProcess())
    x, y = np.ones((4, 3), np.float32), np.ones((4, 1), np.float32)
    step(iter([(x, y)]))
    before = [v.numpy().copy() for v in model.variables + optimizer.variables[1:]]
    y[0, 0] = np.inf
    result = step(iter([(x, y)]))
    assert not np.isfinite(result.loss.numpy()) and not bool(result.inputs_finite)
    after = [v.numpy() for v in model.variables + optimizer.variables[1:]]
    assert all(
        np.array_equal(a, b) for a, b in zip(before, after)
    )  # weights and momentum as before
    assert int(optimizer.iterations.numpy()) == 2  # the schedule moves on
    y[0, 0] = 1.0
    step(iter([(x, y)]))  # the control: a finite step does change the weights
    assert not all(np.array_equal(a, v.numpy()) for a, v in zip(before, model.variables))


def _copy_deepcam(src, dst):
    helpers.copy_deepcam_subset(src, dst, n_train=8, n_valid=4)
    return dst


def _deepcam_run(data, config, out, *extra):
    # runtime.tiny: 8 training samples (all of them), 4 validation, batch 1, one epoch.
    return helpers.run(
        helpers.train_cmd(
            "deepcam",
            config,
            "--tiny",
            "--data_dir_prefix",
            data,
            "--output_dir",
            out,
            "--set",
            "staging.cache=false",
            *extra,
        ),
        timeout=300,
    )


def _error_lines(stderr: str) -> list[str]:
    """Our error lines (TensorFlow's own log lines may hold 'error:' mid-line)."""
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def _assert_named(proc, name, *words):
    """Exit 2, one error line, the last on stderr, naming `name` and saying each of `words`."""
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    errors = _error_lines(proc.stderr)
    assert len(errors) == 1 and name in errors[0], proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == errors[0]
    assert all(w in errors[0] for w in words), errors[0]
    assert "Traceback" not in proc.stderr
    return errors[0]


def _run_stop(log_path) -> dict:
    lines = [
        json.loads(line.split(":::MLLOG ", 1)[1]) for line in log_path.read_text().splitlines()
    ]
    stops = [e for e in lines if e["key"] == "run_stop"]
    assert len(stops) == 1, stops
    return stops[0]["metadata"]


# NaN read from HDF5 and -Inf read staged show both readers and both kinds of value (the other two
# pairs would repeat them: the same count of NaN and Inf); the staged reader's in the slow tier (the
# same count, after another DeepCAM trace).
@pytest.mark.parametrize(
    "value, staged", [(np.nan, False), pytest.param(-np.inf, True, marks=pytest.mark.slow)]
)
def test_a_non_finite_deepcam_field_is_named(deepcam_data, deepcam_config, tmp_path, value, staged):
    data = _copy_deepcam(deepcam_data, tmp_path / "data")
    victim = sorted((data / "train").glob("*.h5"))[3]
    helpers.spoil_deepcam_sample(victim, value, where=(10, 20, 5))
    extra = ["--stage_dir", tmp_path / "stage"] if staged else []
    proc = _deepcam_run(data, deepcam_config, tmp_path / "run", *extra)
    nan, inf = (1, 0) if np.isnan(value) else (0, 1)
    line = _assert_named(
        proc,
        victim.name,
        "climate/data",
        f"{nan} NaN and {inf} Inf",
        "height 10, width 20, channel 5",
    )
    if staged:  # the staged copy is what was read; the source is what to mend
        assert f"staged from {victim}" in line and ".raw" in line
    stop = _run_stop(tmp_path / "run" / "mlperf.log")
    assert stop["status"] == "aborted" and stop["reason"] == "non-finite input"
    assert stop["input_file"] == str(victim)


def test_a_non_finite_validation_sample_is_named(deepcam_data, deepcam_config, tmp_path):
    data = _copy_deepcam(deepcam_data, tmp_path / "data")
    victim = sorted((data / "validation").glob("*.h5"))[1]
    helpers.spoil_deepcam_sample(victim, np.nan)
    proc = _deepcam_run(data, deepcam_config, tmp_path / "run")
    _assert_named(proc, victim.name, "climate/data", "validation")
    assert _run_stop(tmp_path / "run" / "mlperf.log")["status"] == "aborted"


def test_a_non_finite_stats_file_is_named(deepcam_data, deepcam_config, tmp_path):
    data = _copy_deepcam(deepcam_data, tmp_path / "data")
    helpers.spoil_deepcam_stats(data / "stats.h5", np.nan, "climate/minval", channel=7)
    proc = _deepcam_run(data, deepcam_config, tmp_path / "run")
    _assert_named(proc, "stats.h5", "climate/minval", "channels [7]")


def _copy_cosmoflow(src, dst, n_train=16, n_valid=8):
    for split, n in (("train", n_train), ("validation", n_valid)):
        (dst / split).mkdir(parents=True)
        for f in sorted((src / split).glob("*.tfrecord"))[:n]:
            shutil.copy(f, dst / split / f.name)
    return dst


def test_a_nan_cosmoflow_target_is_named(cosmo_data, tiny_config, tmp_path):
    data = _copy_cosmoflow(cosmo_data, tmp_path / "data")
    victim = sorted((data / "train").glob("*.tfrecord"))[6]
    helpers.spoil_cosmoflow_target(victim, np.nan, index=2)
    proc = helpers.run(
        helpers.train_cmd(
            "cosmoflow",
            tiny_config,
            "--tiny",
            "--data-dir",
            data,
            "--output-dir",
            tmp_path / "run",
            "--n-train",
            "16",
        ),
        timeout=300,
    )
    _assert_named(proc, str(victim), "target 'y' holds NaN")
    stop = _run_stop(tmp_path / "run" / "mlperf.log")
    assert stop["status"] == "aborted" and stop["input_file"] == str(victim)


def test_a_nan_target_read_by_one_rank_ends_both(cosmo_data, tiny_config, tmp_path):
    from common.config import load_config
    from common.inputs.pipeline import list_files, select_and_shard
    from cosmoflow.config import CosmoFlowConfig

    data = _copy_cosmoflow(cosmo_data, tmp_path / "data")
    seed = load_config(CosmoFlowConfig, tiny_config, {"data.data_dir": str(data)}).train.seed
    shard = select_and_shard(list_files(data / "train", (".tfrecord",)), 16, 1, 2, seed, "n_train")
    victim = data / "train" / sorted(shard)[0].rsplit("/", 1)[1]  # read by rank 1 only
    helpers.spoil_cosmoflow_target(victim, np.inf, index=0)
    proc = helpers.horovodrun(
        2,
        helpers.train_cmd(
            "cosmoflow",
            tiny_config,
            "--tiny",
            "--data-dir",
            data,
            "--output-dir",
            tmp_path / "run",
            "--n-train",
            "16",
        ),
        timeout=300,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-3000:]
    # Every rank agreed and says it, naming the file rank 1 found: no rank was left waiting.
    for rank in (0, 1):
        mine = [line for line in helpers.error_lines(output) if f"error: [rank {rank}]" in line]
        assert len(mine) == 1 and str(victim) in mine[0] and "on rank 1" in mine[0], output[-3000:]
    assert _run_stop(tmp_path / "run" / "mlperf.log")["status"] == "aborted"


def test_a_diverging_run_ends_with_exit_4_and_a_finite_checkpoint(
    cosmo_data, tiny_config, tmp_path
):
    out = tmp_path / "run"
    proc = helpers.run(
        helpers.train_cmd(
            "cosmoflow",
            tiny_config,
            "--tiny",
            "--data-dir",
            cosmo_data,
            "--output-dir",
            out,
            "--set",
            "optimizer.base_learning_rate=1e12",
            "--set",
            "train.stop_check_steps=2",
        ),
        timeout=300,
    )
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-3000:]
    errors = _error_lines(proc.stderr)
    assert len(errors) == 1 and "no input file was found bad" in errors[0], proc.stderr[-3000:]
    stop = _run_stop(out / "mlperf.log")
    assert stop["status"] == "aborted" and stop["reason"] == "non-finite loss"
    assert stop["loss"] in ("nan", "inf", "-inf") and stop["step_num"] >= 1
    # The checkpoint the message names holds the last finite state, and was taken at the check.
    assert stop["checkpoint"] in errors[0]
    folder = Path(stop["checkpoint"])
    assert json.loads((folder / "state.json").read_text())["global_step"] <= stop["step_num"] + 2
    tensors = helpers.final_checkpoint_state(out)
    assert all(
        np.isfinite(t).all()
        for t in tensors.values()
        if np.issubdtype(np.asarray(t).dtype, np.floating)
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "aborted" and summary["failure"]["exit_code"] == 4
