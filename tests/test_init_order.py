"""The order of initialization, a contract no CPU run would break visibly: Horovod's init, the device
pinned, threads and precision set, and only then the first TensorFlow op (a collective, on a
spatial run: the check of its groups' nodes). On a GPU an op before the pinning initializes every
visible GPU and the pinning raises; here tests/init_order_probe.py sees it as thread pools that
can no longer be set."""

import re

from tests import helpers

PROBE = re.compile(r"init-order probe: rank (\d+) device (\w+) thread pools (set|refused)")


def test_no_op_runs_before_the_runtime_is_configured_on_a_spatial_run(
    cosmo_data, tiny_config, tmp_path
):
    # 4 ranks in 2 groups of K=2 (a spatial run whose groups are fewer than the ranks: static process
    # sets registered by hvd.init, the groups' nodes gathered), in benchmark mode; rank 3 runs an op before train.py's main, the
    # negative control, so the same launch shows the probe can fail.
    out = tmp_path / "run"
    cmd = [
        helpers.PYTHON,
        helpers.REPO / "tests" / "init_order_probe.py",
        "--op-first",
        "3",
        "cosmoflow",
        tiny_config,
        "--data-dir",
        cosmo_data,
        "--output-dir",
        out,
        "--n-train",
        "16",
        "--n-valid",
        "8",
        "--batch-size",
        "2",
        "--spatial-ranks",
        "2",
        "--benchmark",
        "1",
        "--set",
        "train.benchmark_warmup_steps=0",
    ]
    proc = helpers.horovodrun(4, cmd, timeout=600)
    assert proc.returncode == 0, helpers.failure_output(proc)
    probes = {int(rank): (device, pools) for rank, device, pools in PROBE.findall(proc.stdout)}
    assert probes == {
        0: ("cpu", "set"),
        1: ("cpu", "set"),
        2: ("cpu", "set"),
        3: ("cpu", "refused"),
    }, proc.stdout
    # Rank 0's [init] line says nothing of TensorFlow running early: its pools are as sized.
    assert "static process sets of 2 ranks" in proc.stdout  # the groups' sets, from HOROVOD_SIZE
    assert "TensorFlow was running before the runtime was configured" not in proc.stdout
