import h5py
import numpy as np
import pytest

from common.errors import InputError
from cosmoflow import data, prepare


def write_universe(path, n, seed):
    rng = np.random.default_rng(seed)
    full = rng.integers(0, 1000, size=(n, n, n, 4)).astype(np.int16)
    par = rng.uniform(-1, 1, 4).astype(np.float32)
    with h5py.File(path, "w") as f:
        f["full"] = full
        f["unitPar"] = par
    return full, par


def test_universes_become_subvolume_records(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    universes = {f"univ_{i}": write_universe(raw / f"univ_{i}.h5", 16, i) for i in range(4)}
    counts = prepare.prepare(
        raw, tmp_path / "out", sub=8, valid_fraction=0.5, workers=2, progress=lambda m: None
    )
    assert counts["train"] + counts["validation"] == 4 * 8
    for split in ("train", "validation"):
        for path in sorted((tmp_path / "out" / split).glob("*.tfrecord")):
            name, idx = path.stem.rsplit("_", 1)
            full, par = universes[name]
            assert prepare.assign_split(name, 0.5) == split
            ((x, y),) = [
                (x.numpy(), y.numpy())
                for x, y in data.make_dataset([str(path)], (8, 8, 8, 4), 1, "GZIP", training=False)
            ]
            i, j, k = int(idx) // 4, (int(idx) // 2) % 2, int(idx) % 2
            cube = full[i * 8 : (i + 1) * 8, j * 8 : (j + 1) * 8, k * 8 : (k + 1) * 8]
            np.testing.assert_array_equal(x[0], cube)
            np.testing.assert_allclose(y[0], par)


def test_bad_universe_names_the_file(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    with h5py.File(raw / "broken.h5", "w") as f:
        f["full"] = np.zeros((8, 8, 8, 4), np.int16)
    with pytest.raises(InputError, match=r"broken.h5: missing dataset 'unitPar'"):
        prepare.prepare(raw, tmp_path / "out", sub=8, workers=1, progress=lambda m: None)
    (raw / "broken.h5").unlink()
    (raw / "trunc.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 20)
    with pytest.raises(InputError, match=r"trunc.h5: unreadable HDF5"):
        prepare.prepare(raw, tmp_path / "out", sub=8, workers=1, progress=lambda m: None)
