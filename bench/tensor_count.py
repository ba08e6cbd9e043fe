"""TensorFlow's own count of its tensors' bytes on the CPU, for the bench scripts.

Set COUNT_TENSORS in a child's environment (read before TensorFlow starts): TensorFlow then
allocates host tensors with its BFC allocator, which counts the bytes in use
(tf.config.experimental.get_memory_info("CPU:0")): the count a GPU's memory follows, without the
host's malloc and TensorFlow's runtime. One process measures either its RSS or its tensors.
"""

COUNT_TENSORS = {"TF_CPU_ALLOCATOR_USE_BFC": "true"}


def over(run) -> tuple[int, int]:
    """(bytes in use at run()'s peak, bytes held before it), under COUNT_TENSORS."""
    import tensorflow as tf
    held = tf.config.experimental.get_memory_info("CPU:0")["current"]
    tf.config.experimental.reset_memory_stats("CPU:0")
    run()
    return tf.config.experimental.get_memory_info("CPU:0")["peak"], held
