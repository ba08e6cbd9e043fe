"""Runs a benchmark's train.py in benchmark mode once per precision mode, and tables its figures.

The throughput scripts (bench/cosmoflow_throughput.py, bench/deepcam_throughput.py) only
write data and choose a size: the figures come from the real trainer (`train.py CONFIG
--benchmark N`, common/run/benchmark_mode.py), which writes them to summary.json's
"throughput" dict, read back here. So a figure counts what a training run pays per step:
the input pipeline feeding the step, and the Horovod allreduce when there are several ranks.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from common import benchmarks, launchers

REPO = Path(__file__).resolve().parents[1]

# --modes: the precision overrides of each mode. 'amp' is what --amp picks on this
# machine (fp32 on a CPU without native bf16, common.runtime.choose_precision);
# 'bf16' forces mixed bf16, emulated where the CPU lacks it.
MODES = {
    "fp32": {"runtime.amp": "false"},
    "amp": {"runtime.amp": "true"},
    "bf16": {"runtime.amp": "true", "runtime.amp_dtype": "bfloat16"},
}


def parser(
    doc: str,
    config: str,
    data_dir: str,
    n_samples: int,
    batch_size: int,
    warmup_steps: int,
    steps: int,
) -> argparse.ArgumentParser:
    """A throughput script's parser, with the flags every one of them takes at the script's defaults; the
    script adds its sample size."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--config", default=config)
    p.add_argument("--data-dir", default=data_dir)
    p.add_argument(
        "--n-samples",
        type=int,
        default=n_samples,
        help="training samples to write (and a quarter as many validation samples, which "
        "the trainer lists at init but benchmark mode never reads)",
    )
    p.add_argument("--batch-size", type=int, default=batch_size, help="local (per rank) batch")
    add_arguments(p, warmup_steps, steps)
    return p


def whole_batches(n: int, args) -> int:
    """n samples cut to whole global batches (--np x --batch-size): every rank runs the same whole steps."""
    global_batch = args.np * args.batch_size
    return n // global_batch * global_batch


def too_few_samples(parser, args) -> None:
    """Exits with the usage error of a --n-samples too small for the ranks and the batch."""
    parser.error(
        f"--n-samples {args.n_samples} is too few for {args.np} rank(s) x batch {args.batch_size}: "
        f"use at least {4 * args.np * args.batch_size}"
    )


def add_arguments(parser, warmup_steps: int, steps: int) -> None:
    """The flags every throughput script shares: steps, modes, ranks, where the runs go."""
    parser.add_argument(
        "--warmup-steps",
        type=int,
        default=warmup_steps,
        help="training steps run before the clock starts (train.benchmark_warmup_steps)",
    )
    parser.add_argument(
        "--steps", type=int, default=steps, help="timed training steps (--benchmark)"
    )
    parser.add_argument(
        "--modes",
        default="fp32,amp",
        help="comma-separated: fp32, amp (what --amp picks here), bf16 (mixed bf16 forced)",
    )
    parser.add_argument(
        "--np",
        type=int,
        default=1,
        help="ranks: more than 1 runs train.py under horovodrun --gloo on this machine",
    )
    parser.add_argument(
        "--output-dir",
        default=None,
        help="keep each mode's run folder (config.yaml, summary.json) here; default: a temporary dir",
    )
    parser.add_argument(
        "--json",
        default=None,
        help="also write the table and the machine here (make bench reads it)",
    )
    parser.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one more config override for every run, as train.py's --set (repeatable)",
    )


def extra_overrides(parser, args) -> dict:
    """{key: value} of the --set flags (e.g. runtime.gradient_allreduce=grouped)."""
    bad = [item for item in args.sets if "=" not in item]
    if bad:
        parser.error(f"--set expects KEY=VALUE, got {bad[0]!r}")
    return dict(item.split("=", 1) for item in args.sets)


def parse_modes(parser, value: str) -> list[str]:
    modes = value.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"--modes: unknown {', '.join(unknown)}; known: {', '.join(MODES)}")
    return modes


def run_benchmark_mode(
    name: str,
    config: str,
    overrides: dict,
    steps: int,
    warmup_steps: int,
    ranks: int,
    run_dir: Path,
) -> dict:
    """Runs `name`'s train.py in benchmark mode and returns its summary.json.

    Args:
      name: the benchmark (common.benchmarks).
      config: the config file train.py reads.
      overrides: {config key: value}, passed as --set KEY=VALUE.
      steps: timed training steps (--benchmark).
      warmup_steps: steps before the clock starts (train.benchmark_warmup_steps).
      ranks: 1 runs train.py directly; more run it under horovodrun over Gloo.
      run_dir: the run's folder (train.py's output flag).

    Raises:
      RuntimeError: train.py failed, or its summary.json holds no benchmark figures.
    """
    entry = benchmarks.get(name)
    cmd = [
        sys.executable,
        str(REPO / entry.train_script),
        config,
        "--benchmark",
        str(steps),
        entry.output_flag,
        str(run_dir),
        "--set",
        f"train.benchmark_warmup_steps={warmup_steps}",
    ]
    for key, value in overrides.items():
        cmd += ["--set", f"{key}={value}"]
    cmd = launchers.on_this_host(cmd, ranks)
    print(f"[bench] {' '.join(cmd)}", flush=True)
    # train.py's output goes straight through: its [init] lines name the CPU and the precision
    # it chose, and a long run shows its progress.
    code = subprocess.run(cmd).returncode
    if code != 0:
        raise RuntimeError(f"{entry.train_script} exited with status {code} (its output is above)")
    summary = json.loads((run_dir / "summary.json").read_text())
    if summary.get("status") != "benchmarked" or not isinstance(summary.get("throughput"), dict):
        raise RuntimeError(
            f"{run_dir / 'summary.json'} holds no benchmark figures (status "
            f"{summary.get('status')!r}, 'throughput': {summary.get('throughput')!r})"
        )
    return summary


def run_modes(
    name: str,
    config: str,
    overrides: dict,
    modes,
    steps: int,
    warmup_steps: int,
    ranks: int,
    output_dir=None,
) -> list[tuple[str, dict]]:
    """(mode, summary.json) of one benchmark-mode run per precision mode, each in output_dir/<mode>."""
    with tempfile.TemporaryDirectory(prefix=f"{name}_throughput.") as tmp:  # removed at the end
        root = Path(output_dir or tmp)
        return [
            (
                mode,
                run_benchmark_mode(
                    name, config, overrides | MODES[mode], steps, warmup_steps, ranks, root / mode
                ),
            )
            for mode in modes
        ]


def rows(runs, input_label: str, training_label: str) -> list[tuple[str, str, float, float]]:
    """Table rows (measurement, precision (mode), samples/s per rank, samples/s in total) of `run_modes`."""
    out = []
    for mode, summary in runs:
        b = summary["throughput"]
        # The input pipeline alone does not depend on the precision, but each run measures it anew.
        out.append(
            (
                input_label,
                f"- ({mode} run)",
                b["input_samples_per_s_per_rank"],
                b["input_samples_per_s_per_rank"] * b["ranks"],
            )
        )
        out.append(
            (
                training_label,
                f"{b['precision']} ({mode})",
                b["samples_per_s_per_rank"],
                b["samples_per_s"],
            )
        )
    return out


def machine(runs) -> str:
    """The machine the figures were measured on, from the first run's summary: CPU, ISA, device, stack."""
    rt = runs[0][1]["runtime"]
    cpu = rt["cpu"]
    return (
        f"CPU {cpu['cpu']} ({cpu['isa']}, bf16 {cpu['bf16']}, oneDNN {cpu['onednn'].split(' ')[0]}), "
        f"{rt['intra_op_threads']} thread(s) per rank, device {rt['device']}, {rt['stack']}"
    )


def report(benchmark: str, sample: str, args, runs, table_rows) -> None:
    """Prints the table of a throughput script under a title naming the run and the machine;
    with args.json also writes it there."""
    title = (
        f"{benchmark} throughput, train.py --benchmark {args.steps} after {args.warmup_steps} "
        f"warm-up step(s), {args.np} rank(s), sample {sample}, {machine(runs)}"
    )
    print_table(title, table_rows)
    if args.json:
        write_json(args.json, title, runs, table_rows)


def write_json(path, title: str, runs, table_rows) -> None:
    """The table of print_table as JSON, with the machine of the first run (bench/report.py reads it)."""
    rt = runs[0][1]["runtime"]
    record = {
        "title": title,
        "machine": rt["cpu"]
        | {
            "tensorflow": rt["stack"].split(",")[0].removeprefix("TensorFlow "),
            "threads_per_rank": rt["intra_op_threads"],
        },
        "rows": [
            {
                "measurement": what,
                "precision": precision,
                "samples_per_s_per_rank": per_rank,
                "samples_per_s": total,
            }
            for what, precision, per_rank, total in table_rows
        ],
    }
    Path(path).write_text(json.dumps(record, indent=2))


def print_table(title: str, table_rows) -> None:
    print(f"\n{title}")
    print(
        f"{'measurement':60s} {'precision (mode)':22s} {'samples/s/rank':>14s} {'samples/s total':>15s}"
    )
    for what, precision, per_rank, total in table_rows:
        print(f"{what:60s} {precision:22s} {per_rank:14.2f} {total:15.2f}")
