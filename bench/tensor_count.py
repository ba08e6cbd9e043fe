"""TensorFlow's own count of its tensors' bytes on the CPU, for the bench scripts.

Set COUNT_TENSORS in a child's environment (read before TensorFlow starts): TensorFlow then
allocates host tensors with its BFC allocator, which counts the bytes in use
(tf.config.experimental.get_memory_info("CPU:0")): the count a GPU's memory follows, without the
host's malloc and TensorFlow's runtime. One process measures either its RSS or its tensors.
"""

COUNT_TENSORS = {"TF_CPU_ALLOCATOR_USE_BFC": "true"}
