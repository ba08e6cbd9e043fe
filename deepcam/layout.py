"""Names in the public DeepCAM on-disk layout (no TensorFlow import: used by worker processes)."""

SUFFIXES = (".h5",)
DATA_KEY = "climate/data"  # float32 [height, width, 16]
LABEL_KEY = "climate/labels_0"  # [height, width]: 0 background, 1 cyclone, 2 river
STATS_FILE = "stats.h5"  # climate/minval, maxval, mean, sqmean, count per channel

# Staged layout (staging.convert, deepcam.sample_files.raw_layout): NAME.h5 -> NAME.raw holding the
# selected channels as float32 [height, width, channels], C order, little-endian, then
# the labels as uint8 [height, width]; no header (the staging manifest names the layout).
RAW_SUFFIX = ".raw"
