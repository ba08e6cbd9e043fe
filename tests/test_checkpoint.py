"""common.checkpoints.Checkpointer and common.resume.resume_point: pruning to the newest `keep`,
removing partial saves, restoring."""

import types

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from common.checkpoints import Checkpointer, read_state
from common.errors import InputError
from common.resume import resume_point


def _model_and_optimizer(seed: int = 0):
    tf_keras.utils.set_random_seed(seed)
    model = tf_keras.Sequential([tf_keras.Input((3,)), tf_keras.layers.Dense(2)])
    optimizer = tf_keras.optimizers.SGD(0.1, momentum=0.9)
    optimizer.build(model.trainable_variables)
    return model, optimizer


def _train_and_save(checkpointer, model, optimizer, n_saves: int) -> dict:
    """One SGD step before each save (save i after step i); returns what each save held."""
    rng = np.random.default_rng(0)
    held = {}
    for step in range(1, n_saves + 1):
        grads = [
            tf.constant(rng.standard_normal(v.shape), tf.float32) for v in model.trainable_variables
        ]
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        checkpointer.save(step, {"epoch": step, "steps_done": 0})
        held[step] = {
            "weights": [v.numpy() for v in model.trainable_variables],
            "momentum": [v.numpy() for v in optimizer.variables[1:]],
            "iterations": int(optimizer.iterations),
        }
    checkpointer.wait()
    return held


@pytest.mark.parametrize("keep, kept", [(2, [4, 5]), (3, [3, 4, 5]), (0, [1, 2, 3, 4, 5])])
def test_after_five_saves_only_the_newest_keep_remain(tmp_path, keep, kept):
    model, optimizer = _model_and_optimizer()
    checkpointer = Checkpointer(tmp_path / "checkpoints", model, optimizer, keep=keep)
    _train_and_save(checkpointer, model, optimizer, 5)
    assert [p.name for p in checkpointer.all()] == [f"step-{s:010d}" for s in kept]
    # Nothing else is left in the folder: no .tmp of a published save, no stray files.
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        f"step-{s:010d}" for s in kept
    ]
    assert checkpointer.latest() == checkpointer.folder(5)


def test_remove_partial_removes_only_tmp_leftovers(tmp_path):
    model, optimizer = _model_and_optimizer()
    checkpointer = Checkpointer(tmp_path / "checkpoints", model, optimizer, keep=0)
    _train_and_save(checkpointer, model, optimizer, 2)
    # A save killed mid-write leaves its staging folder (ckpt parts, a rank's file).
    for step in (3, 7):
        partial = checkpointer.staging_folder(step)
        partial.mkdir()
        (partial / "ckpt.index").write_bytes(b"half")
        (partial / "rank-00001.npz").write_bytes(b"")
    assert [p.name for p in checkpointer.all()] == [
        "step-0000000001",
        "step-0000000002",
    ]  # never listed
    checkpointer.remove_partial()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "step-0000000001",
        "step-0000000002",
    ]
    assert (checkpointer.folder(2) / "ckpt.index").is_file()
    Checkpointer(
        tmp_path / "absent", model, optimizer
    ).remove_partial()  # no folder yet: nothing to do


def test_restoring_the_newest_gives_the_saved_values(tmp_path):
    model, optimizer = _model_and_optimizer()
    checkpointer = Checkpointer(tmp_path / "checkpoints", model, optimizer, keep=2)
    held = _train_and_save(checkpointer, model, optimizer, 5)
    assert held[5]["iterations"] == 5 and not np.array_equal(
        held[5]["weights"][0], held[4]["weights"][0]
    )

    fresh_model, fresh_optimizer = _model_and_optimizer(seed=1)  # other initial weights, step 0
    assert not np.array_equal(fresh_model.trainable_variables[0].numpy(), held[5]["weights"][0])
    state = Checkpointer(tmp_path / "checkpoints", fresh_model, fresh_optimizer).restore(
        checkpointer.latest()
    )
    assert state == {"epoch": 5, "steps_done": 0} == read_state(checkpointer.folder(5))
    for got, saved in zip(fresh_model.trainable_variables, held[5]["weights"]):
        np.testing.assert_array_equal(got.numpy(), saved)
    assert int(fresh_optimizer.iterations) == 5
    for got, saved in zip(fresh_optimizer.variables[1:], held[5]["momentum"]):
        np.testing.assert_array_equal(got.numpy(), saved)
    assert any(np.abs(m).max() > 0 for m in held[5]["momentum"])  # the slots were really trained


@pytest.mark.parametrize(
    "written, shards", [(2, None), (1, 2)], ids=["sharded-read-whole", "whole-read-sharded"]
)
def test_a_checkpoint_resumes_only_with_the_optimizer_sharded_as_it_was_written(
    tmp_path, written, shards
):
    model, optimizer = _model_and_optimizer()
    checkpointer = Checkpointer(tmp_path / "checkpoints", model, optimizer)
    checkpointer.save(
        4,
        {
            "epoch": 0,
            "steps_done": 4,
            "steps_per_epoch": 4,
            "global_step": 4,
            "ranks": 2,
            "optimizer_shards": written,
        },
    )
    checkpointer.wait()
    shard = None if shards is None else types.SimpleNamespace(size=shards, index=0)
    with pytest.raises(
        InputError, match=f"step-0000000004: its optimizer is sharded over {written} rank"
    ):
        resume_point(
            checkpointer,
            checkpointer.folder(4),
            model=model,
            rank=0,
            ranks=2,
            steps_per_epoch=4,
            accumulation=1,
            optimizer_shard=shard,
        )
    # The control: as written, it resumes.
    same = None if written == 1 else types.SimpleNamespace(size=written, index=0)
    point = resume_point(
        checkpointer,
        checkpointer.folder(4),
        model=model,
        rank=0,
        ranks=2,
        steps_per_epoch=4,
        accumulation=1,
        optimizer_shard=same,
    )
    assert point.global_step == 4
