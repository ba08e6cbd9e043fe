"""Input files: sharding, epochs, node-local staging, page cache, synthetic files."""
