"""python -m offline.preflight: on 2 Gloo ranks end to end, its checks' exit codes, and its pure parts."""

import json
import subprocess

import pytest

from common.errors import InputError
from offline.preflight import host, ranks, sweep, verdict
from tests import helpers
from tests.test_gpus import A, B, fake_nvml  # noqa: F401  (fake_nvml: a fixture)

PREFLIGHT = [helpers.PYTHON, "-m", "offline.preflight"]


def preflight(args, environ=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*PREFLIGHT, *map(str, args)],
        cwd=helpers.REPO,
        env=environ or helpers.env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_two_gloo_ranks_report_sweep_benchmark_and_verdict(tmp_path):
    out = tmp_path / "pf"
    proc = helpers.horovodrun(
        2,
        [
            *PREFLIGHT,
            "--tiny",
            "--sweep-sizes",
            "8,1M",
            "--sweep-iterations",
            "3",
            "--output-dir",
            out,
        ],
        timeout=300,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    lines = proc.stdout.splitlines()
    # Rank 0 alone prints: the table once, from rank 0 (horovodrun's "[0]<stdout>:" prefix).
    tables = [
        line
        for line in lines
        if "[preflight] allreduce sweep: single eager Horovod allreduces (gloo, 2 ranks" in line
    ]
    assert len(tables) == 1 and tables[0].startswith("[0]"), output[-4000:]
    assert len([line for line in lines if "[benchmark] cosmoflow: 20 steps" in line]) == 1
    assert len([line for line in lines if "[preflight] verdict: measured" in line]) == 1

    report = json.loads((out / "preflight.json").read_text())
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    for r in report["ranks"]:
        assert r["device"] == "cpu" and r["tf_gpus"] == 0 and r["cpus"]
        assert "horovodrun binds no CPUs" in r["threads_note"] and r["intra_op_threads"] >= 1
    assert report["built"]["gloo"] is True
    rows = report["sweep"]
    assert [r["size_bytes"] for r in rows] == [8, 1 << 20]
    for r in rows:  # n = 2: busbw = algbw x 2(n-1)/n = algbw
        assert r["seconds"] > 0 and r["algbw"] == pytest.approx(r["size_bytes"] / r["seconds"])
        assert r["busbw"] == pytest.approx(r["algbw"])
    assert report["benchmark"]["steps"] == 20 and report["benchmark"]["ranks"] == 2
    v = report["verdict"]
    assert v["measured_step_s"] > 0 and v["projected_step_s"] > 0
    assert v["ratio"] == pytest.approx(v["measured_step_s"] / v["projected_step_s"])
    assert v["within"] == (1 / v["tolerance"] <= v["ratio"] <= v["tolerance"])
    # The machine file it wrote for this host is one the projection reads.
    from offline.projection import inputs

    machine = inputs.load_machine(out / "machine.yaml")
    assert (
        machine.devices_per_node == 2
        and machine.peak("fp32") > 0
        and machine.efficiency_for("cosmoflow") == 1.0
    )


@pytest.mark.parametrize(
    "args, says",
    [
        (["--machine", "no-such-machine"], "cannot read machine file"),
        (["--steps", "many"], "argument --steps: invalid int value"),
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--sweep-sizes", "3"], "not a whole number of float32 elements"),
        (["--config", "deepcam/configs/deepcam_synthetic_cpu.yaml"], "needs --data-dir"),
        (["--tolerance", "0.5"], "a factor above 1"),
    ],
)
def test_bad_input_is_one_error_line_and_exit_2(args, says):
    proc = preflight(args, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    own = helpers.own_lines(proc.stderr)
    assert len(own) == 1 and own[0].startswith("error: ") and says in own[0], proc.stderr


def test_fewer_gpus_than_expected_exits_1_and_the_table_shows_nvmls(fake_nvml, tmp_path):  # noqa: F811
    # NVML (a fake) shows 2 GPUs, but TensorFlow sees none: training would run on the CPU.
    env = helpers.env() | {"LD_LIBRARY_PATH": str(fake_nvml), "FAKE_NVML_UUIDS": f"{A},{B}"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    proc = preflight(
        ["--expect-gpus", "1", "--no-benchmark", "--output-dir", tmp_path / "pf"], environ=env
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    errors = helpers.error_lines(proc.stderr)
    assert (
        len(errors) == 1
        and "--expect-gpus 1: rank(s) 0 see 0 GPU(s) through TensorFlow" in errors[0]
    )
    assert A in proc.stdout  # rank 0 uses the first GPU NVML lists
    report = json.loads((tmp_path / "pf" / "preflight.json").read_text())
    assert report["ranks"][0]["nvml_gpus"] == 2 and report["ranks"][0]["gpu_uuid"] == A


# ---------------------------------------------------------------- the pure parts
def test_sweep_sizes_read_with_binary_units():
    assert sweep.parse_sizes("8, 64K,1M,2MiB") == (8, 64 << 10, 1 << 20, 2 << 20)
    for bad in ("", "7", "1.5M", "x"):
        with pytest.raises(InputError):
            sweep.parse_sizes(bad)


def test_bus_bandwidth_is_nccl_tests_allreduce_factor():
    row = sweep.bandwidths(1 << 20, 1e-3, ranks=8)
    assert row.count == 262144 and row.algbw == pytest.approx(1048576 / 1e-3)
    assert row.busbw == pytest.approx(row.algbw * 2 * 7 / 8)
    assert "float" in sweep.sweep_table([row], "t").splitlines()[2]


LSCPU = """Architecture:                            x86_64
Model name:                              AMD EPYC 7763 64-Core Processor
Thread(s) per core:                      2
Core(s) per socket:                      64
Socket(s):                               2
"""


def test_lscpu_and_the_machine_file_it_writes_load_as_a_machine(tmp_path):
    cpu = host.parse_lscpu(LSCPU)
    assert (cpu.model, cpu.cores, cpu.threads_per_core) == (
        "AMD EPYC 7763 64-Core Processor",
        128,
        2,
    )
    text = host.machine_yaml(
        host="node1",
        cpu=cpu,
        cpu_source="lscpu",
        device_name="AMD EPYC 7763, 16 CPUs a rank",
        matmul_edge=1024,
        peaks=[host.DevicePeaks(2e11, 5e10), host.DevicePeaks(1e11, 4e10)],
        devices_per_node=8,
        busbw=3e9,
        latency_s=1e-5,
        ranks=8,
        command="python -m offline.preflight",
    )
    (tmp_path / "m.yaml").write_text(text)
    from offline.projection import inputs

    m = inputs.load_machine(tmp_path / "m.yaml")
    assert m.peak("fp32") == pytest.approx(1e11) and m.memory_bytes_per_s == pytest.approx(
        4e10
    )  # the slowest rank
    assert (m.devices_per_node, m.cores_per_node, m.intra_node_bytes_per_s) == (
        8,
        128,
        pytest.approx(3e9),
    )
    assert m.nic_bytes_per_s == pytest.approx(8 * 3e9) and m.efficiency_for("deepcam") == 1.0


def facts(rank, tf_gpus):
    return ranks.RankFacts(
        rank, "node1", rank, "gpu" if tf_gpus else "cpu", "", -1, tf_gpus, "0-3", 4, 2, ""
    )


def test_expected_gpus_name_the_ranks_that_see_fewer():
    assert ranks.too_few_gpus([facts(0, 4), facts(1, 4)], 4) is None
    assert ranks.too_few_gpus([facts(0, 4)], None) is None
    assert "rank(s) 1 see 0 GPU(s)" in ranks.too_few_gpus([facts(0, 4), facts(1, 0)], 1)


@pytest.mark.parametrize(
    "policy, device, peaks, chosen, noted",
    [
        ("float32", "cpu", {"fp32": 1}, "fp32", False),
        (
            "float32",
            "gpu",
            {"fp32": 1, "tf32": 8},
            "tf32",
            False,
        ),  # TensorFlow's float32 on Ampere+ is TF32
        ("mixed_float16", "gpu", {"fp32": 1, "fp16": 16}, "fp16", False),
        ("mixed_bfloat16", "cpu", {"fp32": 1}, "fp32", True),
    ],
)
def test_the_projection_takes_the_runs_precision(policy, device, peaks, chosen, noted):
    precision, note = verdict.projection_precision(policy, device, peaks)
    assert precision == chosen and bool(note) is noted


def test_a_verdict_is_the_ratio_against_the_tolerance_either_way():
    v = verdict.Verdict(
        measured_step_s=0.3,
        projected_step_s=0.1,
        precision="fp32",
        bound="compute",
        machine="m",
        efficiency=0.5,
        tolerance=2.0,
    )
    assert v.ratio == pytest.approx(3) and not v.within and "outside the tolerance" in v.line()
    fast = verdict.Verdict(0.06, 0.1, "fp32", "compute", "m", 0.5, 2.0)
    assert fast.within and "ratio 0.60, within" in fast.line()
