"""Reader tests on files written with TensorFlow's own TFRecordWriter."""

import numpy as np
import pytest
import tensorflow as tf

from cosmoflow import data
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
    ds = data.make_dataset(files, SHAPE, batch_size=2, compression=data.resolve_compression("auto", files),
                           transform="log", training=False)
    xs, ys = zip(*[(x.numpy(), y.numpy()) for x, y in ds])
    x = np.concatenate(xs)
    y = np.concatenate(ys)
    assert x.shape == (4,) + SHAPE and x.dtype == np.float32
    # Ordered pass: sample i of the files, log(1 + counts), C-order layout kept.
    for i, (x_ref, y_ref) in enumerate(samples):
        np.testing.assert_allclose(x[i], np.log1p(x_ref.astype(np.float32)), rtol=1e-6)
        np.testing.assert_allclose(y[i], y_ref)
    assert x[0, 1, 2, 3, 0] == pytest.approx(np.log1p(samples[0][0][1, 2, 3, 0]))


def test_transforms_eager_and_in_map():
    x = np.arange(2 * 2 * 2 * 4, dtype=np.int16).reshape(2, 2, 2, 4)
    eager = data.log_transform(tf.constant(x)).numpy()
    np.testing.assert_allclose(eager, np.log1p(x.astype(np.float32)), rtol=1e-6)
    mapped = next(iter(tf.data.Dataset.from_tensors(x).map(data.mean_normalize))).numpy()
    np.testing.assert_allclose(mapped, x / x.mean(), rtol=1e-6)
    assert mapped.mean() == pytest.approx(1.0)


def test_training_pipeline_shuffles_repeats_and_covers_every_sample(tmp_path):
    files, samples = make_files(tmp_path / "d", 8)
    ds = data.make_dataset(files, SHAPE, batch_size=4, compression="GZIP", training=True, seed=3)
    it = iter(ds)
    epochs = []
    for _ in range(2):
        ys = np.concatenate([next(it)[1].numpy() for _ in range(2)])
        epochs.append([tuple(np.round(v, 5)) for v in ys])
    every = sorted(tuple(np.round(y, 5)) for _, y in samples)
    assert sorted(epochs[0]) == every and sorted(epochs[1]) == every


def test_cache_gives_same_samples(tmp_path):
    files, _ = make_files(tmp_path / "d", 4)
    plain = [y.numpy() for _, y in data.make_dataset(files, SHAPE, 2, "GZIP", training=False)]
    cached = [y.numpy() for _, y in data.make_dataset(files, SHAPE, 2, "GZIP", training=False, cache=True)]
    np.testing.assert_array_equal(np.concatenate(plain), np.concatenate(cached))


def test_find_bad_file_names_truncated_and_wrong_shape(tmp_path):
    files, _ = make_files(tmp_path / "d", 3)
    assert data.find_bad_file(files, SHAPE) is None
    raw = open(files[1], "rb").read()
    open(files[1], "wb").write(raw[: len(raw) // 2])
    msg = data.find_bad_file(files, SHAPE)
    assert msg.startswith(files[1]) and "unreadable" in msg
    msg = data.find_bad_file([files[0]], (4, 4, 4, 4))
    assert msg.startswith(files[0]) and "expected 256" in msg
