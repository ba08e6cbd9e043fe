"""Scoring by the MLPerf HPC rules on real v3.0 result logs (tests/fixtures, public MLCommons data)."""

import json
import re
import shutil
import tarfile

import pytest

from common import scoring
from tests import helpers

FIXTURES = helpers.REPO / "tests" / "fixtures" / "hpc_results_v3.0.tar.gz"
COSMO = "HPE+LBNL/results/perlmutter_128x4/strong/cosmoflow"
DEEPCAM_WEAK = "HPE+LBNL/results/perlmutter_10x128x4_ngc21.09_pytorch/weak/deepcam"


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("fixtures")
    with tarfile.open(FIXTURES) as tar:
        tar.extractall(root)
    return root / "hpc_results_v3.0"


def by_key(sets):
    return {(s.org, s.system, s.scaling, s.benchmark): s for s in sets}


def test_scores_equal_the_official_summarizer_on_v3_results(results):
    sets = by_key(scoring.score_path(results))
    # Figures of mlperf_logging's result summarizer (see tests/fixtures README.md).
    cosmo = sets[("HPE+LBNL", "perlmutter_128x4", "strong", "cosmoflow")]
    assert cosmo.score_minutes == pytest.approx(4.728052, abs=1e-6)
    assert len(cosmo.runs) == 10 and cosmo.passing == 10 and cosmo.complete and not cosmo.notes
    assert cosmo.rcp.startswith("pass")
    assert all(r.epochs is not None and 20 <= r.epochs <= 25 for r in cosmo.runs)
    dell = sets[("Dell", "32xXE8545x4A100-SXM4-40GB", "strong", "deepcam")]
    assert dell.score_minutes == pytest.approx(12.99535, abs=1e-6)
    weak = sets[("HPE+LBNL", "perlmutter_10x128x4_ngc21.09_pytorch", "weak", "deepcam")]
    assert weak.number_of_models == 10 and weak.instance_scale == 512
    assert weak.time_to_train_all == pytest.approx(4.846933, abs=1e-6)
    assert weak.models_per_minute == pytest.approx(10 / 4.846933333333333)


def test_incomplete_set_is_reported(results, tmp_path):
    folder = tmp_path / "org" / "results" / "sys" / "strong" / "cosmoflow"
    folder.mkdir(parents=True)
    for i in (1, 2, 3):
        shutil.copy(results / COSMO / f"result_{i}.txt", folder)
    (s,) = scoring.score_path(tmp_path)
    assert not s.complete and any("INCOMPLETE: 3 of the 10" in n for n in s.notes)
    # The olympic mean of 3 runs is the middle one.
    assert s.score_minutes == pytest.approx(sorted(r.minutes for r in s.runs)[1])


def test_failing_run_is_named_and_dropped_as_the_slowest(results, tmp_path):
    folder = tmp_path / "org" / "results" / "sys" / "strong" / "cosmoflow"
    shutil.copytree(results / COSMO, folder)
    bad = folder / "result_4.txt"
    # A run that never reached the target: every evaluation above MAE 0.124, stopped as aborted.
    text = re.sub(r'("key": "eval_error", "value": )[0-9.e-]+', r"\g<1>0.5", bad.read_text())
    bad.write_text(text.replace('"status": "success"', '"status": "aborted"'))
    (s,) = scoring.score_path(tmp_path)
    (failed,) = [r for r in s.runs if r.problem]
    assert failed.file.endswith("result_4.txt") and failed.status == "aborted" and not failed.passed_checker
    assert any("result_4.txt" in n for n in s.notes)
    good = sorted(r.minutes for r in s.runs if not r.problem)
    assert s.score_minutes == pytest.approx(sum(good[1:]) / len(good[1:]))   # only the fastest dropped
    text = scoring.format_set(s)
    assert "FAIL" in text and "do not count" in text


def test_directory_of_run_directories_and_json_cli(results, tmp_path, capsys):
    for i in (1, 2, 3, 4, 5):
        run = tmp_path / f"run{i}"
        run.mkdir()
        shutil.copy(results / DEEPCAM_WEAK / f"result_{i}.txt",
                    run / "mlperf.log")
    assert scoring.main([str(tmp_path), "--json"]) == 0
    (s,) = json.loads(capsys.readouterr().out)
    assert s["benchmark"] == "deepcam" and s["scaling"] == "strong" and len(s["runs"]) == 5
    assert s["complete"] and s["score_minutes"] > 0
    assert scoring.main([str(tmp_path / "missing")]) == 2
