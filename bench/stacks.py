"""The two supported stacks side by side on this CPU: the default (TensorFlow 2.21 + tf-keras) and
the older (STACK=tf2.15: TensorFlow 2.15.1), each from its own venv, oneDNN on in both.

  python bench/stacks.py                                   # .venv against .venv-tf2.15
  python bench/stacks.py --venv .venv --venv /opt/other-venv --rounds 5 --skip-run

Per venv and round it runs, with that venv's Python:
  - each benchmark's throughput script with its stack_bench_args (common.benchmarks: CosmoFlow at
    64^3 x 4, batch 4; the full DeepCAM model at 192x288, batch 1), fp32: training samples/s of
    train.py --benchmark;
  - what `make run` runs (CosmoFlow's synthetic CPU config on its synthetic data, one rank) to the
    target: its time to train (summary.json), unless --skip-run.
Rounds alternate the order of the venvs (A B, then B A, ...), so a drift of the machine during the
bench falls on both; the table gives each figure's median over the rounds and the slowest/fastest
ratio across rounds. The load average is printed before each measurement. Writes the table as
Markdown to --output (default bench/results/stacks-<ISA>.md) and its figures as JSON beside it.
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
from common import benchmarks, cpu  # noqa: E402


def step_benches() -> list[tuple[str, str, list]]:
    """(label, script, arguments) of each benchmark's training-step measurement (common.benchmarks)."""
    return [(f"{b.name} {' '.join(b.stack_bench_args)}, fp32", b.throughput_bench,
             [*b.stack_bench_args, "--modes", "fp32", "--data-dir", f"data/bench_stacks_{b.name}"])
            for b in benchmarks.BENCHMARKS if b.throughput_bench and b.stack_bench_args]


def make_run_benchmark():
    """The benchmark `make run` trains (the one whose make targets carry no suffix)."""
    return next(b for b in benchmarks.BENCHMARKS if b.make_suffix == "")


def stack_of(python: Path) -> str:
    """'TensorFlow 2.21.0, Keras 2.21.0, Python 3.12.1' of a venv's Python (common.runtime.software_stack)."""
    code = "import common, common.runtime as r; print(r.software_stack())"
    proc = subprocess.run([python, "-c", code], cwd=REPO, capture_output=True, text=True, check=False,
                          env=dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3"))
    if proc.returncode != 0:
        sys.exit(f"error: {python} cannot import the project's TensorFlow: {proc.stderr.strip().splitlines()[-1:]}")
    return proc.stdout.strip().splitlines()[-1]


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def step_figure(python: Path, script: str, args: list, workdir: Path) -> float:
    """Training samples/s (per rank, one rank) of one throughput script run under `python`."""
    out = workdir / "figures.json"
    cmd = [str(python), script, *args, "--json", str(out)]
    print(f"[stacks] {load()}: {' '.join(cmd)}", flush=True)
    subprocess.run(cmd, cwd=REPO, check=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    rows = json.loads(out.read_text())["rows"]
    return next(r["samples_per_s_per_rank"] for r in rows if r["measurement"].startswith("training"))


def time_to_train(python: Path, workdir: Path) -> float:
    """Minutes to the target of what `make run` runs (one rank), from its summary.json."""
    entry = make_run_benchmark()
    data = REPO / entry.synthetic_data
    if not (data / "train").is_dir():
        subprocess.run([str(python), "-m", entry.generator, "--output-dir", str(data), *entry.generator_args],
                       cwd=REPO, check=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    run_dir = workdir / "run"
    cmd = [str(python), entry.train_script, entry.synthetic_config, entry.data_flag, str(data),
           entry.output_flag, str(run_dir)]
    print(f"[stacks] {load()}: {' '.join(cmd)}", flush=True)
    subprocess.run(cmd, cwd=REPO, check=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    summary = json.loads((run_dir / "summary.json").read_text())
    if summary["status"] != "success":
        sys.exit(f"error: {run_dir}/summary.json: the run ended {summary['status']!r}, not at the target")
    return summary["time_to_train_s"] / 60


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--venv", action="append", help="a venv holding one stack (twice or more); "
                   "default: .venv and .venv-tf2.15")
    p.add_argument("--rounds", type=int, default=3, help="measurements of each figure per venv")
    p.add_argument("--skip-run", action="store_true", help="leave out the time to train")
    p.add_argument("--output", default=None, help="the Markdown table (and .json beside it)")
    args = p.parse_args(argv)
    venvs = [Path(v) for v in (args.venv or [REPO / ".venv", REPO / ".venv-tf2.15"])]
    pythons = []
    for venv in venvs:
        python = venv / "bin" / "python"
        if not python.exists():
            p.error(f"{venv}: no bin/python (make install STACK=tf2.15 VENV={venv} makes the older one)")
        pythons.append(python.absolute())
    stacks = [stack_of(python) for python in pythons]
    steps = step_benches()
    names = [name for name, _, _ in steps] + ([] if args.skip_run else ["make run: minutes to the target"])
    figures = {s: {n: [] for n in names} for s in stacks}
    for rnd in range(args.rounds):
        order = list(zip(pythons, stacks))
        if rnd % 2:
            order.reverse()
        for python, stack in order:
            print(f"[stacks] round {rnd + 1}/{args.rounds}: {stack}", flush=True)
            for name, script, script_args in steps:
                with tempfile.TemporaryDirectory(prefix="stacks.") as tmp:
                    figures[stack][name].append(step_figure(python, script, script_args, Path(tmp)))
            if not args.skip_run:
                with tempfile.TemporaryDirectory(prefix="stacks.") as tmp:
                    figures[stack][names[-1]].append(time_to_train(python, Path(tmp)))

    machine = cpu.describe()
    title = (f"CPU {machine['cpu']} ({machine['isa']}, bf16 {machine['bf16']}), {os.cpu_count()} core(s), "
             f"oneDNN on; median of {args.rounds} round(s), venvs alternating; `python bench/stacks.py`")
    lines = [title, "", "| measurement | " + " | ".join(stacks) + " | ratio | spread |",
             "|---|" + "---:|" * (len(stacks) + 2)]
    for name in names:
        medians = [statistics.median(figures[s][name]) for s in stacks]
        spread = max(max(figures[s][name]) / min(figures[s][name]) for s in stacks)
        lines.append(f"| {name} | " + " | ".join(f"{m:.3f}" for m in medians)
                     + f" | {medians[0] / medians[-1]:.3f} | {spread:.3f} |")
    lines += ["", "ratio: the first venv's median over the last's (samples/s: above 1 is faster; minutes: "
              "above 1 is slower). spread: the largest max/min of one figure's rounds on one venv."]
    table = "\n".join(lines) + "\n"
    print("\n" + table)
    output = Path(args.output or REPO / "bench" / "results" / f"stacks-{machine['isa']}.md")
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_suffix(".md.tmp")
    tmp.write_text(table)
    tmp.replace(output)
    record = {"title": title, "stacks": stacks, "figures": figures}
    output.with_suffix(".json.tmp").write_text(json.dumps(record, indent=2))
    output.with_suffix(".json.tmp").replace(output.with_suffix(".json"))
    print(f"[stacks] wrote {output} and {output.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
