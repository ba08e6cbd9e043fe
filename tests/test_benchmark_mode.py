"""Benchmark mode (train.py --benchmark N) through the real trainer, and a throughput script on top of it."""

import json
import re
import sys

import pytest

from tests import helpers


def benchmark_lines(stdout: str) -> list[str]:
    # horovodrun prefixes each line with its rank ("[1,0]<stdout>:"), so not only at the line's start.
    return [line for line in stdout.splitlines() if "[benchmark]" in line]


def check_benchmarked(proc, run_dir, ranks: int, steps: int, warmup_steps: int) -> dict:
    """The checks every benchmark-mode run passes; returns summary.json's benchmark figures."""
    output = helpers.failure_output(proc)
    assert proc.returncode == 0, output
    assert len(benchmark_lines(proc.stdout)) == 1, output  # rank 0 only
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "benchmarked"
    b = summary["throughput"]
    assert isinstance(b, dict), f"summary.json's 'throughput' is {b!r}, not the benchmark figures"
    assert (b["ranks"], b["steps"], b["warmup_steps"]) == (ranks, steps, warmup_steps)
    assert (
        b["seconds"] > 0
        and b["samples_per_s_per_rank"] > 0
        and b["input_samples_per_s_per_rank"] > 0
    )
    assert b["samples_per_s"] == pytest.approx(b["samples_per_s_per_rank"] * ranks, rel=1e-6)
    # The shape of a step, for offline/first_job.py's report: the global batch it makes up.
    assert b["global_batch_size"] == (
        ranks // b["spatial_ranks"] * b["local_batch_size"] * b["gradient_accumulation"]
    )
    assert b["precision"] == "float32"
    # Benchmark mode is no result: no MLPerf log, complete or partial.
    assert not [p.name for p in run_dir.iterdir() if p.name.startswith("mlperf")]
    return b


def test_cosmoflow_benchmark_mode_on_two_ranks(cosmo_data, tiny_config, tmp_path):
    out = tmp_path / "run"
    proc = helpers.horovodrun(
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
            "--benchmark",
            "3",
            "--set",
            "train.benchmark_warmup_steps=1",
        ),
        timeout=300,
    )
    b = check_benchmarked(proc, out, ranks=2, steps=3, warmup_steps=1)
    assert b["global_batch_size"] == 16  # 2 ranks x the tiny config's batch 8


@pytest.mark.slow  # the mode CosmoFlow's test shows on two ranks, after a DeepCAM trace
def test_deepcam_benchmark_mode_on_one_rank(deepcam_data, deepcam_config, tmp_path):
    out = tmp_path / "run"
    proc = helpers.run(
        helpers.train_cmd(
            "deepcam",
            deepcam_config,
            "--data_dir_prefix",
            deepcam_data,
            "--output_dir",
            out,
            "--benchmark",
            "3",
            "--set",
            "train.benchmark_warmup_steps=1",
            "--set",
            "data.n_train=8",
            "--set",
            "data.n_valid=4",
        ),
        timeout=300,
    )
    b = check_benchmarked(proc, out, ranks=1, steps=3, warmup_steps=1)
    assert b["global_batch_size"] == 4  # the tiny config's local batch


@pytest.mark.slow  # a bench script's own test: bench/ tooling, not the training path
def test_cosmoflow_throughput_script_prints_its_table(tmp_path):
    proc = helpers.run(
        [
            sys.executable,
            helpers.REPO / "bench" / "cosmoflow_throughput.py",
            "--size",
            "32",
            "--config",
            "cosmoflow/configs/cosmoflow_synthetic_cpu.yaml",
            "--data-dir",
            tmp_path / "data",
            "--n-samples",
            "16",
            "--modes",
            "fp32",
            "--warmup-steps",
            "1",
            "--steps",
            "2",
            "--output-dir",
            tmp_path / "runs",
        ],
        timeout=300,
    )
    assert proc.returncode == 0, helpers.failure_output(proc)
    table = proc.stdout[proc.stdout.index("\nCosmoFlow throughput") :]
    assert "CPU " in table.splitlines()[1]  # the title names the machine
    rows = {}
    for line in table.splitlines()[3:]:
        match = re.match(r"(.+?)\s{2,}(\S+ \(.+?\))\s+([\d.]+)\s+([\d.]+)$", line)
        assert match, f"not a table row: {line!r}"
        rows[match[1].split(" (")[0]] = (match[2], float(match[3]), float(match[4]))
    assert set(rows) == {"input pipeline alone", "training"}
    precision, per_rank, total = rows["training"]
    assert (
        precision == "float32 (fp32)"
        and per_rank > 0
        and total == pytest.approx(per_rank, abs=0.01)
    )
    assert rows["input pipeline alone"][1] > 0
    summary = json.loads((tmp_path / "runs" / "fp32" / "summary.json").read_text())
    assert summary["throughput"]["steps"] == 2


@pytest.mark.slow  # a bench script's own test: bench/ tooling, not the training path
def test_deepcam_throughput_script_writes_its_table_as_json(tmp_path):
    out = tmp_path / "table.json"
    proc = helpers.run(
        [
            sys.executable,
            helpers.REPO / "bench" / "deepcam_throughput.py",
            "--height",
            "64",
            "--width",
            "96",
            "--config",
            "deepcam/configs/deepcam_synthetic_cpu.yaml",
            "--data-dir",
            tmp_path / "data",
            "--n-samples",
            "4",
            "--modes",
            "fp32",
            "--warmup-steps",
            "1",
            "--steps",
            "1",
            "--json",
            out,
        ],
        timeout=300,
    )
    assert proc.returncode == 0, helpers.failure_output(proc)
    record = json.loads(out.read_text())
    assert record["title"].startswith("DeepCAM throughput") and record["machine"]["isa"]
    rows = {r["measurement"].split(",")[0]: r for r in record["rows"]}
    assert set(rows) == {"HDF5 reader alone", "training (reader)"}, rows
    assert rows["training (reader)"]["precision"] == "float32 (fp32)"
    assert all(r["samples_per_s_per_rank"] > 0 for r in record["rows"])
    # The reader's line reads the same figure the table holds.
    reader = rows["HDF5 reader alone"]["samples_per_s_per_rank"]
    assert (
        "reader alone (4 files in flight" in proc.stdout
        and f"{reader:.2f} samples/s" in proc.stdout
    )


@pytest.mark.slow  # a bench script's own test: bench/ tooling, not the training path
def test_input_pipeline_bench_measures_before_and_after(tmp_path):
    out = tmp_path / "input.json"
    proc = helpers.run(
        [
            sys.executable,
            helpers.REPO / "bench" / "input_pipeline.py",
            "--data-dir",
            tmp_path / "data",
            "--n-samples",
            "4",
            "--passes",
            "1",
            "--repeats",
            "1",
            "--cosmoflow-size",
            "16",
            "--cosmoflow-batch",
            "2",
            "--deepcam-height",
            "32",
            "--deepcam-width",
            "48",
            "--json",
            out,
        ],
        timeout=300,
    )
    assert proc.returncode == 0, helpers.failure_output(proc)
    record = json.loads(out.read_text())
    variants = [(r["benchmark"], r["variant"].split(" (")[0].split(",")[0]) for r in record["rows"]]
    check = "the train step's NaN/Inf check alone"
    alone = (
        "HDF5 files alone"  # the readers without tf.data, after the former unstaged pipeline's row
    )
    assert variants == [
        ("cosmoflow", "gzip in place"),
        ("cosmoflow", "gzip in place"),
        ("cosmoflow", "staged"),
        ("cosmoflow", check),
        ("deepcam", "HDF5 through h5py"),
        ("deepcam", "staged raw"),
        ("deepcam", "HDF5"),
    ] + [("deepcam", alone)] * 4 + [
        ("deepcam", "HDF5"),
        ("deepcam", "staged raw"),
        ("deepcam", check),
    ], variants
    readers_alone = [
        r["variant"].split(", ")[1:] for r in record["rows"] if r["variant"].startswith(alone)
    ]
    assert readers_alone == [
        [reader, f"{n} reader thread(s)"]
        for reader in ("h5py read_direct", "readinto past h5py")
        for n in (1, 2)
    ], readers_alone
    cores = record["machine"]["cores"]
    for r in record["rows"]:
        assert r["samples_per_s"] > 0
        assert r["samples_per_s_per_core"] == pytest.approx(r["samples_per_s"] / cores)
    # Staged CosmoFlow files are inflated: larger than the gzip ones.
    assert record["rows"][2]["mb_per_file"] > record["rows"][1]["mb_per_file"]
    assert "cosmoflow: last variant / first" in proc.stdout
    assert "deepcam: the NaN/Inf check takes" in proc.stdout
