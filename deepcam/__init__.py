"""DeepCAM (MLPerf HPC): DeepLabv3+ segmentation of extreme weather in climate data."""

import common  # noqa: F401  (turns oneDNN on before this package imports TensorFlow)
