"""DeepCAM model size and initialization, prediction, loss and IoU metric against hand-computed cases,
and the IoU of an evaluation whose last batch is padded.

(The model's function against the reference's: tests/test_deepcam_reference.py.)
"""

import math
from types import SimpleNamespace

import h5py
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from common.config import dump_config
from common.model_folder import CONFIG_NAME, restore_model_weights, save_model_weights
from common.run.steps import eval_step_specs, make_eval_step
from common.run.trainer import Trainer, padded_batches
from deepcam import import_reference, model, predict, task
from tests import helpers
from tests.fake_distribution import OneRankDistribution

TINY_CONFIG = (
    helpers.REPO / "tests" / "configs" / "deepcam_tiny.yaml"
)  # width 0.125, one middle block


def count(m):
    return int(sum(np.prod(v.shape) for v in m.trainable_variables))


@pytest.fixture(scope="module")
def full_model():
    """The reference-size model, built once (about 10 s) for the size and initialization tests."""
    tf_keras.utils.set_random_seed(5)
    return model.build_model(768, 1152, 16)


def test_full_model_has_the_reference_parameter_count(full_model):
    assert count(full_model) == 56_454_720
    assert full_model.output_shape == (None, 768, 1152, 3)
    assert full_model.output.dtype == tf.float32


def pytorch_initial_distribution(name, torch_shape, weight_shape):
    """(kind, "normal" or "uniform", std) of a reference tensor when DeepLabv3_plus is built.

    Xception and ASPP_module call kaiming_normal_ on their nn.Conv2d weights:
    N(0, 2 / fan_in). Every other convolution keeps PyTorch's default,
    kaiming_uniform_(a=sqrt 5): U(-b, b), b = 1 / sqrt(fan_in), as does the one
    bias. PyTorch's fan-in is dim 1 x kh x kw of the weight: in / groups for a
    convolution [out, in / groups, kh, kw], out for a transposed one [in, out, kh, kw].
    """
    fan_in = weight_shape[1] * weight_shape[2] * weight_shape[3]
    if name.endswith(".bias"):
        return "bias", "uniform", 1 / math.sqrt(fan_in) / math.sqrt(3)
    if name.startswith(("xception_features.", "bottleneck.aspp")):
        if name == "xception_features.conv1.weight":
            kind = "entry conv"
        elif torch_shape[1] == 1:
            kind = "depthwise"
        elif torch_shape[2:] == (1, 1) and name.startswith("xception_features."):
            kind = "pointwise and skip"
        else:
            kind = "ASPP and 3x3 conv" if name.startswith("bottleneck") else "entry 3x3 conv"
        return kind, "normal", math.sqrt(2 / fan_in)
    kind = "transposed conv" if "deconv" in name else "default-init conv"
    return kind, "uniform", 1 / math.sqrt(fan_in) / math.sqrt(3)


def test_initialization_follows_pytorch_per_layer(full_model):
    # One build gives thousands to millions of draws per kind (the smallest: the
    # 4608 of the entry conv), so one seed decides; each layer of 4096 draws or
    # more is checked alone as well (its std is then known to about 1%).
    mapping = import_reference.tensor_map(full_model)
    pooled = {}
    for name, (variable, layout) in mapping.items():
        value = variable.numpy()
        suffix = name.rsplit(".", 1)[1]
        if (
            suffix in ("running_mean", "running_var")
            or ".bn." in name
            or ".global_average_pool.2." in name
        ):
            # Batch norm and TrainableAffine: scale 1, shift 0; running statistics 0 and 1.
            expected = 1.0 if suffix in ("weight", "weights", "running_var") else 0.0
            np.testing.assert_array_equal(value, expected, err_msg=name)
            continue
        weight = name.rsplit(".", 1)[0] + ".weight"
        torch_shape = layout.reference_shape(variable.shape)
        kind, law, std = pytorch_initial_distribution(
            name, torch_shape, mapping[weight][1].reference_shape(mapping[weight][0].shape)
        )
        z = value.ravel() / std
        if z.size >= 4096:
            assert abs(z.std() - 1) < 0.1, f"{name}: std {value.std():.4g}, PyTorch's {std:.4g}"
        pooled.setdefault((kind, law), []).append(z)
    assert set(kind for kind, _ in pooled) == {
        "entry conv",
        "entry 3x3 conv",
        "depthwise",
        "pointwise and skip",
        "ASPP and 3x3 conv",
        "default-init conv",
        "transposed conv",
        "bias",
    }
    for (kind, law), parts in pooled.items():
        z = np.concatenate(parts)
        assert abs(z.std() - 1) < 0.1, f"{kind}: std {z.std():.3f} x PyTorch's"
        if law == "normal":
            # Not truncated: a normal has 1.24% beyond 2.5 sigma, Keras' truncated he_normal none.
            assert 0.006 < np.mean(np.abs(z) > 2.5) < 0.02, kind
        else:
            assert np.abs(z).max() <= math.sqrt(3) * (1 + 1e-6), kind  # within the uniform bound
            assert np.abs(z).max() > 0.95 * math.sqrt(3), kind  # and reaching it


def write_sample(path, x, y):
    """The public layout, written with h5py here (not with the project's writer)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        f["climate/data"] = x
        f["climate/labels_0"] = y.astype(np.float32)


def numpy_iou(labels, pred, n_classes=3):
    """Mean over classes of TP / (TP + FP + FN); a class in neither counts 1."""
    scores = []
    for c in range(n_classes):
        union = np.sum((labels == c) | (pred == c))
        scores.append(np.sum((labels == c) & (pred == c)) / union if union else 1.0)
    return float(np.mean(scores))


def test_predict_writes_logits_mask_and_picture(tmp_path, capsys):
    # A tiny model saved as an import would be (weights + config.yaml), a sample of
    # another size than the config's, its stats.h5 in the folder above (DATA layout).
    cfg = predict.load_model_config(TINY_CONFIG)
    net = model.from_config(cfg)
    folder = save_model_weights(net, tmp_path / "imported")
    dump_config(cfg, folder / CONFIG_NAME)
    rng = np.random.default_rng(0)
    lo, hi = rng.uniform(-50, 0, 16), rng.uniform(10, 300, 16)
    x = (lo + (hi - lo) * rng.uniform(size=(32, 48, 16))).astype(np.float32)
    labels = rng.integers(0, 3, (32, 48))
    sample = tmp_path / "data" / "validation" / "s.h5"
    write_sample(sample, x, labels)
    with h5py.File(tmp_path / "data" / "stats.h5", "w") as f:
        f["climate/minval"], f["climate/maxval"] = lo, hi

    out = tmp_path / "prediction"
    assert predict.main([str(folder), str(sample), "--out", str(out)]) == 0

    logits, mask = np.load(out / "logits.npy"), np.load(out / "mask.npy")
    assert logits.shape == (32, 48, 3) and logits.dtype == np.float32
    assert mask.shape == (32, 48) and np.array_equal(mask, logits.argmax(-1))
    assert (out / "prediction.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Normalized as training normalizes, (x - min) / (max - min), and run in inference mode.
    same = model.build_model(32, 48, 16, width_multiplier=0.125, middle_blocks=1)
    restore_model_weights(same, folder)
    expected = same(((x - lo) / (hi - lo))[None].astype(np.float32), training=False).numpy()[0]
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
    line = capsys.readouterr().out.strip()
    assert (
        "\n" not in line
        and f"IoU {numpy_iou(labels, mask):.4f}" in line
        and str(out / "mask.npy") in line
    )


def test_predict_without_a_config_is_an_input_error(tmp_path, capsys):
    net = model.build_model(32, 48, 16, width_multiplier=0.125, middle_blocks=1)
    folder = save_model_weights(net, tmp_path / "bare")
    write_sample(tmp_path / "s.h5", np.zeros((32, 48, 16), np.float32), np.zeros((32, 48)))
    assert predict.main([str(folder), str(tmp_path / "s.h5"), "--out", str(tmp_path / "p")]) == 2
    assert "pass --config" in capsys.readouterr().err


def test_small_model_runs_and_scales_with_width():
    m = model.build_model(64, 96, 4, width_multiplier=0.125, middle_blocks=1)
    out = m(tf.random.normal([2, 64, 96, 4]), training=True)
    assert out.shape == (2, 64, 96, 3)
    assert count(m) < count(model.build_model(64, 96, 4, width_multiplier=0.25, middle_blocks=1))


def test_loss_weights_classes_by_inverse_frequency_power():
    # Two pixels, label 0 and 2, uniform logits: CE = log 3 for both.
    labels = tf.constant([[[0, 2]]])
    logits = tf.zeros([1, 1, 2, 3])
    w = task.CLASS_WEIGHTS
    assert w[0] == pytest.approx(0.986267818390377**-0.125)
    expected = np.log(3) * (w[0] + w[2]) / 2
    assert float(task.weighted_cross_entropy(labels, logits)) == pytest.approx(expected, rel=1e-6)
    # A confident correct pixel costs almost nothing, whatever its weight.
    confident = tf.constant([[[[0.0, 0.0, 30.0]]]])
    assert float(task.weighted_cross_entropy(tf.constant([[[2]]]), confident)) < 1e-10


def one_hot_logits(pred):
    return tf.one_hot(tf.constant(pred), 3) * 10.0


def test_iou_by_hand_including_absent_classes():
    label = [[0, 0, 1, 2]]
    pred = [[0, 1, 1, 0]]
    # class 0: TP 1, FP 1 (last), FN 1 (second) -> 1/3; class 1: TP 1, FP 1 -> 1/2;
    # class 2: TP 0, FN 1 -> 0.
    score = task.per_sample_iou(tf.constant([label]), one_hot_logits([pred]))
    assert float(score[0]) == pytest.approx((1 / 3 + 1 / 2 + 0) / 3)
    # Classes 1 and 2 absent from label and prediction count 1 each.
    score = task.per_sample_iou(tf.constant([[[0, 0]]]), one_hot_logits([[[0, 0]]]))
    assert float(score[0]) == pytest.approx(1.0)
    # Per sample, then averaged: the metric's sums over a batch of both.
    both = task.mean_iou().update(
        tf.constant([[label[0]], [[0, 0, 0, 0]]]), one_hot_logits([[pred[0]], [[0, 0, 0, 0]]])
    )
    assert both.numpy() == pytest.approx([(1 / 3 + 1 / 2) / 3 + 1.0, 2.0])
    assert task.mean_iou().finalize(both.numpy()) == pytest.approx(((1 / 3 + 1 / 2) / 3 + 1.0) / 2)


def _evaluation(net, eval_step, batches) -> tuple[float, float]:
    """(IoU, mean loss) of common.run.trainer.Trainer.evaluate over `batches` of (x, y, n), one rank."""
    ctx = SimpleNamespace(
        metric=task.mean_iou(),
        eval_step=eval_step,
        dist=OneRankDistribution(),
        mesh=SimpleNamespace(size=1),
        task=None,
        shards=SimpleNamespace(valid_files=[]),
    )
    return Trainer.evaluate(ctx, batches, epoch=1)


def test_a_padded_last_batch_leaves_iou_and_loss_as_unpadded_and_is_traced_at_init():
    """7 validation samples in batches of 3: the last holds 1, padded to 3 (padded_batches), the eval
    step traced once, at init's specs. The IoU and the per-sample loss are those of the same metric
    and loss over the unpadded batches, as evaluation computed them before padding."""
    tf_keras.utils.set_random_seed(7)
    net = model.build_model(32, 48, 4, width_multiplier=0.0625, middle_blocks=1)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(7, 32, 48, 4)).astype(np.float32)
    y = rng.integers(0, 3, size=(7, 32, 48)).astype(np.int32)
    batch = 3
    unpadded = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)
    metric, sums, loss = task.mean_iou(), np.zeros(2), 0.0
    for xb, yb in unpadded:
        pred = net(xb, training=False)
        sums += metric.update(yb, pred).numpy()
        loss += float(task.weighted_cross_entropy(yb, pred)) * len(xb)
    want = (metric.finalize(sums), loss / len(x))

    specs = (
        tf.TensorSpec((batch, 32, 48, 4), tf.float32),
        tf.TensorSpec((batch, 32, 48), tf.int32),
    )
    eval_step = make_eval_step(net, metric, loss_fn=task.weighted_cross_entropy)
    eval_step.get_concrete_function(*eval_step_specs(specs))  # as the trainer traces it at init
    padded = padded_batches(unpadded, batch)
    assert padded.element_spec[:2] == specs
    assert _evaluation(net, eval_step, padded) == pytest.approx(want, rel=1e-6, abs=1e-7)
    assert eval_step.experimental_get_tracing_count() == 1

    # Controls: the padding counted (n = 3 for every batch) changes the IoU; the partial batch
    # unpadded is traced a second time.
    counted = padded.map(lambda xb, yb, n: (xb, yb, tf.constant(batch)))
    iou = _evaluation(net, eval_step, counted)[0]
    assert iou != pytest.approx(want[0], rel=1e-6, abs=1e-7), (iou, want)
    assert eval_step.experimental_get_tracing_count() == 1
    _evaluation(net, eval_step, unpadded.map(lambda xb, yb: (xb, yb, tf.shape(xb)[0])))
    assert eval_step.experimental_get_tracing_count() == 2


def test_under_xla_a_padded_last_batch_leaves_iou_and_loss_as_unpadded():
    """The forward pass compiled at the traced shape, the samples that count cut after it (a
    one-convolution model: what is tested is the eval step, and XLA compiles it in a second)."""
    tf_keras.utils.set_random_seed(7)
    net = tf_keras.Sequential(
        [tf_keras.Input((8, 12, 4)), tf_keras.layers.Conv2D(3, 3, padding="same")]
    )
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5, 8, 12, 4)).astype(np.float32)
    y = rng.integers(0, 3, size=(5, 8, 12)).astype(np.int32)
    unpadded = tf.data.Dataset.from_tensor_slices((x, y)).batch(2)
    step = make_eval_step(net, task.mean_iou(), xla=True, loss_fn=task.weighted_cross_entropy)
    padded = _evaluation(net, step, padded_batches(unpadded, 2))
    assert step.experimental_get_tracing_count() == 1
    # XLA's over the unpadded batches: the last one traced and compiled again at its shape.
    each = _evaluation(net, step, unpadded.map(lambda xb, yb: (xb, yb, tf.shape(xb)[0])))
    assert step.experimental_get_tracing_count() == 2
    assert padded == pytest.approx(each, rel=1e-6, abs=1e-7)
    counted = _evaluation(net, step, padded_batches(unpadded, 2).map(lambda a, b, n: (a, b, 2)))
    assert counted[0] != pytest.approx(each[0], rel=1e-6, abs=1e-7)  # the control: padding counted
