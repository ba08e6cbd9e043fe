"""common/legacy_keras.py: TF_USE_LEGACY_KERAS=1 where tf-keras is installed, a user's choice kept,
and tf.keras is Keras 2 on the stack this suite runs on."""

import importlib.util
import subprocess

import pytest

from common import legacy_keras
from tests import helpers


def test_set_where_tf_keras_is_installed_and_a_user_choice_is_kept():
    env = {}
    assert legacy_keras.prefer_legacy_keras(env, tf_keras_installed=True)
    assert env == {legacy_keras.LEGACY_KERAS_ENV: "1"}
    env = {legacy_keras.LEGACY_KERAS_ENV: "0"}
    assert not legacy_keras.prefer_legacy_keras(env, tf_keras_installed=True)
    assert env == {legacy_keras.LEGACY_KERAS_ENV: "0"}


def test_not_set_without_tf_keras_where_tf_keras_is_keras_2_already():
    # The TF 2.15 stack: TensorFlow 2.15 would look for the missing tf_keras if the variable were set.
    env = {}
    assert not legacy_keras.prefer_legacy_keras(env, tf_keras_installed=False) and env == {}


def test_an_inherited_setting_is_dropped_only_where_tensorflow_s_own_keras_is_keras_2(capsys):
    # A shell that ran the default stack, then the older one: TF 2.15 would fail to import Keras.
    env = {legacy_keras.LEGACY_KERAS_ENV: "1"}
    assert not legacy_keras.prefer_legacy_keras(env, tf_keras_installed=False, tf_version="2.15.1")
    assert env == {} and "TF_USE_LEGACY_KERAS=1 is set but tf-keras is not installed" in capsys.readouterr().err
    # Kept where TensorFlow's own Keras is 3 (2.21 without tf-keras) and where tf-keras is installed.
    for installed, version in ((False, "2.21.0"), (True, "2.15.1"), (True, "2.21.0")):
        env = {legacy_keras.LEGACY_KERAS_ENV: "1"}
        assert not legacy_keras.prefer_legacy_keras(env, tf_keras_installed=installed, tf_version=version)
        assert env == {legacy_keras.LEGACY_KERAS_ENV: "1"}, (installed, version)
    assert capsys.readouterr().err == ""


def test_tf_keras_is_keras_2_once_the_project_is_imported_first():
    env = helpers.env()
    env.pop(legacy_keras.LEGACY_KERAS_ENV, None)
    # get_scaled_loss: Keras 2's loss-scaling API, which the training step calls and Keras 3 dropped.
    probe = ("import common, tensorflow as tf; "
             "print(hasattr(tf.keras.mixed_precision.LossScaleOptimizer, 'get_scaled_loss'))")
    out = subprocess.run([helpers.PYTHON, "-c", probe], env=env, capture_output=True, text=True, timeout=120,
                         cwd=helpers.REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "True", out.stdout


TF_KERAS = importlib.util.find_spec("tf_keras") is not None


def run_probe(code):
    env = helpers.env()
    env.pop(legacy_keras.LEGACY_KERAS_ENV, None)
    return subprocess.run([helpers.PYTHON, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          cwd=helpers.REPO)


@pytest.mark.skipif(not TF_KERAS, reason="tf-keras is installed on the TF 2.21 stack only")
def test_tensorflow_imported_first_still_gets_keras_2_without_a_warning():
    out = run_probe("import tensorflow as tf; import common; print(tf.keras.__name__)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1].startswith("tf_keras") and "warning: tf.keras" not in out.stderr


@pytest.mark.skipif(not TF_KERAS, reason="tf-keras is installed on the TF 2.21 stack only")
def test_tf_keras_used_before_the_project_is_keras_3_and_says_so():
    out = run_probe("import tensorflow as tf; tf.keras.layers; import common; print(tf.keras.__name__)")
    assert out.returncode == 0, out.stderr
    assert not out.stdout.split()[-1].startswith("tf_keras")
    assert "warning: tf.keras was used before this project could set TF_USE_LEGACY_KERAS=1" in out.stderr


def test_the_stack_line_names_the_keras_that_runs():
    # After what train.py imports, tf.keras's own __name__ can be TensorFlow's alias ("tensorflow.keras"):
    # the line must name the package the layers come from.
    from common.run import launch  # noqa: F401
    import tensorflow as tf
    from common import runtime
    line = runtime.software_stack()
    package = "tf_keras" if TF_KERAS else "keras"
    assert line.startswith(f"TensorFlow {tf.__version__}, Keras ") and f"({package})" in line, line
    assert tf.keras.layers.Dense.__module__.startswith(package)
