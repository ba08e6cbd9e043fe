"""common.parallel.rebuilt_input: a convolution of parts whose backward rebuilds its padded input.

Its gradients are autodiff's (2D and 3D, a part of zero rows included), and the rebuild in backward
waits for the incoming gradient: a graph runs an op once its inputs are ready, so a rebuild reading
only forward tensors would run during forward and be kept, as autodiff keeps the padded input.
What that saves, and that the convolution its tape records is pruned (equal step times), is a
measurement (docs/figures.md), not a test."""

import contextlib

import numpy as np
import pytest
import tensorflow as tf

from common.parallel import rebuilt_input


def _grads(fn, parts, kernel, weights):
    with tf.GradientTape() as tape:
        tape.watch(parts + [kernel])
        out = fn(parts, kernel)
        loss = tf.reduce_sum(out * weights)
    return [out] + tape.gradient(loss, parts + [kernel])


def _assemble_2d(above, slab, below):
    return tf.pad(tf.concat([above, slab, below], axis=1), [[0, 0], [0, 0], [1, 1], [0, 0]])


def _assemble_3d(*planes):
    return tf.pad(tf.concat(planes, axis=1), [[0, 0], [0, 0], [1, 1], [1, 1], [0, 0]])


@pytest.mark.parametrize("rank, top", [(2, 1), (2, 0), (3, 1)])
def test_gradients_are_autodiff_s(rank, top):
    rng = np.random.default_rng(rank + top)
    if rank == 2:
        shapes, kernel_shape, assemble = (
            [(2, top, 5, 3), (2, 6, 5, 3), (2, 1, 5, 3)],
            (3, 3, 3, 4),
            _assemble_2d,
        )
        conv = lambda x, k: tf.nn.conv2d(x, k, 1, "VALID")  # noqa: E731
    else:
        shapes, kernel_shape, assemble = (
            [(1, 1, 4, 5, 2), (1, 6, 4, 5, 2), (1, 1, 4, 5, 2)],
            (3, 3, 3, 2, 3),
            _assemble_3d,
        )
        conv = lambda x, k: tf.nn.conv3d(x, k, [1] * 5, "VALID")  # noqa: E731
    parts = [tf.constant(rng.normal(size=s).astype(np.float32)) for s in shapes]
    kernel = tf.constant(rng.normal(size=kernel_shape).astype(np.float32))
    out_shape = conv(assemble(*parts), kernel).shape
    weights = tf.constant(rng.normal(size=out_shape).astype(np.float32))
    want = _grads(lambda p, k: conv(assemble(*p), k), parts, kernel, weights)
    got = tf.function(
        lambda: _grads(
            lambda p, k: rebuilt_input.convolve_rebuilding_input(p, assemble, k, conv),
            parts,
            kernel,
            weights,
        )
    )()
    for w, g in zip(want, got):
        assert w.shape == g.shape
        np.testing.assert_allclose(
            g.numpy(), w.numpy(), rtol=1e-5, atol=1e-5 * np.abs(w.numpy()).max(initial=0)
        )


def _rebuild_waits_for_the_gradient() -> bool:
    """Whether, in a traced forward and backward, the backward's concatenation (the rebuilt input)
    depends, through data or control edges, on the incoming gradient (ops of the tape's
    gradient_tape/ scope)."""
    parts = [tf.TensorSpec((1, 1, 5, 2)), tf.TensorSpec((1, 4, 5, 2)), tf.TensorSpec((1, 1, 5, 2))]

    @tf.function(input_signature=[parts, tf.TensorSpec((3, 3, 2, 2))])
    def step(p, kernel):
        with tf.GradientTape() as tape:
            tape.watch(p)
            out = rebuilt_input.convolve_rebuilding_input(
                p, _assemble_2d, kernel, lambda x, k: tf.nn.conv2d(x, k, 1, "VALID")
            )
            loss = tf.reduce_sum(out * out)
        return tape.gradient(loss, p)

    concats = [
        op for op in step.get_concrete_function().graph.get_operations() if op.type == "ConcatV2"
    ]
    assert len(concats) == 2  # forward's, then backward's
    seen, todo = set(), [concats[1]]
    while todo:  # the backward concatenation's ancestors
        op = todo.pop()
        for parent in [t.op for t in op.inputs] + list(op.control_inputs):
            if parent.name not in seen:
                seen.add(parent.name)
                todo.append(parent)
    return any(name.startswith("gradient_tape/") for name in seen)


def test_backward_rebuilds_the_input_after_the_gradient_arrives(monkeypatch):
    assert _rebuild_waits_for_the_gradient()
    # The negative control: without the dependency the check sees none.
    monkeypatch.setattr(
        rebuilt_input.tf, "control_dependencies", lambda deps: contextlib.nullcontext()
    )
    assert not _rebuild_waits_for_the_gradient()
