"""Shared layer of the MLPerf HPC benchmarks: distribution, config, staging, logging, trainer."""

import os as _os

from common import cpu as _cpu

_cpu.prefer_onednn()  # before any module of this repository imports TensorFlow (common/cpu.py)
# The code uses tf_keras, never tf.keras: without this, `import tensorflow` also loads Keras 3.
_os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
