"""Reader tests on files written with TensorFlow's own TFRecordWriter."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from cosmoflow import data, sample_files
from tests.helpers import write_tfrecord

SHAPE = (8, 8, 8, 4)


def make_files(directory, n, gzip=True, seed=0):
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    samples = []
    for i in range(n):
        x = rng.integers(0, 50, size=SHAPE).astype(np.int16)
        y = rng.uniform(-1, 1, 4).astype(np.float32)
        write_tfrecord(directory / f"s{i:03d}.tfrecord", x, y, gzip=gzip)
        samples.append((x, y))
    return sorted(str(p) for p in directory.iterdir()), samples


@pytest.mark.parametrize("gzip", [True, False])
def test_reads_public_layout_gzip_and_plain(tmp_path, gzip):
    files, samples = make_files(tmp_path / "d", 4, gzip=gzip)
    assert data.detect_compression(files[0]) == ("GZIP" if gzip else "")
    ds = data.make_dataset(
        files,
        SHAPE,
        batch_size=2,
        compression=data.resolve_compression("auto", files),
        training=False,
    )
    xs, ys = zip(*[(x.numpy(), y.numpy()) for x, y in ds])
    x = np.concatenate(xs)
    y = np.concatenate(ys)
    # The counts as stored (int16, half the bytes of float32), C-order layout kept.
    assert x.shape == (4,) + SHAPE and x.dtype == np.int16
    for i, (x_ref, y_ref) in enumerate(samples):
        np.testing.assert_array_equal(x[i], x_ref)
        np.testing.assert_allclose(y[i], y_ref)
    assert x[0, 1, 2, 3, 0] == samples[0][0][1, 2, 3, 0]


def test_transforms_of_a_batch():
    x = np.arange(2 * 2 * 2 * 2 * 4, dtype=np.int16).reshape(2, 2, 2, 2, 4)
    logged = data.log_transform(tf.constant(x)).numpy()
    assert logged.dtype == np.float32
    np.testing.assert_allclose(logged, np.log1p(x.astype(np.float32)), rtol=1e-6)
    # Each sample by its own mean, not by the batch's.
    normalized = data.mean_normalize(tf.constant(x)).numpy()
    for i in range(2):
        np.testing.assert_allclose(normalized[i], x[i] / x[i].mean(), rtol=1e-6)
        assert normalized[i].mean() == pytest.approx(1.0)


def test_the_task_transforms_inside_the_step(tmp_path):
    # The pipeline yields int16; CosmoFlowTask.preprocess_batch makes the model's float32 input.
    from cosmoflow.config import CosmoFlowConfig
    from cosmoflow.task import CosmoFlowTask

    counts = np.arange(2 * 8 * 8 * 8 * 4, dtype=np.int16).reshape(2, 8, 8, 8, 4) % 50
    x = tf.constant(counts)
    per_sample_mean = counts.astype(np.float64).mean(axis=(1, 2, 3, 4), keepdims=True)
    for transform, expected in (
        ("log", np.log1p(counts.astype(np.float32))),
        ("mean", counts / per_sample_mean),
    ):
        cfg = CosmoFlowConfig(
            data=dataclasses.replace(
                CosmoFlowConfig().data,
                data_dir=str(tmp_path),
                sample_shape=(8, 8, 8, 4),
                transform=transform,
            )
        )
        task = CosmoFlowTask(cfg)
        assert task.input_specs()[0].dtype == tf.int16
        y = tf.zeros((2, 4))
        x_in, y_in = tf.function(task.preprocess_batch)(x, y)
        assert x_in.dtype == tf.float32
        np.testing.assert_allclose(x_in.numpy(), expected, rtol=1e-6)
        assert y_in is y or np.array_equal(y_in.numpy(), y.numpy())


@pytest.mark.parametrize("cache", [False, True])
def test_training_pipeline_shuffles_repeats_and_covers_every_sample(tmp_path, cache):
    files, samples = make_files(tmp_path / "d", 8)
    index = {
        tuple(np.round(y, 5)): i for i, (_, y) in enumerate(samples)
    }  # targets name the samples
    assert len(index) == 8

    def orders(seed, n_epochs=3):
        """The sample indices each epoch gives, in order (in-order reading: the order is the seed's)."""
        ds = data.make_dataset(
            files,
            SHAPE,
            batch_size=4,
            compression="GZIP",
            training=True,
            seed=seed,
            cache=cache,
            deterministic=True,
        )
        it = iter(ds)
        return [
            [
                index[tuple(np.round(v, 5))]
                for v in np.concatenate([next(it)[1].numpy() for _ in range(2)])
            ]
            for _ in range(n_epochs)
        ]

    epochs = orders(seed=3)
    for order in epochs:  # each epoch is one pass: every sample exactly once
        assert sorted(order) == list(range(8)), epochs
    # A new order every epoch (8! orders: equal by chance with probability 1/40320).
    assert len({tuple(order) for order in epochs}) == 3, epochs
    assert epochs[0] != list(range(8))  # not the file order either
    # The order is the seed's: the same again with seed 3, another with seed 4.
    assert orders(seed=3) == epochs
    other = orders(seed=4)
    assert all(sorted(order) == list(range(8)) for order in other)
    assert all(a != b for a, b in zip(other, epochs)), (other, epochs)


def test_cache_gives_same_samples(tmp_path):
    files, _ = make_files(tmp_path / "d", 4)
    plain = [y.numpy() for _, y in data.make_dataset(files, SHAPE, 2, "GZIP", training=False)]
    cached = [
        y.numpy() for _, y in data.make_dataset(files, SHAPE, 2, "GZIP", training=False, cache=True)
    ]
    np.testing.assert_array_equal(np.concatenate(plain), np.concatenate(cached))


def test_find_bad_file_names_truncated_and_wrong_shape(tmp_path):
    files, _ = make_files(tmp_path / "d", 3)
    assert sample_files.find_bad_file(files, SHAPE) is None
    raw = open(files[1], "rb").read()
    open(files[1], "wb").write(raw[: len(raw) // 2])
    msg = sample_files.find_bad_file(files, SHAPE)
    assert msg.startswith(files[1]) and "unreadable" in msg
    msg = sample_files.find_bad_file([files[0]], (4, 4, 4, 4))
    assert msg.startswith(files[0]) and "expected 256" in msg
