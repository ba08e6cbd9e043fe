"""Horovod's cycle time (common/parallel/cycle_time.py): read as Horovod 0.28 reads it, shortened before init for
runs with batch-norm groups unless the environment already chose, and, set in the process before Distribution(),
the period Horovod's loop then runs at (tests/cycle_time_probe.py, one rank). The 2-rank group run of
tests/test_deepcam_end_to_end.py checks the launcher's [init] line."""

import json

import pytest

from common import benchmarks
from common.config import peek
from common.parallel import cycle_time
from deepcam.config import DeepCAMConfig
from tests import helpers


@pytest.mark.parametrize(
    "env, ms, source",
    [
        ({}, 1.0, "Horovod's default"),
        ({"HOROVOD_CYCLE_TIME": "0.1"}, 0.1, "HOROVOD_CYCLE_TIME=0.1"),
        (
            {"HOROVOD_CYCLE_TIME": " 2.5ms"},
            2.5,
            "HOROVOD_CYCLE_TIME= 2.5ms",
        ),  # strtof: the number at the start
        (
            {"HOROVOD_CYCLE_TIME": "fast"},
            0.0,
            "HOROVOD_CYCLE_TIME=fast",
        ),  # no number: strtof gives 0
        ({"HOROVOD_ENABLE_XLA_OPS": "1"}, 0.0, "Horovod's default with HOROVOD_ENABLE_XLA_OPS"),
        ({"HOROVOD_ENABLE_XLA_OPS": "true"}, 1.0, "Horovod's default"),  # strtol("true") is 0: off
        ({"HOROVOD_ENABLE_XLA_OPS": "1", "HOROVOD_CYCLE_TIME": "3"}, 3.0, "HOROVOD_CYCLE_TIME=3"),
    ],
)
def test_read_mirrors_horovods_parsing(env, ms, source):
    got = cycle_time.read(env)
    assert (got.ms, got.source, got.autotuned) == (ms, source, False)


def test_the_autotuner_owns_it_unless_the_variable_fixes_it():
    assert (
        cycle_time.read({"HOROVOD_AUTOTUNE": "1"}).describe()
        == "cycle time tuned by Horovod's autotuner (Horovod's default)"
    )
    assert not cycle_time.read({"HOROVOD_AUTOTUNE": "1", "HOROVOD_CYCLE_TIME": "2"}).autotuned


def test_set_for_batchnorm_groups_only_when_nobody_chose(monkeypatch):
    monkeypatch.setattr(cycle_time, "_set_here", None)
    short = f"{cycle_time.BATCHNORM_GROUP_MS:g}"
    for group, env in ((1, {}), (2, {"HOROVOD_CYCLE_TIME": "5"}), (2, {"HOROVOD_AUTOTUNE": "1"})):
        before = dict(env)
        assert not cycle_time.set_for_batchnorm_groups(group, env) and env == before
    assert cycle_time.read({"HOROVOD_CYCLE_TIME": short}).source == f"HOROVOD_CYCLE_TIME={short}"
    env = {}
    assert cycle_time.set_for_batchnorm_groups(2, env) and env == {"HOROVOD_CYCLE_TIME": short}
    assert (
        cycle_time.read(env).describe()
        == f"cycle time {short} ms (HOROVOD_CYCLE_TIME={short}, set by the launcher for batch-norm groups)"
    )
    # Once the user's value differs from what was set, it is the user's.
    assert cycle_time.read({"HOROVOD_CYCLE_TIME": "0.7"}).source == "HOROVOD_CYCLE_TIME=0.7"


def test_without_its_variables_distribution_reports_horovods_default_without_parsing():
    from common.parallel import distribution

    assert cycle_time.read({}).describe() == distribution.DEFAULT_CYCLE
    # Each variable Distribution snapshots changes what read() reports.
    assert all(
        cycle_time.read({k: "2"}) != cycle_time.read({}) for k in distribution.CYCLE_VARIABLES
    )


def test_the_group_size_is_read_before_the_config_from_flags_or_file(tmp_path):
    from deepcam.task import DeepCAMTask

    requested = DeepCAMTask.requested_batchnorm_group_size
    config = tmp_path / "groups.yaml"
    config.write_text("model:\n  batchnorm_group_size: 4\n")
    assert requested(None, {}) == 1
    assert requested(None, {"model.batchnorm_group_size": "2"}) == 2  # --batchnorm_group_size 2
    assert requested(config, {}) == 4
    assert requested(config, {"model.batchnorm_group_size": "2"}) == 2  # the command line wins
    assert requested(tmp_path / "missing.yaml", {}) == 1  # load_config will say what is wrong
    assert requested(None, {"model.batchnorm_group_size": "two"}) == 1
    # A height split's batch norm spans its spatial group too: K x the group size.
    assert requested(None, {"parallel.spatial_ranks": "2"}) == 2
    assert requested(config, {"parallel.spatial_ranks": "2"}) == 8
    # Without a config file the job's size picks a closed config: each must then have groups of 1.
    for path in benchmarks.closed_configs(DeepCAMTask.name):
        assert peek(DeepCAMConfig, path, {}, "model.batchnorm_group_size") == 1, path


@pytest.mark.parametrize("when", ["before", "after"])
def test_set_before_init_it_reaches_horovod_and_the_report_says_what_horovod_read(tmp_path, when):
    # Horovod's own timeline, every cycle marked, gives the period its loop runs at. Set after
    # Distribution() (the negative control), the variable changes neither that nor the report.
    environ = {k: v for k, v in helpers.env().items() if not k.startswith("HOROVOD_")}
    proc = helpers.run(
        [helpers.PYTHON, helpers.REPO / "tests" / "cycle_time_probe.py", when, tmp_path / "t.json"],
        timeout=120,
        environ=environ,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["marks"] > 100, got
    if when == "before":
        assert (
            got["reported_ms"] == cycle_time.BATCHNORM_GROUP_MS
            and "set by the launcher" in got["reported"]
        )
        assert got["median_spacing_us"] < 900, (
            got
        )  # a 1 ms cycle never starts sooner than 1000 us after the last
    else:
        assert got["reported"] == "cycle time 1 ms (Horovod's default)"
        assert got["median_spacing_us"] >= 1000, got
