"""Shared layer of the MLPerf HPC benchmarks: distribution, config, staging, logging, trainer."""

from common import cpu as _cpu
from common import legacy_keras as _legacy_keras

# Before any module of this repository imports TensorFlow (see common/cpu.py, common/legacy_keras.py).
_cpu.prefer_onednn()
_legacy_keras.prefer_legacy_keras()
