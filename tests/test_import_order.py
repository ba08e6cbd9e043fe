"""TensorFlow imported, and `tf.keras` used, before the project: a notebook's first cell or a site's
wrapper script. `tf.keras` is then Keras 3 for the rest of the process; each benchmark's train.py,
run in that process on its synthetic config (`--tiny`), still trains, since the project imports
Keras 2 by name (`import tf_keras`) and never reaches it through `tf.keras`. Imported first, the
project keeps TensorFlow from importing Keras 3 at all (common/__init__.py)."""

import json
import math
import subprocess
from importlib import metadata

import pytest

from common import benchmarks
from common.parallel.distribution import CYCLE_VARIABLES
from tests import conftest, helpers

# Run as `python -c WRAPPER TRAIN_PY ARGS...`: the wrapper's own tf.keras first, then train.py as
# `python TRAIN_PY ARGS...` would run it. The assert is the test's premise: tf.keras is Keras 3 here.
WRAPPER = """
import runpy, sys
import tensorflow as tf
dense = tf.keras.layers.Dense.__module__
assert dense.startswith("keras."), f"tf.keras is not Keras 3 in this process: {dense}"
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:   # the layers of the splits and the sharded optimizer, offline/ and bench/: not a data-parallel run's
    print("SPLIT-MODULES", sorted(m for m in sys.modules if m.startswith(SPLIT_MODULES)), flush=True)
    import json, os
    files = {os.path.relpath(os.path.realpath(m.__file__)) for m in list(sys.modules.values())
             if getattr(m, "__file__", None)} | {os.path.relpath(os.path.realpath(sys.argv[0]))}
    own = [f for f in files if not f.startswith((".", "/")) and "site-packages" not in f]
    print("OWN-FILES", json.dumps({f: len(open(f).readlines()) for f in own}), flush=True)
"""
# What a data-parallel run must not import (issue: the split is a layer a run asks for).
SPLIT_MODULES = (
    "common.parallel.spatial",  # spatial, spatial_mesh, spatial_rows
    "common.parallel.placement",
    "common.parallel.rebuilt_input",
    "common.parallel.sharded_optimizer",
    "offline",
    "bench",
)
WRAPPER = f"SPLIT_MODULES = {SPLIT_MODULES!r}\n" + WRAPPER

# What a vendor reads to follow a run: at most this many of the repository's files (a package's
# __init__.py of at most 10 lines not counted) and lines (all of them counted) imported by a run.
READ_BUDGET = {"cosmoflow": (25, 5000), "deepcam": (28, 6000)}

TEST_DATA_SHAPE = {
    "cosmoflow": [
        "--set",
        f"data.sample_shape={conftest.EASY['size']},{conftest.EASY['size']},"
        f"{conftest.EASY['size']},4",
    ],
    "deepcam": [
        "--set",
        f"data.height={conftest.DEEPCAM_TINY['height']}",
        "--set",
        f"data.width={conftest.DEEPCAM_TINY['width']}",
        *helpers.DEEPCAM_NARROW,
    ],
}


@pytest.mark.parametrize("name", benchmarks.names())
def test_train_py_trains_after_tensorflow_was_imported_and_tf_keras_used(name, request, tmp_path):
    bench = benchmarks.get(name)
    data = request.getfixturevalue("cosmo_easy_data" if name == "cosmoflow" else "deepcam_data")
    out = tmp_path / "run"
    environ = helpers.env()
    # Set before TensorFlow's first use of tf.keras, it would make tf.keras Keras 2 and hide the case.
    environ.pop("TF_USE_LEGACY_KERAS", None)
    # As `make run` on a fresh machine: a cycle time set would have the run read it (cycle_time.py).
    for key in CYCLE_VARIABLES:
        environ.pop(key, None)
    train_py = [
        helpers.REPO / bench.train_script,
        helpers.REPO / bench.synthetic_config,
        bench.data_flag,
        data,
        bench.output_flag,
        out,
        "--tiny",
        *TEST_DATA_SHAPE[name],
    ]
    proc = subprocess.run(
        [helpers.PYTHON, "-c", WRAPPER, *train_py],
        cwd=helpers.REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # 3: trained, target not reached (a tiny run is a smoke run).
    assert proc.returncode in (0, 3), helpers.failure_output(proc)
    assert f"Keras {metadata.version('tf-keras')} (tf_keras)" in proc.stdout, proc.stdout[-3000:]
    assert "SPLIT-MODULES []" in proc.stdout, proc.stdout[-3000:]
    own = json.loads(proc.stdout.split("OWN-FILES ", 1)[1].splitlines()[0])
    files = [f for f, n in own.items() if not (f.endswith("__init__.py") and n <= 10)]
    assert f"{name}/train.py" in own and "common/run/trainer.py" in own, sorted(own)
    most_files, most_lines = READ_BUDGET[name]
    assert len(files) <= most_files and sum(own.values()) <= most_lines, (
        len(files),
        sum(own.values()),
        sorted(own.items()),
    )
    summary = json.loads((out / "summary.json").read_text())
    assert [h["epoch"] for h in summary["history"]] == [1]
    assert math.isfinite(summary["history"][0]["loss"])


def test_the_project_imported_first_keeps_keras_3_out_of_the_process():
    probe = "import sys, common, tensorflow; print('keras' in sys.modules)"
    environ = helpers.env()
    environ.pop("TF_USE_LEGACY_KERAS", None)
    loaded = subprocess.run(
        [helpers.PYTHON, "-c", probe],
        cwd=helpers.REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert loaded.stdout.split() == ["False"], loaded.stdout + loaded.stderr
    # Negative control: the user's TF_USE_LEGACY_KERAS=0 is kept, and TensorFlow then imports Keras 3.
    environ["TF_USE_LEGACY_KERAS"] = "0"
    loaded = subprocess.run(
        [helpers.PYTHON, "-c", probe],
        cwd=helpers.REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert loaded.stdout.split() == ["True"], loaded.stdout + loaded.stderr


def test_control_the_split_modules_are_seen_when_imported():
    # The wrapper's listing of split modules finds one that the process did import.
    code = WRAPPER.replace(
        "sys.argv = sys.argv[1:]",
        "import common.parallel.spatial, common.parallel.spatial_mesh\nsys.argv = sys.argv[1:]",
    )
    environ = helpers.env()
    environ.pop("TF_USE_LEGACY_KERAS", None)
    proc = subprocess.run(
        [helpers.PYTHON, "-c", code, "-c"],
        cwd=helpers.REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    listed = [line for line in proc.stdout.splitlines() if line.startswith("SPLIT-MODULES")]
    assert listed, proc.stdout + proc.stderr
    for module in ("spatial", "spatial_mesh", "placement"):  # spatial_mesh imports placement
        assert f"'common.parallel.{module}'" in listed[0], proc.stdout + proc.stderr
