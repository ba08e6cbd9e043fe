"""tools/install.sh: the interpreter it picks, a failed install names the step that failed, a done
one is not redone."""

import shutil
import subprocess

from tests.helpers import REPO

BASH = shutil.which("bash")  # by its full path: some tests give the script a PATH without it
WAYS_ON = ("`uv python install 3.13`", "`pyenv install 3.13`", "docker/Dockerfile.cpu")


def install(env_overrides, tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **env_overrides}
    return subprocess.run(
        [BASH, str(REPO / "tools" / "install.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def fake_python(folder, name: str, version: str):
    """An executable answering --version and the version probe like Python `version`, failing anything else."""
    folder.mkdir(exist_ok=True)
    major_minor = ".".join(version.split(".")[:2])
    fake = folder / name
    fake.write_text(
        f"#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'Python {version}'; exit 0; fi\n"
        f'if [ "$1" = -c ]; then echo {major_minor}; exit 0; fi\nexit 1\n'
    )
    fake.chmod(0o755)
    return fake


def fake_shim(folder, name: str):
    """What pyenv puts on PATH for a version that is installed but not active: found, and failing."""
    folder.mkdir(exist_ok=True)
    shim = folder / name
    shim.write_text(f"#!/bin/sh\necho 'pyenv: {name}: command not found' >&2\nexit 127\n")
    shim.chmod(0o755)
    return shim


def test_unsupported_python_names_the_step(tmp_path):
    fake = fake_python(tmp_path, "python3.14", "3.14.0")
    proc = install({"PYTHON": str(fake), "VENV": str(tmp_path / "venv")}, tmp_path)
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(
        '[install] FAILED at step "python": TensorFlow 2.21.0 needs '
        f"Python 3.10-3.13; PYTHON={fake} is Python 3.14"
    )
    assert all(way in lines[0] for way in WAYS_ON)
    assert not (tmp_path / "venv").exists()


def test_a_path_with_only_python3_9_gets_one_line_with_the_ways_on(tmp_path):
    bin_dir = tmp_path / "bin"
    fake_python(bin_dir, "python3.9", "3.9.18")
    proc = install({"PATH": str(bin_dir), "VENV": str(tmp_path / "venv")}, tmp_path)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        '[install] FAILED at step "python": TensorFlow 2.21.0 needs Python 3.10-3.13; none of '
        "python3.13, python3.12, python3.11, python3.10 runs on PATH (found: python3.9 = Python 3.9); ways on: "
        "`uv python install 3.13` then PYTHON=$(uv python find 3.13), or `pyenv install 3.13` then "
        "PYTHON=$(pyenv prefix 3.13)/bin/python3, or the CPU image (docker build -f docker/Dockerfile.cpu .)"
    ]
    assert not (tmp_path / "venv").exists()


def path_with_pythons(tmp_path, pythons, shims=()):
    bin_dir = tmp_path / "bin"
    for name, version in pythons:
        fake_python(bin_dir, name, version)
    for name in shims:
        fake_shim(bin_dir, name)
    for tool in (
        "cat",
        "sha256sum",
        "cut",
        "dirname",
        "mktemp",
        "rm",
    ):  # what the script runs before the venv
        (bin_dir / tool).symlink_to(shutil.which(tool))
    return bin_dir


def test_without_python_the_newest_supported_that_runs_is_taken(tmp_path):
    # python3.13 is a pyenv shim of a version that is not active: found on PATH, but it does not run.
    bin_dir = path_with_pythons(
        tmp_path,
        (("python3.9", "3.9.18"), ("python3.10", "3.10.13"), ("python3.12", "3.12.3")),
        shims=("python3.13",),
    )
    proc = install({"PATH": str(bin_dir), "VENV": str(tmp_path / "venv")}, tmp_path)
    assert (
        "[install] TensorFlow 2.21.0 (requirements.txt), python: python3.12 (Python 3.12.3)"
        in proc.stdout
    ), proc.stdout + proc.stderr
    # The fake cannot make a venv: the install stops at the next step, naming it.
    assert proc.returncode == 1 and 'FAILED at step "venv"' in proc.stderr


def test_missing_python_names_the_step(tmp_path):
    proc = install(
        {"PYTHON": str(tmp_path / "no-such-python"), "VENV": str(tmp_path / "venv")}, tmp_path
    )
    assert proc.returncode != 0
    assert 'FAILED at step "python"' in proc.stderr and "is not a working Python" in proc.stderr


def test_second_call_returns_at_once():
    proc = subprocess.run(
        ["bash", str(REPO / "tools" / "install.sh")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert proc.returncode == 0 and proc.stdout == ""  # the stamp matched: nothing installed again


def wheelhouse(tmp_path, files=(), listed=(), python_version=None, variant="cpu"):
    """A wheelhouse as tools/wheelhouse.sh writes it: `files` (name: bytes) and a SHA256SUMS listing `listed` too."""
    import hashlib
    import sys

    folder = tmp_path / "wh"
    folder.mkdir()
    sums = []
    for name, data in dict(files).items():
        (folder / name).write_bytes(data)
        sums.append(f"{hashlib.sha256(data).hexdigest()}  {name}")
    sums += [f"{'0' * 64}  {name}" for name in listed]
    (folder / "SHA256SUMS").write_text("".join(line + "\n" for line in sums))
    version = python_version or "{}.{}".format(*sys.version_info[:2])
    (folder / "MADE_FOR").write_text(
        f"python {version} x\nplatform linux-x86_64\nvariant {variant}\n"
    )
    return folder


def install_from(folder, tmp_path):
    import sys

    return install(
        {
            "PYTHON": sys.executable,
            "VENV": str(tmp_path / "venv"),
            "WHEELHOUSE": str(folder),
            "PIP_INDEX_URL": "http://127.0.0.1:9/",
        },
        tmp_path,
    )


def test_a_file_the_wheelhouse_lost_is_named_on_one_line(tmp_path):
    name = "tensorflow_cpu-2.21.0-cp311-cp311-manylinux_2_27_x86_64.whl"
    folder = wheelhouse(tmp_path, files={"six-1.17.0-py2.py3-none-any.whl": b"six"}, listed=[name])
    proc = install_from(folder, tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        f'[install] FAILED at step "wheelhouse": {folder}/{name} is missing (listed in {folder}/SHA256SUMS)'
    ]
    assert not (tmp_path / "venv").exists()


def test_a_damaged_file_and_a_wheelhouse_of_another_python_are_refused(tmp_path):
    folder = wheelhouse(tmp_path, files={"six-1.17.0-py2.py3-none-any.whl": b"six"})
    (folder / "six-1.17.0-py2.py3-none-any.whl").write_bytes(b"damaged")
    proc = install_from(folder, tmp_path)
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1
    assert (
        f"{folder}/six-1.17.0-py2.py3-none-any.whl does not match its hash in SHA256SUMS"
        in proc.stderr
    )
    (folder / "six-1.17.0-py2.py3-none-any.whl").write_bytes(b"six")
    (folder / "MADE_FOR").write_text("python 3.9 cpython-39\nvariant cpu\n")
    proc = install_from(folder, tmp_path)
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1
    assert (
        f"{folder} was made for Python 3.9, variant cpu" in proc.stderr
        and "make wheelhouse" in proc.stderr
    )
    assert not (tmp_path / "venv").exists()


def test_a_package_the_wheelhouse_has_no_file_for_is_named_on_one_line(tmp_path):
    # A wheelhouse without wheel or setuptools (the venv brings pip): the first install step stops.
    proc = install_from(wheelhouse(tmp_path), tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        f'[install] FAILED at step "pip upgrade": the wheelhouse {tmp_path / "wh"} has no file for wheel '
        "(make wheelhouse again on a machine with PyPI)"
    ]
    assert "installing from the wheelhouse" in proc.stdout
