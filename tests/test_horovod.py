"""Real two-rank Horovod runs on this machine: horovodrun over Gloo, and mpirun over MPI."""

import json
import time

import pytest

from tests import helpers
from tests.test_cosmoflow_end_to_end import copy_subset, shard_of, truncate


@pytest.fixture(params=["gloo", "mpi"])
def launcher(request):
    if request.param == "mpi" and not helpers.horovod_has_mpi():
        pytest.skip(
            "Horovod was built without MPI (install libopenmpi-dev, then `make install` rebuilds it)"
        )
    return request.param


# The same run under mpirun (summary.json's controller "mpi") is the slow tier's repetition: Gloo shows
# the shards, the weights and the log.
@pytest.mark.parametrize(
    "launcher", ["gloo", pytest.param("mpi", marks=pytest.mark.slow)], indirect=True
)
def test_two_ranks_disjoint_shards_identical_weights_one_log(
    cosmo_data, tiny_config, tmp_path, launcher
):
    out = tmp_path / "run"
    proc = helpers.LAUNCHERS[launcher](
        2,
        helpers.train_cmd(
            "cosmoflow",
            tiny_config,
            "--data-dir",
            cosmo_data,
            "--output-dir",
            out,
            "--n-train",
            "32",
            "--n-valid",
            "16",
            "--n-epochs",
            "2",
            "--set",
            "runtime.record_shards=true",
            "--set",
            "train.stop_at_target=false",
            "--stage-dir",
            tmp_path / "stage",
        ),
    )
    assert (out / "summary.json").exists(), helpers.failure_output(proc)
    assert "2 rank(s) on 1 node(s)" in proc.stdout
    # Data parallel: plain hvd.init() (a run with groups says its static sets: test_init_order).
    assert "process sets" not in proc.stdout

    shards = [json.loads((out / "shards" / f"rank-{r:05d}.json").read_text()) for r in (0, 1)]
    for split, total in (("train", 32), ("valid", 16)):
        a, b = set(shards[0][split]), set(shards[1][split])
        assert len(a) == len(b) == total // 2 and not a & b
        # Each rank read its files from the node-local stage directory.
        assert all(f.startswith(str(tmp_path / "stage")) for f in a | b)
    assert len(list((tmp_path / "stage" / "train").iterdir())) == 32

    summary = json.loads((out / "summary.json").read_text())
    assert summary["ranks"] == 2 and summary["epochs"] == 2 and summary["controller"] == launcher
    assert summary["weights_in_sync"] is True
    assert summary["staging"]["files"] == 32 + 16 and summary["staging"]["bytes"] > 0

    logs = sorted(p.name for p in out.iterdir() if p.name.startswith("mlperf"))
    assert logs == ["mlperf.log"]
    log = (out / "mlperf.log").read_text()
    assert log.count('"key": "run_start"') == 1
    assert log.index('"key": "staging_stop"') < log.index('"key": "run_start"')
    assert '"key": "global_batch_size", "value": 16' in log


# The smallest run that reads its shard (--tiny: a 2-filter model, batch 1, one epoch). MPI ending
# both ranks as Gloo does is the slow tier's repetition (test_dead_rank.py: a rank killed).
@pytest.mark.parametrize(
    "launcher", ["gloo", pytest.param("mpi", marks=pytest.mark.slow)], indirect=True
)
def test_bad_file_on_one_rank_ends_both_ranks(cosmo_data, tiny_config, tmp_path, launcher):
    data = tmp_path / "data"
    copy_subset(cosmo_data, data, 16, 8)
    victim = shard_of(data, rank=1, size=2, n_train=16)[3]
    truncate(data / "train" / victim.split("/")[-1])
    start = time.time()
    proc = helpers.LAUNCHERS[launcher](
        2,
        helpers.train_cmd(
            "cosmoflow",
            tiny_config,
            "--data-dir",
            data,
            "--output-dir",
            tmp_path / "run",
            "--tiny",
            "--n-train",
            "16",
        ),
        timeout=240,
    )
    assert proc.returncode != 0
    assert time.time() - start < 200
    output = proc.stdout + proc.stderr
    errors = [line for line in output.splitlines() if "error: [rank 1]" in line]
    assert len(errors) == 1 and victim in errors[0], output[-3000:]


def run_probe(launcher, ranks, out_dir):
    proc = helpers.LAUNCHERS[launcher](
        ranks,
        [helpers.PYTHON, helpers.REPO / "tests" / "dist_probe.py", out_dir],
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(p.read_text()) for p in sorted(out_dir.glob("rank-*.json"))]


# MPI registers the static sets as Gloo does: its repetition is the slow tier's.
@pytest.mark.parametrize(
    "launcher", ["gloo", pytest.param("mpi", marks=pytest.mark.slow)], indirect=True
)
def test_rank_groups_and_group_batch_norm_over_static_process_sets(launcher, tmp_path):
    results = run_probe(launcher, 4, tmp_path)
    assert [r["rank"] for r in results] == [0, 1, 2, 3]
    for r in results:
        # Registered by hvd.init from the launcher's size, no dynamic sets: add_process_set refused.
        pair = r["rank"] // 2
        assert r["group_set"] == [1 + pair, [2 * pair, 2 * pair + 1], 2]
        assert r["process_set_refusal"] == "not dynamic"
        assert "static process sets of 2 ranks" in r["init"]
        assert r["group_sum"] == [4.0 * pair + 1.0]  # {0, 1} -> 1, {2, 3} -> 5
        assert r["group_bn"] == pytest.approx(-1.0 if r["rank"] % 2 == 0 else 1.0, abs=1e-3)
        # Plain collectives still span all 4.
        assert r["size"] == 4 and r["nodes"] == 1 and r["local_rank"] == r["rank"]
        assert r["mean"] == [1.5, 10.0]
        assert r["max"] == [3.0]
        assert r["gathered"] == [[0.0], [2.0], [4.0], [6.0]]
        assert r["object"] == {"from": 0}
        assert r["broadcast"] == [1.0, 1.0, 1.0]  # rank 0's initial value everywhere
        assert r["grad"] == [1.5, 1.5]  # average of 0, 1, 2 and 3
        assert r["refused"] is None
        # The negative control, on the same 4 ranks: a Distribution that declares no group size
        # (a data-parallel job) refuses a group of 2, though Horovod holds their sets; its group is
        # the job, Horovod's global set, and it names no process sets.
        u = r["undeclared"]
        assert "initialised without the process sets of groups of 2 ranks" in u["refused"]
        assert u["group_set"] == [0, [0, 1, 2, 3], 4] and "process sets" not in u["init"]
        assert u["group_sum"] == [6.0]


@pytest.mark.parametrize(
    "environ, size, told_by",
    [
        ({}, 1, "no launcher variable"),
        (
            {"HOROVOD_SIZE": "4", "SLURM_STEP_NUM_TASKS": "1"},
            4,
            "HOROVOD_SIZE",
        ),  # horovodrun in srun
        ({"OMPI_COMM_WORLD_SIZE": "8", "SLURM_NTASKS": "16"}, 8, "OMPI_COMM_WORLD_SIZE"),
        ({"PMI_SIZE": "3"}, 3, "PMI_SIZE"),
        # srun's step, not the allocation's SLURM_NTASKS (a lone process in an sbatch script).
        ({"SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "8"}, 2, "SLURM_STEP_NUM_TASKS"),
        ({"SLURM_NTASKS": "8"}, 1, "no launcher variable"),
    ],
)
def test_launched_size_reads_the_launchers_variable(environ, size, told_by):
    from common.parallel.distribution import launched_size

    got, source = launched_size(environ)
    assert got == size and source.startswith(told_by)


def test_launched_size_refuses_what_is_no_count():
    from common.errors import ConfigError
    from common.parallel.distribution import launched_size

    with pytest.raises(ConfigError, match="OMPI_COMM_WORLD_SIZE='x'"):
        launched_size({"OMPI_COMM_WORLD_SIZE": "x"})
