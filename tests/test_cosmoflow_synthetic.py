import json

import numpy as np
import pytest

from common.inputs import synthetic_files
from cosmoflow import data, sample_files, synthetic


def test_field_statistics_follow_the_parameters():
    rng = np.random.default_rng(0)
    base = np.zeros(4)

    def stats(y):
        x = np.log1p(synthetic.make_sample(np.asarray(y, float), 32, rng).astype(np.float64))
        g = x[..., 3]
        small_scale = np.mean(np.diff(g, axis=0) ** 2) / g.var()
        return x.mean(), x[..., 3].std() - x[..., 0].std(), small_scale

    lo, hi = base.copy(), base.copy()
    lo[0], hi[0] = -1, 1
    assert stats(hi)[0] > stats(lo)[0] + 0.3  # y0: density
    lo, hi = base.copy(), base.copy()
    lo[1], hi[1] = -1, 1
    assert stats(hi)[1] > stats(lo)[1]  # y1: amplitude grows more with "time"
    lo, hi = base.copy(), base.copy()
    lo[2], hi[2] = -1, 1
    assert stats(hi)[2] > stats(lo)[2] * 1.2  # y2: more small-scale power


def test_writes_public_layout_and_skips_a_second_time(tmp_path):
    messages = []
    synthetic.generate(
        tmp_path, size=8, n_train=6, n_valid=2, seed=1, workers=1, progress=messages.append
    )
    train = sorted((tmp_path / "train").glob("*.tfrecord"))
    valid = sorted((tmp_path / "validation").glob("*.tfrecord"))
    assert len(train) == 6 and len(valid) == 2
    assert data.detect_compression(train[0]) == "GZIP"
    assert sample_files.find_bad_file([str(p) for p in train + valid], (8, 8, 8, 4)) is None
    ys = np.concatenate(
        [
            y.numpy()
            for _, y in data.make_dataset(
                [str(p) for p in train], (8, 8, 8, 4), 6, "GZIP", training=False
            )
        ]
    )
    assert ys.shape == (6, 4) and np.all(np.abs(ys) <= 1) and len(np.unique(ys[:, 0])) == 6
    assert json.loads((tmp_path / synthetic_files.MARKER).read_text())["n_train"] == 6
    messages.clear()
    synthetic.generate(
        tmp_path, size=8, n_train=6, n_valid=2, seed=1, workers=1, progress=messages.append
    )
    assert messages == [f"[synthetic] {tmp_path} already holds this data set; nothing to do"]


def test_a_narrow_target_spread_keeps_the_parameters_near_zero(tmp_path, capsys):
    """--target-spread S: the parameters in [-S, S] (the easy set of the launcher tests); the
    default set spreads over [-1, 1] (the negative control); a spread outside (0, 1] is one line."""

    def parameters(folder, **spread):
        synthetic.generate(
            folder,
            size=8,
            n_train=8,
            n_valid=1,
            seed=3,
            workers=1,
            progress=lambda m: None,
            **spread,
        )
        files = sorted(str(p) for p in (folder / "train").glob("*.tfrecord"))
        return np.concatenate(
            [
                y.numpy()
                for _, y in data.make_dataset(files, (8, 8, 8, 4), 8, "GZIP", training=False)
            ]
        )

    narrow, wide = parameters(tmp_path / "narrow", target_spread=0.1), parameters(tmp_path / "wide")
    assert np.abs(narrow).max() <= 0.1 and np.abs(wide).max() > 0.5
    assert (
        json.loads((tmp_path / "narrow" / synthetic_files.MARKER).read_text())["target_spread"]
        == 0.1
    )
    with pytest.raises(SystemExit) as exited:
        synthetic.main(["--output-dir", str(tmp_path / "bad"), "--target-spread", "0"])
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("error: --target-spread must be in (0, 1], got 0.0"), err
    assert not (tmp_path / "bad").exists()
