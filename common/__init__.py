"""Shared layer of the MLPerf HPC benchmarks: distribution, config, staging, logging, trainer."""
