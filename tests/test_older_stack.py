"""The older stack (STACK=tf2.15: TensorFlow 2.15.1 on Python 3.9-3.11) beside the suite's own.

The whole suite runs on the stack it was installed with (the default: TensorFlow 2.21 + tf-keras);
this module installs the older stack into its own venv (tools/install.sh, as `make install
STACK=tf2.15 VENV=.venv-tf2.15`; a second install returns at once) and runs the smoke set there:
CosmoFlow on 2 Horovod ranks (on the easy set, its target met in one epoch) and DeepCAM on one
(learning to its target), each with a log that passes the checker, and each benchmark's checkpoint
restored bit-exact by the other stack, both ways.
OLDER_STACK_VENV and OLDER_STACK_PYTHON choose the venv and the interpreter it is made with.
"""

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests import helpers
from tests.conftest import EASY_ARGS

pytestmark = [pytest.mark.slow, pytest.mark.system]

OLDER_TF = "2.15.1"
OLDER_VENV = Path(os.environ.get("OLDER_STACK_VENV", helpers.REPO / ".venv-tf2.15"))


@pytest.fixture(scope="module")
def older_python() -> Path:
    """The older stack's Python, installed (once: tools/install.sh keeps a stamp) into OLDER_VENV."""
    import tensorflow as tf
    if tf.__version__ == OLDER_TF:
        pytest.skip("the suite itself runs on the older stack (TensorFlow 2.15): nothing to compare it with")
    environ = {k: v for k, v in os.environ.items() if k != "PYTHON"}   # CI's PYTHON is the default stack's
    if "OLDER_STACK_PYTHON" in os.environ:
        environ["PYTHON"] = os.environ["OLDER_STACK_PYTHON"]
    proc = subprocess.run(["bash", helpers.REPO / "tools" / "install.sh"], capture_output=True, text=True,
                          env=dict(environ, STACK="tf2.15", VENV=str(OLDER_VENV)), timeout=2400)
    if proc.returncode != 0 and '[install] FAILED at step "python"' in proc.stderr:
        pytest.skip(f"no Python for the older stack here: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, helpers.failure_output(proc)
    python = OLDER_VENV / "bin" / "python"
    version = subprocess.run([python, "-c", "import tensorflow as tf; print(tf.__version__)"],
                             capture_output=True, text=True, env=_environ(python)).stdout.strip()
    assert version == OLDER_TF, f"{python} has TensorFlow {version!r}, not {OLDER_TF}"
    return python


def _environ(python: Path) -> dict:
    """The environment of a command run by `python`: for the older stack's, without the
    TF_USE_LEGACY_KERAS=1 this process set for its own TensorFlow (horovodrun's check of the
    older stack's Horovod imports TensorFlow 2.15, which would look for the missing tf-keras)."""
    environ = helpers.env()
    if python != Path(helpers.PYTHON):
        environ.pop("TF_USE_LEGACY_KERAS", None)
    return environ


def _cosmoflow(python: Path, ranks: int, data, config, out: Path, *args) -> subprocess.CompletedProcess:
    cmd = [python, helpers.REPO / "cosmoflow" / "train.py", config, "--data-dir", data, "--output-dir", out,
           "--set", "train.checkpoint_every=1", *args]
    if ranks > 1:   # this venv's own horovodrun, which starts this venv's Python
        cmd = [python.with_name("horovodrun"), "-np", str(ranks), "-H", f"localhost:{ranks}", "--gloo", *cmd]
    return helpers.run(cmd, timeout=900, environ=_environ(python))


def _deepcam(python: Path, data, config, out: Path, *args) -> subprocess.CompletedProcess:
    return helpers.run([python, helpers.REPO / "deepcam" / "train.py", config, "--data_dir_prefix", data,
                        "--output_dir", out, "--run_tag", "r0", "--set", "train.checkpoint_every=1", *args],
                       timeout=900, environ=_environ(python))


@pytest.fixture(scope="module")
def older_runs(older_python, cosmo_easy_data, tiny_config, deepcam_data, deepcam_config, tmp_path_factory) -> dict:
    """{bench: (process, run folder)} of the older stack's runs to the targets. CosmoFlow's on the easy
    set (conftest.EASY: its subject is the older stack's Horovod on two ranks and its log, the target
    met in one epoch); DeepCAM's learns to its target on the suite's set."""
    out = tmp_path_factory.mktemp("older-stack")
    cosmo = _cosmoflow(older_python, 2, cosmo_easy_data, tiny_config, out / "cosmoflow", *EASY_ARGS)
    deepcam = _deepcam(older_python, deepcam_data, deepcam_config, out / "deepcam")
    return {"cosmoflow": (cosmo, out / "cosmoflow"), "deepcam": (deepcam, out / "deepcam" / "r0")}


@pytest.fixture(scope="module")
def default_runs(cosmo_data, tiny_config, deepcam_data, deepcam_config, tmp_path_factory) -> dict:
    """{bench: run folder} of one short epoch each on the suite's own (default) stack."""
    out = tmp_path_factory.mktemp("default-stack")
    python = Path(helpers.PYTHON)
    cosmo = _cosmoflow(python, 1, cosmo_data, tiny_config, out / "cosmoflow", "--n-epochs", "1",
                       "--n-train", "64", "--n-valid", "32", "--set", "train.stop_at_target=false")
    deepcam = _deepcam(python, deepcam_data, deepcam_config, out / "deepcam", "--set", "train.n_epochs=1",
                       "--set", "train.stop_at_target=false")
    for proc in (cosmo, deepcam):
        assert proc.returncode in (0, 3), helpers.failure_output(proc)   # 3: target not reached
    return {"cosmoflow": out / "cosmoflow", "deepcam": out / "deepcam" / "r0"}


@pytest.mark.parametrize("bench", ["cosmoflow", "deepcam"])
def test_the_older_stack_trains_to_the_target_with_a_log_the_checker_passes(older_runs, bench):
    proc, run = older_runs[bench]
    assert proc.returncode == 0, helpers.failure_output(proc)
    assert "PASSED the compliance checker" in proc.stdout
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "success" and summary["log_check"] == "passed"
    assert summary["metric"] <= 0.124 if bench == "cosmoflow" else summary["metric"] >= 0.82
    # The run was the older stack's, and CosmoFlow's on two ranks.
    assert f"[init] TensorFlow {OLDER_TF}, Keras 2.15" in proc.stdout, proc.stdout[:2000]
    assert summary["runtime"]["stack"].startswith(f"TensorFlow {OLDER_TF}")
    if bench == "cosmoflow":
        assert summary["ranks"] == 2 and summary["weights_in_sync"] is True


def _newest_checkpoint(run: Path) -> Path:
    folders = sorted((run / "checkpoints").glob("step-??????????"))
    assert folders, f"no checkpoint in {run}"
    return folders[-1]


def _restored(python: Path, bench: str, checkpoint: Path, out: Path, *flags) -> dict:
    proc = helpers.run([python, helpers.REPO / "tests" / "restore_probe.py", bench, checkpoint, out, *flags],
                       timeout=300, environ=_environ(python))
    assert proc.returncode == 0, helpers.failure_output(proc)
    return helpers.final_checkpoint_state(out)


@pytest.mark.parametrize("bench", ["cosmoflow", "deepcam"])
@pytest.mark.parametrize("writer", ["older", "default"])
def test_a_checkpoint_restores_bit_exact_on_the_other_stack(older_python, older_runs, default_runs, bench, writer,
                                                            tmp_path):
    if writer == "older":
        run, reader = older_runs[bench][1], Path(helpers.PYTHON)
    else:
        run, reader = default_runs[bench], older_python
    checkpoint = _newest_checkpoint(run)
    written = helpers.final_checkpoint_state(run)
    assert any(n.startswith("optimizer/") for n in written) and any(n.startswith("model/") for n in written)
    restored = _restored(reader, bench, checkpoint, tmp_path / "restored")
    assert sorted(restored) == sorted(written)
    differ = [n for n in written if not np.array_equal(written[n], restored[n])]
    assert not differ, f"{len(differ)} of {len(written)} tensors differ after the restore, e.g. {differ[:3]}"
    # Negative control: the same model as built, not restored, differs (so the comparison can fail).
    # Twice, not four times: once per reader stack and once per benchmark (each case costs a restore).
    if (writer, bench) not in (("older", "cosmoflow"), ("default", "deepcam")):
        return
    fresh = _restored(reader, bench, checkpoint, tmp_path / "fresh", "--fresh")
    assert sum(not np.array_equal(written[n], fresh[n]) for n in written if n in fresh) > len(written) // 2

