"""Keras 2 for `tf.keras` on TensorFlow >= 2.16, settled before TensorFlow loads.

The code is Keras 2 (`tf.keras`): the LossScaleOptimizer calls, the optimizers' `update_step` and
`_build_learning_rate`, SyncBatchNorm's `_assign_moving_average` and `hvd.broadcast_variables` all
break, or are silently ignored, under the Keras 3 that TensorFlow 2.16+ serves as `tf.keras`. With
the tf-keras package installed and `TF_USE_LEGACY_KERAS=1` set, `tf.keras` is tf-keras (Keras 2).

On the TF 2.15 stack tf-keras is not installed and `tf.keras` is Keras 2 already: nothing is set,
since TensorFlow 2.15 would then look for the missing tf_keras and fail ("Keras cannot be
imported"). A value the user set is left alone, but for that one case: TF_USE_LEGACY_KERAS=1
inherited (a site's module, a shell that ran the default stack) where tf-keras is absent and the
TensorFlow is older than 2.16 is removed, saying so in one line.

TensorFlow reads the variable when `tf.keras` is first used, not when it is imported: set after
`import tensorflow`, it still takes. Only when tf.keras was used before this project was imported
is it too late; then one line on stderr says so (as common/cpu.py does for oneDNN). This module
imports nothing heavy: it must be importable before TensorFlow.
"""

import importlib.util
import os
import sys

LEGACY_KERAS_ENV = "TF_USE_LEGACY_KERAS"


def prefer_legacy_keras(environ=None, tf_keras_installed=None, tf_version=None) -> bool:
    """Sets TF_USE_LEGACY_KERAS=1 where tf-keras is installed, unless the user chose; True if it set it.

    Args:
      environ: the environment to update (default: os.environ).
      tf_keras_installed: whether tf-keras can be imported (default: look for it, without importing it).
      tf_version: the installed TensorFlow's version (default: its package metadata, without importing it).
    """
    if tf_version is None:
        tf_version = installed_tensorflow_version()
    environ = os.environ if environ is None else environ
    if tf_keras_installed is None:
        tf_keras_installed = importlib.util.find_spec("tf_keras") is not None
    if LEGACY_KERAS_ENV in environ:
        if not tf_keras_installed and environ[LEGACY_KERAS_ENV].lower() in ("1", "true") \
                and _own_keras_is_keras_2(tf_version):
            del environ[LEGACY_KERAS_ENV]
            print(f"warning: {LEGACY_KERAS_ENV}=1 is set but tf-keras is not installed; TensorFlow {tf_version}'s "
                  f"tf.keras is Keras 2 already, so this run unsets it", file=sys.stderr, flush=True)
        return False
    if not tf_keras_installed:
        return False
    environ[LEGACY_KERAS_ENV] = "1"
    if environ is os.environ and "tensorflow" in sys.modules and not _tf_keras_is_keras_2():
        # TensorFlow resolves tf.keras on first use, not at import: the variable set now still
        # works unless tf.keras was used before this project was imported. Asked, not assumed.
        print(f"warning: tf.keras was used before this project could set {LEGACY_KERAS_ENV}=1, so it is "
              f"Keras 3, which this code does not support (its optimizers and loss scaling fail); import "
              f"common, cosmoflow or deepcam before tensorflow, or start Python with {LEGACY_KERAS_ENV}=1 "
              f"set", file=sys.stderr, flush=True)
        return False
    return True


def installed_tensorflow_version() -> str:
    """The installed TensorFlow's version from its package metadata ('' when none is found)."""
    from importlib import metadata
    for package in ("tensorflow", "tensorflow-cpu", "tensorflow-intel", "intel-tensorflow"):
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return ""


def _own_keras_is_keras_2(tf_version: str) -> bool:
    """Whether this TensorFlow's own tf.keras is Keras 2 (before 2.16), with no tf-keras needed."""
    try:
        major, minor = (int(part) for part in tf_version.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) < (2, 16)


def _tf_keras_is_keras_2() -> bool:
    return sys.modules["tensorflow"].keras.__name__.startswith("tf_keras")
