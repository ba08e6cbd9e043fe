"""tests/conftest.py's TEST_COST_LOG records and tools/test_costs.py's table of them (what CI prints
last, to say where its time went)."""

import json
import subprocess
import sys

from tests import helpers

TOOL = helpers.REPO / "tools" / "test_costs.py"


def _table(log) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, TOOL, log, "--top", "3"], capture_output=True, text=True, timeout=60
    )


def test_a_pytest_run_records_each_test_and_the_table_puts_the_longest_module_first(tmp_path):
    module = tmp_path / "tests" / "test_pair.py"
    module.parent.mkdir()
    module.write_text(
        "import time\n\ndef test_short():\n    pass\n\ndef test_long():\n    time.sleep(0.5)\n"
    )
    (tmp_path / "tests" / "conftest.py").write_text(
        (helpers.REPO / "tests" / "conftest.py").read_text()
    )
    log = tmp_path / "costs.jsonl"
    env = helpers.env() | {"TEST_COST_LOG": str(log), "PYTHONPATH": str(helpers.REPO)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            str(module),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    records = {r["test"].split("::")[-1]: r for r in map(json.loads, log.read_text().splitlines())}
    assert set(records) == {"test_short", "test_long"}
    assert records["test_long"]["wall_s"] >= 0.5 > records["test_short"]["wall_s"]
    table = _table(log)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert (
        lines[0].startswith("[costs] 2 tests") and "CPU s" in lines[1]
    )  # one process: its CPU is its own
    longest = lines[lines.index("[costs] the 3 longest tests:") + 1]
    assert longest.endswith("test_pair.py::test_long") or "test_pair.py::test_long " in longest


def test_two_workers_print_wall_seconds_only_and_bad_logs_are_one_error_line(tmp_path):
    log = tmp_path / "costs.jsonl"
    log.write_text(
        "\n".join(
            json.dumps(
                {
                    "test": f"tests/test_{m}.py::t{i}",
                    "wall_s": w,
                    "machine_cpu_s": 2 * w,
                    "worker": f"gw{i % 2}",
                }
            )
            for i, (m, w) in enumerate([("a", 1.0), ("b", 9.0), ("a", 2.0)])
        )
        + "\n"
    )
    table = _table(log)
    assert table.returncode == 0, table.stderr
    modules = table.stdout.splitlines()[2:4]
    assert modules[0].split()[0] == "tests/test_b.py" and modules[1].split()[0] == "tests/test_a.py"
    assert "CPU s" not in table.stdout
    for bad, says in (
        (tmp_path / "missing.jsonl", "No such file"),
        (tmp_path / "empty.jsonl", "no test recorded"),
        (tmp_path / "torn.jsonl", "line 1: not a test record"),
    ):
        if bad.name != "missing.jsonl":
            bad.write_text(
                "" if bad.name == "empty.jsonl" else '{"test": "tests/test_a.py::t", "wall'
            )
        proc = _table(bad)
        assert proc.returncode == 1 and proc.stderr.count("error:") == 1 and says in proc.stderr, (
            proc.stderr
        )
        assert proc.stderr.startswith(f"error: {bad}")


def test_xdist_takes_the_costliest_files_first_and_the_rest_in_its_own_order():
    from tests import conftest

    queue = conftest._CostliestFilesFirst()
    # xdist's order: most tests first; the two heavy files come last in it.
    for scope in (
        "tests/test_projection.py",
        "tests/test_closed_configs.py",
        "tests/test_slurm.py",
        "tests/test_docs.py",
        "tests/test_images.py",
    ):
        queue[scope] = {f"{scope}::t": False}
    taken = [queue.popitem(last=False)[0] for _ in range(len(queue))]
    assert taken == [
        "tests/test_images.py",
        "tests/test_slurm.py",
        "tests/test_projection.py",
        "tests/test_closed_configs.py",
        "tests/test_docs.py",
    ]
    # Negative control: a plain OrderedDict, what xdist holds, gives them last.
    import collections

    plain = collections.OrderedDict(
        (s, {}) for s in ("tests/test_projection.py", "tests/test_images.py")
    )
    assert plain.popitem(last=False)[0] == "tests/test_projection.py"
