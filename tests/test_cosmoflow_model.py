import numpy as np
import pytest

from common.config import load_config
from cosmoflow import model
from cosmoflow.config import CosmoFlowConfig
from tests.helpers import REPO


def count(m):
    return int(sum(np.prod(v.shape) for v in m.trainable_variables))


def test_reference_model_has_8907556_parameters():
    cfg = load_config(
        CosmoFlowConfig,
        REPO / "cosmoflow/configs/cosmoflow_closed_gbs512.yaml",
        {"data.data_dir": "/d"},
    )
    m = model.from_config(cfg)
    assert count(m) == 8_907_556
    assert m.output_shape == (None, 4)
    assert [
        layer.filters
        for layer in m.layers
        if layer.name.startswith("conv") and not layer.name.endswith("act")
    ] == [32, 64, 128, 256, 512]


def test_output_is_bounded_by_1_2():
    m = model.build_model((16, 16, 16, 4), conv_size=2, n_conv_layers=2, dropout=0.0)
    big = np.full((2, 16, 16, 16, 4), 1e3, np.float32)
    out = m(big, training=False).numpy()
    assert np.all(np.abs(out) <= model.OUTPUT_SCALE + 1e-6)


def test_weight_decay_is_l2_on_the_hidden_dense_kernels_only():
    # The reference (models/cosmoflow.py) regularizes Dense fc1 and fc2, not the convs or the head.
    m = model.build_model((16, 16, 16, 4), conv_size=2, n_conv_layers=2, dropout=0.0, l2=0.01)
    m(np.zeros((1, 16, 16, 16, 4), np.float32))
    regularized = sorted(
        layer.name for layer in m.layers if getattr(layer, "kernel_regularizer", None)
    )
    assert regularized == ["fc1", "fc2"]
    expected = sum(
        0.01 * float(np.sum(np.square(m.get_layer(n).kernel.numpy()))) for n in ("fc1", "fc2")
    )
    assert float(sum(m.losses)) == pytest.approx(expected, rel=1e-5)
    assert not model.build_model((16, 16, 16, 4), conv_size=2, n_conv_layers=2, l2=0.0).losses


def _parameters_by_hand(
    edge: int, layers: int, cap: int, conv_size: int = 32, channels: int = 4
) -> int:
    """Conv kernels 3^3 x in x out + bias, then fc1 on 4^3 x last filters, fc2, head: counted from the shapes."""
    total, c_in = 0, channels
    for i in range(layers):
        c_out = min(conv_size * 2**i, cap)
        total += 27 * c_in * c_out + c_out
        c_in = c_out
    flat = (edge // 2**layers) ** 3 * c_in
    return total + (flat * 128 + 128) + (128 * 64 + 64) + (64 * 4 + 4)


@pytest.mark.parametrize("edge", [256, 512])
def test_large_volume_configs_take_log2_minus_2_layers_with_capped_filters(edge):
    cfg = load_config(
        CosmoFlowConfig,
        REPO / f"cosmoflow/configs/cosmoflow_spatial_{edge}.yaml",
        {"data.data_dir": "/d"},
    )
    layers = int(np.log2(edge)) - 2
    assert cfg.model.n_conv_layers == layers and cfg.data.sample_shape[0] == edge
    m = model.from_config(cfg)  # unsplit: the shapes are symbolic, no activation memory is taken
    filters = [
        layer.filters
        for layer in m.layers
        if layer.name.startswith("conv") and not layer.name.endswith("act")
    ]
    assert max(filters) == cfg.model.max_channels == 256 and len(filters) == layers
    assert m.get_layer("fc1").kernel.shape[0] == 4**3 * 256  # fc1 does not grow with the volume
    assert count(m) == _parameters_by_hand(edge, layers, 256)
    # Uncapped, fc1 would hold most of the model.
    uncapped = model.build_model(cfg.data.sample_shape, n_conv_layers=layers)
    assert count(uncapped) == _parameters_by_hand(edge, layers, 10**9) > 3 * count(m)
