"""tools/install.sh: a failed install names the step that failed; a done one is not redone."""

import subprocess

from tests.helpers import REPO


def install(env_overrides, tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **env_overrides}
    return subprocess.run(["bash", str(REPO / "tools" / "install.sh")], env=env, capture_output=True,
                          text=True, timeout=120)


def test_unsupported_python_names_the_step(tmp_path):
    fake = tmp_path / "python3.13"
    fake.write_text("#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'Python 3.13.0'; exit 0; fi\nexit 1\n")
    fake.chmod(0o755)
    proc = install({"PYTHON": str(fake), "VENV": str(tmp_path / "venv")}, tmp_path)
    assert proc.returncode == 1
    assert '[install] FAILED at step "python": TensorFlow 2.15.1 needs Python 3.9-3.11' in proc.stderr
    assert not (tmp_path / "venv").exists()


def test_missing_python_names_the_step(tmp_path):
    proc = install({"PYTHON": str(tmp_path / "no-such-python"), "VENV": str(tmp_path / "venv")}, tmp_path)
    assert proc.returncode != 0
    assert 'FAILED at step "python"' in proc.stderr


def test_second_call_returns_at_once():
    proc = subprocess.run(["bash", str(REPO / "tools" / "install.sh")], capture_output=True, text=True, timeout=60,
                          cwd=REPO)
    assert proc.returncode == 0 and proc.stdout == ""  # the stamp matched: nothing installed again
