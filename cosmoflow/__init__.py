"""CosmoFlow: a 3D CNN regressing 4 cosmological parameters from dark-matter volumes."""

import common  # noqa: F401  (turns oneDNN on before this package imports TensorFlow)
