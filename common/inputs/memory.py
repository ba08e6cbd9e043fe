"""Whether a cache fits in this node's memory."""

import psutil

CACHE_MEMORY_FRACTION = 0.5  # leave the rest to the framework, the model and the page cache


def fits_in_memory(nbytes: int, local_size: int) -> bool:
    """True if `nbytes` per rank, times the node's ranks, fits in half the available memory."""
    return nbytes * max(1, local_size) <= CACHE_MEMORY_FRACTION * psutil.virtual_memory().available
