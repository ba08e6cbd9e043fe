"""Offline report read from a finished run folder: staging, I/O, compute, memory, network, roofline.

The run's own figures are measured inside the training process after run_stop
(common/run/characterization.py, with runtime.characterize=true) and saved in summary.json;
this tool reads them, adds this machine's limits and writes the report.

  python deepcam/train.py CONFIG ... --set runtime.characterize=true      # records what is needed
  python -m offline.characterize RUN_DIR [--machine machine.json]

Reads RUN_DIR/summary.json, measures this machine's limits (a large matmul in fp32 and bf16
for peak FLOP/s, a large memory copy for bandwidth) unless --machine gives them, and writes
  RUN_DIR/characterization.json   every figure, with how FLOPs and traffic were counted
  RUN_DIR/characterization.txt    the same as a table
  RUN_DIR/curves.png              metric and loss vs epoch and vs time (target line), throughput per epoch
  RUN_DIR/roofline.png            the run placed against the measured compute and memory limits
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from common.cli import tool_main
from common.errors import write_text_atomic
from offline.plots import plot_curves_time_and_epoch, plot_roofline


def measure_machine(matmul_size: int = 4096, copy_bytes: int = 1 << 30) -> dict:
    """Peak matmul FLOP/s (fp32, bf16) and memory-copy bandwidth of this machine (best of a few)."""
    import tensorflow as tf

    peaks = {}
    for name, dtype in (("fp32", tf.float32), ("bf16", tf.bfloat16)):
        a = tf.random.normal([matmul_size, matmul_size], dtype=tf.float32)
        a = tf.cast(a, dtype)
        matmul = tf.function(lambda x: tf.linalg.matmul(x, x))
        matmul(a).numpy()
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            out = [matmul(a) for _ in range(4)]
            out[-1].numpy()
            best = min(best, (time.perf_counter() - start) / 4)
        peaks[name] = 2 * matmul_size**3 / best
    src = np.ones(copy_bytes // 8, np.float64)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    # A copy reads and writes every byte.
    return {
        "peak_flop_per_s": peaks,
        "memory_bytes_per_s": 2 * src.nbytes / best,
        "method": f"{matmul_size}^2 matmul (TF), {copy_bytes >> 20} MiB numpy copy; best of 3",
        "cpus": os.cpu_count(),
    }


def characterize(run_dir, machine: dict | None = None) -> dict:
    run_dir = Path(run_dir)
    summary_path = run_dir / "summary.json"
    if not summary_path.exists():
        raise FileNotFoundError(f"{summary_path} not found: is {run_dir} a run directory?")
    summary = json.loads(summary_path.read_text())
    c = summary.get("characterization") or {}
    if not c:
        raise ValueError(
            f"{summary_path} has no characterization; rerun with --set runtime.characterize=true"
        )
    machine = machine or measure_machine()
    staging = c.get("staging") or {}
    intensity = c["flops_per_sample_train"] / c["memory_bytes_per_sample_train"]
    # The roof of the precision the run computed in (bf16 under --amp on CPU).
    precision = (summary.get("runtime") or {}).get("precision", "float32")
    peaks = machine["peak_flop_per_s"]
    peak_name = "bf16" if "bfloat16" in precision and "bf16" in peaks else "fp32"
    best_peak = peaks.get(peak_name, max(peaks.values()))
    roof = min(best_peak, machine["memory_bytes_per_s"] * intensity)
    out = {
        "benchmark": summary.get("benchmark"),
        "status": summary.get("status"),
        "epochs": summary.get("epochs"),
        "time_to_train_min": summary.get("time_to_train_s", float("nan")) / 60,
        "ranks": c["ranks"],
        "staging_bytes": staging.get("bytes", 0),
        "staging_seconds": staging.get("seconds", 0.0),
        "staging_gb_per_s": staging.get("gb_per_s", 0.0),
        "input_samples_per_s": c["input_samples_per_s"],
        "bytes_read_per_sample": c["bytes_read_per_sample"],
        "train_samples_per_s": c["train_samples_per_s"],
        "flops_per_sample_train": c["flops_per_sample_train"],
        "flops_method": c["flops_method"],
        "achieved_flop_per_s": c["achieved_flop_per_s"],
        "memory_bytes_per_sample_train": c["memory_bytes_per_sample_train"],
        "memory_traffic_method": c["memory_traffic_method"],
        "precision": precision,
        "roof_precision": peak_name,
        "arithmetic_intensity": intensity,
        "roofline_bound_flop_per_s": roof,
        "fraction_of_roofline": c["achieved_flop_per_s"] / roof if roof else 0.0,
        "bound": "memory" if machine["memory_bytes_per_s"] * intensity < best_peak else "compute",
        "peak_host_memory_bytes": c["peak_host_memory_bytes"],
        "parameters": c["parameters"],
        "gradient_bytes_per_step": c["gradient_bytes_per_step"],
        "allreduce_seconds_per_step": c["allreduce_seconds_per_step"],
        "step_seconds": c["step_seconds"],
        "allreduce_share": c["allreduce_share"],
        "machine": machine,
    }
    write_text_atomic(run_dir / "characterization.json", json.dumps(out, indent=2))
    write_text_atomic(run_dir / "characterization.txt", format_table(out))
    history = summary.get("history") or []
    if history:
        plot_curves_time_and_epoch(
            history,
            summary["metric_name"],
            summary["target"],
            f"{out['benchmark']}: {out['status']}, "
            f"{out['epochs']} epoch(s), {out['time_to_train_min']:.2f} min",
            run_dir / "curves.png",
        )
    plot_roofline(
        machine,
        [(out["benchmark"] or "run", intensity, c["achieved_flop_per_s"])],
        f"{out['benchmark']} on {machine.get('cpus', '?')} CPU core(s)",
        run_dir / "roofline.png",
    )
    return out


ROWS = (
    ("staging", "staging_bytes", "{:,.0f} B"),
    ("", "staging_seconds", "{:.2f} s"),
    ("", "staging_gb_per_s", "{:.3f} GB/s"),
    ("input pipeline", "input_samples_per_s", "{:.1f} samples/s"),
    ("", "bytes_read_per_sample", "{:,.0f} B/sample"),
    ("training", "train_samples_per_s", "{:.1f} samples/s"),
    ("compute", "flops_per_sample_train", "{:,.0f} FLOP/sample"),
    ("", "achieved_flop_per_s", "{:.3e} FLOP/s"),
    ("", "arithmetic_intensity", "{:.1f} FLOP/B"),
    ("", "roof_precision", "{}"),
    ("", "roofline_bound_flop_per_s", "{:.3e} FLOP/s"),
    ("", "fraction_of_roofline", "{:.1%}"),
    ("", "bound", "{}"),
    ("memory", "peak_host_memory_bytes", "{:,.0f} B"),
    ("network", "gradient_bytes_per_step", "{:,.0f} B/step"),
    ("", "allreduce_seconds_per_step", "{:.4f} s"),
    ("", "allreduce_share", "{:.1%} of a step"),
)


def format_table(c: dict) -> str:
    lines = [
        f"{c['benchmark']} run: {c['status']}, {c['epochs']} epoch(s), {c['time_to_train_min']:.3f} min, "
        f"{c['ranks']} rank(s)"
    ]
    lines += [f"  {group:15s} {key:28s} {fmt.format(c[key])}" for group, key, fmt in ROWS]
    m = c["machine"]
    peaks = ", ".join(f"{k} {v / 1e9:.0f} GFLOP/s" for k, v in m["peak_flop_per_s"].items())
    lines.append(
        f"  machine: {peaks}; memory {m['memory_bytes_per_s'] / 1e9:.1f} GB/s ({m['method']})"
    )
    lines.append(f"  FLOPs: {c['flops_method']}; traffic: {c['memory_traffic_method']}")
    return "\n".join(lines) + "\n"


@tool_main(FileNotFoundError, ValueError)
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument(
        "--machine", help="JSON with peak_flop_per_s and memory_bytes_per_s (skip measuring)"
    )
    args = parser.parse_args(argv)
    machine = json.loads(Path(args.machine).read_text()) if args.machine else None
    out = characterize(args.run_dir, machine)
    print(format_table(out), end="")
    print(
        f"wrote {Path(args.run_dir) / 'characterization.json'}, characterization.txt, curves.png, roofline.png"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
