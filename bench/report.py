"""`make bench`: one table of both benchmarks' compute and input figures on this machine, per ISA.

  python bench/report.py                 # everything (~20-30 minutes on a 2-core AVX2 CPU)
  python bench/report.py --quick         # fewer steps and samples: a smoke run of the table

Runs, each in its own process so that TensorFlow reads TF_ENABLE_ONEDNN_OPTS afresh:
  - compute: bench/cosmoflow_throughput.py (the closed CosmoFlow model, 128^3 x 4) and
    bench/deepcam_throughput.py (the full 56,454,720-parameter DeepCAM model, 192x288), fp32
    and, where the CPU computes bf16 natively (AVX512_BF16, AMX), mixed bf16, each with oneDNN
    on and off: train.py --benchmark, so the figures are training steps of the real loop.
    Emulated bf16 is 7-9x slower than fp32 and would take most of an hour here; --bf16
    measures it anyway;
  - input: bench/input_pipeline.py (full-size samples, before/after staging), samples/s per core;
  - spatial: bench/spatial.py (the table's spatial_bench models: CosmoFlow at 128^3 and 256^3,
    DeepCAM at 768x1152, unsplit and split 2 ways, the halo overlapped and not): samples/s, peak
    RSS per rank against K = 1, the halo's bytes and share of the step (also written to
    bench/results/spatial_<ISA>.md with every column; it refuses a busy machine; --quick runs the
    table's first model anyway, as a smoke run).
Writes bench/results/<ISA>.json and bench/results/<ISA>.md (the ISA of this CPU: AVX2,
AVX-512, AMX...), so the table of every ISA measured so far is kept side by side; the README
quotes them. A figure names its CPU in the file's heading.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from common import benchmarks, cpu  # noqa: E402
from common.errors import write_text_atomic  # noqa: E402

RESULTS = REPO / "bench" / "results"


def compute_runs(quick: bool) -> list[tuple[str, list[str]]]:
    """(benchmark, throughput script command) of the compute measurements: each table entry's
    throughput_bench with its throughput_args."""
    steps = (
        ["--steps", "2", "--warmup-steps", "1"]
        if quick
        else ["--steps", "4", "--warmup-steps", "2"]
    )
    return [
        (
            name,
            [benchmarks.get(name).throughput_bench, *benchmarks.get(name).throughput_args, *steps],
        )
        for name in benchmarks.names_with("throughput_bench")
    ]


def run_json(cmd: list[str], env: dict) -> dict:
    """Runs a bench script with --json into a temporary file; its output goes straight through."""
    with tempfile.TemporaryDirectory(prefix="bench_report.") as tmp:
        out = Path(tmp) / "out.json"
        full = [sys.executable, *cmd, "--json", str(out)]
        print(
            f"[bench] {' '.join(k + '=' + v for k, v in env.items())} {' '.join(full)}", flush=True
        )
        code = subprocess.run(full, cwd=REPO, env=os.environ | env).returncode
        if code != 0:
            raise RuntimeError(f"{cmd[0]} exited with status {code} (its output is above)")
        return json.loads(out.read_text())


def compute_rows(quick: bool, bf16: bool) -> list[dict]:
    rows = []
    modes = "fp32,bf16" if bf16 else "fp32"
    for benchmark, cmd in compute_runs(quick):
        for onednn in ("1", "0"):
            record = run_json([*cmd, "--modes", modes], {cpu.ONEDNN_ENV: onednn})
            for r in record["rows"]:
                if r["measurement"].startswith("training"):
                    rows.append(
                        {
                            "benchmark": benchmark,
                            "kind": "compute",
                            "measurement": r["measurement"],
                            "onednn": "on" if onednn == "1" else "off",
                            "precision": r["precision"],
                            "samples_per_s": r["samples_per_s_per_rank"],
                            "per_core": r["samples_per_s_per_rank"]
                            / record["machine"]["threads_per_rank"],
                            "source": record["title"],
                        }
                    )
    return rows


def input_rows(quick: bool) -> list[dict]:
    cmd = ["bench/input_pipeline.py"] + (["--n-samples", "8", "--repeats", "1"] if quick else [])
    record = run_json(cmd, {})
    return [
        {
            "benchmark": r["benchmark"],
            "kind": "input",
            "measurement": f"{r['variant']}, {r['sample']}",
            "onednn": "-",
            "precision": "-",
            "samples_per_s": r["samples_per_s"],
            "per_core": r["samples_per_s_per_core"],
            "source": "bench/input_pipeline.py",
        }
        for r in record["rows"]
    ]


def spatial_rows(quick: bool) -> list[dict]:
    # Quick: the table's first model (the others are larger), K = 1 and 2 overlapped, one step, whatever the load.
    first = benchmarks.get(benchmarks.names_with("spatial_bench")[0]).spatial_bench[0]
    quick_args = ["--configs", first, "--halo-overlap", "on", "--steps", "1", "--allow-load"]
    record = run_json(["bench/spatial.py"] + (quick_args if quick else []), {})
    rows = []
    for r in record["rows"]:
        memory = f"peak RSS {r['peak_rss_gib_per_rank']:.2f} GiB/rank"
        if r["spatial_ranks"] > 1 and r["above_import_vs_unsplit"]:
            memory += f" ({r['above_import_vs_unsplit']:.2f}x K=1 above import)"
        halo = (
            ""
            if r["halo_in_flight_share"] is None
            else (
                f", halo {r['halo']}, {r['halo_mib_forward_per_rank']:.1f} MiB forward, "
                f"in flight {100 * r['halo_in_flight_share']:.0f}% of step"
            )
        )
        rows.append(
            {
                "benchmark": r["benchmark"],
                "kind": "spatial",
                "measurement": f"{r['sample_name']}, K={r['spatial_ranks']} "
                f"({r['threads_per_rank']} thread(s)/rank): {memory}{halo}",
                "onednn": "on",
                "precision": "fp32",
                "samples_per_s": r["samples_per_s"],
                "per_core": r["samples_per_s"] / cpu.cores(),
                "source": "bench/spatial.py",
            }
        )
    return rows


def markdown(machine: dict, rows: list[dict], seconds: float) -> str:
    lines = [
        f"# Bench figures: {machine['isa']}",
        "",
        f"CPU {machine['cpu']} ({machine['isa']}, bf16 {machine['bf16']}), {machine['cores']} core(s), "
        f"TensorFlow {machine['tensorflow']}; measured {machine['date']} by `make bench` "
        f"(`python bench/report.py{' --quick' if machine['quick'] else ''}`, {seconds / 60:.1f} min). "
        "Compute: training samples/s of train.py --benchmark, one rank using every core. "
        "Input: the input pipeline alone, files in page cache."
        + (
            ""
            if machine["bf16_measured"]
            else " bf16 not measured: emulated on this CPU (7-9x slower than fp32; `--bf16` measures it)."
        ),
        "",
        "| benchmark | kind | measurement | oneDNN | precision | samples/s | per core |",
        "|---|---|---|---|---|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['benchmark']} | {r['kind']} | {r['measurement']} | {r['onednn']} | {r['precision']} | "
            f"{r['samples_per_s']:.2f} | {r['per_core']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--quick", action="store_true", help="fewer steps and samples (a smoke run of the table)"
    )
    p.add_argument("--only", choices=("compute", "input", "spatial"), help="one part of the table")
    p.add_argument(
        "--bf16",
        action="store_true",
        default=cpu.has_native_bf16(),
        help="also mixed bf16 (the default where the CPU has native bf16)",
    )
    p.add_argument("--out-dir", default=str(RESULTS), help="where <ISA>.json and <ISA>.md go")
    args = p.parse_args(argv)
    start = time.perf_counter()
    rows = []
    if args.only in (None, "compute"):
        rows += compute_rows(args.quick, args.bf16)
    if args.only in (None, "input"):
        rows += input_rows(args.quick)
    if args.only in (None, "spatial"):
        rows += spatial_rows(args.quick)
    import tensorflow as tf

    machine = cpu.describe() | {
        "cores": cpu.cores(),
        "tensorflow": tf.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "quick": args.quick,
        "bf16_measured": args.bf16,
    }
    seconds = time.perf_counter() - start
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = machine["isa"].replace(" ", "_")
    write_text_atomic(
        out / f"{name}.json", json.dumps({"machine": machine, "rows": rows}, indent=2)
    )
    table = markdown(machine, rows, seconds)
    write_text_atomic(out / f"{name}.md", table)
    print("\n" + table)
    print(f"[bench] wrote {out / name}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
