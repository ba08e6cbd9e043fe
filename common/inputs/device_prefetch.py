"""The input pipeline's last stage: batches copied to the device ahead of the step that takes them.

Without it, every train step starts by copying its batch from host memory to the GPU
(a CosmoFlow local batch of 4 is 64 MiB of int16, a DeepCAM batch of 2 is 115 MB), while
the GPU waits. `tf.data.experimental.prefetch_to_device` (in TF 2.x: copy_to_device, then
a prefetch buffer on the device) makes the copy in tf.data's own thread instead, while the
step before runs. What travels is what the pipeline yields, the compact batches (int16
counts; float32 fields and uint8 labels): casts and normalization run inside the compiled
step (Task.preprocess_batch), on the device.

It must be the last transformation: the host pipeline behind it keeps its own options,
optimizations and autotuning (its iterator is made on the host, where TensorFlow finalizes
it), and the device side holds only the copy and its buffer. In eager mode the prefetch
and the iterator of `iter(dataset)` are colocated with the copy, so `next()` from a Python
loop returns tensors already on the device, which the tf.function steps take as they are.
"""

import tensorflow as tf

# Batches held on the device beyond the one a step is using: the copy of the next batch
# overlaps the current step (a copy takes milliseconds, a step hundreds); each more batch
# costs device memory and gains nothing once one is always ready.
DEVICE_BUFFER = 1

OFF = "off"


def target_device(setting: str, device: str) -> str:
    """Where the last stage prefetches batches to: '/gpu:0', '/cpu:0', or 'off' (they stay in host memory).

    Args:
      setting: runtime.prefetch_to_device: 'auto' (on for a GPU, off for a CPU), 'on' or 'off'.
      device: the device kind this rank computes on ('gpu' or 'cpu', Distribution.device).
        A rank's GPU is '/gpu:0', the only one visible to it once pinned (common.parallel.distribution).
        'on' on a CPU prefetches to '/cpu:0': no copy, the same stage, so it can be tested there.
    """
    if setting not in ("auto", "on", "off"):
        raise ValueError(f"prefetch_to_device must be auto, on or off, not {setting!r}")
    if setting == "off" or (setting == "auto" and device != "gpu"):
        return OFF
    return "/gpu:0" if device == "gpu" else "/cpu:0"


def host_options(threads: int) -> tf.data.Options:
    """Options for the whole host pipeline, given last before the stage: tf.data's thread pool.

    Args:
      threads: the rank's cores (common.parallel.binding's rule: its CPUs, divided among the
        node's ranks where they share them; the runtime's "input_threads").
    """
    options = tf.data.Options()
    # tf.data's maps and interleaves run on a private pool of the rank's cores: not on a pool
    # TensorFlow sizes itself, which ran at most as many calls at once as the process has CPUs
    # whatever runtime.inter_op_threads (TF 2.21; tests/test_device_prefetch.py), i.e. the whole
    # node's on a rank no launcher bound.
    options.threading.private_threadpool_size = threads
    return options


def prefetch_to(dataset: tf.data.Dataset, target: str) -> tf.data.Dataset:
    """`dataset` with its batches prefetched to `target` (a target_device answer; 'off': as it is).

    Nothing may be applied after it (prefetch_to_device must be the last transformation).
    """
    if target == OFF:
        return dataset
    return dataset.apply(tf.data.experimental.prefetch_to_device(target, buffer_size=DEVICE_BUFFER))
