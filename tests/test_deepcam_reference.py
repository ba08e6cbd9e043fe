"""Our DeepCAM model against the MLPerf reference (PyTorch), with NumPy as the oracle.

The oracle below re-implements, in NumPy and NCHW, what the reference's
modules compute (mlcommons/hpc deepcam/src/deepCam/architecture/
deeplab_xception.py): PyTorch's padding and transposed-convolution placement,
its weight layouts, and DeepLabv3_plus' forward pass module by module, naming
each tensor as the reference's state_dict does. It is written from the
reference, not from deepcam/model.py, so a layer our model places, pads,
orders or names differently shows up as a different number or a missing name.
"""

import importlib.util
import json

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from common.model_folder import restore_model_weights
from deepcam import import_reference, model
from tests import helpers

TINY_CONFIG = (
    helpers.REPO / "tests" / "configs" / "deepcam_tiny.yaml"
)  # width 0.125, one middle block
TINY = dict(width=0.125, middle_blocks=1)


# ------------------------------------------------------------------ PyTorch semantics in NumPy
def torch_conv2d(x, w, stride=1, padding=0, dilation=1, groups=1):
    """nn.Conv2d on one sample: x [C, H, W], w [O, C / groups, kh, kw]; zero padding on each side."""
    c, h, wd = x.shape
    o, _, kh, kw = w.shape
    assert groups in (1, c) and (groups == 1 or o == c), "plain or depthwise only"
    xp = np.pad(x, ((0, 0), (padding, padding), (padding, padding)))
    ho = (h + 2 * padding - dilation * (kh - 1) - 1) // stride + 1
    wo = (wd + 2 * padding - dilation * (kw - 1) - 1) // stride + 1
    out = np.zeros((o, ho, wo))
    for i in range(kh):
        for j in range(kw):
            # Output (r, s) reads padded input (stride * r + dilation * i, stride * s + dilation * j).
            patch = xp[
                :,
                dilation * i : dilation * i + stride * (ho - 1) + 1 : stride,
                dilation * j : dilation * j + stride * (wo - 1) + 1 : stride,
            ]
            if groups == 1:
                out += np.einsum("oc,chw->ohw", w[:, :, i, j], patch)
            else:
                out += w[:, 0, i, j][:, None, None] * patch
    return out


def torch_conv_transpose2d(x, w, stride=2, padding=1, output_padding=1):
    """nn.ConvTranspose2d on one sample: x [C, H, W], w [C, O, kh, kw].

    Input (r, s) adds x * w[..., i, j] at output (stride * r - padding + i,
    stride * s - padding + j); the output has (H - 1) * stride - 2 * padding
    + kh + output_padding rows.
    """
    c, h, wd = x.shape
    _, o, kh, kw = w.shape
    ho = (h - 1) * stride - 2 * padding + kh + output_padding
    wo = (wd - 1) * stride - 2 * padding + kw + output_padding
    full = np.zeros(
        (o, (h - 1) * stride + kh + output_padding, (wd - 1) * stride + kw + output_padding)
    )
    for i in range(kh):
        for j in range(kw):
            full[
                :, i : i + stride * (h - 1) + 1 : stride, j : j + stride * (wd - 1) + 1 : stride
            ] += np.einsum("co,chw->ohw", w[:, :, i, j], x)
    return full[:, padding : padding + ho, padding : padding + wo]


def relu(a):
    return np.maximum(a, 0.0)


def reference_forward(x, param, n_classes=3, width=1.0, middle_blocks=16):
    """DeepLabv3_plus(n_input, n_classes, os=16).eval() on one sample x [C, H, W] -> logits [classes, H, W].

    `param(name, shape)` returns the tensor of the reference's state_dict of
    that name (the shape says what the reference's module would hold). Widths
    scale as our config's model.width does; middle blocks are block4..
    block(3 + middle_blocks), the exit block the next (block20 in the reference).
    """

    def ch(c):
        return max(1, int(round(c * width)))

    def bn(a, name):  # GBN wraps BatchNorm2d as `.bn`; eval mode: running statistics, eps 1e-5
        c = a.shape[0]
        name = f"{name}.bn"
        param(f"{name}.num_batches_tracked", ())
        mean, var = param(f"{name}.running_mean", (c,)), param(f"{name}.running_var", (c,))
        gamma, beta = param(f"{name}.weight", (c,)), param(f"{name}.bias", (c,))
        return (a - mean[:, None, None]) / np.sqrt(var[:, None, None] + 1e-5) * gamma[
            :, None, None
        ] + beta[:, None, None]

    def separable(a, name, cin, cout, stride=1, dilation=1):  # SeparableConv2d_same
        a = torch_conv2d(
            a,
            param(f"{name}.conv1.weight", (cin, 1, 3, 3)),
            stride,
            padding=dilation,
            dilation=dilation,
            groups=cin,
        )
        return torch_conv2d(a, param(f"{name}.pointwise.weight", (cout, cin, 1, 1)))

    def block(
        a,
        name,
        planes,
        reps,
        stride=1,
        dilation=1,
        end_with_relu=True,
        grow_first=True,
        is_last=False,
    ):
        inplanes, planes = a.shape[0], ch(planes)
        # The reference's nn.Sequential `rep`, entry by entry.
        rep, filters = [], inplanes
        if grow_first:
            rep += [("sep", inplanes, planes, 1, dilation), ("bn",), ("relu",)]
            filters = planes
        for _ in range(reps - 1):
            rep += [("sep", filters, filters, 1, dilation), ("bn",), ("relu",)]
        if not grow_first:
            rep += [("sep", inplanes, planes, 1, dilation), ("bn",), ("relu",)]
        rep = rep[:-1]
        if stride != 1:
            rep.append(("sep", planes, planes, 2, 1))
        if stride == 1 and is_last:
            rep.append(("sep", planes, planes, 1, 1))
        y = a
        for index, (kind, *args) in enumerate(rep):
            if kind == "sep":
                y = separable(y, f"{name}.rep.{index}", *args)
            elif kind == "bn":
                y = bn(y, f"{name}.rep.{index}")
            else:
                y = relu(y)
        if planes != inplanes or stride != 1:
            skip = bn(
                torch_conv2d(a, param(f"{name}.skip.weight", (planes, inplanes, 1, 1)), stride),
                f"{name}.skipbn",
            )
        else:
            skip = a
        y = y + skip
        return relu(y) if end_with_relu else y

    # Xception
    p = "xception_features"
    a = torch_conv2d(x, param(f"{p}.conv1.weight", (ch(32), x.shape[0], 3, 3)), stride=2, padding=1)
    a = relu(bn(a, f"{p}.bn1"))
    a = relu(
        bn(
            torch_conv2d(a, param(f"{p}.conv2.weight", (ch(64), ch(32), 3, 3)), padding=1),
            f"{p}.bn2",
        )
    )
    a = block(a, f"{p}.block1", 128, reps=2, stride=2, end_with_relu=False)
    # `low_level_feat = x; x = self.relu(x)` with an in-place ReLU: both are ReLU(block1).
    a = low_level = relu(a)
    a = block(a, f"{p}.block2", 256, reps=2, stride=2)
    a = block(a, f"{p}.block3", 728, reps=2, stride=2, is_last=True)
    for i in range(middle_blocks):
        a = block(a, f"{p}.block{4 + i}", 728, reps=3)
    a = block(
        a,
        f"{p}.block{4 + middle_blocks}",
        1024,
        reps=2,
        end_with_relu=False,
        grow_first=False,
        is_last=True,
    )
    for k, (cin, cout) in zip((3, 4, 5), ((1024, 1536), (1536, 1536), (1536, 2048))):
        a = relu(bn(separable(a, f"{p}.conv{k}", ch(cin), ch(cout), dilation=2), f"{p}.bn{k}"))

    # Bottleneck: ASPP at rates 1, 6, 12, 18 and the pooling branch
    c, cin = ch(256), a.shape[0]
    branches = []
    for k, rate in enumerate((1, 6, 12, 18), start=1):
        size, pad = (1, 0) if rate == 1 else (3, rate)
        y = torch_conv2d(
            a,
            param(f"bottleneck.aspp{k}.atrous_convolution.weight", (c, cin, size, size)),
            padding=pad,
            dilation=rate,
        )
        branches.append(relu(bn(y, f"bottleneck.aspp{k}.bn")))
    g = "bottleneck.global_avg_pool.global_average_pool"
    pooled = torch_conv2d(
        a.mean(axis=(1, 2), keepdims=True), param(f"{g}.1.weight", (c, cin, 1, 1))
    )
    pooled = relu(param(f"{g}.2.weights", (c, 1, 1)) * pooled + param(f"{g}.2.bias", (c, 1, 1)))
    # torch.tile to (48, 72): the feature size at 768x1152; here, the feature size.
    branches.append(np.broadcast_to(pooled, (c,) + a.shape[1:]))
    a = torch_conv2d(np.concatenate(branches), param("bottleneck.conv.weight", (c, 5 * c, 1, 1)))
    a = relu(bn(a, "bottleneck.bn"))

    # Low-level features and the decoder
    low = relu(bn(torch_conv2d(low_level, param("conv2.weight", (ch(48), ch(128), 1, 1))), "bn2"))
    u = "upsample"
    a = relu(
        bn(
            torch_conv_transpose2d(a, param(f"{u}.deconv1.0.weight", (c, c, 3, 3))),
            f"{u}.deconv1.1",
        )
    )
    a = relu(
        bn(
            torch_conv_transpose2d(a, param(f"{u}.deconv1.3.weight", (c, c, 3, 3))),
            f"{u}.deconv1.4",
        )
    )
    a = np.concatenate([a, low])
    a = relu(
        bn(
            torch_conv2d(a, param(f"{u}.conv1.0.weight", (c, c + ch(48), 3, 3)), padding=1),
            f"{u}.conv1.1",
        )
    )
    a = relu(
        bn(torch_conv2d(a, param(f"{u}.conv1.3.weight", (c, c, 3, 3)), padding=1), f"{u}.conv1.4")
    )
    a = (
        torch_conv2d(a, param(f"{u}.conv1.6.weight", (c, c, 1, 1)))
        + param(f"{u}.conv1.6.bias", (c,))[:, None, None]
    )
    a = relu(
        bn(
            torch_conv_transpose2d(a, param(f"{u}.deconv2.0.weight", (c, c, 3, 3))),
            f"{u}.deconv2.1",
        )
    )
    return torch_conv_transpose2d(a, param(f"{u}.last_deconv.0.weight", (c, n_classes, 3, 3)))


def reference_shapes(n_input, **size) -> dict:
    """{name: shape} of the reference's state_dict, by running the oracle on a 16x16 zero input."""
    shapes = {}

    def record(name, shape):
        shapes[name] = shape
        return np.zeros(shape)

    reference_forward(np.zeros((n_input, 16, 16)), record, **size)
    return shapes


def random_state(shapes, seed=0) -> dict:
    """A reference state dict with random values at scales that keep activations O(1)."""
    rng = np.random.default_rng(seed)
    state = {}
    for name, shape in shapes.items():
        if name.endswith("num_batches_tracked"):
            value = np.array(7, np.int64)
        elif name.endswith("running_var"):
            value = rng.uniform(0.5, 1.5, shape)
        elif name.endswith(("bn.weight", ".weights")):  # batch norm and TrainableAffine scales
            value = rng.uniform(0.7, 1.3, shape)
        elif name.endswith(("running_mean", "bias")):
            value = rng.normal(0.0, 0.1, shape)
        else:  # convolution weights
            value = rng.normal(0.0, 1.0, shape) / np.sqrt(np.prod(shape[1:]))
        state[name] = value.astype(np.float32) if value.dtype == np.float64 else value
    return state


def keras_nchw(net, x_chw):
    """Our model in inference mode on one NCHW sample, back in NCHW."""
    out = net(tf.constant(x_chw.transpose(1, 2, 0)[None], tf.float32), training=False)
    return out.numpy()[0].transpose(2, 0, 1)


def assert_close(ours, oracle, rel=1e-4):
    scale = np.abs(oracle).max()
    assert scale > 0.1, "degenerate oracle output"
    assert ours.shape == oracle.shape
    assert np.abs(ours - oracle).max() <= rel * scale, (
        f"max diff {np.abs(ours - oracle).max():.3g} of {scale:.3g}"
    )


# ------------------------------------------------------------------ single layers
def test_entry_conv_pads_one_on_each_side_as_pytorch():
    # Even and odd sizes: TF's "same" would pad 0 before and 1 after (even) and differ.
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 10, 13))
    w = rng.normal(size=(4, 3, 3, 3))
    inputs = tf_keras.Input((10, 13, 3))
    net = tf_keras.Model(inputs, model.entry_conv(inputs, 4, name="conv1"))
    net.get_layer("conv1").kernel.assign(import_reference.CONV.to_keras(w))
    assert_close(keras_nchw(net, x), torch_conv2d(x, w, stride=2, padding=1), rel=1e-5)


def test_transposed_conv_places_taps_as_pytorch():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(3, 5, 7))
    w = rng.normal(size=(3, 4, 3, 3))  # PyTorch [in, out, kh, kw]
    inputs = tf_keras.Input((5, 7, 3))
    net = tf_keras.Model(inputs, model.transposed_conv(inputs, 4, name="deconv"))
    net.get_layer("deconv").kernel.assign(import_reference.CONV.to_keras(w))
    oracle = torch_conv_transpose2d(x, w)
    assert oracle.shape == (4, 10, 14)
    assert_close(keras_nchw(net, x), oracle, rel=1e-5)


def test_decoder_low_level_branch_reads_relu_of_block1():
    net = model.build_model(32, 48, 3, width_multiplier=0.125, middle_blocks=1)
    # The 48-channel reduction's input against block 1's sum (before any ReLU).
    probe = tf_keras.Model(
        net.input,
        [net.get_layer("xception_features.block1_add").output, net.get_layer("conv2").input],
    )
    block1, low = probe(tf.random.normal([1, 32, 48, 3]), training=False)
    assert float(tf.reduce_min(block1)) < 0
    np.testing.assert_array_equal(low.numpy(), np.maximum(block1.numpy(), 0))


# ------------------------------------------------------------------ the whole network, by import
@pytest.fixture(scope="module")
def reference_npz(tmp_path_factory):
    """A small-width reference state dict (5 input fields) as the npz the import reads, with DDP's prefix."""
    shapes = reference_shapes(5, **TINY)
    state = random_state(shapes)
    path = tmp_path_factory.mktemp("reference") / "state.npz"
    np.savez(path, **{f"module.{name}": value for name, value in state.items()})
    return path, state


def test_imported_model_computes_the_reference_function(reference_npz, tmp_path):
    path, state = reference_npz
    out = import_reference.import_reference(
        path, tmp_path / "imported", TINY_CONFIG, print_fn=lambda *a: None
    )
    record = json.loads((out / "import.json").read_text())
    n_counters = sum(name.endswith("num_batches_tracked") for name in state)
    assert record["tensors"] == len(state) - n_counters and record["input_channels"] == 5
    assert "channels:\n  - 0\n  - 1\n  - 2\n  - 3\n  - 4\n" in (out / "config.yaml").read_text()

    # A fresh model at another size reads the folder; every tensor must act where the reference's does.
    # A 20x21 feature map (input / 16): ASPP's 6, 12 and 18 dilations each reach other pixels.
    net = model.build_model(320, 336, 5, width_multiplier=0.125, middle_blocks=1)
    restore_model_weights(net, out)
    x = np.random.default_rng(3).normal(size=(5, 320, 336))
    oracle = reference_forward(x, lambda name, shape: state[name].astype(np.float64), **TINY)
    assert_close(keras_nchw(net, x), oracle)


@pytest.mark.parametrize(
    "change, named",
    [
        ("missing", "upsample.conv1.6.bias"),
        ("extra", "bottleneck.aspp5.bn.bn.weight"),
        ("misshaped", "xception_features.block4.rep.3.conv1.weight"),
    ],
)
def test_import_rejects_a_tensor_named_in_one_line(reference_npz, tmp_path, capsys, change, named):
    _, state = reference_npz
    state = dict(state)
    if change == "missing":
        del state[named]
    elif change == "extra":
        state[named] = np.ones(32, np.float32)
    else:
        state[named] = np.ones((12, 1, 5, 5), np.float32)
    bad = tmp_path / "bad.npz"
    np.savez(bad, **state)
    assert (
        import_reference.main([str(bad), str(tmp_path / "out"), "--config", str(TINY_CONFIG)]) == 2
    )
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and named in err and "\n" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(
    importlib.util.find_spec("torch") is not None,
    reason="torch is installed here: the .pt file would be read",
)
def test_pytorch_file_without_torch_says_how_to_convert(tmp_path, capsys):
    pt = tmp_path / "model.pt"
    pt.write_bytes(b"not read")
    assert import_reference.main([str(pt), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "needs torch" in err and "numpy.savez" in err
