"""The projection's DeepCAM network (offline/projection/height_split.py, arithmetic only) against
deepcam/model.py's, built unsplit at the reference size with TensorFlow: the same layers holding
weights, by name, with the same input shapes and parameters; the same halo and batch-norm layers;
and the same rule for which K split the height."""

import types

import pytest

from offline.projection import height_split

tf = pytest.importorskip("tensorflow")
tf_keras = pytest.importorskip("tf_keras")


@pytest.fixture(scope="module")
def real():
    from deepcam import model

    tf_keras.backend.clear_session()
    net = model.build_model(
        height_split.HEIGHT,
        height_split.WIDTH,
        height_split.IN_CHANNELS,
        height_split.N_CLASSES,
        middle_blocks=height_split.MIDDLE_BLOCKS,
    )
    yield net
    tf_keras.backend.clear_session()


def _trainable(layer) -> int:
    """Trainable parameters (batch norm's moving statistics are not parameters of the count)."""
    return sum(int(tf.size(w)) for w in layer.trainable_weights)


def _weighted(layers):
    return {layer.name: layer for layer in layers if layer.params}


def test_the_constants_are_the_model_s():
    from deepcam import config, model

    assert (height_split.ASPP_RATES, height_split.EXIT_FLOW_DILATION) == (
        model.ASPP_RATES,
        model.EXIT_FLOW_DILATION,
    )
    d, m = config.DataConfig(), config.ModelConfig()
    assert (height_split.HEIGHT, height_split.WIDTH, height_split.IN_CHANNELS) == (
        d.height,
        d.width,
        config.N_CHANNELS,
    )
    assert (height_split.OUTPUT_STRIDE, height_split.MIDDLE_BLOCKS) == (
        m.output_stride,
        m.middle_blocks,
    )


def test_the_rebuilt_layers_are_the_real_model_s(real):
    rebuilt = height_split.network_layers(1)
    assert sum(layer.params for layer in rebuilt) == _trainable(real) == 56_454_720
    layers = {layer.name: layer for layer in real.layers if layer.weights}
    ours = _weighted(rebuilt)
    assert set(ours) == set(layers)
    for name, layer in layers.items():
        assert ours[name].params == _trainable(layer), name
        assert ours[name].in_shape == tuple(layer.input.shape[1:]), name
        assert ours[name].out_shape == tuple(layer.output.shape[1:]), name
    # Spot checks a reader can follow: the padded entry, a middle block, the widest ASPP branch, the last layer.
    for name, shape in (
        ("xception_features.conv1", (770, 1154, 16)),
        ("xception_features.block11.rep.3.conv1", (48, 72, 728)),
        ("bottleneck.aspp4.atrous_convolution", (48, 72, 2048)),
        ("upsample.last_deconv.0", (384, 576, 256)),
    ):
        assert ours[name].in_shape == tuple(layers[name].input.shape[1:]) == shape


def test_halo_and_batch_norm_layers_are_the_real_model_s(real):
    """The layers that read beyond a slab are the convolutions of kernel 3 (3x3, depthwise, dilated,
    strided, transposed); their dilation is the halo of the stride-1 ones."""
    convs = (tf_keras.layers.Conv2D, tf_keras.layers.DepthwiseConv2D)  # Conv2DTranspose is a Conv2D
    wide = {
        layer.name: layer
        for layer in real.layers
        if isinstance(layer, convs) and layer.kernel_size[0] > 1
    }
    rebuilt = height_split.network_layers(1)
    halos = {layer.name: layer for layer in rebuilt if layer.halo}
    assert set(halos) == set(wide) and len(halos) == 74
    for name, layer in wide.items():
        if layer.strides == (1, 1) and not isinstance(layer, tf_keras.layers.Conv2DTranspose):
            assert halos[name].halo == layer.dilation_rate[0], name
    bns = {
        layer.name for layer in real.layers if isinstance(layer, tf_keras.layers.BatchNormalization)
    }
    assert bns == {layer.name for layer in rebuilt if layer.kind == "bn"} and len(bns) == 76


def test_the_height_split_rule_is_the_config_s():
    """height_split.valid_ranks against deepcam/config.py's check_height_split for K up to 64."""
    from common.errors import ConfigError
    from deepcam import config

    def accepted(k):
        cfg = types.SimpleNamespace(
            parallel=types.SimpleNamespace(spatial_ranks=k),
            data=config.DataConfig(),
            model=config.ModelConfig(),
            staging=types.SimpleNamespace(stage_dir=None),
        )
        try:
            config.check_height_split(cfg)
        except ConfigError:
            return False
        return True

    assert (
        [k for k in range(2, 65) if accepted(k)]
        == height_split.valid_ranks()
        == [2, 3, 4, 6, 8, 12, 16, 24, 48]
    )
