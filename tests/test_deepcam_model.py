"""DeepCAM model size, loss and IoU metric against hand-computed cases."""

import numpy as np
import pytest
import tensorflow as tf

from deepcam import model, task


def count(m):
    return int(sum(np.prod(v.shape) for v in m.trainable_variables))


def test_full_model_has_the_reference_parameter_count():
    m = model.build_model(768, 1152, 16)
    assert count(m) == 56_454_720
    assert m.output_shape == (None, 768, 1152, 3)
    assert m.output.dtype == tf.float32


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
    assert w[0] == pytest.approx(0.986267818390377 ** -0.125)
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
    both = task.metric(None).update(tf.constant([[label[0]], [[0, 0, 0, 0]]]),
                                    one_hot_logits([[pred[0]], [[0, 0, 0, 0]]]))
    assert both.numpy() == pytest.approx([(1 / 3 + 1 / 2) / 3 + 1.0, 2.0])
    assert task.metric(None).finalize(both.numpy()) == pytest.approx(((1 / 3 + 1 / 2) / 3 + 1.0) / 2)
