"""A real one-node SLURM cluster on this machine runs slurm/cosmoflow.sbatch with 2 tasks.

Needs root and the Debian packages slurm-wlm and munge (installed here if missing); without
them the test is skipped with the reason. CI runs as root, so CI runs it.
"""

import json
import os
import shutil
import subprocess
import time

import pytest

from common import launchers
from tests import helpers
from tests.conftest import EASY_ARGS

# A whole cluster: `make test-all` runs it, `make test` skips it.
pytestmark = [pytest.mark.slow, pytest.mark.system]

LOCAL_SLURM = helpers.REPO / "tools" / "local_slurm.sh"


def _ensure_packages() -> str | None:
    """None when SLURM and munge are usable, else why not."""
    if os.geteuid() != 0:
        return "not root: cannot start munged/slurmctld/slurmd"
    if all(shutil.which(b) for b in ("munged", "slurmctld", "slurmd", "sbatch")):
        return None
    proc = subprocess.run(
        "apt-get install -y -qq slurm-wlm munge >/dev/null 2>&1 || "
        "(apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq slurm-wlm munge >/dev/null 2>&1)",
        shell=True,
        timeout=900,
    )
    if proc.returncode != 0 or not shutil.which("slurmctld"):
        return "cannot install slurm-wlm and munge with apt-get"
    return None


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory):
    why = _ensure_packages()
    if why:
        print(f"SKIP test_slurm: {why}")
        pytest.skip(why)
    state = tmp_path_factory.mktemp("slurm")
    start = subprocess.run(
        ["bash", LOCAL_SLURM, "start", state], capture_output=True, text=True, timeout=180
    )
    try:
        assert start.returncode == 0, start.stdout + start.stderr
        yield state / "slurm.conf"
    finally:  # the daemons go away whatever happened
        subprocess.run(["bash", LOCAL_SLURM, "stop", state], capture_output=True, timeout=60)


def test_sbatch_cosmoflow_two_tasks_under_pmix(
    slurm_cluster, cosmo_easy_data, tiny_config, tmp_path
):
    if not helpers.horovod_has_mpi():
        pytest.fail(
            "Horovod was built without MPI: srun ranks could not be wired (install libopenmpi-dev)"
        )
    out = tmp_path / "run"
    env = helpers.env() | {
        "SLURM_CONF": str(slurm_cluster),
        "REPO": str(helpers.REPO),
        "DATA_DIR": str(cosmo_easy_data),
        "CONFIG": str(tiny_config),
        "OUTPUT_DIR": str(out),
        "STAGE_DIR": str(tmp_path / "stage"),
        "VENV": str(helpers.REPO / ".venv"),
        # The easy set (conftest.EASY): the job is the subject, not learning.
        "EXTRA_ARGS": " ".join(["--set", "runtime.record_shards=true", *EASY_ARGS]),
    }
    job_out = tmp_path / "job.out"
    proc = subprocess.run(
        [
            "sbatch",
            "--wait",
            "-N",
            "1",
            "-n",
            "2",
            "-o",
            str(job_out),
            str(helpers.REPO / "slurm" / "cosmoflow.sbatch"),
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    log_text = job_out.read_text() if job_out.exists() else "(no job output)"
    print(log_text[-4000:])  # shown in the test report and the closing note
    assert proc.returncode == 0, proc.stdout + proc.stderr + log_text[-4000:]
    assert "Submitted batch job" in proc.stdout

    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "success" and summary["log_check"] == "passed"
    assert summary["ranks"] == 2 and summary["nodes"] == 1
    # Wired by SLURM's PMI through MPI, not by horovodrun's Gloo rendezvous.
    assert summary["controller"] == "mpi"
    assert summary["launcher"]["SLURM_NTASKS"] == "2" and "SLURM_JOB_ID" in summary["launcher"]
    assert summary["staging"]["files"] > 0 and summary["weights_in_sync"]
    log = (out / "mlperf.log").read_text()
    assert (
        '"key": "number_of_nodes", "value": 1' in log
        and '"key": "number_of_ranks", "value": 2' in log
    )
    assert '"key": "staging_start"' in log
    shards = [json.loads((out / "shards" / f"rank-{r:05d}.json").read_text()) for r in (0, 1)]
    assert not set(shards[0]["train"]) & set(shards[1]["train"])


def test_killing_one_srun_rank_ends_the_job(slurm_cluster, cosmo_data, tiny_config, tmp_path):
    # srun --kill-on-bad-exit=1 (as slurm/env.sh's run_ranks): SIGTERM to the rest, then SIGKILL.
    from tests.test_dead_rank import long_run

    if not helpers.horovod_has_mpi():
        pytest.fail(
            "Horovod was built without MPI: srun ranks could not be wired (install libopenmpi-dev)"
        )
    out = tmp_path / "run"
    cmd = launchers.srun(2) + long_run(cosmo_data, tiny_config, out)
    code, seconds, output = helpers.kill_a_rank_mid_epoch(
        cmd, out, environ=helpers.env() | {"SLURM_CONF": str(slurm_cluster)}
    )
    print(f"srun: every rank gone {seconds:.1f} s after rank 1 was killed (exit {code})")
    assert code != 0 and seconds < 60, output[-3000:]
    log = (out / "mlperf.log").read_text().splitlines()
    assert '"key": "run_stop"' in log[-1] and '"status": "aborted"' in log[-1], output[-3000:]


def _job_state(job_id: str, environ) -> dict:
    out = subprocess.run(
        ["scontrol", "show", "job", job_id], env=environ, capture_output=True, text=True
    ).stdout
    return dict(field.split("=", 1) for field in out.split() if "=" in field)


def test_sbatch_signalled_job_requeues_and_resumes_to_the_uninterrupted_weights(
    slurm_cluster, cosmo_data, tiny_config, tmp_path
):
    """SIGUSR1 to the job's ranks (what --signal=USR1@grace sends before the time limit): the
    ranks checkpoint and exit 75, the script requeues its job, the requeued job resumes from
    the checkpoint and ends with the weights of an uninterrupted job, bit for bit."""
    if not helpers.horovod_has_mpi():
        pytest.fail(
            "Horovod was built without MPI: srun ranks could not be wired (install libopenmpi-dev)"
        )
    env = helpers.env() | {
        "SLURM_CONF": str(slurm_cluster),
        "REPO": str(helpers.REPO),
        "DATA_DIR": str(cosmo_data),
        "CONFIG": str(tiny_config),
        "VENV": str(helpers.REPO / ".venv"),
        "EXTRA_ARGS": " ".join(
            helpers.COSMOFLOW_EXACT_ARGS + ["--set", "train.stop_check_steps=1"]
        ),
    }
    script = str(helpers.REPO / "slurm" / "cosmoflow.sbatch")
    whole = tmp_path / "whole"
    proc = subprocess.run(
        ["sbatch", "--wait", "-N", "1", "-n", "2", "-o", str(tmp_path / "whole.out"), script],
        env=env | {"OUTPUT_DIR": str(whole)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, (
        proc.stdout + proc.stderr + (tmp_path / "whole.out").read_text()[-3000:]
    )

    out, job_out = tmp_path / "preempted", tmp_path / "preempted.out"
    submit = subprocess.run(
        ["sbatch", "--parsable", "-N", "1", "-n", "2", "-o", str(job_out), script],
        env=env | {"OUTPUT_DIR": str(out)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert submit.returncode == 0, submit.stderr
    job_id = submit.stdout.strip().split(";")[0]
    partial = out / "mlperf.log.partial"
    deadline = time.monotonic() + 600
    while not (partial.exists() and "epoch_start" in partial.read_text()):
        assert time.monotonic() < deadline, (
            job_out.read_text()[-3000:] if job_out.exists() else "no output"
        )
        time.sleep(0.1)
    time.sleep(1.0)
    signalled = time.monotonic()
    subprocess.run(["scancel", "--signal=USR1", job_id], env=env, check=True, timeout=30)
    hurried = False
    while True:
        state = _job_state(job_id, env)
        if state.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            break
        idle = subprocess.run(
            ["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True
        ).stdout
        # The first incarnation's PMIx socket (same job and step id) must be gone, or the next step fails.
        stale = list((slurm_cluster.parent / "slurmd").glob(f"stepd.slurm.pmix.{job_id}.*"))
        if (
            state.get("JobState") == "PENDING"
            and state.get("Restarts") == "1"
            and idle.strip() == "idle"
            and not stale
            and not hurried
        ):
            # slurmctld holds a requeued batch job back for a while (about 2 minutes here);
            # a cluster would wait, the test need not.
            subprocess.run(
                ["scontrol", "update", f"JobId={job_id}", "StartTime=now"], env=env, timeout=30
            )
            hurried = True
        assert time.monotonic() < deadline, f"job {job_id} never finished: {state}"
        time.sleep(1.0)
    log_text = job_out.read_text()
    print(log_text[-2500:])
    print(
        f"job {job_id}: {state.get('JobState')} after {state.get('Restarts')} restart(s), "
        f"{time.monotonic() - signalled:.0f} s after SIGUSR1"
    )
    assert state["JobState"] == "COMPLETED" and state.get("Restarts") == "1", log_text[-3000:]
    assert "requeueing job" in log_text and "[done] stopped on request" in log_text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from"]["checkpoint"].startswith(str(out / "checkpoints"))
    helpers.assert_same_final_state(whole, out, "cosmoflow")
