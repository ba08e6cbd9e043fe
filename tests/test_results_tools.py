"""Result sets (N seeded runs in the submission layout) and the characterization of a run.

The tests that launch whole runs are marked slow: `make test-all` runs them, `make test` skips them.
"""

import json

import matplotlib.image
import pytest

from common import characterize
from common.compliance import check_log
from tests import helpers


@pytest.mark.slow
def test_result_set_runs_seeded_runs_into_the_submission_layout(cosmo_data, tiny_config, tmp_path):
    out = tmp_path / "set"
    proc = helpers.run([helpers.PYTHON, "-m", "common.result_set", "--bench", "cosmoflow", "--config", tiny_config,
                        "--data-dir", cosmo_data, "--runs", "2", "--seed-base", "5", "--output", out,
                        "--system", "testbox", "--", "--n-train", "256", "--n-valid", "64", "--n-epochs", "1"],
                       timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    folder = out / "reference" / "results" / "testbox" / "strong" / "cosmoflow"
    logs = sorted(folder.glob("result_*.txt"))
    assert [p.name for p in logs] == ["result_0.txt", "result_1.txt"]
    seeds = [next(json.loads(line.split(":::MLLOG ")[1])["value"] for line in p.read_text().splitlines()
                  if '"key": "seed"' in line) for p in logs]
    assert seeds == [5, 6]
    # One epoch cannot reach the target: the set is scored and both runs are named as failing.
    assert "INCOMPLETE: 2 of the 10" in proc.stdout
    assert "result_0.txt" in proc.stdout and "do not count" in proc.stdout


@pytest.mark.slow
def test_characterization_of_a_tiny_run_writes_json_table_and_pngs(cosmo_data, tiny_config, tmp_path):
    run = tmp_path / "run"
    proc = helpers.run(helpers.train_cmd("cosmoflow", tiny_config, "--data-dir", cosmo_data, "--output-dir", run,
                                         "--n-train", "512", "--n-valid", "64", "--n-epochs", "2",
                                         "--stage-dir", tmp_path / "stage", "--set", "runtime.characterize=true"))
    assert proc.returncode in (0, 3), proc.stdout[-3000:] + proc.stderr[-3000:]
    machine = characterize.measure_machine(matmul_size=512, copy_bytes=1 << 24)
    (tmp_path / "machine.json").write_text(json.dumps(machine))
    proc = helpers.run([helpers.PYTHON, "-m", "common.characterize", run, "--machine", tmp_path / "machine.json"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    c = json.loads((run / "characterization.json").read_text())
    expected = {"staging_bytes", "staging_seconds", "staging_gb_per_s", "input_samples_per_s",
                "bytes_read_per_sample", "flops_per_sample_train", "achieved_flop_per_s", "peak_host_memory_bytes",
                "gradient_bytes_per_step", "allreduce_share", "arithmetic_intensity", "roofline_bound_flop_per_s"}
    assert expected <= set(c)
    assert c["staging_bytes"] > 0 and c["input_samples_per_s"] > 0 and c["bytes_read_per_sample"] > 1000
    # Forward FLOPs of the tiny net on 32^3 x 4 (profiler) are ~0.1 GFLOP; training is 3x.
    assert 2e8 < c["flops_per_sample_train"] < 5e8
    assert c["gradient_bytes_per_step"] == 4 * c["parameters"] and c["allreduce_share"] == 0.0   # one rank
    assert c["peak_host_memory_bytes"] > 100e6 and 0 < c["fraction_of_roofline"] <= 1.5
    assert "flops_per_sample_train" in (run / "characterization.txt").read_text()
    for png in ("curves.png", "roofline.png"):
        image = matplotlib.image.imread(run / png)
        assert image.shape[0] > 200 and image.shape[1] > 300


def test_characterize_explains_a_run_without_figures(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"benchmark": "cosmoflow", "history": []}))
    with pytest.raises(ValueError, match="runtime.characterize=true"):
        characterize.characterize(tmp_path, machine={"peak_flop_per_s": {"fp32": 1.0}, "memory_bytes_per_s": 1.0})
    assert characterize.main([str(tmp_path / "nothing")]) == 2


@pytest.mark.slow
def test_weak_scaling_launcher_trains_instances_concurrently(cosmo_data, tiny_config, tmp_path):
    out = tmp_path / "weak"
    proc = helpers.run([helpers.PYTHON, "-m", "common.weak_scaling", "--bench", "cosmoflow", "--config", tiny_config,
                        "--data-dir", cosmo_data, "--instances", "2", "--ranks", "1", "--output", out,
                        "--system", "testbox", "--", "--n-train", "1024", "--n-valid", "128"], timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    folder = out / "reference" / "results" / "testbox" / "weak" / "cosmoflow"
    logs = sorted(folder.glob("result_*.txt"))
    assert [p.name for p in logs] == ["result_0.txt", "result_1.txt"]
    starts = []
    for i, log in enumerate(logs):
        passed, output = check_log(log)
        assert passed, output
        text = log.read_text()
        assert f'"key": "instance_id", "value": {i}' in text and '"key": "number_of_instances", "value": 2' in text
        starts.append(next(json.loads(line.split(":::MLLOG ")[1]) for line in text.splitlines()
                           if '"key": "run_start"' in line)["time_ms"])
    # Concurrent: the second instance started training before the first one finished.
    first_stop = json.loads([line for line in logs[0].read_text().splitlines()
                             if '"key": "run_stop"' in line][0].split(":::MLLOG ")[1])["time_ms"]
    assert max(starts) < first_stop
    assert "informational, not a valid score: 2 model(s)" in proc.stdout and "models/min" in proc.stdout
