import numpy as np
import pytest

from common.config_loading import load_config
from cosmoflow import model
from cosmoflow.config import CosmoFlowConfig
from tests.helpers import REPO


def count(m):
    return int(sum(np.prod(v.shape) for v in m.trainable_variables))


def test_reference_model_has_8907556_parameters():
    cfg = load_config(CosmoFlowConfig, REPO / "cosmoflow/configs/cosmoflow_closed_gbs512.yaml", {"data.data_dir": "/d"})
    m = model.from_config(cfg)
    assert count(m) == 8_907_556
    assert m.output_shape == (None, 4)
    assert [layer.filters for layer in m.layers if layer.name.startswith("conv") and
            not layer.name.endswith("act")] == [32, 64, 128, 256, 512]


def test_output_is_bounded_by_1_2():
    m = model.build_model((16, 16, 16, 4), conv_size=2, n_conv_layers=2, dropout=0.0)
    big = np.full((2, 16, 16, 16, 4), 1e3, np.float32)
    out = m(big, training=False).numpy()
    assert np.all(np.abs(out) <= model.OUTPUT_SCALE + 1e-6)


def test_weight_decay_is_l2_on_the_hidden_dense_kernels_only():
    # The reference (models/cosmoflow.py) regularizes Dense fc1 and fc2, not the convs or the head.
    m = model.build_model((16, 16, 16, 4), conv_size=2, n_conv_layers=2, dropout=0.0, l2=0.01)
    m(np.zeros((1, 16, 16, 16, 4), np.float32))
    regularized = sorted(layer.name for layer in m.layers if getattr(layer, "kernel_regularizer", None))
    assert regularized == ["fc1", "fc2"]
    expected = sum(0.01 * float(np.sum(np.square(m.get_layer(n).kernel.numpy()))) for n in ("fc1", "fc2"))
    assert float(sum(m.losses)) == pytest.approx(expected, rel=1e-5)
    assert not model.build_model((16, 16, 16, 4), conv_size=2, n_conv_layers=2, l2=0.0).losses
