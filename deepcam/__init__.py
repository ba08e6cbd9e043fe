"""DeepCAM (MLPerf HPC): DeepLabv3+ segmentation of extreme weather in climate data."""
