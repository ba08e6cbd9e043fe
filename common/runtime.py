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
    return {"device": device, "intra_op_threads": intra, "inter_op_threads": runtime.inter_op_threads,
            "precision": set_precision(runtime, device), "xla": runtime.xla,
            "gradient_compression": runtime.gradient_compression}


def set_precision(runtime, device: str) -> str:
    """Sets the Keras dtype policy for models built from now on; returns its name."""
    precision = "float32"
    if runtime.amp:
        dtype = runtime.amp_dtype
        if dtype == "auto":
            dtype = "float16" if device == "gpu" else "bfloat16"
        precision = f"mixed_{dtype}"
    tf.keras.mixed_precision.set_global_policy(precision)
    return precision


def wrap_optimizer(optimizer):
    """Adds dynamic loss scaling when the global policy computes in float16 (bf16 needs none)."""
    if tf.keras.mixed_precision.global_policy().compute_dtype == "float16":
        return tf.keras.mixed_precision.LossScaleOptimizer(optimizer)
    return optimizer


def accelerators_per_node(device: str, dist) -> int:
    """0 on CPU-only nodes, as the MLPerf HPC rules ask; else the GPUs used on this node."""
    if device != "gpu":
        return 0
    return dist.local_size
