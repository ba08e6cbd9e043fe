"""Checkpoints written at commit c5be9f3 restore and continue with today's code.

tests/fixtures/checkpoints_c5be9f3/ (its README says how they were made) holds, per benchmark, two
checkpoints of a 1-rank `--deterministic` run: one at the end of epoch 1 and one mid-epoch 2 with
its rank-00000.npz (the epoch's losses so far, DeepCAM's batch-norm statistics too), and the final
state that resuming from either ended with at c5be9f3. Resumed here with the same data, config
and flags, each run must end with every tensor of the same name (model, optimizer, CosmoFlow's
dropout generators) and the same last-epoch loss (for the mid-epoch checkpoint, the mean over the
losses read from its rank file and the steps run after), to within what another CPU changes:
oneDNN picks its kernels by the CPU's instruction set, and DeepCAM's state made on the Intel Xeon
with AMX that wrote the fixtures ends up to 6e-6 away on an AMD EPYC Zen 4 with c5be9f3's own code
(CosmoFlow's bit for bit). Bit-for-bit equality before and after a change is checked side by side
on one machine (the README's commands at both commits). The tolerance is about 17 times that drift,
far below what training changes: the state 4 steps before the end is outside it (its control).
The control: the same checkpoint with one layer stored under another name must fail to restore.
"""

import hashlib
import json
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest

from tests import helpers

FIXTURES = helpers.REPO / "tests" / "fixtures" / "checkpoints_c5be9f3"
# DeepCAM's epoch-end checkpoint is not resumed: what it would add to its mid-epoch case (the
# restore of the model and LAMB, the rank file's losses and batch-norm statistics) is CosmoFlow's
# epoch-end case's.
CASES = [
    ("cosmoflow", "step-0000000004"),
    ("cosmoflow", "step-0000000006"),
    ("deepcam", "step-0000000012"),
]


def _data_digest(data_dir: Path) -> str:
    """SHA-256 of the samples' contents (not of the files' bytes: the writer's compression may
    vary)."""
    import h5py

    h = hashlib.sha256()
    samples = sorted(p for p in data_dir.rglob("*") if p.is_file() and p.parent != data_dir)
    for f in samples:
        h.update(str(f.relative_to(data_dir)).encode())
        if f.suffix == ".tfrecord":
            x, y, _ = helpers.read_tfrecord(f)
            h.update(x.tobytes())
            h.update(y.tobytes())
        elif f.suffix == ".h5":
            with h5py.File(f) as h5:
                for key in ("climate/data", "climate/labels_0"):
                    h.update(h5[key][()].tobytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    """bench -> (its unpacked fixture folder, fixture.json, the regenerated data set)."""
    from cosmoflow import synthetic as cosmo_synthetic
    from deepcam import synthetic as deepcam_synthetic

    root = tmp_path_factory.mktemp("fixtures_c5be9f3")
    found = {}
    for bench in ("cosmoflow", "deepcam"):
        with tarfile.open(FIXTURES / f"{bench}.tar.gz") as tar:
            tar.extractall(root, filter="data")
        folder = root / bench
        spec = json.loads((folder / "fixture.json").read_text())
        data = root / f"{bench}-data"
        s = spec["synthetic"]
        if bench == "cosmoflow":
            cosmo_synthetic.generate(
                data,
                s["size"],
                s["n_train"],
                s["n_valid"],
                seed=s["seed"],
                workers=1,
                progress=lambda msg: None,
            )
        else:
            deepcam_synthetic.generate(data, workers=1, progress=lambda *a, **k: None, **s)
            # The run's own normalization statistics: a parallel sum may differ in the last bit.
            shutil.copy(folder / "stats.h5", data / "stats.h5")
        assert _data_digest(data) == spec["data_digest"], (
            f"{bench}'s synthetic generator no longer writes the samples the fixture was trained on"
        )
        found[bench] = folder, spec, data
    return found


def _resume(bench, folder, spec, data, checkpoint, out):
    data_flag, out_flag = {
        "cosmoflow": ("--data-dir", "--output-dir"),
        "deepcam": ("--data_dir_prefix", "--output_dir"),
    }[bench]
    config = helpers.REPO / spec["config"]
    cmd = helpers.train_cmd(
        bench, config, data_flag, data, out_flag, out, *spec["args"], "--checkpoint", checkpoint
    )
    return helpers.run(cmd, timeout=300)


@pytest.mark.parametrize("bench,step", CASES)
def test_a_c5be9f3_checkpoint_resumes_to_the_same_final_state(bench, step, fixtures, tmp_path):
    folder, spec, data = fixtures[bench]
    checkpoint = folder / "checkpoints" / step
    proc = _resume(bench, folder, spec, data, checkpoint, tmp_path / "run")
    assert proc.returncode == 0, helpers.failure_output(proc)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    expected = spec["resumed"][step]
    assert summary["resumed_from"]["checkpoint"] == str(checkpoint.resolve())
    position = {k: v for k, v in summary["resumed_from"].items() if k != "checkpoint"}
    assert position == expected["resumed_from"]
    got = helpers.final_checkpoint_state(tmp_path / "run")
    with np.load(folder / "expected_final.npz") as f:
        want = {k: f[k] for k in f.files}
    assert sorted(got) == sorted(want)
    differ = [n for n in want if not _close(want[n], got[n])]
    assert not differ, (
        f"{len(differ)} of {len(want)} tensors differ from c5be9f3's, e.g. {differ[:3]}"
    )
    assert summary["history"][-1]["epoch"] == expected["last_epoch"]
    assert summary["history"][-1]["loss"] == pytest.approx(expected["last_epoch_loss"], rel=1e-6)


def _close(want, got) -> bool:
    """Equal, or for floats within the tolerance (the module's docstring says why)."""
    if want.dtype.kind != "f":
        return np.array_equal(want, got)
    return np.allclose(got, want, rtol=1e-4, atol=1e-4)


def test_the_tolerance_tells_four_steps_of_training(fixtures):
    """Control of the tolerance: DeepCAM's mid-epoch checkpoint (4 steps before the end) is not
    within it of the final state."""
    import tensorflow as tf

    folder, _, _ = fixtures["deepcam"]
    reader = tf.train.load_checkpoint(str(folder / "checkpoints" / "step-0000000012" / "ckpt"))
    with np.load(folder / "expected_final.npz") as f:
        want = {k: f[k] for k in f.files}
    model = [n for n in want if n.startswith("model/") and want[n].dtype.kind == "f"]
    differ = [n for n in model if not _close(want[n], reader.get_tensor(n))]
    assert len(differ) > len(model) // 2, f"{len(differ)} of {len(model)} model tensors differ"


GRAPH = "_CHECKPOINTABLE_OBJECT_GRAPH"


def _rename_layer(src: Path, dst: Path, edge: str, new: str) -> None:
    """A copy of checkpoint folder `src` whose model holds the layer checkpointed as `edge` under
    the name `new` instead: every edge of the object graph from the model to that layer (a
    functional model has two: `layer_with_weights-N` and `layer-M`) and its tensors' keys
    renamed. Without the second, the restore would find the layer by `layer-M`."""
    import tensorflow as tf
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("ckpt.*"))
    reader = tf.train.load_checkpoint(str(src / "ckpt"))
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor(GRAPH))
    model = graph.nodes[next(c.node_id for c in graph.nodes[0].children if c.local_name == "model")]
    layer = next(c.node_id for c in model.children if c.local_name == edge)
    for child in model.children:
        if child.node_id == layer:
            other = f"{new}-{child.local_name}"
            child.local_name = new if child.local_name == edge else other
    keys = {}
    for node in graph.nodes:
        for attribute in node.attributes:
            old = attribute.checkpoint_key
            if old.startswith(f"model/{edge}/"):
                attribute.checkpoint_key = f"model/{new}/" + old[len(f"model/{edge}/") :]
            keys[old] = attribute.checkpoint_key
    names = [n for n in reader.get_variable_to_shape_map() if n != GRAPH]
    tensors = {keys.get(n, n): reader.get_tensor(n) for n in names}
    assert sum(k.startswith(f"model/{new}/") for k in tensors) == 2  # its kernel and bias
    tensors[GRAPH] = graph.SerializeToString()
    tf.raw_ops.SaveV2(
        prefix=str(dst / "ckpt"),
        tensor_names=list(tensors),
        shape_and_slices=[""] * len(tensors),
        tensors=list(tensors.values()),
    )


def test_a_checkpoint_with_a_renamed_layer_fails_to_restore(fixtures, tmp_path):
    """Control: the mid-epoch CosmoFlow fixture with its third layer with weights (conv3)
    renamed."""
    folder, spec, data = fixtures["cosmoflow"]
    renamed = tmp_path / "step-0000000006"
    source = folder / "checkpoints" / "step-0000000006"
    _rename_layer(source, renamed, "layer_with_weights-2", "renamed_conv")
    proc = _resume("cosmoflow", folder, spec, data, renamed, tmp_path / "run")
    assert proc.returncode != 0, helpers.failure_output(proc)
    output = proc.stdout + proc.stderr
    assert helpers.error_lines(output), helpers.failure_output(proc)
    assert "not bound to checkpointed values" in output, helpers.failure_output(proc)
    named = "'conv3/kernel:0'" in output and "'conv3/bias:0'" in output
    assert named, helpers.failure_output(proc)
