"""Runtime knobs (device, threads, precision), set in one place and reported."""

import os

import tensorflow as tf


def configure(runtime, dist) -> dict:
    """Applies a RuntimeConfig before any TensorFlow op runs; returns what was set.

    Threads default to this node's cores divided among its local ranks, so two
    ranks on one node do not each spawn a pool as large as the machine.
    """
    device = dist.pin_device()
    cores = len(os.sched_getaffinity(0))
    intra = runtime.intra_op_threads or max(1, cores // dist.local_size)
    tf.config.threading.set_intra_op_parallelism_threads(intra)
    tf.config.threading.set_inter_op_parallelism_threads(runtime.inter_op_threads)
    precision = "float32"
    if runtime.amp:
        dtype = runtime.amp_dtype
        if dtype == "auto":
            dtype = "float16" if device == "gpu" else "bfloat16"
        precision = f"mixed_{dtype}"
    tf.keras.mixed_precision.set_global_policy(precision)
    return {"device": device, "intra_op_threads": intra, "inter_op_threads": runtime.inter_op_threads,
            "precision": precision, "xla": runtime.xla, "gradient_compression": runtime.gradient_compression}


def accelerators_per_node(device: str, dist) -> int:
    """0 on CPU-only nodes, as the MLPerf HPC rules ask; else GPUs used per node."""
    if device != "gpu":
        return 0
    return min(dist.local_size, len(tf.config.list_physical_devices("GPU")) * dist.local_size)
