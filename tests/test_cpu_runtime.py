"""oneDNN on any x86-64 CPU, the CPU report, and an honest --amp (common/cpu.py, common/runtime.py)."""

import os
import platform
import types

import numpy as np
import pytest

from common import cpu
from tests import helpers

AVX2 = frozenset({"sse4_2", "avx", "avx2", "fma"})
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512_vnni"}
SAPPHIRE_RAPIDS = AVX512 | {"avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"}


@pytest.mark.parametrize(
    "flags, isa, bf16",
    [
        (AVX2, "AVX2", False),
        (AVX512, "AVX-512", False),
        (AVX512 | {"avx512_bf16"}, "AVX-512", True),
        (SAPPHIRE_RAPIDS, "AMX", True),
    ],
)
def test_isa_and_native_bf16_from_cpu_flags(flags, isa, bf16):
    assert cpu.isa(flags) == isa
    assert cpu.has_native_bf16(flags) is bf16


def test_onednn_is_preferred_on_x86_64_only_and_a_user_choice_is_kept(tmp_path):
    no_gpu = str(tmp_path / "absent")
    env = {}
    assert cpu.prefer_onednn(env, machine="x86_64", gpus_dir=no_gpu) and env == {
        cpu.ONEDNN_ENV: "1"
    }
    env = {cpu.ONEDNN_ENV: "0"}
    assert not cpu.prefer_onednn(env, machine="x86_64", gpus_dir=no_gpu) and env == {
        cpu.ONEDNN_ENV: "0"
    }
    env = {}
    assert not cpu.prefer_onednn(env, machine="aarch64", gpus_dir=no_gpu) and env == {}


def test_onednn_is_left_to_tensorflow_where_a_gpu_is_visible(tmp_path):
    # The NVIDIA driver's list as /proc/driver/nvidia/gpus holds it on a GPU node: a folder per GPU.
    gpus = tmp_path / "gpus"
    (gpus / "0000:07:00.0").mkdir(parents=True)
    env = {}
    assert not cpu.prefer_onednn(env, machine="x86_64", gpus_dir=str(gpus)) and env == {}
    for hidden in ("", "-1"):  # CUDA_VISIBLE_DEVICES hiding every GPU: a CPU run, oneDNN on
        env = {"CUDA_VISIBLE_DEVICES": hidden}
        assert (
            cpu.prefer_onednn(env, machine="x86_64", gpus_dir=str(gpus))
            and env[cpu.ONEDNN_ENV] == "1"
        )
    (gpus / "0000:07:00.0").rmdir()  # the driver loaded, no GPU: the control
    env = {}
    assert cpu.prefer_onednn(env, machine="x86_64", gpus_dir=str(gpus)) and env == {
        cpu.ONEDNN_ENV: "1"
    }


PROBE = "import common, tensorflow; from common import cpu; print('onednn', cpu.onednn_enabled())"


@pytest.mark.skipif(
    platform.machine() != "x86_64", reason="oneDNN is turned on for x86-64 CPUs only"
)
@pytest.mark.parametrize("user_value, expected", [(None, "True"), ("0", "False")])
def test_tensorflow_runs_onednn_unless_the_user_turned_it_off(user_value, expected):
    env = helpers.env()
    env.pop(cpu.ONEDNN_ENV, None)
    if user_value is not None:
        env[cpu.ONEDNN_ENV] = user_value
    proc = helpers.run([helpers.PYTHON, "-c", PROBE], timeout=120, environ=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["onednn", expected]


# A notebook's cells: TensorFlow first, then one training step of the small synthetic DeepCAM config.
TENSORFLOW_FIRST = """
import tensorflow as tf
import numpy as np
from common import cpu
from common.config import load_config, replace
from common.parallel.distribution import RankGroup
from common.run.steps import TrainStep
from deepcam.config import DeepCAMConfig
from deepcam.task import DeepCAMTask
from tests import helpers
cfg = load_config(DeepCAMConfig, "deepcam/configs/deepcam_synthetic_cpu.yaml", {"data.data_dir": "%s"})
task = DeepCAMTask(replace(cfg, DeepCAMTask.tiny_overrides(cfg)))
model = task.build_model(RankGroup(1, None))
step = TrainStep(model, task.build_optimizer(1, 1)[0], task.build_losses(), helpers.SingleProcess(),
                 preprocess=task.preprocess_batch)
x_spec, y_spec = task.input_specs()
x = np.random.default_rng(0).random(x_spec.shape, np.float32)
loss = step(iter([(x, np.zeros(y_spec.shape, np.uint8))])).loss
print("loss", float(loss), "onednn", cpu.onednn_enabled(), cpu.describe()["onednn"])
"""
# The CPU flags with which TensorFlow 2.15 turns oneDNN on by itself (tensorflow/core/util/port.cc).
_ONEDNN_BY_DEFAULT = {"avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16"}


@pytest.mark.skipif(
    platform.machine() != "x86_64" or bool(_ONEDNN_BY_DEFAULT & cpu._cpuinfo()[1]),
    reason="TensorFlow's own default is oneDNN off on this CPU only",
)
@pytest.mark.parametrize("variable", [None, "1"])
def test_importing_tensorflow_first_trains_and_says_what_it_costs(deepcam_data, variable):
    env = helpers.env()
    env.pop(cpu.ONEDNN_ENV, None)  # the tests' own process set it (conftest imports common)
    if variable is not None:  # the control: set before Python starts, it is TensorFlow's choice
        env[cpu.ONEDNN_ENV] = variable
    proc = helpers.run(
        [helpers.PYTHON, "-c", TENSORFLOW_FIRST % deepcam_data], timeout=300, environ=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    words = proc.stdout.split("loss", 1)[1].split()
    assert np.isfinite(float(words[0]))
    warnings = [
        line
        for line in proc.stderr.splitlines()
        if line.startswith("warning: TensorFlow was imported")
    ]
    if variable is None:
        assert words[2] == "False" and "imported before this project" in proc.stdout
        assert len(warnings) == 1 and "slower" in warnings[0] and "before tensorflow" in warnings[0]
    else:
        assert words[2] == "True" and not warnings


def rt(amp=True, amp_dtype="auto"):
    return types.SimpleNamespace(amp=amp, amp_dtype=amp_dtype)


@pytest.mark.parametrize(
    "runtime, device, native, precision, says_why",
    [
        (rt(amp=False), "cpu", False, "float32", False),
        (rt(), "cpu", True, "mixed_bfloat16", False),
        (rt(), "cpu", False, "float32", True),  # emulated bf16: stays fp32, says so
        (rt(amp_dtype="bfloat16"), "cpu", False, "mixed_bfloat16", False),  # forced
        (rt(), "gpu", False, "mixed_float16", False),
        (rt(amp_dtype="bfloat16"), "gpu", False, "mixed_bfloat16", False),
    ],
)
def test_amp_precision_follows_the_hardware(runtime, device, native, precision, says_why):
    from common.runtime import choose_precision

    chosen, why = choose_precision(runtime, device, native_bf16=native)
    assert chosen == precision
    assert bool(why) is says_why
    if says_why:
        assert "no native bf16" in why and "runtime.amp_dtype=bfloat16" in why and "\n" not in why


def test_the_container_image_a_run_computes_in(tmp_path, monkeypatch):
    from common.runtime import container_image

    for name in ("APPTAINER_CONTAINER", "SINGULARITY_CONTAINER", "MLPERF_HPC_IMAGE_SHA256"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLPERF_HPC_COMMIT", "abc123")
    if not os.path.exists("/.dockerenv"):
        assert container_image() == {}  # outside a container: nothing said
    sif = tmp_path / "image.sif"
    (tmp_path / "image.sif.sha256").write_text(
        f"{'a' * 64}  image.sif\n"
    )  # as `make sif` writes it
    monkeypatch.setenv("APPTAINER_CONTAINER", str(sif))
    expected = {"runtime": "apptainer", "image": str(sif), "sha256": "a" * 64, "commit": "abc123"}
    assert container_image() == expected
    monkeypatch.setenv(
        "MLPERF_HPC_IMAGE_SHA256", "b" * 64
    )  # slurm/env.sh's, where the file is not visible
    assert container_image() == expected | {"sha256": "b" * 64}
