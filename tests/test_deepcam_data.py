"""DeepCAM reader, statistics and synthetic data, on HDF5 files written with h5py directly."""

import os

import h5py
import numpy as np
import pytest
import tensorflow as tf

from common.errors import InputError
from common.inputs.staging import stage_files
from deepcam import data, sample_files, stats, synthetic
from deepcam.layout import RAW_SUFFIX

H, W = 16, 24


def write_sample(path, x, y):
    """The public layout, written with h5py here (not with the project's writer)."""
    with h5py.File(path, "w") as f:
        f["climate/data"] = x
        f["climate/labels_0"] = y


def write_stats(directory, lo, hi):
    with h5py.File(directory / "stats.h5", "w") as f:
        f["climate/minval"], f["climate/maxval"] = lo, hi
        f["climate/mean"] = (lo + hi) / 2


@pytest.fixture
def small_set(tmp_path):
    rng = np.random.default_rng(0)
    (tmp_path / "train").mkdir()
    files = []
    for i, label_dtype in enumerate([np.float32, np.int64, np.uint8, np.float32]):
        x = rng.uniform(-5, 20, (H, W, 16)).astype(np.float32)
        y = rng.integers(0, 3, (H, W)).astype(label_dtype)
        path = tmp_path / "train" / f"s{i}.h5"
        write_sample(path, x, y)
        files.append((str(path), x, y))
    write_stats(tmp_path, np.full(16, -5.0), np.arange(16) + 20.0)
    return tmp_path, files


def test_read_sample_normalizes_with_stats_and_reads_float_or_int_labels(small_set):
    root, files = small_set
    shift, scale = data.load_normalization(root, range(16))
    for path, x, y in files:
        xs, ys = sample_files.read_sample(path, tuple(range(16)), shift, scale, H, W)
        np.testing.assert_allclose(xs, (x + 5.0) / (np.arange(16) + 25.0), rtol=1e-6)
        assert ys.dtype == np.int32 and np.array_equal(ys, y.astype(np.int32))


def test_channel_selection_reads_the_chosen_fields(small_set):
    root, files = small_set
    channels = (3, 0, 15)
    shift, scale = data.load_normalization(root, channels)
    xs, _ = sample_files.read_sample(files[0][0], channels, shift, scale, H, W)
    expect = (files[0][1][..., list(channels)] + 5.0) / (np.array(channels) + 25.0)
    np.testing.assert_allclose(xs, expect, rtol=1e-6)


def test_dataset_batches_inside_tf_data(small_set):
    root, files = small_set
    paths = [f[0] for f in files]
    ds = data.make_dataset(
        paths, channels=tuple(range(16)), height=H, width=W, batch_size=2, training=False, readers=2
    )
    batches = list(ds)
    assert len(batches) == 2
    x, y = batches[0]
    # As stored (normalized inside the step), labels as uint8, file order kept in validation.
    assert x.shape == (2, H, W, 16) and x.dtype == tf.float32 and y.dtype == tf.uint8
    np.testing.assert_array_equal(x.numpy()[1], files[1][1])
    assert np.array_equal(y.numpy()[1], files[1][2].astype(np.uint8))
    empty = data.make_dataset([], channels=(0, 1), height=H, width=W, batch_size=2, training=False)
    assert list(empty) == []  # a rank without validation files evaluates nothing
    train = data.make_dataset(
        paths, channels=(0, 1), height=H, width=W, batch_size=3, training=True, seed=1, cache=True
    )
    for x, _ in train.take(3):  # repeats forever, full batches only
        assert x.shape == (3, H, W, 2)


def test_bad_files_are_named(small_set, tmp_path):
    root, files = small_set
    wrong = root / "train" / "wrong.h5"
    write_sample(wrong, np.zeros((H, W + 1, 16), np.float32), np.zeros((H, W + 1)))
    truncated = root / "train" / "cut.h5"
    truncated.write_bytes(open(files[0][0], "rb").read()[:1500])
    nolabel = root / "train" / "nolabel.h5"
    with h5py.File(nolabel, "w") as f:
        f["climate/data"] = np.zeros((H, W, 16), np.float32)
    channels = tuple(range(16))
    assert sample_files.find_bad_file([f[0] for f in files], channels, H, W) is None
    assert "wrong.h5" in sample_files.find_bad_file([files[0][0], str(wrong)], channels, H, W)
    assert "shape" in sample_files.find_bad_file([str(wrong)], channels, H, W)
    assert "cut.h5" in sample_files.find_bad_file([str(truncated)], channels, H, W)
    assert "climate/labels_0" in sample_files.find_bad_file([str(nolabel)], channels, H, W)


def _write_layout(path, x, y, layout):
    """A sample with its datasets stored as `layout` says (written with h5py directly)."""
    options = {
        "contiguous": {},
        "user block": {},
        "chunked, gzip": {"chunks": (4, W, 16), "compression": "gzip"},
        "big-endian": {"dtype": ">f4"},
        "float64": {"dtype": "<f8"},
    }[layout]
    with h5py.File(path, "w", userblock_size=512 if layout == "user block" else 0) as f:
        f.create_dataset("climate/data", data=x, **options)
        f.create_dataset(
            "climate/labels_0", data=y, **({"chunks": (4, W)} if "chunked" in layout else {})
        )


def _h5py_reads_refused(monkeypatch):
    """From now on, a read of a dataset's values through h5py fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("read through h5py")

    monkeypatch.setattr(h5py.Dataset, "read_direct", refuse)
    monkeypatch.setattr(h5py.Dataset, "__getitem__", refuse)


@pytest.mark.parametrize("channels", [tuple(range(16)), (3, 0, 15)])
@pytest.mark.parametrize("label_dtype", [np.float32, np.int64])
def test_contiguous_hdf5_datasets_are_read_past_h5py_as_h5py_reads_them(
    tmp_path, monkeypatch, channels, label_dtype
):
    # h5py's readers take turns on its lock; a contiguous dataset is read from its offset with readinto
    # instead (read_fields_into). Each layout is read as h5py reads it; h5py reads only the others,
    # which the refusal below shows: the fallback layouts, the negative control, then fail.
    rng = np.random.default_rng(2)
    x = rng.uniform(-5, 20, (H, W, 16)).astype(np.float32)
    y = rng.integers(0, 3, (H, W)).astype(label_dtype)
    layouts = {
        "contiguous": True,
        "user block": True,
        "chunked, gzip": False,
        "big-endian": False,
        "float64": False,
    }
    for layout in layouts:
        _write_layout(tmp_path / f"{layout}.h5", x, y, layout)
    with monkeypatch.context() as patch:
        _h5py_reads_refused(patch)
        for layout, past_h5py in layouts.items():
            x_out, y_out = np.empty((H, W, len(channels)), np.float32), np.empty((H, W), np.uint8)
            if past_h5py:
                data.read_fields_into(tmp_path / f"{layout}.h5", channels, H, W, x_out, y_out)
                np.testing.assert_array_equal(x_out, x[..., list(channels)])
                np.testing.assert_array_equal(y_out, y.astype(np.uint8))
            else:
                with pytest.raises(AssertionError, match="read through h5py"):
                    data.read_fields_into(tmp_path / f"{layout}.h5", channels, H, W, x_out, y_out)
    for layout in layouts:  # h5py allowed again: every layout reads the same sample
        x_out, y_out = np.empty((H, W, len(channels)), np.float32), np.empty((H, W), np.uint8)
        data.read_fields_into(tmp_path / f"{layout}.h5", channels, H, W, x_out, y_out)
        np.testing.assert_array_equal(
            x_out, x[..., list(channels)]
        )  # float64 holds the float32 values exactly
        np.testing.assert_array_equal(y_out, y.astype(np.uint8))


@pytest.mark.parametrize("cache", [False, True])
@pytest.mark.parametrize("channels", [tuple(range(16)), (3, 0, 15)])
def test_a_height_split_rank_reads_its_rows_of_every_layout(tmp_path, channels, cache):
    # A rank of a height split (slab=(index, K)) reads only its rows of each sample: the same values as
    # the whole sample's rows, from every HDF5 layout (past h5py or through it) and staged raw files.
    rng = np.random.default_rng(4)
    x = rng.uniform(-5, 20, (H, W, 16)).astype(np.float32)
    y = rng.integers(0, 3, (H, W)).astype(np.float32)
    layouts = ("contiguous", "user block", "chunked, gzip", "big-endian", "float64")
    for layout in layouts:
        _write_layout(tmp_path / f"{layout}.h5", x, y, layout)
    staged, _ = stage_files(
        [str(tmp_path / "contiguous.h5")],
        tmp_path / "stage",
        sample_files.raw_layout(channels, H, W),
    )
    sources = {layout: [str(tmp_path / f"{layout}.h5")] for layout in layouts} | {"staged": staged}
    common = dict(channels=channels, height=H, width=W, batch_size=1, training=False, cache=cache)
    k, rows = 4, H // 4
    for name, files in sources.items():
        for index in range(k):
            [(x_slab, y_slab)] = list(data.make_dataset(files, slab=(index, k), **common))
            want = slice(index * rows, (index + 1) * rows)
            assert x_slab.shape == (1, rows, W, len(channels)), name
            np.testing.assert_array_equal(
                x_slab.numpy()[0], x[want][..., list(channels)], err_msg=f"{name} {index}"
            )
            np.testing.assert_array_equal(
                y_slab.numpy()[0], y[want].astype(np.uint8), err_msg=f"{name} {index}"
            )
    # The negative control: the slabs differ from each other, so reading the wrong rows would show.
    assert not np.array_equal(x[:rows], x[rows : 2 * rows])


def test_a_label_out_of_range_in_a_contiguous_file_is_still_named(tmp_path):
    y = np.zeros((H, W), np.float32)
    y[3, 4] = 7
    _write_layout(tmp_path / "bad.h5", np.zeros((H, W, 16), np.float32), y, "contiguous")
    with pytest.raises(InputError, match="bad.h5.*not the classes"):
        data.read_fields_into(
            tmp_path / "bad.h5",
            tuple(range(16)),
            H,
            W,
            np.empty((H, W, 16), np.float32),
            np.empty((H, W), np.uint8),
        )


@pytest.mark.parametrize("staged", [False, True])
@pytest.mark.parametrize("channels", [tuple(range(16)), (3, 0, 15)])
def test_batches_held_by_the_consumer_are_never_overwritten(small_set, tmp_path, staged, channels):
    # Batches are filled in reused buffers (common.inputs.pipeline): holding many of them at once
    # (here 12, more than the pool keeps) must leave each as read, in training and validation.
    root, files = small_set
    paths = [f[0] for f in files]
    if staged:
        paths, _ = stage_files(paths, tmp_path / "stage", sample_files.raw_layout(channels, H, W))
    expected = {
        os.path.basename(p).split(".")[0]: (x[..., list(channels)], y.astype(np.uint8))
        for p, x, y in files
    }
    by_content = {x.tobytes(): name for name, (x, _) in expected.items()}
    common = dict(channels=channels, height=H, width=W, readers=2, prefetch=1)
    train = data.make_dataset(paths, batch_size=2, training=True, seed=3, **common)
    held = list(train.take(12))
    assert all(x.shape == (2, H, W, len(channels)) for x, _ in held)  # static batch dimension
    counts = {}
    for x, y in held:
        for xs, ys in zip(x.numpy(), y.numpy()):
            name = by_content[xs.tobytes()]  # KeyError: a sample that no file holds
            np.testing.assert_array_equal(ys, expected[name][1])
            counts[name] = counts.get(name, 0) + 1
    assert sorted(counts.values()) == [6, 6, 6, 6]  # 6 epochs, each file once an epoch
    valid = list(data.make_dataset(paths, batch_size=3, training=False, **common))
    assert [x.shape[0] for x, _ in valid] == [3, 1]
    got = np.concatenate([x.numpy() for x, _ in valid])
    np.testing.assert_array_equal(got, np.stack([expected[f"s{i}"][0] for i in range(4)]))


@pytest.mark.parametrize("channels", [tuple(range(16)), (3, 0, 15)])
def test_staged_raw_samples_read_as_the_hdf5_ones(small_set, tmp_path, channels):
    # Staged in the raw layout (read by TensorFlow's own ops, no h5py): the same batches.
    root, files = small_set
    paths = [f[0] for f in files]
    layout = sample_files.raw_layout(channels, H, W)
    staged, stats_ = stage_files(paths, tmp_path / "stage", layout)
    assert [os.path.basename(p) for p in staged] == [f"s{i}{RAW_SUFFIX}" for i in range(4)]
    assert stats_.bytes == 4 * H * W * (4 * len(channels) + 1) == 4 * os.path.getsize(staged[0])
    assert sample_files.find_bad_file(staged, channels, H, W) is None
    common = dict(channels=channels, height=H, width=W, batch_size=2, training=False)
    for (x_h5, y_h5), (x_raw, y_raw) in zip(
        data.make_dataset(paths, **common), data.make_dataset(staged, **common)
    ):
        assert x_raw.dtype == tf.float32 and y_raw.dtype == tf.uint8
        np.testing.assert_array_equal(x_raw.numpy(), x_h5.numpy())
        np.testing.assert_array_equal(y_raw.numpy(), y_h5.numpy())
    # The layout's name holds its parameters: other channels stage again, the same ones reuse.
    assert stage_files(paths, tmp_path / "stage", layout)[1].skipped == 4
    assert (
        stage_files(paths, tmp_path / "stage", sample_files.raw_layout((1,), H, W))[1].skipped == 0
    )


def test_a_bad_staged_raw_sample_is_named(small_set, tmp_path):
    root, files = small_set
    staged, _ = stage_files(
        [f[0] for f in files[:2]], tmp_path / "stage", sample_files.raw_layout(range(16), H, W)
    )
    cut = staged[1]
    with open(cut, "r+b") as f:
        f.truncate(1000)
    problem = sample_files.find_bad_file(staged, tuple(range(16)), H, W)
    assert problem.startswith(cut) and "1,000 bytes" in problem, problem
    # The readers refuse it too, naming it (decode_raw alone would zero-pad it).
    common = dict(channels=tuple(range(16)), height=H, width=W, batch_size=1, training=False)
    for cache in (False, True):
        with pytest.raises(tf.errors.OpError, match=f"{cut}: staged raw sample of 1,000 bytes"):
            list(data.make_dataset([cut], cache=cache, **common))
    with pytest.raises(InputError, match="mixes"):
        data.make_dataset(
            [staged[0], files[0][0]], channels=(0,), height=H, width=W, batch_size=1, training=False
        )


def test_staging_a_bad_hdf5_sample_names_it(small_set, tmp_path):
    root, _ = small_set
    wrong = root / "train" / "wrong.h5"
    write_sample(wrong, np.zeros((H, W + 1, 16), np.float32), np.zeros((H, W + 1)))
    with pytest.raises(InputError, match=f"{wrong}.*shape"):
        stage_files([str(wrong)], tmp_path / "stage", sample_files.raw_layout(range(16), H, W))
    negative = root / "train" / "negative.h5"
    write_sample(negative, np.zeros((H, W, 16), np.float32), np.full((H, W), -1.0))
    with pytest.raises(InputError, match=f"cannot stage {negative}: climate/labels_0 holds values"):
        stage_files([str(negative)], tmp_path / "stage", sample_files.raw_layout(range(16), H, W))
    cut = root / "train" / "cut.h5"
    cut.write_bytes(b"\x89HDF\r\n" + bytes(100))
    with pytest.raises(InputError, match=f"cannot stage {cut}: unreadable HDF5"):
        stage_files([str(cut)], tmp_path / "stage", sample_files.raw_layout(range(16), H, W))
    assert not [p for p in (tmp_path / "stage" / "train").iterdir()]  # nothing half-written left


def test_the_task_normalizes_inside_the_step(small_set):
    # DeepCAMTask.preprocess_batch: (x - min) / (max - min) from stats.h5, labels to int32,
    # equal to what read_sample (prediction) gives for the same file.
    import dataclasses

    from deepcam.config import DeepCAMConfig
    from deepcam.task import DeepCAMTask

    root, files = small_set
    channels = (3, 0, 15)
    base = DeepCAMConfig()
    cfg = dataclasses.replace(
        base,
        data=dataclasses.replace(
            base.data, data_dir=str(root), height=H, width=W, channels=channels, local_batch_size=2
        ),
    )
    task = DeepCAMTask(cfg)
    assert [s.dtype for s in task.input_specs()] == [tf.float32, tf.uint8]
    [(x, y)] = data.make_dataset(
        [f[0] for f in files[:2]],
        channels=channels,
        height=H,
        width=W,
        batch_size=2,
        training=False,
    ).take(1)
    x_in, y_in = tf.function(task.preprocess_batch)(x, y)
    assert y_in.dtype == tf.int32
    shift, scale = data.load_normalization(root, channels)
    for i in range(2):
        expect_x, expect_y = sample_files.read_sample(files[i][0], channels, shift, scale, H, W)
        np.testing.assert_allclose(x_in.numpy()[i], expect_x, rtol=1e-6)
        np.testing.assert_array_equal(y_in.numpy()[i], expect_y)


def test_missing_or_broken_stats_file_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="stats.h5"):
        data.load_normalization(tmp_path, range(16))
    with h5py.File(tmp_path / "stats.h5", "w") as f:
        f["climate/minval"] = np.zeros(16)
    with pytest.raises(InputError, match="maxval"):
        data.load_normalization(tmp_path, range(16))


def test_stats_tool_matches_numpy_over_all_files(small_set):
    root, files = small_set
    (root / "stats.h5").unlink()
    stats.compute_stats(root, workers=2, print_fn=lambda *a: None)
    allx = np.concatenate([f[1].reshape(-1, 16) for f in files]).astype(np.float64)
    with h5py.File(root / "stats.h5") as f:
        np.testing.assert_allclose(f["climate/minval"][...], allx.min(0))
        np.testing.assert_allclose(f["climate/maxval"][...], allx.max(0))
        np.testing.assert_allclose(f["climate/mean"][...], allx.mean(0), rtol=1e-9)
        np.testing.assert_allclose(f["climate/sqmean"][...], (allx**2).mean(0), rtol=1e-9)
        assert np.all(f["climate/count"][...] == allx.shape[0])


def test_synthetic_data_has_the_layout_and_near_real_class_frequencies(tmp_path):
    synthetic.generate(
        tmp_path,
        192,
        288,
        n_train=24,
        n_valid=4,
        seed=3,
        label_dtype="int32",
        workers=2,
        progress=lambda *a, **k: None,
    )
    train = sorted((tmp_path / "train").glob("*.h5"))
    assert len(train) == 24 and len(list((tmp_path / "validation").glob("*.h5"))) == 4
    labels = []
    for path in train:
        with h5py.File(path) as f:
            assert (
                f["climate/data"].shape == (192, 288, 16) and f["climate/data"].dtype == np.float32
            )
            assert f["climate/labels_0"].dtype == np.int32
            labels.append(f["climate/labels_0"][...])
    freq = np.bincount(np.concatenate([lab.ravel() for lab in labels]), minlength=3) / (
        24 * 192 * 288
    )
    # Real: 0.986 / 0.00046 / 0.0133; a few samples of Poisson-many events scatter widely.
    assert 0.97 < freq[0] < 0.995
    assert 0.0001 < freq[1] < 0.002
    assert 0.004 < freq[2] < 0.03
    assert (tmp_path / "stats.h5").exists()
    mtime = train[0].stat().st_mtime
    synthetic.generate(
        tmp_path,
        192,
        288,
        n_train=24,
        n_valid=4,
        seed=3,
        label_dtype="int32",
        progress=lambda *a, **k: None,
    )
    assert train[0].stat().st_mtime == mtime  # same request: nothing rewritten
