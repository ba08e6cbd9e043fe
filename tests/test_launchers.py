"""common/launchers.py: each launcher's command prefix, the one-rank case, and its command line for make."""

import subprocess
import sys

import pytest

from common import launchers
from tests import helpers


def test_horovodrun_is_the_one_beside_this_python_over_gloo_on_this_host():
    assert launchers.prefix("horovodrun", 3) == [
        str(helpers.PYTHON).rsplit("/", 1)[0] + "/horovodrun",
        "-np",
        "3",
        "-H",
        "localhost:3",
        "--gloo",
    ]
    assert launchers.horovodrun(4, hosts="localhost:2,127.0.0.1:2")[3:5] == [
        "-H",
        "localhost:2,127.0.0.1:2",
    ]


def test_mpirun_runs_as_root_oversubscribed_and_passes_the_environment_on():
    assert launchers.prefix("mpirun", 2) == [
        "mpirun",
        "--allow-run-as-root",
        "--oversubscribe",
        "-np",
        "2",
        "-x",
        "PYTHONPATH",
        "-x",
        "TF_CPP_MIN_LOG_LEVEL",
    ]


def test_srun_is_one_node_under_pmix_and_ends_every_rank_when_one_fails():
    assert launchers.prefix("srun", 2) == [
        "srun",
        "--mpi=pmix",
        "-N",
        "1",
        "-n",
        "2",
        "--kill-on-bad-exit=1",
    ]


def test_an_unknown_launcher_is_refused_naming_the_known_ones():
    with pytest.raises(
        ValueError, match="unknown launcher 'pbsrun'; known: horovodrun, mpirun, srun"
    ):
        launchers.prefix("pbsrun", 2)


def test_one_rank_runs_alone_and_more_under_horovodrun():
    cmd = ["python", "train.py", 7]
    assert launchers.on_this_host(cmd, 1) == ["python", "train.py", "7"]
    assert launchers.on_this_host(cmd, 2) == launchers.horovodrun(2) + ["python", "train.py", "7"]


def test_the_command_line_prints_the_prefix_for_make():
    out = subprocess.run(
        [sys.executable, "-m", "common.launchers", "horovodrun", "2"],
        cwd=helpers.REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.split() == launchers.horovodrun(2)
    refused = subprocess.run(
        [sys.executable, "-m", "common.launchers", "pbsrun", "2"],
        cwd=helpers.REPO,
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 2 and "invalid choice: 'pbsrun'" in refused.stderr
