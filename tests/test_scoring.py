"""Scoring by the MLPerf HPC rules on real v3.0 result logs (tests/fixtures, public MLCommons data).

Failed runs are made from those logs: `not_converged` (every evaluation above the target, run_stop
status 'aborted', as train.py writes a run that exits 3) and `killed` (cut mid-line before
run_stop, as mlperf.log.partial is when the launcher kills a run).
"""

import json
import os
import re
import shutil
import tarfile

import pytest
from mlperf_logging.compliance_checker import mlp_compliance

from offline import run_logs, scoring
from tests import helpers

FIXTURES = helpers.REPO / "tests" / "fixtures" / "hpc_results_v3.0.tar.gz"
COSMO = "HPE+LBNL/results/perlmutter_128x4/strong/cosmoflow"
DEEPCAM_WEAK = "HPE+LBNL/results/perlmutter_10x128x4_ngc21.09_pytorch/weak/deepcam"


def extract_fixtures(root):
    with tarfile.open(FIXTURES) as tar:
        tar.extractall(root)
    return root / "hpc_results_v3.0"


def not_converged(log_text: str) -> str:
    """The log of a run that never reached the target: every evaluation at 0.5, stopped as aborted."""
    text = re.sub(r'("key": "eval_(error|accuracy)", "value": )[0-9.e-]+', r"\g<1>0.5", log_text)
    return text.replace('"status": "success"', '"status": "aborted"')


def killed(log_text: str) -> str:
    """The log of a run killed during training: no run_stop, the last line cut halfway."""
    lines = log_text.splitlines(keepends=True)
    stop = next(i for i, line in enumerate(lines) if '"key": "run_stop"' in line)
    kept = lines[: stop - 2]
    return "".join(kept) + lines[stop - 2][:40]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return extract_fixtures(tmp_path_factory.mktemp("fixtures"))


def by_key(sets):
    return {(s.org, s.system, s.scaling, s.benchmark): s for s in sets}


def cosmo_set(results, tmp_path):
    folder = tmp_path / "org" / "results" / "sys" / "strong" / "cosmoflow"
    shutil.copytree(results / COSMO, folder)
    return folder


def test_scores_equal_the_official_summarizer_on_v3_results(results):
    sets = by_key(scoring.score_path(results))
    # Figures of mlperf_logging's result summarizer (see tests/fixtures README.md).
    cosmo = sets[("HPE+LBNL", "perlmutter_128x4", "strong", "cosmoflow")]
    assert cosmo.score_minutes == pytest.approx(4.728052, abs=1e-6)
    assert len(cosmo.runs) == 10 and cosmo.passing == 10 and cosmo.complete and not cosmo.notes
    assert cosmo.valid and cosmo.averaged_runs == 8
    assert cosmo.rcp.startswith("pass")
    assert all(r.epochs is not None and 20 <= r.epochs <= 25 for r in cosmo.runs)
    text = scoring.format_set(cosmo)
    assert "olympic mean over 8 of 10 runs" in text and "a valid result" in text
    dell = sets[("Dell", "32xXE8545x4A100-SXM4-40GB", "strong", "deepcam")]
    assert dell.score_minutes == pytest.approx(12.99535, abs=1e-6)
    weak = sets[("HPE+LBNL", "perlmutter_10x128x4_ngc21.09_pytorch", "weak", "deepcam")]
    assert weak.number_of_models == 10 and weak.instance_scale == 512
    assert weak.time_to_train_all == pytest.approx(4.846933, abs=1e-6)
    assert weak.models_per_minute == pytest.approx(10 / 4.846933333333333)


def test_incomplete_set_is_not_a_valid_result(results, tmp_path):
    folder = tmp_path / "org" / "results" / "sys" / "strong" / "cosmoflow"
    folder.mkdir(parents=True)
    for i in (1, 2, 3):
        shutil.copy(results / COSMO / f"result_{i}.txt", folder)
    (s,) = scoring.score_path(tmp_path)
    assert not s.complete and not s.valid
    assert any(n.startswith("NOT A VALID RESULT: incomplete: 3 of the 10") for n in s.notes)
    # The olympic mean of 3 runs is the middle one.
    assert s.score_minutes == pytest.approx(sorted(r.minutes for r in s.runs)[1])
    assert "olympic mean over 1 of 3 runs" in scoring.format_set(s)


def test_run_that_did_not_converge_is_counted_and_dropped_as_the_slowest(results, tmp_path):
    folder = cosmo_set(results, tmp_path)
    bad = folder / "result_4.txt"
    bad.write_text(not_converged(bad.read_text()))
    (s,) = scoring.score_path(tmp_path)
    assert len(s.runs) == 10
    (failed,) = s.failed
    assert failed.name == "result_4.txt" and failed.status == "aborted" and failed.checker == "FAIL"
    assert failed.problem.startswith(
        "did not reach the target (run_stop status 'aborted'; checker: "
    )
    good = sorted(r.minutes for r in s.runs if not r.problem)
    assert s.score_minutes == pytest.approx(
        sum(good[1:]) / len(good[1:])
    )  # only the fastest dropped
    assert s.averaged_runs == 8 and s.valid  # one failed run is within the rules
    text = scoring.format_set(s)
    assert "1 failed" in text and "result_4.txt: did not reach the target" in text


def test_two_failed_runs_are_not_a_valid_result(results, tmp_path):
    folder = cosmo_set(results, tmp_path)
    for i in (4, 7):
        bad = folder / f"result_{i}.txt"
        bad.write_text(not_converged(bad.read_text()))
    (s,) = scoring.score_path(tmp_path)
    assert [r.name for r in s.failed] == ["result_4.txt", "result_7.txt"]
    assert s.score_minutes is None and not s.valid
    assert (
        "NOT A VALID RESULT: 2 failed runs: the olympic mean may drop only one"
        in scoring.format_set(s)
    )


def deepcam_run_dirs(results, root, n=5):
    for i in range(n):
        run = root / f"run_{i}"
        run.mkdir(parents=True)
        shutil.copy(results / DEEPCAM_WEAK / f"result_{i + 1}.txt", run / "mlperf.log")
    return [root / f"run_{i}" for i in range(n)]


def test_killed_run_counts_as_failed_not_as_its_older_log(results, tmp_path):
    runs = deepcam_run_dirs(results, tmp_path)
    # run_2 was resumed once (its first log kept as mlperf.log.1), then killed: only .partial.
    log = runs[2] / "mlperf.log"
    log.rename(runs[2] / "mlperf.log.1")
    (runs[2] / "mlperf.log.partial").write_text(killed(log.with_name("mlperf.log.1").read_text()))
    (s,) = scoring.score_path(tmp_path)
    assert [r.name for r in s.runs] == [f"run_{i}" for i in range(5)]
    (failed,) = s.failed
    assert failed.name == "run_2" and failed.file.endswith("mlperf.log.partial")
    assert "only mlperf.log.partial" in failed.problem
    good = sorted(r.minutes for r in s.runs if not r.problem)
    assert len(good) == 4 and s.score_minutes == pytest.approx(sum(good[1:]) / 3)
    assert "olympic mean over 3 of 5 runs" in scoring.format_set(s)
    assert "run_2: no run_stop: killed or still running" in scoring.format_set(s)


def test_stale_log_beside_a_partial_one_and_a_log_without_run_stop_fail(results, tmp_path):
    runs = deepcam_run_dirs(results, tmp_path)
    # run_1: a directory reused by a run that was then killed; its mlperf.log is the earlier run's.
    (runs[1] / "mlperf.log.partial").write_text(killed((runs[1] / "mlperf.log").read_text()))
    # run_3: a run that failed before training; its log was closed without run_stop.
    log = runs[3] / "mlperf.log"
    log.write_text(
        "".join(
            line for line in log.read_text().splitlines(keepends=True) if "run_stop" not in line
        )
    )
    (s,) = scoring.score_path(tmp_path)
    problems = {r.name: r.problem for r in s.failed}
    assert set(problems) == {"run_1", "run_3"}
    assert "the mlperf.log beside it is an earlier run's" in problems["run_1"]
    assert problems["run_3"] == "mlperf.log has no run_stop: the run failed before it ended"
    assert s.score_minutes is None and not s.valid


def test_failed_marker_of_a_result_set_counts_the_run_failed(results, tmp_path):
    folder = cosmo_set(results, tmp_path)
    # A run that crashed after a complete-looking log, and one that left no log at all.
    (folder / "result_2.txt.failed").write_text("exit code 1\n")
    (folder / "result_5.txt").unlink()
    (folder / "result_5.txt.failed").write_text("exit code 137; no mlperf.log in run_5\n")
    (s,) = scoring.score_path(tmp_path)
    assert len(s.runs) == 10
    problems = {r.name: r.problem for r in s.failed}
    assert problems == {
        "result_2.txt": "exit code 1",
        "result_5.txt": "exit code 137; no mlperf.log in run_5",
    }
    assert {r.name: r.checker for r in s.failed} == {"result_2.txt": "PASS", "result_5.txt": "-"}
    # Both are failed runs for the summarizer too: two is one too many for the olympic mean.
    assert s.score_minutes is None and not s.valid


def test_checker_crash_is_reported_with_its_reason(results, tmp_path, monkeypatch):
    folder = cosmo_set(results, tmp_path)
    crashing = os.path.realpath(folder / "result_3.txt")
    check_file = mlp_compliance.ComplianceChecker.check_file

    def check_file_that_crashes(self, filename, config_file):
        if os.path.realpath(filename) == crashing:
            raise KeyError("metadata")
        return check_file(self, filename, config_file)

    monkeypatch.setattr(mlp_compliance.ComplianceChecker, "check_file", check_file_that_crashes)
    (s,) = scoring.score_path(tmp_path)
    (failed,) = s.failed
    assert failed.name == "result_3.txt" and failed.checker == "CRASH" and not failed.passed_checker
    assert failed.problem == "compliance checker crashed: KeyError: 'metadata'"
    # The other nine still pass, and the crashed run counts as the dropped slowest.
    assert s.passing == 9 and s.averaged_runs == 8 and s.score_minutes is not None
    text = scoring.format_set(s)
    assert "CRASH" in text and "result_3.txt: compliance checker crashed: KeyError" in text


def test_wrong_ruleset_is_reported_as_such(results, capsys):
    with pytest.raises(scoring.RulesetError, match=r"unknown ruleset '9\.9\.9'.*3\.0\.0"):
        scoring.score_path(results / COSMO, ruleset="9.9.9")
    assert scoring.main([str(results / COSMO), "--ruleset", "9.9.9"]) == 2
    assert "unknown ruleset '9.9.9'" in capsys.readouterr().err


def test_directory_of_run_directories_and_json_cli(results, tmp_path, capsys):
    for i in (1, 2, 3, 4, 5):
        run = tmp_path / f"run{i}"
        run.mkdir()
        shutil.copy(results / DEEPCAM_WEAK / f"result_{i}.txt", run / "mlperf.log")
    assert scoring.main([str(tmp_path), "--json"]) == 0
    (s,) = json.loads(capsys.readouterr().out)
    assert s["benchmark"] == "deepcam" and s["scaling"] == "strong" and len(s["runs"]) == 5
    assert s["complete"] and s["score_minutes"] > 0 and s["averaged_runs"] == 3
    assert [r["name"] for r in s["runs"]] == [f"run{i}" for i in (1, 2, 3, 4, 5)]
    assert scoring.main([str(tmp_path / "missing")]) == 2


def test_collected_logs_are_the_runs_own(results, tmp_path):
    log = (results / COSMO / "result_1.txt").read_text()
    run_dir, folder = tmp_path / "runs" / "run_0", tmp_path / "set"
    run_dir.mkdir(parents=True)
    (run_dir / "mlperf.log").write_text(log)  # an earlier run's, in a reused directory
    moved = run_logs.set_aside(run_dir)
    assert moved.parent == tmp_path / "runs.previous" and (moved / "mlperf.log").read_text() == log
    assert not run_dir.exists() and run_logs.set_aside(run_dir) is None
    # The new run is killed: its partial log is collected, marked failed.
    run_dir.mkdir()
    (run_dir / "mlperf.log.partial").write_text(killed(log))
    run = run_logs.collect(run_dir, folder, 0, 137)
    assert (folder / "result_0.txt").read_text() == killed(log)
    assert run.failure.startswith("exit code 137; no run_stop: killed or still running")
    assert (folder / "result_0.txt.failed").read_text().strip() == run.failure
    # Redone: a complete log that did not converge (exit 3) is no failure of the launcher.
    (run_dir / "mlperf.log.partial").unlink()
    (run_dir / "mlperf.log").write_text(not_converged(log))
    assert run_logs.collect(run_dir, folder, 0, 3).failure == ""
    assert not (folder / "result_0.txt.failed").exists()
    # A crash closes the log with run_stop 'aborted': only the exit code tells it from non-convergence.
    assert run_logs.collect(run_dir, folder, 0, 1).failure == "exit code 1"
    # No log at all: an empty result file, so that the run still counts in the set.
    (run_dir / "mlperf.log").unlink()
    assert (
        run_logs.collect(run_dir, folder, 1, 2).failure
        == f"exit code 2; no mlperf.log in {run_dir}"
    )
    assert (folder / "result_1.txt").read_text() == ""
    assert [run_logs.exit_status(c) for c in ([0, 0], [0, 3], [3, 137], [2])] == [0, 3, 1, 1]
