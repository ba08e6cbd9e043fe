"""A convolution of a slab and its halo that keeps the parts for backward, not their padded copy.

A convolution on a slab of a split sample reads the slab with its neighbours' boundary rows (or
planes) and zero padding around it: a new tensor, as large as the slab. Left to autodiff, the
convolution keeps that tensor for its backward pass while the layer before keeps the slab itself:
every split convolution would hold its input twice until backward reaches it. Here the gradient is
written out: forward keeps the parts (the slab, which the layer before holds anyway, and the thin
halo strips) and backward assembles the padded input again, a transient, to take the
convolution's own gradient through it.

Backward takes that gradient with a tape over the same convolution: its gradient ops read the
convolution's input and kernel, never its output, so the forward op the tape records there feeds
nothing and TensorFlow prunes it from the function: 1.01 slabs kept per layer against autodiff's
2.02, at equal step times (2-core AMD EPYC, AVX2; docs/figures.md).
"""

import tensorflow as tf


def convolve_rebuilding_input(parts: list, assemble, kernel, convolve):
    """convolve(assemble(*parts), kernel), whose backward rebuilds assemble(*parts) rather than keep it.

    Args:
      parts: the tensors the input is made of (e.g. [halo above, slab, halo below]).
      assemble: parts -> the convolution's input (concatenation, zero padding); differentiable.
      kernel: the kernel as a tensor (read from its variable outside, so the gradient reaches it).
      convolve: (input, kernel) -> output, differentiable.
    Returns:
      The output, with the gradient of the unsplit computation for every part and the kernel.
    """

    @tf.custom_gradient
    def run(*args):
        *inputs, weights = args
        outputs = convolve(assemble(*inputs), weights)

        def grad(upstream):
            # After the gradient arrives: a graph runs an op once its inputs are ready, and these
            # read only forward tensors, so without the dependency the padded input would be built
            # again during forward and kept until backward, as autodiff keeps it.
            with tf.control_dependencies([upstream]), tf.GradientTape() as tape:
                tape.watch(args)
                again = convolve(assemble(*inputs), weights)
            return tape.gradient(again, list(args), output_gradients=upstream)

        return outputs, grad

    return run(*parts, kernel)
