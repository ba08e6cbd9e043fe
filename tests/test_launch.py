"""train.py's command line: reference-style invocation without a config, the runtime.tiny
shrink switch, and the precision policy passed to the model builder, not left global."""

import dataclasses

import pytest
import tf_keras

from common import benchmarks, runtime
from common.config import load_config, load_run_config
from common.errors import ConfigError
from tests import helpers

TASKS = {name: benchmarks.task_class(name) for name in benchmarks.names()}


@pytest.mark.parametrize("name", benchmarks.names())
def test_without_a_config_the_closed_config_of_the_jobs_global_batch_is_used(name):
    task = TASKS[name]
    for path in benchmarks.closed_configs(name):
        closed = load_config(task.config_class, path, {"data.data_dir": "/data"})
        ranks = closed.train.global_batch_size // task(closed).local_batch_size
        cfg, note = load_run_config(task, None, {"data.data_dir": "/data"}, ranks)
        assert note.startswith(f"no config given: using {path}"), note
        assert cfg.train.global_batch_size == closed.train.global_batch_size
        assert cfg == closed


def test_without_a_config_a_global_batch_no_closed_config_has_is_one_line(tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"no closed config of deepcam has this job's global batch \(3 ranks\).*"
        r"deepcam_closed_gbs128.yaml \(global batch 128\)",
    ):
        load_run_config(TASKS["deepcam"], None, {"data.data_dir": "/data"}, 3)


def test_a_reference_style_job_script_starts_without_a_config(deepcam_data, tmp_path):
    """The reference DeepCAM's flags only: the [init] line names the config it took. Forked as
    every single-rank run (helpers.run); no warm-up, which compiles what the step does anyway."""
    proc = helpers.run(
        helpers.TrainCommand(
            [
                helpers.PYTHON,
                helpers.REPO / "deepcam" / "train.py",
                "--data_dir_prefix",
                deepcam_data,
                "--output_dir",
                tmp_path,
                "--run_tag",
                "run0",
                "--local_batch_size",
                "128",
                "--max_epochs",
                "1",
                "--set",
                "data.height=64",
                "--set",
                "data.width=96",
                "--set",
                "data.n_train=128",
                "--set",
                "data.n_valid=4",
                "--set",
                "model.width=0.0625",
                "--set",
                "model.middle_blocks=1",
                "--set",
                "runtime.check_log=false",
                "--set",
                "train.stop_at_target=false",
                "--set",
                "train.warmup_steps=0",
            ]
        ),
        timeout=600,
    )
    assert (
        "[init] no config given: using deepcam/configs/deepcam_closed_gbs128.yaml"
        in proc.stdout.replace(str(helpers.REPO) + "/", "")
    ), proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.returncode in (0, 3), proc.stderr[-3000:]
    assert (tmp_path / "run0" / "mlperf.log").is_file()  # --run_tag names the run's folder
    assert "global_batch_size: 128" in (tmp_path / "run0" / "config.yaml").read_text()


@pytest.mark.parametrize("name", benchmarks.names())
def test_tiny_shrinks_a_config_and_the_command_line_still_wins(name):
    task = TASKS[name]
    path = benchmarks.closed_configs(name)[0]
    full = load_config(task.config_class, path, {"data.data_dir": "/data"})
    tiny, note = load_run_config(
        task, path, {"data.data_dir": "/data", "runtime.tiny": "true", "train.seed": "5"}, ranks=2
    )
    assert "runtime.tiny" in note
    assert tiny.train.n_epochs == 1 and tiny.train.global_batch_size is None
    assert task(tiny).local_batch_size == 1 < task(full).local_batch_size
    assert tiny.train.seed == 5  # the command line wins over tiny
    # The hyperparameters stay (DeepCAM's warmup steps aside: a few steps would all be warmup).
    kept = (
        dataclasses.replace(tiny.optimizer, lr_warmup_steps=full.optimizer.lr_warmup_steps)
        if name == "deepcam"
        else tiny.optimizer
    )
    assert kept == full.optimizer
    assert tiny.mlperf == full.mlperf


def test_the_precision_policy_is_passed_to_the_builder_and_not_left_global():
    from cosmoflow.model import build_model

    assert tf_keras.mixed_precision.global_policy().name == "float32"
    with runtime.dtype_policy("mixed_bfloat16"):
        model = build_model((8, 8, 8, 4), conv_size=2, n_conv_layers=1, fc1_size=4, fc2_size=4)
    assert tf_keras.mixed_precision.global_policy().name == "float32"
    assert model.get_layer("conv1").compute_dtype == "bfloat16"
    assert model.get_layer("conv1").variable_dtype == "float32"
    assert model.get_layer("head").compute_dtype == "float32"  # the output layers stay float32
    sgd = tf_keras.optimizers.SGD(0.1)
    assert runtime.wrap_optimizer(sgd, "mixed_bfloat16") is sgd  # bf16: no loss scaling
    assert isinstance(
        runtime.wrap_optimizer(tf_keras.optimizers.SGD(0.1), "mixed_float16"),
        tf_keras.mixed_precision.LossScaleOptimizer,
    )
    assert tf_keras.mixed_precision.global_policy().name == "float32"
