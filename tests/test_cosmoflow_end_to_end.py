"""Whole runs of cosmoflow/train.py on synthetic data: one rank, resumed, and bad input."""

import json
import platform
import shutil

import numpy as np
import pytest
import yaml

from common.inputs.pipeline import list_files, select_and_shard
from common.run.report import check_log
from tests import helpers


# Slow: ~50 s of learning alone, six or seven epochs to the target (the quick tier's run that
# learns is DeepCAM's, tests/test_deepcam_end_to_end.py).
@pytest.mark.slow
def test_single_rank_run_reaches_target_and_log_passes_checker(cosmo_data, tiny_config, tmp_path):
    out = tmp_path / "run"
    proc = helpers.run(
        helpers.train_cmd("cosmoflow", tiny_config, "--data-dir", cosmo_data, "--output-dir", out)
    )
    assert proc.returncode == 0, helpers.failure_output(proc)
    assert "147,740 trainable parameters" in proc.stdout
    assert "PASSED the compliance checker" in proc.stdout

    resolved = yaml.safe_load((out / "config.yaml").read_text())
    assert resolved["data"]["data_dir"] == str(cosmo_data)
    assert resolved["data"]["n_train"] == 2048 and resolved["model"]["conv_size"] == 8
    assert resolved["train"]["seed"] == 0  # defaults are written out too

    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "success" and summary["metric"] <= 0.124
    assert summary["log_check"] == "passed"
    ckpts = sorted((out / "checkpoints").iterdir())
    assert ckpts and ckpts[-1] == helpers.checkpoint_after_epoch(out, summary["epochs"])
    assert (ckpts[-1] / "ckpt.index").exists()

    import matplotlib.image

    curve = matplotlib.image.imread(out / "training_curve.png")
    assert curve.shape[0] > 100 and curve.shape[1] > 100
    assert (
        len(summary["history"]) == summary["epochs"] and summary["history"][-1]["metric"] <= 0.124
    )

    passed, output = check_log(out / "mlperf.log")
    assert passed, output
    log = (out / "mlperf.log").read_text()
    assert '"key": "run_stop"' in log and '"status": "success"' in log
    assert not (out / "mlperf.log.partial").exists()


def _checkpoint_tensors(folder) -> dict:
    """Every tensor of one checkpoint folder, by name (optimizer step, slots, model, generator)."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(folder / "ckpt"))
    return {
        n: reader.get_tensor(n)
        for n in reader.get_variable_to_shape_map()
        if not n.startswith(("save_counter", "_CHECKPOINTABLE"))
    }


def _iterations(tensors: dict) -> int:
    """The optimizer's step count (optimizer.iterations), which drives the LR schedule."""
    return int(tensors["optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"])


def test_resume_continues_from_the_checkpoint(cosmo_data, tiny_config, tmp_path):
    """Two epochs, then --resume to three, against three epochs in one go (op determinism,
    dropout on): the state the resumed run starts from is the uninterrupted run's state after
    epoch 2, and it ends with that run's model, optimizer and dropout generator, bit for bit.
    The LR decays at the resumed epoch (boundary 1 acts from 0-based epoch 2: steps 32..47 run
    at 0.01 x 0.5), so a resumed run that restored the step count wrongly trains at another LR."""
    out, whole_dir = tmp_path / "run", tmp_path / "whole"
    common = [
        "--data-dir",
        cosmo_data,
        "--n-train",
        "128",
        "--n-valid",
        "32",
        "--set",
        "train.stop_at_target=false",
        "--checkpoint-every",
        "1",
        "--deterministic",
        "--set",
        "model.dropout=0.3",
        "--set",
        "optimizer.decay_boundary_epochs=1",
        "--set",
        "optimizer.decay_factors=0.5",
        "--set",
        "runtime.check_log=false",
    ]
    whole = helpers.run(
        helpers.train_cmd(
            "cosmoflow", tiny_config, *common, "--output-dir", whole_dir, "--n-epochs", "3"
        )
    )
    assert whole.returncode == 3, whole.stdout[-2000:] + whole.stderr[-2000:]  # no target reached
    first = helpers.run(
        helpers.train_cmd("cosmoflow", tiny_config, *common, "--output-dir", out, "--n-epochs", "2")
    )
    assert first.returncode == 3, first.stdout[-2000:] + first.stderr[-2000:]
    after_2 = helpers.checkpoint_after_epoch(out, 2)

    # What the resumed run will restore: the uninterrupted run's state after the same 32 steps.
    held, expected = (
        _checkpoint_tensors(after_2),
        _checkpoint_tensors(helpers.checkpoint_after_epoch(whole_dir, 2)),
    )
    assert sorted(held) == sorted(expected) and any(n.startswith("rng/") for n in held)
    assert [n for n in expected if not np.array_equal(held[n], expected[n])] == []
    assert _iterations(held) == 32

    second = helpers.run(
        helpers.train_cmd(
            "cosmoflow", tiny_config, *common, "--output-dir", out, "--n-epochs", "3", "--resume"
        )
    )
    assert second.returncode == 3, second.stdout[-2000:] + second.stderr[-2000:]
    assert "(epoch 2, 16 of 16 steps done)" in second.stdout, second.stdout + second.stderr
    # Model weights, optimizer step and momentum, dropout generator: bit for bit after step 48.
    helpers.assert_same_final_state(whole_dir, out, "cosmoflow")
    final = helpers.final_checkpoint_state(out)
    assert _iterations(final) == 48 and final.keys() == held.keys()
    assert any(
        not np.array_equal(final[n], held[n]) for n in final if n.startswith("model/")
    )  # it trained on
    # The resumed epoch ran at the LR of steps 32..47, as in the uninterrupted run.
    history = json.loads((out / "summary.json").read_text())["history"]
    whole_history = json.loads((whole_dir / "summary.json").read_text())["history"]
    assert [h["lr"] for h in whole_history] == pytest.approx([0.001, 0.01, 0.005])
    assert history[-1]["lr"] == whole_history[-1]["lr"]

    log = (out / "mlperf.log").read_text()
    assert '"epoch_num": 3' in log and '"epoch_num": 1}' not in log
    assert (out / "mlperf.log.1").exists()  # the first run's log is kept
    # The log and summary say where it resumed from, and scoring refuses it as a result.
    resumed = {"checkpoint": str(after_2.resolve()), "epoch": 2, "step": 16, "global_step": 32}
    assert f'"key": "resumed_from", "value": {json.dumps(resumed)}' in log
    assert json.loads((out / "summary.json").read_text())["resumed_from"] == resumed
    from offline import run_logs, scoring

    run, _ = scoring.read_run(run_logs.from_run_dir(out), "3.0.0")
    assert (
        run.problem.startswith("resumed from a checkpoint")
        and "not a valid benchmark result" in run.problem
    )


def copy_subset(src, dst, n_train, n_valid):
    for split, n in (("train", n_train), ("validation", n_valid)):
        (dst / split).mkdir(parents=True)
        for p in sorted((src / split).glob("*.tfrecord"))[:n]:
            shutil.copy(p, dst / split / p.name)


def truncate(path):
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])


def run_with_truncated_file(
    cosmo_data, tiny_config, tmp_path, split, index, n_train, n_valid, *extra
):
    """Runs train.py on a copy of the data in which one file is cut in half; returns (proc, the file)."""
    data = tmp_path / "data"
    copy_subset(cosmo_data, data, n_train, n_valid)
    victim = sorted((data / split).glob("*.tfrecord"))[index]
    truncate(victim)
    proc = helpers.run(
        helpers.train_cmd(
            "cosmoflow",
            tiny_config,
            "--data-dir",
            data,
            "--output-dir",
            tmp_path / "run",
            "--n-train",
            n_train,
            "--n-valid",
            n_valid,
            *extra,
        )
    )
    return proc, victim


def test_truncated_gzip_record_is_named(cosmo_data, tiny_config, tmp_path):
    proc, victim = run_with_truncated_file(cosmo_data, tiny_config, tmp_path, "train", 5, 32, 16)
    assert proc.returncode == 2
    errors = helpers.error_lines(proc.stderr)
    assert len(errors) == 1 and str(victim) in errors[0] and "truncated record" in errors[0], (
        proc.stderr[-2000:]
    )
    assert "Traceback" not in proc.stderr
    # The aborted run's log is closed with run_stop 'aborted', not lost.
    assert '"status": "aborted"' in (tmp_path / "run" / "mlperf.log").read_text()


def test_staged_runs_train_as_the_unstaged_one(cosmo_data, tiny_config, tmp_path):
    # Staged inflated (staging.convert, the default; data.compression GZIP describes the sources)
    # or copied as is: the same samples, so a deterministic run ends with the same figures.
    def figures(name, *extra, data=cosmo_data):
        proc = helpers.run(
            helpers.train_cmd(
                "cosmoflow",
                tiny_config,
                "--data-dir",
                data,
                "--output-dir",
                tmp_path / name,
                "--n-train",
                "16",
                "--n-valid",
                "8",
                "--n-epochs",
                "2",
                "--deterministic",
                "--set",
                "staging.cache=false",
                "--set",
                "runtime.check_log=false",
                # Two whole epochs that end in success: a target any model reaches, no stop at it.
                "--set",
                "target_mae=10",
                "--set",
                "train.stop_at_target=false",
                *extra,
            ),
            timeout=300,
        )
        assert proc.returncode == 0, helpers.failure_output(proc)
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        return [(h["epoch"], h["loss"], h.get("metric")) for h in summary["history"]], summary[
            "staging"
        ]

    unstaged, _ = figures("in_place")
    inflated, stats = figures(
        "inflated", "--stage-dir", tmp_path / "stage1", "--set", "data.compression=GZIP"
    )
    copied, _ = figures(
        "copied", "--stage-dir", tmp_path / "stage2", "--set", "staging.convert=false"
    )
    assert inflated == copied == unstaged
    # Control: the comparison sees which samples were read. The same file names, each training file
    # holding its neighbour's sample, train to other figures.
    other = tmp_path / "other"
    shutil.copytree(cosmo_data / "validation", other / "validation", symlinks=True)
    (other / "train").mkdir()
    files = sorted((cosmo_data / "train").iterdir())
    for name, sample in zip(files, files[1:] + files[:1]):
        (other / "train" / name.name).symlink_to(sample)
    assert figures("control", data=other)[0] != unstaged
    staged = next((tmp_path / "stage1" / "train").iterdir())
    assert staged.read_bytes()[:2] != b"\x1f\x8b"  # inflated
    assert next((tmp_path / "stage2" / "train").iterdir()).read_bytes()[:2] == b"\x1f\x8b"  # copied
    assert stats["files"] == 24


def test_truncated_file_found_while_staging_with_decompression(cosmo_data, tiny_config, tmp_path):
    proc, victim = run_with_truncated_file(
        cosmo_data, tiny_config, tmp_path, "validation", 2, 16, 8, "--stage-dir", tmp_path / "stage"
    )  # staging.convert: inflating
    assert proc.returncode == 2
    errors = helpers.error_lines(proc.stderr)
    assert len(errors) == 1 and f"cannot stage {victim}" in errors[0], proc.stderr[-2000:]


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--data-dir", "{tmp}/nowhere"], "data directory not found: {tmp}/nowhere/train"),
        (["--n-train", "100"], "n_train=100 is not divisible by ranks x local batch = 1 x 8 = 8"),
        (["--set", "model.conv_sise=4"], "unknown config key 'model.conv_sise'"),
        (["--batch-size", "eight"], "config key 'data.batch_size'"),
        (["--n-valid", "100000"], "n_valid=100000 but only 256 files"),
    ],
)
def test_bad_input_gives_one_line_and_nonzero_exit(
    cosmo_data, tiny_config, tmp_path, args, expected
):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if "--data-dir" not in args:
        args += ["--data-dir", str(cosmo_data)]
    proc = helpers.run(
        helpers.train_cmd("cosmoflow", tiny_config, "--output-dir", tmp_path / "run", *args),
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout[-1000:] + proc.stderr[-2000:]
    errors = helpers.error_lines(proc.stderr)
    assert len(errors) == 1 and expected.replace("{tmp}", str(tmp_path)) in errors[0], proc.stderr[
        -2000:
    ]
    assert "Traceback" not in proc.stderr


def test_unknown_key_in_config_file(tmp_path, cosmo_data, tiny_config):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        tiny_config.read_text().replace("  dropout: 0.0", "  dropout: 0.0\n  dropuot: 0.1")
    )
    proc = helpers.run(helpers.train_cmd("cosmoflow", bad, "--data-dir", cosmo_data), timeout=120)
    assert proc.returncode == 2
    assert helpers.error_lines(proc.stderr) == [
        f"error: unknown config key 'model.dropuot' in {bad}"
    ]


def shard_of(data, rank, size, n_train, seed=0):
    return select_and_shard(
        list_files(data / "train", (".tfrecord",)), n_train, rank, size, seed, "n_train"
    )


@pytest.mark.parametrize(
    "amp_args",
    [["--amp"], ["--amp", "--set", "runtime.amp_dtype=bfloat16"]],
    ids=["amp", "amp-forced-bf16"],
)
def test_amp_uses_bf16_where_the_cpu_computes_it(cosmo_data, tiny_config, tmp_path, amp_args):
    from common import cpu

    out = tmp_path / "run"
    proc = helpers.run(
        helpers.train_cmd(
            "cosmoflow",
            tiny_config,
            "--data-dir",
            cosmo_data,
            "--output-dir",
            out,
            "--n-train",
            "64",
            "--n-valid",
            "32",
            "--n-epochs",
            "1",
            *amp_args,
            "--set",
            "runtime.check_log=false",
        )
    )
    assert proc.returncode in (0, 3), proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    forced = "runtime.amp_dtype=bfloat16" in amp_args
    bf16 = forced or cpu.has_native_bf16()
    assert summary["runtime"]["precision"] == ("mixed_bfloat16" if bf16 else "float32")
    # Falling back to float32 is said in one line, never silently.
    assert ("no native bf16" in proc.stdout) is not bf16, proc.stdout[-2000:]
    cpu_line = f"{cpu.isa()}, bf16 {'native' if cpu.has_native_bf16() else 'emulated'}, oneDNN "
    cpu_line += "on" if platform.machine() == "x86_64" else ""
    assert cpu_line in proc.stdout, proc.stdout[-2000:]
    assert summary["epochs"] == 1 and 0 < summary["metric"] < 2
