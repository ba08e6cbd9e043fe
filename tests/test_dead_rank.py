"""A rank killed with SIGKILL mid-step ends the whole job: nothing hangs, and rank 0
closes its MLPerf log as aborted (common/run/termination.py) before the launcher kills it.
(srun: tests/test_slurm.py.)"""

import pytest

from common import launchers
from tests import helpers

pytestmark = pytest.mark.slow  # two 2-rank jobs

EXIT_BOUND_S = 30  # measured here: gloo 10.3 s (horovodrun SIGKILLs after SIGTERM), mpirun 2.1 s (2-core AMD EPYC)


def long_run(data, config, out):
    return helpers.train_cmd(
        "cosmoflow",
        config,
        "--data-dir",
        data,
        "--output-dir",
        out,
        "--n-train",
        "1024",
        "--n-valid",
        "256",
        "--n-epochs",
        "100",
        "--set",
        "train.stop_at_target=false",
        "--set",
        "runtime.check_log=false",
    )


@pytest.mark.parametrize("launcher", ["gloo", "mpi"])
def test_killing_one_rank_ends_every_rank_and_closes_the_log(
    cosmo_data, tiny_config, tmp_path, launcher
):
    if launcher == "mpi" and not helpers.horovod_has_mpi():
        pytest.skip("Horovod without MPI or no mpirun")
    out = tmp_path / "run"
    train = long_run(cosmo_data, tiny_config, out)
    cmd = launchers.prefix({"gloo": "horovodrun", "mpi": "mpirun"}[launcher], 2) + train
    code, seconds, output = helpers.kill_a_rank_mid_epoch(cmd, out)
    print(f"{launcher}: every rank gone {seconds:.1f} s after rank 1 was killed (exit {code})")
    assert code != 0
    assert seconds < EXIT_BOUND_S, output[-3000:]
    assert "error: [rank 0] terminated (SIGTERM)" in output
    log = (out / "mlperf.log").read_text().splitlines()
    assert '"key": "run_stop"' in log[-1] and '"status": "aborted"' in log[-1]
    assert not (out / "mlperf.log.partial").exists()
