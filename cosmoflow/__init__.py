"""CosmoFlow: a 3D CNN regressing 4 cosmological parameters from dark-matter volumes."""
