"""Shared layer of the MLPerf HPC benchmarks: distribution, config, staging, logging, trainer."""

import os as _os

from common import cpu as _cpu

# Before any module of this repository imports TensorFlow (see common/cpu.py).
_cpu.prefer_onednn()
# The code imports Keras 2 by name (`import tf_keras`) and never uses tf.keras, so this changes no
# result: without it `import tensorflow` also imports Keras 3, to serve tf.keras (TensorFlow 2.21
# on a 2-core AMD EPYC: 40 MiB more peak RSS and about 1 s more per process). A value the user set
# is kept.
_os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
