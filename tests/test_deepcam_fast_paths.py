"""DeepCAM's faster convolution paths compute what the plain Keras formulations compute.

deepcam/model.py runs a dilated convolution as one Conv2D op with a `dilations`
attribute (not Keras' SpaceToBatchND route) and a PyTorch-style transposed
convolution with explicit padding (not "valid" and a crop); both were chosen
for speed (bench/deepcam_vs_reference.py). Here each is checked against the
slower formulation on small inputs: outputs, input gradients and kernel
gradients. (The whole network against the PyTorch reference: tests/test_deepcam_reference.py.)
"""

import numpy as np
import pytest
import tensorflow as tf

from deepcam import model


def _output_and_gradients(fn, x, kernel):
    x = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
        # A loss that weighs every output position differently.
        loss = tf.reduce_sum(
            y
            * tf.reshape(tf.range(tf.size(y), dtype=y.dtype), tf.shape(y))
            / tf.cast(tf.size(y), y.dtype)
        )
    dx, dk = tape.gradient(loss, [x, kernel])
    return y.numpy(), dx.numpy(), dk.numpy()


def _assert_same(got, expected, rel=1e-5):
    for name, a, b in zip(("output", "input gradient", "kernel gradient"), got, expected):
        assert a.shape == b.shape, name
        scale = np.abs(b).max()
        assert np.abs(a - b).max() <= rel * scale, (
            f"{name}: max diff {np.abs(a - b).max():.3g} of {scale:.3g}"
        )


@pytest.mark.skipif(
    not model.direct_dilation_supported(),
    reason="no dilated Conv2D backward pass here (oneDNN off, no GPU)",
)
@pytest.mark.parametrize("rate", [2, 6, 18])
def test_direct_dilated_conv_equals_space_to_batch(rate):
    # 10x13: odd and even sides, smaller than the rate-18 kernel's reach (all but the centre tap in padding).
    rng = np.random.default_rng(rate)
    x = rng.normal(size=(2, 10, 13, 5)).astype(np.float32)
    layer = model.DilatedConv2D(
        4, 3, padding="same", dilation_rate=rate, use_bias=True, direct=True
    )
    layer.build(x.shape)
    layer.bias.assign(rng.normal(size=4).astype(np.float32))
    keras_way = model.DilatedConv2D.from_config(layer.get_config() | {"direct": False})
    keras_way.build(x.shape)
    keras_way.set_weights(layer.get_weights())
    direct = _output_and_gradients(layer, x, layer.kernel)
    _assert_same(direct, _output_and_gradients(keras_way, x, keras_way.kernel))


@pytest.mark.parametrize("size", [(5, 7), (6, 6)])
def test_explicitly_padded_transposed_conv_equals_valid_then_crop(size):
    rng = np.random.default_rng(sum(size))
    x = rng.normal(size=(2, *size, 3)).astype(np.float32)
    layer = model.TorchConvTranspose2D(4, use_bias=False)
    layer.build(x.shape)
    layer.kernel.assign(rng.normal(size=layer.kernel.shape).astype(np.float32))

    def valid_then_crop(inputs):
        # The reference's taps: TF's "valid" places tap k of input i at 2i + k; PyTorch at 2i - 1 + k.
        h, w = size
        y = tf.nn.conv2d_transpose(
            inputs, layer.kernel, [2, 2 * h + 1, 2 * w + 1, 4], strides=2, padding="VALID"
        )
        return y[:, 1:, 1:, :]

    got = _output_and_gradients(layer, x, layer.kernel)
    assert got[0].shape == (2, 2 * size[0], 2 * size[1], 4)
    _assert_same(got, _output_and_gradients(valid_then_crop, x, layer.kernel))


@pytest.mark.parametrize("flags, bf16_direct", [({"avx2"}, False), ({"avx2", "avx512f"}, True)])
def test_bfloat16_dilation_takes_the_direct_op_only_where_onednn_runs_bfloat16(
    monkeypatch, flags, bf16_direct
):
    # oneDNN takes bfloat16 only on AVX-512 CPUs; elsewhere TensorFlow's Eigen kernels run the direct
    # dilated op, and they have no backward pass for it: the Keras route is taken then. float32 is oneDNN's
    # on either (where its kernels are on: this suite's runs turn them on).
    from common import cpu

    monkeypatch.setattr(cpu, "_cpuinfo", lambda: ("a CPU", frozenset(flags)))
    monkeypatch.setattr(cpu, "onednn_enabled", lambda: True)
    monkeypatch.setattr(tf.config, "list_logical_devices", lambda kind=None: [])
    assert model.direct_dilation_supported(tf.float32)
    assert model.direct_dilation_supported(tf.bfloat16) == bf16_direct
    monkeypatch.setattr(cpu, "onednn_enabled", lambda: False)
    assert not model.direct_dilation_supported(tf.float32)
