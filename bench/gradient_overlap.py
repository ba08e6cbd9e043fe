"""Step time with gradients averaged as backward produces them (runtime.gradient_allreduce=overlap,
the default) beside one grouped allreduce after backward (grouped), on 2 Horovod ranks of this host.

  python bench/gradient_overlap.py                  # every benchmark, 3 rounds
  python bench/gradient_overlap.py --rounds 5 --np 2

Per benchmark, round and mode it runs the benchmark's throughput script (common.benchmarks: its
stack_bench_args, fp32) under horovodrun --gloo with `--set runtime.gradient_allreduce=MODE`, and
reads the training samples/s of train.py --benchmark. Rounds alternate the order of the modes, so a
drift of the machine falls on both; the table gives each figure's median and the spread across
rounds. Gloo over loopback shares the cores with the backward pass it would overlap, so on a CPU
host this says what the change costs or saves here, not what it does on a GPU node (NCCL on its own
streams); tests/test_gradient_overlap.py proves the order (a Horovod timeline) and the equality.
Refuses to print figures when the load average is above 0.5 per core. Writes the table as Markdown
to --output (default bench/results/gradient_overlap-<ISA>.md) and its figures as JSON beside it.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench import machine_load  # noqa: E402
from common import benchmarks, cpu  # noqa: E402

MODES = ("overlap", "grouped")


def figure(script: str, args: list, mode: str, ranks: int, workdir: Path) -> float:
    """Training samples/s in total of one throughput-script run."""
    out = workdir / "figures.json"
    cmd = [sys.executable, script, *args, "--modes", "fp32", "--np", str(ranks),
           "--set", f"runtime.gradient_allreduce={mode}", "--json", str(out)]
    print(f"[overlap] load {machine_load.per_core():.2f} per core: {' '.join(cmd)}", flush=True)
    subprocess.run(cmd, cwd=REPO, check=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    rows = json.loads(out.read_text())["rows"]
    return next(r["samples_per_s"] for r in rows if r["measurement"].startswith("training"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--np", type=int, default=2, help="ranks on this host")
    p.add_argument("--output", default=None)
    args = p.parse_args(argv)
    refusal = machine_load.refusal()
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    entries = [b for b in benchmarks.BENCHMARKS if b.throughput_bench and b.stack_bench_args]
    figures = {b.name: {m: [] for m in MODES} for b in entries}
    loads = []
    for round_ in range(args.rounds):
        order = MODES if round_ % 2 == 0 else MODES[::-1]
        for b in entries:
            bench_args = [*b.stack_bench_args, "--data-dir", f"data/bench_overlap_{b.name}"]
            for mode in order:
                loads.append(machine_load.per_core())
                with tempfile.TemporaryDirectory() as tmp:
                    figures[b.name][mode].append(figure(b.throughput_bench, bench_args, mode, args.np, Path(tmp)))
    machine = f"{cpu.describe()['cpu']} ({cpu.isa()}), {os.cpu_count()} cores"
    lines = [f"# Gradients overlapping backward against one grouped allreduce: {args.np} ranks on one host",
             "", f"Machine: {machine}; load average per core during the runs {min(loads):.2f}-{max(loads):.2f}; "
             f"`python bench/gradient_overlap.py --rounds {args.rounds} --np {args.np}`.", "",
             "| benchmark (fp32, arguments) | overlap samples/s | grouped samples/s | overlap / grouped | "
             "spread (slowest/fastest round) |", "|---|---|---|---|---|"]
    table = {}
    for b in entries:
        med = {m: statistics.median(figures[b.name][m]) for m in MODES}
        spread = max(max(v) / min(v) for v in figures[b.name].values())
        table[b.name] = {"args": list(b.stack_bench_args), "samples_per_s": figures[b.name], "median": med,
                         "ratio": med["overlap"] / med["grouped"], "spread": spread}
        lines.append(f"| {b.name} {' '.join(b.stack_bench_args)} | {med['overlap']:.3f} | {med['grouped']:.3f} | "
                     f"{med['overlap'] / med['grouped']:.2f} | {spread:.2f} |")
    lines += ["", "Gloo over loopback shares these cores with the backward pass: the ratio says what overlap "
              "costs or saves on this host, not on a GPU node."]
    output = Path(args.output or REPO / "bench" / "results" / f"gradient_overlap-{cpu.isa()}.md")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text("\n".join(lines) + "\n")
    output.with_suffix(".json").write_text(json.dumps({"machine": machine, "loads": loads, "table": table},
                                                      indent=2) + "\n")
    print("\n".join(lines))
    print(f"[overlap] wrote {output} and {output.with_suffix('.json').name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
