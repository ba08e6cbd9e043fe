"""A site's first job: the published rates it compares with (read again from NVIDIA's logs), its
report (offline/first_job.py) on hand-written runs, and slurm/first_job.sbatch through a stand-in srun.
"""

import gzip
import json
import os
import re
import shutil
import stat
import statistics
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from common import benchmarks
from offline import first_job
from tests import helpers

REPO = helpers.REPO
PUBLISHED = [b for b in benchmarks.BENCHMARKS if b.published_rate]
NVIDIA_LOGS = REPO / "tests" / "fixtures" / "hpc_results_v3.0_nvidia"
H100_TOPOLOGY = REPO / "tests" / "fixtures" / "nvidia_smi_topo_dgx_h100.txt"

# all_reduce_perf's output on 8 GPUs, hand-written in nccl-tests' format (2.13: a root column), its
# figures made up: three sizes, the largest 4 GiB.
NCCL_TESTS = (
    """\
# nThread 1 nGpus 1 minBytes 8 maxBytes 4294967296 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
"""
    + "".join(
        f"#  Rank {r:2d} Group  0 Pid {4000 + r:6d} on      node1 device {r:2d} [0x{r:02x}] NVIDIA H100 80GB HBM3\n"
        for r in range(8)
    )
    + """\
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
           8             2     float     sum      -1    31.20    0.00    0.00      0    30.85    0.00    0.00      0
     1048576        262144     float     sum      -1    48.10   21.80   38.15      0    47.90   21.89   38.31      0
  4294967296    1073741824     float     sum      -1  22030.1  194.96  341.18      0  22011.7  195.12  341.46      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 126.5
#
"""
)
NCCL_INFO = (
    "node1:4000:4000 [0] NCCL INFO Bootstrap : Using ib0:10.0.0.1<0>\n"
    "node1:4000:4000 [0] NCCL INFO NCCL version 2.19.3+cuda12.3\n"
    "node1:4000:4100 [0] NCCL INFO Using network IB\n"
)


# --- the published rates ----------------------------------------------------------------------


def _mllog(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return [json.loads(line[len(":::MLLOG ") :]) for line in f if line.startswith(":::MLLOG")]


@pytest.mark.parametrize("bench", PUBLISHED, ids=lambda b: b.name)
def test_each_published_rate_is_what_its_log_says(bench):
    """The rate per GPU: the median of tracked_stats over the timed run's epochs after the first (a
    log may go on past run_stop), over nodes x accelerators per node; the local batch, the global
    batch over the GPUs and the accumulation."""
    p = bench.published_rate
    records = _mllog(NVIDIA_LOGS / f"{p.log}.gz")
    value = {r["key"]: r["value"] for r in records if r["event_type"] == "POINT_IN_TIME"}
    stop = next(i for i, r in enumerate(records) if r["key"] == "run_stop")
    rates = [r["value"]["throughput"] for r in records[:stop] if r["key"] == "tracked_stats"]
    gpus = value["number_of_nodes"] * value["accelerators_per_node"]
    assert (gpus, value["number_of_nodes"]) == (p.accelerators, p.nodes)
    accumulation = value.get("gradient_accumulation_frequency", 1)
    assert value["global_batch_size"] == gpus * p.local_batch * accumulation
    assert round(statistics.median(rates[1:]) / gpus, 1) == p.samples_per_s
    assert f"epochs 2-{len(rates)}" in p.how
    assert bench.name in p.log  # the log is the benchmark's own


# --- counts -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", benchmarks.names())
def test_the_synthetic_set_is_one_global_batch(name, capsys):
    plan = benchmarks.job_config(name, 8)  # one node of 8 GPUs: a closed config
    assert plan.closed
    args = ["counts", name, "8", str(plan.path), *plan.overrides]
    assert first_job.main(args) == 0
    n_train, n_valid = map(int, capsys.readouterr().out.split())
    assert (n_train, n_valid) == (plan.global_batch, 8 * plan.local_batch)
    # The control: a local batch given on the command line counts.
    key = benchmarks.get(name).local_batch_key
    assert first_job.main([*args, "--set", f"{key}=1"]) == 0
    assert capsys.readouterr().out.split()[1] == "8"


# --- report -----------------------------------------------------------------------------------


def write_run(run_dir: Path, name: str, samples_per_s: float, status="benchmarked", data_dir=None):
    """A run directory as train.py --benchmark leaves it, written by hand: 8 ranks on one node."""
    run_dir.mkdir(parents=True)
    summary = {
        "status": status,
        "benchmark": name,
        "nodes": 1,
        "runtime": {"device": "gpu", "cpu": "unused"},
        "throughput": {
            "steps": 50,
            "warmup_steps": 5,
            "seconds": 10.0,
            "samples_per_s": samples_per_s,
            "samples_per_s_per_rank": samples_per_s / 8,
            "spatial_ranks": 1,
            "input_samples_per_s_per_rank": 900.0,
            "global_batch_size": 32,
            "local_batch_size": 4,
            "gradient_accumulation": 1,
            "ranks": 8,
            "precision": "mixed_float16",
        },
    }
    if status != "benchmarked":
        summary["throughput"] = {}
        summary["failure"] = {"message": "data.n_train=3 is not divisible by the 8 ranks"}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    if data_dir is not None:
        (run_dir / "config.yaml").write_text(f"data:\n  data_dir: {data_dir}\n")
    (run_dir / "timeline.json").write_text("[\n")
    (run_dir / "nccl").mkdir()
    (run_dir / "nccl" / "node1.4000.log").write_text(NCCL_INFO)


@pytest.fixture
def job(tmp_path) -> dict:
    """Two benchmarks' runs of 8 GPUs (known samples/s), nvidia-smi -L's and all_reduce_perf's output."""
    data = tmp_path / "data"
    data.mkdir()
    (data / ".synthetic.json").write_text("{}")  # the generator's marker
    rates = {b.name: 8 * b.published_rate.samples_per_s / 2 for b in PUBLISHED}  # half of it
    for name, rate in rates.items():
        write_run(tmp_path / name, name, rate, data_dir=data)
    (tmp_path / "gpus.txt").write_text(
        "".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i:08x})\n" for i in range(8))
    )
    (tmp_path / "nccl_tests.txt").write_text(NCCL_TESTS)
    return {"dir": tmp_path, "rates": rates}


def report_args(job, *run_dirs) -> list[str]:
    d = job["dir"]
    runs = run_dirs or [str(d / name) for name in job["rates"]]
    return [
        "report",
        "--output-dir",
        str(d / "out"),
        "--gpus",
        str(d / "gpus.txt"),
        "--nccl-tests",
        str(d / "nccl_tests.txt"),
        *runs,
    ]


def test_the_report_puts_each_rate_per_gpu_beside_the_published_one(job, capsys):
    assert first_job.main(report_args(job)) == 0
    printed = capsys.readouterr().out
    out = job["dir"] / "out"
    assert (out / "first_job.md").read_text() == printed
    assert sorted(p.name for p in out.iterdir()) == ["first_job.json", "first_job.md"]  # no tmp
    report = json.loads((out / "first_job.json").read_text())
    assert report["device"] == "8 x NVIDIA H100 80GB HBM3 a node (nvidia-smi -L on the first node)"
    for run, bench in zip(report["runs"], PUBLISHED, strict=True):
        p = bench.published_rate
        per_gpu = job["rates"][bench.name] / 8
        assert run["samples_per_s_per_rank"] == pytest.approx(per_gpu)
        assert run["ratio"] == pytest.approx(0.5)
        line = (
            f"{bench.name}: {per_gpu:.1f} samples/s per GPU on 8 GPUs (1 node(s)), local batch 4 x "
            f"accumulation 1, mixed_float16 = 0.50 x NVIDIA's v3.0 {p.samples_per_s:.1f} per "
            f"{p.accelerator} on {p.accelerators} GPUs ({p.nodes} nodes), local batch {p.local_batch}"
        )
        assert run["line"] == line and f"- {line}\n" in printed
        assert f"[{p.log}]({first_job.RESULTS}{p.log})" in printed  # the source, linked
        assert run["data"].startswith("synthetic, ")
        assert run["nccl"] == {"files": 1, "version": "2.19.3+cuda12.3", "network": "IB"}
        assert run["timeline"] == str(job["dir"] / bench.name / "timeline.json")
    t = report["nccl_tests"]
    assert (t["ranks"], t["largest_bytes"], t["busbw_out_of_place"], t["busbw_in_place"]) == (
        8,
        4294967296,
        341.18,
        341.46,
    )
    assert (t["average_busbw"], t["wrong"]) == (126.5, 0) and "WRONG" not in printed
    assert str(job["dir"] / "nccl_tests.txt") in report["send_back"]


def test_wrong_allreduce_results_are_said(job, capsys):
    """nccl-tests' #wrong columns count results that did not check out: the report says so."""
    last = NCCL_TESTS.splitlines()[-4]
    assert last.startswith("  4294967296")
    (job["dir"] / "nccl_tests.txt").write_text(NCCL_TESTS.replace(last, last[:-1] + "3"))
    assert first_job.main(report_args(job)) == 0
    assert "; 3 WRONG results (nccl-tests' #wrong): a fault" in capsys.readouterr().out


@pytest.mark.parametrize(
    "spoil, named",
    [
        # A run that failed: its summary says so, and why.
        (
            lambda d: (
                shutil.rmtree(d / "deepcam"),
                write_run(d / "deepcam", "deepcam", 0.0, status="aborted"),
            ),
            "deepcam/summary.json: status 'aborted', not 'benchmarked': the run failed: data.n_train=3",
        ),
        # A run that never wrote its summary (killed, or crashed before the end).
        (lambda d: (d / "cosmoflow" / "summary.json").unlink(), "cosmoflow/summary.json: missing"),
        # A run directory that is not there.
        (lambda d: shutil.rmtree(d / "deepcam"), "deepcam: no such run directory"),
        # An earlier run's summary in a directory a later run started in.
        (
            lambda d: (
                os.utime(d / "deepcam" / "summary.json", ns=(0, 0))
                or (d / "deepcam" / ".started").touch()
            ),
            "deepcam/summary.json: older than the run's start",
        ),
        # all_reduce_perf that stopped before its last line.
        (
            lambda d: (d / "nccl_tests.txt").write_text(NCCL_TESTS.split("# Out of bounds")[0]),
            "nccl_tests.txt: no 'Avg bus bandwidth' line",
        ),
    ],
    ids=["failed", "no-summary", "no-run-dir", "stale-summary", "nccl-tests-unfinished"],
)
def test_bad_input_is_refused_naming_it(job, capsys, spoil, named):
    spoil(job["dir"])
    assert first_job.main(report_args(job)) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], captured.err
    assert not (job["dir"] / "out").exists()  # no report of part of the job


def test_the_good_job_is_the_control_of_the_bad_ones(job, capsys):
    """The same job unspoiled writes its report: the refusals above come from the spoiling."""
    assert first_job.main(report_args(job)) == 0
    assert "error" not in capsys.readouterr().err


# --- slurm/first_job.sbatch -------------------------------------------------------------------

# srun: records its arguments and the variables the first job sets (one call a block), prints
# all_reduce_perf's output for nccl-tests, and for a benchmark run (HOROVOD_TIMELINE set) writes
# the summary.json train.py --benchmark would, unless the benchmark is STAND_IN_FAIL's.
SRUN = r"""#!/bin/bash
{ printf '%s\n' "$@"; echo "HOROVOD_TIMELINE=${HOROVOD_TIMELINE-}"; echo "NCCL_DEBUG=${NCCL_DEBUG-}"
  echo "NCCL_DEBUG_FILE=${NCCL_DEBUG_FILE-}"; echo @@; } >> "$SRUN_LOG"
if [[ " $* " == *"/all_reduce_perf "* ]]; then cat "$NCCL_TESTS_OUTPUT"; exit 0; fi
[[ -n ${HOROVOD_TIMELINE:-} ]] || exit 0
run_dir=$(dirname "$HOROVOD_TIMELINE")
bench=$(basename "$run_dir")
[[ $bench != "${STAND_IN_FAIL:-}" ]] || exit 1
printf '{"status": "benchmarked", "benchmark": "%s", "nodes": 1, "runtime": {"device": "gpu"},
 "throughput": {"samples_per_s": 800.0, "input_samples_per_s_per_rank": 500.0, "ranks": 8,
 "steps": 3, "seconds": 1.5, "local_batch_size": 4, "gradient_accumulation": 1,
 "global_batch_size": 32, "precision": "mixed_float16"}}' "$bench" > "$run_dir/summary.json"
"""
# nvidia-smi on a DGX H100: `-L` lists its GPUs, `topo -m` prints its topology.
NVIDIA_SMI = f"""#!/bin/bash
if [[ $1 == -L ]]; then for i in 0 1 2 3 4 5 6 7; do echo "GPU $i: NVIDIA H100 80GB HBM3 (UUID: GPU-$i)"; done
else cat {H100_TOPOLOGY}; fi
"""


def first_job_sbatch(tmp_path, **variables) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    """slurm/first_job.sbatch on one node of 8 GPUs with the stand-ins; the job and srun's calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    for name, text in {
        "srun": SRUN,
        "nvidia-smi": NVIDIA_SMI,
        "all_reduce_perf": "#!/bin/false\n",
    }.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    (tmp_path / "nccl_tests.txt").write_text(NCCL_TESTS)
    site = {"BENCHES", "CONFIG", "CONTAINER", "DATA_DIR", "EXTRA_ARGS", "STAGE_DIR", "STEPS"}
    environ = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "CPU", "HOROVOD_", "NCCL_")) and k not in site
    }
    environ |= {
        "PATH": f"{bin_dir}{os.pathsep}{environ['PATH']}",
        "REPO": str(REPO),
        "VENV": str(Path(sys.executable).parent.parent),
        "OUTPUT_DIR": str(tmp_path / "job"),
        "SRUN_LOG": str(tmp_path / "srun.log"),
        "NCCL_TESTS_OUTPUT": str(tmp_path / "nccl_tests.txt"),
        "SLURM_JOB_ID": "42",
        "SLURM_NNODES": "1",
        "SLURM_NTASKS": "8",
        "SLURM_NTASKS_PER_NODE": "8",
        "SLURM_CPUS_ON_NODE": "224",
        "STEPS": "3",
    } | variables
    proc = subprocess.run(
        ["bash", str(REPO / "slurm" / "first_job.sbatch")],
        env=environ,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    log = (tmp_path / "srun.log").read_text() if (tmp_path / "srun.log").exists() else ""
    return proc, [block.strip("\n").splitlines() for block in log.split("@@\n") if block.strip()]


def test_the_sbatch_script_runs_each_benchmark_under_srun_and_reports(tmp_path):
    proc, calls = first_job_sbatch(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job = tmp_path / "job"
    nccl = [c for c in calls if any(a.endswith("/all_reduce_perf") for a in c)]
    assert len(nccl) == 1 and "-g" in nccl[0] and "NCCL_DEBUG=" in nccl[0]  # no INFO lines in it
    for name in benchmarks.names():
        b = benchmarks.get(name)
        run_dir = job / name
        # The synthetic data: the closed sample shape, one global batch, written on one node.
        generate = [c for c in calls if b.generator in c]
        assert len(generate) == 1 and "--ntasks=1" in generate[0], generate
        g = generate[0]
        at = g.index("--output-dir")
        assert g[at + 1] == str(job / "data" / name)
        assert g[at + 2 : at + 2 + len(b.closed_generator_args)] == list(b.closed_generator_args)
        n_train = g[g.index("--n-train") + 1]
        # The benchmark run: its config, the data's counts, --benchmark, the timeline and NCCL_DEBUG.
        train = [c for c in calls if b.train_script in c]
        assert len(train) == 1, train
        t = train[0]
        plan = benchmarks.job_config(name, 8)  # its own config, not the benchmark's before
        assert REPO / t[t.index(b.train_script) + 1] == plan.path
        assert g[g.index("--n-train") + 1 :: 2][:2] == [
            str(plan.global_batch),
            str(8 * plan.local_batch),
        ]
        assert t[t.index(b.data_flag) + 1] == str(job / "data" / name)
        assert t[t.index(b.output_flag) + 1] == str(run_dir)
        assert f"data.n_train={n_train}" in t and t[t.index("--benchmark") + 1] == "3"
        assert f"HOROVOD_TIMELINE={run_dir / 'timeline.json'}" in t and "NCCL_DEBUG=INFO" in t
        assert f"NCCL_DEBUG_FILE={run_dir / 'nccl'}/%h.%p.log" in t
        assert any(a.startswith("--cpu-bind=mask_cpu:") for a in t)  # bound as training binds
        # The report's line for it, in the job's output.
        assert re.search(
            rf"^- {name}: 100\.0 samples/s per GPU on 8 GPUs .* x NVIDIA's v3\.0", proc.stdout, re.M
        )
    report = json.loads((job / "first_job.json").read_text())
    assert [r["benchmark"] for r in report["runs"]] == list(benchmarks.names())
    assert report["nccl_tests"]["busbw_out_of_place"] == 341.18
    with tarfile.open(f"{job}.tar.gz") as tar:  # what to send back: all but the data
        names = tar.getnames()
    assert "./first_job.md" in names and not [n for n in names if n.startswith("./data")]


def test_a_config_for_several_benchmarks_is_refused_before_srun(tmp_path):
    config = str(benchmarks.closed_configs(benchmarks.names()[0])[0])
    proc, calls = first_job_sbatch(tmp_path, CONFIG=config)
    assert proc.returncode == 2 and calls == []
    assert proc.stderr.splitlines()[-1].startswith(f"error: CONFIG={config} is one benchmark's")
    # With BENCHES that benchmark alone, it runs that config.
    proc, calls = first_job_sbatch(tmp_path / "one", CONFIG=config, BENCHES=benchmarks.names()[0])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [c for c in calls if config in c]


def test_the_sbatch_script_fails_naming_a_failed_run(tmp_path):
    """The control: the same job with one benchmark's run failing exits non-zero, naming it."""
    failing = benchmarks.names()[-1]
    proc, calls = first_job_sbatch(tmp_path, STAND_IN_FAIL=failing)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert (
        len(errors) == 1 and f"{tmp_path / 'job' / failing / 'summary.json'}: missing" in errors[0]
    )
    assert [c for c in calls if benchmarks.get(failing).train_script in c]  # it did reach srun
    assert Path(f"{tmp_path / 'job'}.tar.gz").exists()  # the job's files still go back
