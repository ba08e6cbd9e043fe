"""Result sets (N seeded runs in the submission layout) and the characterization of a run.

The tests that launch whole runs are marked slow: `make test-all` runs them, `make test` skips them.
The sbatch scripts run here without SLURM: a fake `srun` first on PATH leaves canned logs
(tests/test_scoring.py makes them from real v3.0 logs) and exits as a converged, killed or
non-converging run would.
"""

import json
import os
import stat
import subprocess
from pathlib import Path

import matplotlib.image
import pytest

from common.run.report import check_log
from offline import characterize, scoring
from tests import helpers
from tests.conftest import EASY_ARGS
from tests.test_scoring import COSMO, extract_fixtures, killed, not_converged

FAKE_SRUN = """#!/bin/bash
# Stands in for srun: leaves $FAKE_RUNS/<run directory name>/mlperf.log* in the run's output_dir
# and exits with the status in $FAKE_RUNS/<name>/exit_code.
for arg; do
    if [[ $arg == output_dir=* ]]; then out=${arg#output_dir=}; fi
done
src=$FAKE_RUNS/$(basename "$out")
mkdir -p "$out"
cp "$src"/mlperf.log* "$out"/ 2>/dev/null
exit "$(cat "$src/exit_code")"
"""


@pytest.mark.slow
def test_result_set_runs_seeded_runs_into_the_submission_layout(cosmo_data, tiny_config, tmp_path):
    out = tmp_path / "set"
    proc = helpers.run(
        [
            helpers.PYTHON,
            "-m",
            "offline.result_set",
            "--bench",
            "cosmoflow",
            "--config",
            tiny_config,
            "--data-dir",
            cosmo_data,
            "--runs",
            "2",
            "--seed-base",
            "5",
            "--output",
            out,
            "--system",
            "testbox",
            "--",
            "--n-train",
            "256",
            "--n-valid",
            "64",
            "--n-epochs",
            "1",
        ],
        timeout=600,
    )
    # One epoch cannot reach the target: both runs exit 3, and so does the set.
    assert proc.returncode == 3, helpers.failure_output(proc)
    folder = out / "reference" / "results" / "testbox" / "strong" / "cosmoflow"
    logs = sorted(folder.glob("result_*.txt"))
    assert [p.name for p in logs] == ["result_0.txt", "result_1.txt"]
    seeds = [
        next(
            json.loads(line.split(":::MLLOG ")[1])["value"]
            for line in p.read_text().splitlines()
            if '"key": "seed"' in line
        )
        for p in logs
    ]
    assert seeds == [5, 6]
    # The set is scored and both runs are named as failing, with why.
    assert "NOT A VALID RESULT: incomplete: 2 of the 10" in proc.stdout
    assert "result_0.txt: did not reach the target" in proc.stdout
    assert "result_1.txt: did not reach the target" in proc.stdout


@pytest.mark.slow
def test_characterization_of_a_tiny_run_writes_json_table_and_pngs(
    cosmo_data, tiny_config, tmp_path
):
    run = tmp_path / "run"
    proc = helpers.run(
        helpers.train_cmd(
            "cosmoflow",
            tiny_config,
            "--data-dir",
            cosmo_data,
            "--output-dir",
            run,
            "--n-train",
            "512",
            "--n-valid",
            "64",
            "--n-epochs",
            "2",
            "--stage-dir",
            tmp_path / "stage",
            "--set",
            "runtime.characterize=true",
        )
    )
    assert proc.returncode in (0, 3), helpers.failure_output(proc)
    machine = characterize.measure_machine(matmul_size=512, copy_bytes=1 << 24)
    (tmp_path / "machine.json").write_text(json.dumps(machine))
    proc = helpers.run(
        [helpers.PYTHON, "-m", "offline.characterize", run, "--machine", tmp_path / "machine.json"]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    c = json.loads((run / "characterization.json").read_text())
    expected = {
        "staging_bytes",
        "staging_seconds",
        "staging_gb_per_s",
        "input_samples_per_s",
        "bytes_read_per_sample",
        "flops_per_sample_train",
        "achieved_flop_per_s",
        "peak_host_memory_bytes",
        "gradient_bytes_per_step",
        "allreduce_share",
        "arithmetic_intensity",
        "roofline_bound_flop_per_s",
    }
    assert expected <= set(c)
    assert (
        c["staging_bytes"] > 0
        and c["input_samples_per_s"] > 0
        and c["bytes_read_per_sample"] > 1000
    )
    # Forward FLOPs of the tiny net on 32^3 x 4 (profiler) are ~0.1 GFLOP; training is 3x.
    assert 2e8 < c["flops_per_sample_train"] < 5e8
    assert (
        c["gradient_bytes_per_step"] == 4 * c["parameters"] and c["allreduce_share"] == 0.0
    )  # one rank
    assert c["peak_host_memory_bytes"] > 100e6 and 0 < c["fraction_of_roofline"] <= 1.5
    assert "flops_per_sample_train" in (run / "characterization.txt").read_text()
    for png in ("curves.png", "roofline.png"):
        image = matplotlib.image.imread(run / png)
        assert image.shape[0] > 200 and image.shape[1] > 300


def test_characterize_explains_a_run_without_figures(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"benchmark": "cosmoflow", "history": []}))
    with pytest.raises(ValueError, match="runtime.characterize=true"):
        characterize.characterize(
            tmp_path, machine={"peak_flop_per_s": {"fp32": 1.0}, "memory_bytes_per_s": 1.0}
        )
    assert characterize.main([str(tmp_path / "nothing")]) == 2


@pytest.mark.slow
def test_weak_scaling_launcher_trains_instances_concurrently(
    cosmo_easy_data, tiny_config, tmp_path
):
    # The easy set (conftest.EASY): the launcher is the subject, not learning.
    out = tmp_path / "weak"
    proc = helpers.run(
        [
            helpers.PYTHON,
            "-m",
            "offline.weak_scaling",
            "--bench",
            "cosmoflow",
            "--config",
            tiny_config,
            "--data-dir",
            cosmo_easy_data,
            "--instances",
            "2",
            "--ranks",
            "1",
            "--output",
            out,
            "--system",
            "testbox",
            "--",
            *EASY_ARGS,
        ],
        timeout=900,
    )
    assert proc.returncode == 0, helpers.failure_output(proc)
    folder = out / "reference" / "results" / "testbox" / "weak" / "cosmoflow"
    logs = sorted(folder.glob("result_*.txt"))
    assert [p.name for p in logs] == ["result_0.txt", "result_1.txt"]
    starts = []
    for i, log in enumerate(logs):
        passed, output = check_log(log)
        assert passed, output
        text = log.read_text()
        assert (
            f'"key": "instance_id", "value": {i}' in text
            and '"key": "number_of_instances", "value": 2' in text
        )
        starts.append(
            next(
                json.loads(line.split(":::MLLOG ")[1])
                for line in text.splitlines()
                if '"key": "run_start"' in line
            )["time_ms"]
        )
    # Together: no instance logged run_start before the last one was ready (its marker's time), so
    # the second started training before the first finished, however slowly either started up.
    start_dir = out / "instances" / "start"
    ready = [float((start_dir / f"instance_{i}.ready").read_text()) * 1000 for i in (0, 1)]
    assert min(starts) >= max(ready) - 1, (starts, ready)  # time_ms is rounded to the millisecond
    first_stop = json.loads(
        [line for line in logs[0].read_text().splitlines() if '"key": "run_stop"' in line][0].split(
            ":::MLLOG "
        )[1]
    )["time_ms"]
    assert max(starts) < first_stop
    assert sorted(p.name for p in start_dir.iterdir()) == [
        "instance_0.gone",
        "instance_0.ready",
        "instance_1.gone",
        "instance_1.ready",
    ]
    for i in (0, 1):
        assert (
            "[weak-scaling] this instance waited"
            in (out / "instances" / f"instance_{i}" / "stdout.txt").read_text()
        )
    assert (
        "informational, not a valid score: 2 model(s)" in proc.stdout
        and "models/min" in proc.stdout
    )


@pytest.fixture(scope="module")
def cosmo_logs(tmp_path_factory):
    results = extract_fixtures(tmp_path_factory.mktemp("fixtures"))
    return [(results / COSMO / f"result_{i}.txt").read_text() for i in (1, 2, 3)]


def fake_cluster(tmp_path, runs: dict) -> dict:
    """A PATH whose srun is FAKE_SRUN, the canned runs it plays, and what the sbatch scripts need."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "srun").chmod(stat.S_IRWXU)
    for name, (files, code) in runs.items():
        (tmp_path / "fake" / name).mkdir(parents=True)
        (tmp_path / "fake" / name / "exit_code").write_text(str(code))
        for file, text in files.items():
            (tmp_path / "fake" / name / file).write_text(text)
    # The sbatch scripts name the submission folder after the config's mlperf.org.
    (tmp_path / "config.yaml").write_text("mlperf: {org: reference}\n")
    environ = {k: v for k, v in helpers.env().items() if not k.startswith("SLURM_")}
    return environ | {
        "PATH": f"{bin_dir}{os.pathsep}{environ['PATH']}",
        "FAKE_RUNS": str(tmp_path / "fake"),
        "REPO": str(helpers.REPO),
        "VENV": str(Path(helpers.PYTHON).parent.parent),
        "DATA_DIR": str(tmp_path),
        "CONFIG": str(tmp_path / "config.yaml"),
        "SYSTEM": "testbox",
        "BENCH": "cosmoflow",
        "OUTPUT_DIR": str(tmp_path / "out"),
    }


def sbatch(script: str, environ: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(helpers.REPO / "slurm" / script)],
        env=environ,
        cwd=helpers.REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_result_set_sbatch_collects_failed_and_non_converging_runs(cosmo_logs, tmp_path):
    ok, old, other = cosmo_logs
    environ = fake_cluster(
        tmp_path,
        {
            "run_0": ({"mlperf.log": ok}, 0),
            "run_1": ({"mlperf.log.partial": killed(other)}, 137),
            "run_2": ({"mlperf.log": not_converged(other)}, 3),
        },
    )
    # run_1's directory is reused: an earlier run's complete log is there.
    (tmp_path / "out" / "runs" / "run_1").mkdir(parents=True)
    (tmp_path / "out" / "runs" / "run_1" / "mlperf.log").write_text(old)
    codes = []
    for task in (0, 1, 2):
        proc = sbatch("result_set.sbatch", environ | {"SLURM_ARRAY_TASK_ID": str(task)})
        codes.append(proc.returncode)
        assert "[run-logs] run" in proc.stdout, proc.stdout + proc.stderr
    assert codes == [0, 137, 3]  # each array task exits as its run did
    folder = tmp_path / "out" / "reference" / "results" / "testbox" / "strong" / "cosmoflow"
    assert sorted(p.name for p in folder.iterdir()) == [
        "result_0.txt",
        "result_1.txt",
        "result_1.txt.failed",
        "result_2.txt",
    ]
    assert (folder / "result_1.txt").read_text() == killed(other)  # never the earlier run's log
    (previous,) = (tmp_path / "out" / "runs.previous").iterdir()
    assert previous.name.startswith("run_1.") and (previous / "mlperf.log").read_text() == old
    (s,) = scoring.score_path(tmp_path / "out")
    problems = {r.name: r.problem for r in s.failed}
    assert set(problems) == {"result_1.txt", "result_2.txt"} and len(s.runs) == 3
    assert problems["result_1.txt"].startswith(
        "exit code 137; no run_stop: killed or still running"
    )
    assert problems["result_2.txt"].startswith("did not reach the target")
    assert not s.valid


def test_weak_scaling_sbatch_waits_for_every_instance_and_fails_the_job(cosmo_logs, tmp_path):
    ok, _, other = cosmo_logs
    environ = fake_cluster(
        tmp_path,
        {
            "instance_0": ({"mlperf.log": ok}, 0),
            "instance_1": ({"mlperf.log.partial": killed(other)}, 137),
            "instance_2": ({"mlperf.log": not_converged(other)}, 3),
        },
    )
    environ |= {"INSTANCES": "3", "NODES_PER_INSTANCE": "1", "SLURM_NTASKS_PER_NODE": "1"}
    proc = sbatch("weak_scaling.sbatch", environ)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # one instance was killed
    folder = tmp_path / "out" / "reference" / "results" / "testbox" / "weak" / "cosmoflow"
    assert sorted(p.name for p in folder.glob("result_*")) == [
        "result_0.txt",
        "result_1.txt",
        "result_1.txt.failed",
        "result_2.txt",
    ]
    assert "result_1.txt: exit code 137; no run_stop" in proc.stdout
    assert "result_2.txt: did not reach the target" in proc.stdout
    assert "NOT A VALID RESULT: incomplete: 3 of the 10 runs" in proc.stdout
    # Each instance marked gone where the instances meet before run_start (none was ready: fake runs).
    start_dir = tmp_path / "out" / "instances" / "start"
    assert sorted(p.name for p in start_dir.iterdir()) == [f"instance_{i}.gone" for i in range(3)]
    # Run again into the same OUTPUT_DIR: the earlier set's results would be scored with the new one.
    again = sbatch("weak_scaling.sbatch", environ)
    assert again.returncode == 2 and "holds an earlier set's results" in again.stderr


FAKE_TRAIN = """import shutil, sys
from pathlib import Path
# Stands in for train.py: leaves the canned logs of this run directory's name, exits as that run did.
run_dir, fake = Path(sys.argv[1]), Path(sys.argv[2]) / Path(sys.argv[1]).name
run_dir.mkdir(parents=True, exist_ok=True)
for log in fake.glob("mlperf.log*"):
    shutil.copy(log, run_dir / log.name)
sys.exit(int((fake / "exit_code").read_text()))
"""


@pytest.mark.parametrize("launcher", ["result_set", "weak_scaling"])
def test_python_launchers_collect_every_run_and_fail_the_set(
    cosmo_logs, tmp_path, monkeypatch, capsys, launcher
):
    from offline import result_set, weak_scaling

    ok, old, other = cosmo_logs
    kind = "runs" if launcher == "result_set" else "instances"
    name = "run" if launcher == "result_set" else "instance"
    fake_cluster(
        tmp_path,
        {
            f"{name}_0": ({"mlperf.log": ok}, 0),
            f"{name}_1": ({"mlperf.log.partial": killed(other)}, 137),
            f"{name}_2": ({"mlperf.log": not_converged(other)}, 3),
        },
    )
    (tmp_path / "out" / kind / f"{name}_1").mkdir(parents=True)
    (tmp_path / "out" / kind / f"{name}_1" / "mlperf.log").write_text(old)  # an earlier run's
    (tmp_path / "fake_train.py").write_text(FAKE_TRAIN)
    module = result_set if launcher == "result_set" else weak_scaling
    monkeypatch.setattr(
        module,
        "run_command",
        lambda bench, config, run_dir, *a: [
            helpers.PYTHON,
            str(tmp_path / "fake_train.py"),
            str(run_dir),
            str(tmp_path / "fake"),
        ],
    )
    count = ["--runs", "3"] if launcher == "result_set" else ["--instances", "3"]
    argv = [
        "--bench",
        "cosmoflow",
        "--config",
        str(tmp_path / "config.yaml"),
        *count,
        "--output",
        str(tmp_path / "out"),
        "--system",
        "testbox",
    ]
    assert module.main(argv) == 1  # a run was killed
    out = capsys.readouterr().out
    scaling = "strong" if launcher == "result_set" else "weak"
    folder = tmp_path / "out" / "reference" / "results" / "testbox" / scaling / "cosmoflow"
    assert sorted(p.name for p in folder.iterdir()) == [
        "result_0.txt",
        "result_1.txt",
        "result_1.txt.failed",
        "result_2.txt",
    ]
    assert (folder / "result_1.txt").read_text() == killed(other)
    assert len(list((tmp_path / "out" / f"{kind}.previous").iterdir())) == 1
    assert (
        "result_1.txt: exit code 137; no run_stop" in out
        and "result_2.txt: did not reach the target" in out
    )
    if (
        launcher == "weak_scaling"
    ):  # each instance marked gone where the instances meet before run_start
        start_dir = tmp_path / "out" / "instances" / "start"
        assert sorted(p.name for p in start_dir.iterdir()) == [
            f"instance_{i}.gone" for i in range(3)
        ]
    # A second set into the same output would be scored together with this one: refused.
    assert module.main(argv) == 2
    assert "holds an earlier set's results" in capsys.readouterr().err
