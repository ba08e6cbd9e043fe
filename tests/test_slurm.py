"""A real one-node SLURM cluster on this machine (tests/conftest.py's slurm_cluster) ends a job
whose rank was killed, and requeues a signalled slurm/cosmoflow.sbatch job that resumes from its
checkpoint to the end; both with this checkout's venv. That a resumed run ends bitwise equal to an
uninterrupted one is tests/test_exact_resume.py's (SIGUSR1 and SIGKILL under horovodrun). The 2-task PMIx job of slurm/cosmoflow.sbatch
runs in the CPU image's SIF (tests/test_images.py).

Needs root and the Debian packages slurm-wlm and munge (installed here if missing); without
them the test is skipped with the reason. CI runs as root, so CI runs it.
"""

import json
import subprocess
import time

import pytest

from common import launchers
from tests import helpers

# A whole cluster: `make test-all` runs it, `make test` skips it.
pytestmark = [pytest.mark.slow, pytest.mark.system]


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


def _daemon_lines(state_dir, job_id: str) -> str:
    """What slurmctld and slurmd logged of the job, for a failure's message."""
    lines = []
    for log in sorted((state_dir / "log").glob("*.log")):
        lines += [
            f"{log.name}: {line}"
            for line in log.read_text(errors="replace").splitlines()
            if f"JobId={job_id} " in line + " "
            or f"job {job_id}" in line
            or f"[{job_id}." in line
            or f"StepId={job_id}." in line
        ]
    return "\n".join(lines[-60:])


def _job_state(job_id: str, environ) -> dict:
    out = subprocess.run(
        ["scontrol", "show", "job", job_id], env=environ, capture_output=True, text=True
    ).stdout
    return dict(field.split("=", 1) for field in out.split() if "=" in field)


def test_sbatch_signalled_job_requeues_and_resumes_to_the_end(
    slurm_cluster, cosmo_data, tiny_config, tmp_path
):
    """SIGUSR1 to the job's ranks (what --signal=USR1@grace sends before the time limit): the
    ranks checkpoint and exit 75, the script requeues its job, the requeued job resumes from
    that checkpoint (--resume) and trains to the end."""
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
    # The requeued job starts once its old credential has expired (tools/local_slurm.sh's
    # cred_expire), as on a cluster: starting it earlier can fail its launch.
    while True:
        state = _job_state(job_id, env)
        if state.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            break
        assert time.monotonic() < deadline, f"job {job_id} never finished: {state}"
        time.sleep(1.0)
    log_text = job_out.read_text()
    print(log_text[-2500:])
    print(
        f"job {job_id}: {state.get('JobState')} after {state.get('Restarts')} restart(s), "
        f"{time.monotonic() - signalled:.0f} s after SIGUSR1"
    )
    assert state["JobState"] == "COMPLETED" and state.get("Restarts") == "1", (
        f"{state}\n{log_text[-3000:]}\n{_daemon_lines(slurm_cluster.parent, job_id)}"
    )
    assert "requeueing job" in log_text and "[done] stopped on request" in log_text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "success" and summary["ranks"] == 2, summary
    resumed = summary["resumed_from"]
    assert resumed["checkpoint"].startswith(str(out / "checkpoints")), resumed
    # Resumed mid-run, from the signalled job's checkpoint, and trained to the last epoch.
    assert resumed["global_step"] > 0 and summary["epochs"] == 3, (resumed, summary["epochs"])
    assert summary["history"][-1]["epoch"] == 3, summary["history"]
    log = (out / "mlperf.log").read_text()
    assert '"key": "resumed_from"' in log and '"status": "success"' in log
