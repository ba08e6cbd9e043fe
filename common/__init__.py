"""Shared layer of the MLPerf HPC benchmarks: distribution, config, staging, logging, trainer."""

from common import cpu as _cpu

# Before any module of this repository imports TensorFlow (see common/cpu.py).
_cpu.prefer_onednn()
