"""The timed loop reads no value of a step that may still run (tests/inflight_probe.py): the
agreement and the log line read steps two behind the newest launched, the epoch's end reads the
rest. The control, runtime.step_timing, waits for every step of the first epoch: the probe sees it."""

import re

from tests import helpers

PROBE = re.compile(r"inflight probe: read (\d+) launched (\d+) epoch-end (\d)")


def _reads(cosmo_data, tiny_config, out, *extra) -> list[tuple[int, int, int]]:
    # A check and a log line after every step: as many reads as the loop can make.
    cmd = [
        helpers.PYTHON,
        helpers.REPO / "tests" / "inflight_probe.py",
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
        "--n-epochs",
        "2",
        "--set",
        "train.stop_at_target=false",
        "--set",
        "target_mae=10",
        "--set",
        "train.stop_check_steps=1",
        "--set",
        "train.log_every_steps=1",
        *extra,
    ]
    proc = helpers.run(cmd, timeout=300)
    assert proc.returncode == 0, helpers.failure_output(proc)
    return [tuple(map(int, m)) for m in PROBE.findall(proc.stdout)]


def test_the_loop_reads_only_steps_two_behind_the_newest_launched(
    cosmo_data, tiny_config, tmp_path
):
    reads = _reads(cosmo_data, tiny_config, tmp_path / "default")
    in_loop = [(read, launched) for read, launched, end in reads if not end]
    assert len(in_loop) >= 8, reads  # 8 steps an epoch: the agreement and the log line read
    assert all(launched - read >= 2 for read, launched in in_loop), reads
    # The epoch's end reads its last step, once no step is launched.
    assert {(read, launched) for read, launched, end in reads if end} >= {(8, 8), (16, 16)}, reads


def test_control_step_timing_reads_the_step_just_launched(cosmo_data, tiny_config, tmp_path):
    reads = _reads(cosmo_data, tiny_config, tmp_path / "timed", "--set", "runtime.step_timing=true")
    assert any(launched == read for read, launched, end in reads if not end), reads
