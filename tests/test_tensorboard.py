"""TensorBoardListener: events in, event files read back: tags, steps, values, config text."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from common.reporting.events import EpochTrain, Events, RunInfo, StepInfo, TrainLog
from common.reporting.tensorboard import TensorBoardListener

CONFIG = "name: cosmoflow\ntrain:\n  n_epochs: 2\n  log_every_steps: 2\n"
INFO = RunInfo(
    benchmark="cosmoflow",
    seed=7,
    num_nodes=1,
    ranks=2,
    accelerators_per_node=0,
    global_batch_size=8,
    train_samples=32,
    eval_samples=8,
    hyperparameters={
        "opt_name": "sgd",
        "opt_base_learning_rate": 0.004,
        "dropout": 0.5,
        "opt_learning_rate_decay_boundary_epochs": [16, 32],
    },
    target_name="eval_error",
    target=0.124,
    steps_per_epoch=4,
    n_epochs=2,
)


def read_events(log_dir):
    """{tag: [(step, value)]} from every event file in log_dir, in write order."""
    out = collections.defaultdict(list)
    files = sorted(tf.io.gfile.glob(str(log_dir / "events.out.tfevents.*")))
    assert files, f"no event file in {log_dir}"
    for path in files:
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                array = tf.make_ndarray(value.tensor)
                if array.dtype == object:
                    array = array.item().decode()
                out[value.tag].append((event.step, array))
    return out


def run_two_epochs(listener, resume_at: int = 0):
    """The events of a 2-epoch run of 4 steps each, a TrainLog every 2 steps, eval each epoch."""
    events = Events([listener])
    events.on_init_start()
    events.on_init_stop(INFO)
    events.on_run_start()
    global_step = resume_at
    for epoch in (1, 2):
        events.on_epoch_start(epoch, global_step)
        for step in range(1, 5):
            global_step += 1
            events.on_step(StepInfo(epoch, step, 4, global_step))
            if global_step % 2 == 0:
                events.on_train_log(
                    TrainLog(
                        epoch,
                        global_step,
                        loss=1.0 / global_step,
                        lr=0.001 * epoch,
                        samples_per_s=100.0 + global_step,
                    )
                )
        events.on_epoch_stop(
            epoch,
            EpochTrain(
                global_step=global_step,
                loss=0.5 / epoch,
                lr=0.001,
                samples_per_s=90.0 + epoch,
            ),
        )
        events.on_eval_start(epoch)
        events.on_eval_stop(epoch, global_step, 0.3 / epoch)
    events.on_run_stop("success", 2)
    events.close()


def test_scalars_have_the_tags_steps_and_values(tmp_path):
    run_two_epochs(TensorBoardListener(tmp_path, CONFIG))
    got = read_events(tmp_path)
    scalars = {
        tag: [(step, float(v)) for step, v in points]
        for tag, points in got.items()
        if tag.startswith(("train/", "eval/"))
    }
    assert sorted(scalars) == [
        "eval/eval_error",
        "train/epoch_loss",
        "train/epoch_samples_per_s",
        "train/learning_rate",
        "train/loss",
        "train/samples_per_s",
    ]
    assert [s for s, _ in scalars["train/loss"]] == [2, 4, 6, 8]
    np.testing.assert_allclose(
        [v for _, v in scalars["train/loss"]], [1 / 2, 1 / 4, 1 / 6, 1 / 8], rtol=1e-6
    )
    np.testing.assert_allclose(
        [v for _, v in scalars["train/learning_rate"]], [0.001, 0.001, 0.002, 0.002], rtol=1e-6
    )
    assert scalars["train/samples_per_s"] == [(2, 102.0), (4, 104.0), (6, 106.0), (8, 108.0)]
    # Epoch and validation scalars sit at the global step that ended the epoch.
    assert scalars["train/epoch_loss"] == [(4, 0.5), (8, 0.25)]
    assert scalars["train/epoch_samples_per_s"] == [(4, 91.0), (8, 92.0)]
    assert [s for s, _ in scalars["eval/eval_error"]] == [4, 8]
    np.testing.assert_allclose([v for _, v in scalars["eval/eval_error"]], [0.3, 0.15], rtol=1e-6)


def test_config_and_hyperparameters_are_text(tmp_path):
    run_two_epochs(TensorBoardListener(tmp_path, CONFIG))
    got = read_events(tmp_path)
    assert got["config"] == [(0, "```yaml\n" + CONFIG.rstrip() + "\n```")]
    ((step, hyper),) = got["hyperparameters"]
    assert step == 0
    assert hyper.splitlines() == [
        "| name | value |",
        "|---|---|",
        "| opt_name | sgd |",
        "| opt_base_learning_rate | 0.004 |",
        "| dropout | 0.5 |",
        "| opt_learning_rate_decay_boundary_epochs | [16, 32] |",
    ]
    ((_, run),) = got["run"]
    assert "| global_batch_size | 8 |" in run.splitlines()
    assert "| target_name | eval_error |" in run.splitlines()
    assert "resumed_from" not in run  # None: left out


def test_resumed_run_writes_at_the_global_step_the_events_carry(tmp_path):
    run_two_epochs(TensorBoardListener(tmp_path / "resumed", CONFIG), resume_at=40)
    got = read_events(tmp_path / "resumed")
    assert [s for s, _ in got["eval/eval_error"]] == [44, 48]
    assert [s for s, _ in got["train/loss"]] == [42, 44, 46, 48]

    listener = TensorBoardListener(tmp_path / "eval", CONFIG)
    events = Events([listener])
    events.on_init_stop(INFO)
    # An evaluation right after a resume, before any step: at the step eval_stop carries, which
    # is not a multiple of the epoch's steps (a mid-epoch checkpoint's), so no fallback could
    # have guessed it.
    events.on_eval_stop(3, 13, 0.25)
    events.close()
    listener.close()  # a second close is harmless
    assert read_events(tmp_path / "eval")["eval/eval_error"] == [(13, pytest.approx(0.25))]
