"""The tests' horovodrun jobs of train.py run their ranks forked from the zygote
(tests/rank_client.py, tests/train_driver.py --zygote): a job ends there as it ends with a process
per rank, and a rank whose client is killed (as horovodrun kills the ranks of a failed job) does not
outlive it."""

import os
import re
import signal
import subprocess
import time
from pathlib import Path

from common import launchers
from tests import helpers


def _children(pid: int) -> set[int]:
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.add(int(stat.parent.name))
    return found


def test_a_job_of_forked_ranks_ends_as_a_job_of_processes(cosmo_data, tiny_config, tmp_path):
    def job(name):
        # 24 samples do not divide over 2 ranks x batch 8: each rank says so and exits 2.
        return helpers.train_cmd(
            "cosmoflow",
            tiny_config,
            "--data-dir",
            cosmo_data,
            "--output-dir",
            tmp_path / name,
            "--n-train",
            "24",
            "--n-valid",
            "16",
        )

    forked = helpers.horovodrun(2, job("forked"))
    own = helpers.run([*launchers.horovodrun(2), *job("own")])
    assert forked.returncode == own.returncode != 0, helpers.failure_output(own)

    def said(proc, name):
        # What the ranks said, whichever rank said it: once one rank has failed, horovodrun stops the
        # other, which may not have got to its own error line and says it was stopped instead.
        lines = helpers.error_lines(proc.stdout + proc.stderr)
        return {
            re.sub(r"^\[\d+\]<std\w+>:error: \[rank \d+\]", "error:", line).replace(name, "RUN")
            for line in lines
            if "terminated (SIGTERM)" not in line
        }

    assert said(forked, "forked") == said(own, "own") and said(own, "own"), own.stdout[-2000:]
    assert "rank_client" not in forked.stdout + forked.stderr  # no traceback of the client
    # Each rank's temporary directory (autograph's files) went with it, though it ended by os._exit.
    assert [p.name for p in helpers.zygote().socket.parent.iterdir()] == ["socket"]


def test_a_killed_client_takes_its_rank_with_it(cosmo_data, tiny_config, tmp_path):
    train = helpers.train_cmd(
        "cosmoflow", tiny_config, "--data-dir", cosmo_data, "--output-dir", tmp_path / "run"
    )
    cmd, environ = helpers.rank_client(train)
    client = subprocess.Popen(
        cmd, env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    zygote = helpers.zygote()
    deadline = time.monotonic() + 60
    ranks = set()
    while not ranks and time.monotonic() < deadline:
        ranks = {rank for monitor in _children(zygote.proc.pid) for rank in _children(monitor)}
        time.sleep(0.1)
    assert ranks and client.poll() is None, "no rank forked for the client"
    client.send_signal(signal.SIGKILL)
    client.wait()
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{rank}").exists() for rank in ranks) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = [rank for rank in ranks if Path(f"/proc/{rank}").exists()]
    assert not alive, f"rank(s) {alive} outlived their killed client"
    assert os.path.exists(zygote.socket)  # the zygote serves on
