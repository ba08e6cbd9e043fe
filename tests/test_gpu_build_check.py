"""tools/gpu_build_check.sh (`make gpu-build-check`) stops with one line before it installs anything.

The build itself takes half an hour on 2 cores and is run by hand (docs/sites.md has its result);
these check only what it says when it cannot start or when tools/install.sh stops.
"""

import os
import subprocess

from tests.helpers import REPO

SCRIPT = REPO / "tools" / "gpu_build_check.sh"


def check(tmp_path, **env):
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("HOROVOD_CUDA_HOME", "CUDA_HOME")},
        "GPU_CHECK_DIR": str(tmp_path / "check"),
        **env,
    }
    return subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60
    )


def test_a_cuda_home_without_nvcc_is_refused_on_one_line(tmp_path):
    proc = check(tmp_path, HOROVOD_CUDA_HOME=str(tmp_path / "no-cuda"))
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"error: no CUDA toolkit at {tmp_path / 'no-cuda'} (no bin/nvcc): "
        "give HOROVOD_CUDA_HOME=a CUDA toolkit"
    ]
    assert not (tmp_path / "check").exists()


def test_an_install_that_stops_gives_a_fail_verdict_naming_its_step(tmp_path):
    # A CUDA home that passes the first check (an nvcc that says its release), and an install
    # that stops at its first step: the verdict names that step and its reason.
    nvcc = tmp_path / "cuda" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.4, V12.4.131'\n")
    nvcc.chmod(0o755)
    proc = check(tmp_path, CUDA_HOME=str(tmp_path / "cuda"), PYTHON=str(tmp_path / "no-python"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"[gpu-build-check] CUDA 12.4 ({tmp_path / 'cuda'}), archs 80,90")
    assert lines[-1].startswith("[gpu-build-check] FAIL in 0m0")
    assert (
        lines[-1]
        .split(": ", 1)[1]
        .startswith(
            'tools/install.sh failed at step "python": TensorFlow 2.21.0 needs Python 3.10-3.13'
        )
    )
    assert not (tmp_path / "check" / "venv").exists()
