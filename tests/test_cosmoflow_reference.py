"""Models of the MLCommons CosmoFlow reference: importing its Keras .h5 files, training from an
imported (model-only) folder, and predicting with a checkpoint (cosmoflow.import_reference, cosmoflow.predict)."""

import json
import shutil

import h5py
import numpy as np
import pytest
import tensorflow as tf
import tf_keras
import yaml

from common.model_folder import restore_model_weights, save_model_weights
from cosmoflow import import_reference, predict
from cosmoflow import model as model_lib
from tests import helpers

# Sizes the reference's build_model takes, small: 16^3 x 4 input, 2 conv layers of 2 and 4 filters.
SMALL = dict(sample_shape=(16, 16, 16, 4), conv_size=2, n_conv_layers=2, fc1_size=8, fc2_size=4)


def reference_model(
    sample_shape, conv_size, n_conv_layers, fc1_size, fc2_size, seed=3
) -> tf_keras.Model:
    """The reference's layer structure (mlcommons/hpc cosmoflow/models/cosmoflow.py), with random weights."""
    layers = tf_keras.layers
    model = tf_keras.Sequential()
    model.add(layers.Conv3D(conv_size, 3, padding="same", input_shape=sample_shape))
    model.add(layers.LeakyReLU())
    model.add(layers.MaxPool3D(pool_size=2))
    for i in range(1, n_conv_layers):
        model.add(layers.Conv3D(conv_size * 2**i, 3, padding="same"))
        model.add(layers.LeakyReLU())
        model.add(layers.MaxPool3D(pool_size=2))
    model.add(layers.Flatten())
    for size in (fc1_size, fc2_size):
        model.add(layers.Dense(size))
        model.add(layers.LeakyReLU())
        model.add(layers.Dropout(0.5))
    model.add(layers.Dense(4, activation="tanh"))
    model.add(layers.Lambda(scale_1p2))
    # Non-zero biases too, so a bias that went to the wrong layer shows; kernels
    # scaled by fan-in, so the tanh stays away from saturation.
    rng = np.random.default_rng(seed)
    for w in model.weights:
        std = 0.1 if len(w.shape) == 1 else 1.0 / np.sqrt(np.prod(w.shape[:-1]))
        w.assign(rng.normal(0.0, std, w.shape).astype(np.float32))
    return model


def scale_1p2(x):
    return x * 1.2


def write_config(path, sample_shape, conv_size, n_conv_layers, fc1_size, fc2_size):
    path.write_text(
        yaml.safe_dump(
            {
                "data": {"sample_shape": list(sample_shape)},
                "model": {
                    "conv_size": conv_size,
                    "n_conv_layers": n_conv_layers,
                    "fc1_size": fc1_size,
                    "fc2_size": fc2_size,
                    "dropout": 0.5,
                },
            }
        )
    )
    return path


@pytest.fixture(scope="module")
def reference_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("reference")
    # Layer names as the reference's own fresh process gives them (dense, dense_1, ...), whatever
    # other tests of this process built before.
    tf_keras.backend.clear_session()
    model = reference_model(**SMALL)
    model.save(d / "checkpoint-001.h5")  # what the reference's ModelCheckpoint writes
    model.save_weights(d / "weights.h5")
    x = np.random.default_rng(4).uniform(0.0, 2.0, (3, *SMALL["sample_shape"])).astype(np.float32)
    return {
        "full": d / "checkpoint-001.h5",
        "weights": d / "weights.h5",
        "config": write_config(d / "small.yaml", **SMALL),
        "x": x,
        "y": model(x, training=False).numpy(),
    }


@pytest.mark.parametrize("kind", ["full", "weights"])
def test_imported_model_predicts_as_the_reference(reference_files, tmp_path, kind, capsys):
    out = tmp_path / "imported"
    code = import_reference.main(
        [str(reference_files[kind]), str(out), "--config", str(reference_files["config"])]
    )
    assert code == 0, capsys.readouterr().err
    record = json.loads((out / "import.json").read_text())
    assert (
        record["tensors"] == 10
        and record["format"] == {"full": "full model", "weights": "weights"}[kind]
    )
    assert record["layers"] == {
        "conv1": "conv3d",
        "conv2": "conv3d_1",
        "fc1": "dense",
        "fc2": "dense_1",
        "head": "dense_2",
    }
    # Read back as predict does: the folder's own config.yaml builds the model.
    ours, cfg = predict.load_model(out)
    assert cfg.model.conv_size == 2 and cfg.data.data_dir is None
    y = ours(reference_files["x"], training=False).numpy()
    assert (
        np.abs(reference_files["y"]).max() < 1.1
        and np.ptp(reference_files["y"], axis=0).min() > 1e-3
    )
    np.testing.assert_allclose(y, reference_files["y"], rtol=1e-5, atol=1e-6)


def _damage(path, how):
    with h5py.File(path, "r+") as f:
        names = [n.decode() if isinstance(n, bytes) else str(n) for n in f.attrs["layer_names"]]
        if how == "missing_layer":
            del f["conv3d_1"]
            f.attrs["layer_names"] = [n.encode() for n in names if n != "conv3d_1"]
        elif how == "extra_layer":
            f.copy(f["dense_1"], "dense_9")
            f.attrs["layer_names"] = [n.encode() for n in names[:-1] + ["dense_9"] + names[-1:]]
        elif how == "wrong_shape":
            del f["dense_1/dense_1/bias:0"]
            f["dense_1/dense_1/bias:0"] = np.zeros(5, np.float32)
        elif how == "missing_tensor":
            del f["dense/dense/bias:0"]


@pytest.mark.parametrize(
    "how, culprit",
    [
        ("missing_layer", "no Conv3D layer for conv2"),
        ("extra_layer", "extra Dense layer 'dense_9'"),
        ("wrong_shape", "'/dense_1/dense_1/bias:0' has shape (5,)"),
        ("missing_tensor", "'/dense/dense/bias:0' is listed in weight_names but missing"),
        (
            "config_mismatch",
            "'/conv3d/conv3d/kernel:0' has shape (3, 3, 3, 4, 2), but conv1 kernel",
        ),
        ("not_hdf5", "not a readable HDF5 file"),
    ],
)
def test_a_file_that_does_not_fit_is_rejected_naming_the_culprit(
    reference_files, tmp_path, capsys, how, culprit
):
    weights = tmp_path / "weights.h5"
    shutil.copy(reference_files["weights"], weights)
    config = reference_files["config"]
    if how == "config_mismatch":
        config = write_config(tmp_path / "wider.yaml", **(SMALL | {"conv_size": 4}))
    elif how == "not_hdf5":
        weights.write_text("not an HDF5 file\n")
    else:
        _damage(weights, how)
    code = import_reference.main([str(weights), str(tmp_path / "out"), "--config", str(config)])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert culprit in lines[0] and str(weights) in lines[0], lines[0]
    assert not (tmp_path / "out").exists()


def test_command_line_exit_code_with_the_default_config(tmp_path):
    bad = tmp_path / "checkpoint-003.h5"
    bad.write_bytes(b"\x89HDF\r\n" + b"\0" * 100)
    proc = helpers.run(
        [helpers.PYTHON, "-m", "cosmoflow.import_reference", bad, tmp_path / "out"], timeout=120
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = helpers.own_lines(proc.stderr)  # one line of ours, besides TensorFlow's own log
    assert helpers.error_lines(proc.stderr) == [line] and str(bad) in line


# ------------------------------------------- training from an imported folder, then predicting
def _write_samples(folder, n, seed, gzip=True):
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        helpers.write_tfrecord(
            folder / f"univ-{i:03d}.tfrecord",
            rng.integers(0, 30, (32, 32, 32, 4)),
            rng.uniform(-1, 1, 4),
            gzip=gzip,
        )


@pytest.fixture(scope="module")
def imported_run(tmp_path_factory, tiny_config):
    """A model-only folder (as an import writes), and one training epoch started from it at a tiny LR."""
    root = tmp_path_factory.mktemp("imported_run")
    _write_samples(root / "data" / "train", 16, seed=1)
    _write_samples(root / "data" / "validation", 8, seed=2)
    cfg = predict.load_model_config(tiny_config)
    tf_keras.utils.set_random_seed(99)  # not the run's seed: its own init would differ
    imported = model_lib.from_config(cfg)
    save_model_weights(imported, root / "imported")
    proc = helpers.run(
        helpers.train_cmd(
            "cosmoflow",
            tiny_config,
            "--data-dir",
            root / "data",
            "--output-dir",
            root / "run",
            "--checkpoint",
            root / "imported",
            "--n-epochs",
            "1",
            "--n-train",
            "16",
            "--n-valid",
            "8",
            # So small a step that the weights after the epoch are still the imported ones.
            "--set",
            "optimizer.base_learning_rate=1e-12",
            "--set",
            "runtime.check_log=false",
        ),
        timeout=300,
    )
    return {
        "root": root,
        "proc": proc,
        "cfg": cfg,
        "imported": [v.numpy() for v in imported.variables],
    }


def test_training_starts_from_a_model_only_folder(imported_run):
    proc, root = imported_run["proc"], imported_run["root"]
    assert (root / "run" / "summary.json").exists(), helpers.failure_output(proc)
    assert f"[init] model weights from {root / 'imported'} (model-only folder" in proc.stdout, (
        proc.stdout
    )
    assert "resumed from" not in proc.stdout
    summary = json.loads((root / "run" / "summary.json").read_text())
    assert summary["epochs"] == 1 and len(summary["history"]) == 1  # epoch 1: started at epoch 0
    # Started from trained weights: no benchmark result, and the log says so.
    assert summary["resumed_from"] == {
        "checkpoint": str((root / "imported").resolve()),
        "epoch": 0,
        "weights_only": True,
    }
    assert '"key": "resumed_from"' in (root / "run" / "mlperf.log").read_text()
    trained = model_lib.from_config(imported_run["cfg"])
    fresh = [v.numpy() for v in trained.variables]
    restore_model_weights(trained, helpers.checkpoint_after_epoch(root / "run", 1))
    for imported, after in zip(imported_run["imported"], trained.variables):
        np.testing.assert_allclose(after.numpy(), imported, atol=1e-6, err_msg=after.name)
    assert max(np.abs(a - b).max() for a, b in zip(imported_run["imported"], fresh)) > 0.01


def test_predict_command_on_a_training_checkpoint(imported_run, tmp_path):
    root = imported_run["root"]
    sample = root / "data" / "validation" / "univ-003.tfrecord"
    checkpoint = helpers.checkpoint_after_epoch(root / "run", 1)
    proc = helpers.run(
        [helpers.PYTHON, "-m", "cosmoflow.predict", checkpoint, sample, "--out", tmp_path / "pred"],
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "pred" / "univ-003.prediction.json").read_text())
    [s] = report["samples"]
    # The oracle: the checkpoint's model on the file's sample, log(1 + counts) as in training.
    example = tf.train.Example.FromString(
        next(iter(tf.data.TFRecordDataset(str(sample), "GZIP"))).numpy()
    )
    x = np.frombuffer(example.features.feature["x"].bytes_list.value[0], np.int16).reshape(
        1, 32, 32, 32, 4
    )
    target = list(example.features.feature["y"].float_list.value)
    model = model_lib.from_config(imported_run["cfg"])
    restore_model_weights(model, checkpoint)
    expected = model(np.log1p(x.astype(np.float32)), training=False).numpy()[0]
    assert len(s["prediction"]) == 4 and s["target"] == pytest.approx(target)
    np.testing.assert_allclose(s["prediction"], expected, rtol=1e-5, atol=1e-6)
    assert report["mae"] == pytest.approx(np.abs(expected - np.array(target)).mean(), rel=1e-5)
    assert "sample 0: predicted " + " ".join(f"{v:+.4f}" for v in s["prediction"]) in proc.stdout
    assert f"target {' '.join(f'{v:+.4f}' for v in s['target'])}" in proc.stdout


def test_predict_reads_uncompressed_files_and_names_a_bad_one(imported_run, tmp_path, capsys):
    checkpoint = (
        imported_run["root"] / "imported"
    )  # a model-only folder: no config.yaml in or above it
    _write_samples(tmp_path / "plain", 2, seed=5, gzip=False)
    sample = tmp_path / "plain" / "univ-001.tfrecord"
    config = str(helpers.REPO / "tests" / "configs" / "cosmoflow_tiny.yaml")
    assert (
        predict.main([str(checkpoint), str(sample), "--out", str(tmp_path), "--config", config])
        == 0
    )
    assert len(json.loads((tmp_path / "univ-001.prediction.json").read_text())["samples"]) == 1
    capsys.readouterr()

    assert predict.main([str(checkpoint), str(sample)]) == 2
    assert "no config.yaml" in capsys.readouterr().err
    bad = tmp_path / "broken.tfrecord.gz"
    bad.write_bytes(sample.read_bytes()[:5000])
    assert (
        predict.main([str(checkpoint), str(bad), "--out", str(tmp_path), "--config", config]) == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("error: ") and str(bad) in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "broken.prediction.json").exists()


def test_evaluate_an_imported_model_without_training(imported_run, tmp_path):
    # --checkpoint FOLDER --evaluate: one validation pass with the imported weights, no log.
    root, cfg = imported_run["root"], imported_run["cfg"]
    proc = helpers.run(
        helpers.train_cmd(
            "cosmoflow",
            helpers.REPO / "tests/configs/cosmoflow_tiny.yaml",
            "--data-dir",
            root / "data",
            "--output-dir",
            tmp_path / "eval",
            "--checkpoint",
            root / "imported",
            "--evaluate",
            "--n-train",
            "16",
            "--n-valid",
            "8",
        ),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert summary["status"] == "evaluated" and summary["history"] == []
    assert not (tmp_path / "eval" / "mlperf.log").exists()
    # The oracle: the imported model's MAE over the 8 validation files, log(1 + counts) as in training.
    model = model_lib.from_config(cfg)
    restore_model_weights(model, root / "imported")
    errors = []
    for path in sorted((root / "data" / "validation").iterdir()):
        example = tf.train.Example.FromString(
            next(iter(tf.data.TFRecordDataset(str(path), "GZIP"))).numpy()
        )
        x = np.frombuffer(example.features.feature["x"].bytes_list.value[0], np.int16).reshape(
            1, 32, 32, 32, 4
        )
        pred = model(np.log1p(x.astype(np.float32)), training=False).numpy()[0]
        errors.append(np.abs(pred - np.array(example.features.feature["y"].float_list.value)))
    assert summary["metric"] == pytest.approx(float(np.mean(errors)), rel=1e-4)
    assert f"evaluated the model of epoch 0: eval_error {summary['metric']:.4f}" in proc.stdout
