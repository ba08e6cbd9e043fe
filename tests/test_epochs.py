"""An epoch is one pass over the shard in whole optimizer steps (common.inputs.pipeline)."""

import numpy as np
import pytest
import tensorflow as tf

from common.config import load_config
from common.errors import ConfigError, InputError
from common.inputs import pipeline
from cosmoflow.config import CosmoFlowConfig
from cosmoflow.task import CosmoFlowTask
from deepcam.config import DeepCAMConfig
from tests.helpers import REPO


@pytest.mark.parametrize(
    "shard, batch, accumulation, expected",
    [
        (16, 4, 1, 4),
        (18, 4, 1, 4),
        (18, 4, 3, 3),
        (7, 4, 2, 0),
        (121266 // 1024, 2, 1, 59),
        (118, 2, 2, 58),
    ],
)
def test_batches_per_epoch_are_whole_steps_of_full_batches(shard, batch, accumulation, expected):
    assert pipeline.batches_per_epoch(shard, batch, accumulation) == expected


def _numbers(paths: tf.data.Dataset) -> tf.data.Dataset:
    """A stand-in reader: file 'f7' holds the sample 7."""
    return paths.map(lambda p: tf.strings.to_number(tf.strings.substr(p, 1, 8), tf.int64))


def _batches(start, cache, n=None):
    files = [f"f{i}" for i in range(11)]
    ds = pipeline.training_dataset(
        files,
        _numbers,
        batch_size=3,
        n_batches=pipeline.batches_per_epoch(11, 3, 2),
        seed=5,
        cache=cache,
        start=start,
    )
    return [b.numpy() for b in ds.take(n)]


@pytest.mark.parametrize("cache", [False, True])
def test_each_epoch_is_one_reshuffled_pass(cache):
    # 11 samples, batch 3: 3 full batches per pass; keep 2 (accumulation 2): 6 samples an epoch,
    # all distinct, drawn from the whole shard, a new order each epoch.
    batches = _batches(pipeline.Position(), cache, 6)  # 3 epochs x 2 batches
    seen = [np.concatenate(batches[i : i + 2]) for i in (0, 2, 4)]
    for epoch in seen:
        assert len(epoch) == 6 and len(set(epoch.tolist())) == 6
    assert len({tuple(e) for e in seen}) == 3  # reshuffled every pass
    assert (
        len(set(np.concatenate(seen).tolist())) > 6
    )  # the dropped samples change from pass to pass


@pytest.mark.parametrize("cache", [False, True])
@pytest.mark.parametrize("epoch,batch", [(1, 1), (2, 0), (3, 1)])
def test_a_run_started_at_a_position_reads_what_an_uninterrupted_run_reads_next(
    cache, epoch, batch
):
    whole = _batches(pipeline.Position(), cache, 8)
    index = (epoch - 1) * 2 + batch
    resumed = _batches(pipeline.Position(epoch, batch), cache, 8 - index)
    assert [b.tolist() for b in resumed] == [b.tolist() for b in whole[index:]]


def test_cosmoflow_divisibility_counts_gradient_accumulation():
    cfg = load_config(
        CosmoFlowConfig,
        REPO / "tests/configs/cosmoflow_tiny.yaml",
        {
            "data.data_dir": "/data",
            "data.n_train": "48",
            "data.batch_size": "4",
            "train.gradient_accumulation_frequency": "4",
        },
    )
    with pytest.raises(
        InputError,
        match=r"n_train=48 is not divisible by ranks x local batch x accumulation "
        r"= 2 x 4 x 4 = 32",
    ):
        CosmoFlowTask(cfg).shard(0, 2)


def test_xla_with_group_batch_norm_is_rejected():
    with pytest.raises(ConfigError, match="runtime.xla.*batchnorm_group_size"):
        load_config(
            DeepCAMConfig,
            REPO / "tests/configs/deepcam_tiny.yaml",
            {"data.data_dir": "/data", "runtime.xla": "true", "model.batchnorm_group_size": "2"},
        )
