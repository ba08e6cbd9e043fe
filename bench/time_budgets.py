"""Time budgets on this machine: the two README commands, `make run` and `make test`, and CI.

  python bench/time_budgets.py                  # all three (CI: install and every tier, ~40 minutes)
  python bench/time_budgets.py --only run       # or --only test, --only ci
  make bench-budgets

Budgets, for a 2-core AVX2-only CPU, the slowest CI may get:
  - `make run`: under 3 minutes of training (run_start -> run_stop of its MLPerf log);
  - `make test`: the fast tier, under 15 minutes of wall time on an installed venv;
  - `.ci/run` on a fresh clone of HEAD (its own venv installed, every tier, the image test
    included): under 40 minutes, which leaves the next stacks and tests room inside CI's 60.
Each figure is printed with the CPU, its ISA and the oneDNN setting, since a figure
without its machine says nothing; the table is also written as JSON (--json).
Exits 1 when a figure is over its budget.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from common import cpu  # noqa: E402
from common.files import write_text_atomic  # noqa: E402

BUDGETS_S = {"run": 3 * 60, "test": 15 * 60, "ci": 40 * 60}
# pytest's closing line, e.g. "== 120 passed, 3 skipped, 9 deselected in 801.22s (0:13:21) =="
PYTEST_SUMMARY = re.compile(r"=+ (.*) in ([\d.]+)s")


def _make(target: str, *variables: str) -> tuple[subprocess.CompletedProcess, float]:
    start = time.perf_counter()
    proc = subprocess.run(["make", "-C", str(REPO), target, *variables], capture_output=True, text=True)
    return proc, time.perf_counter() - start


def measure_run() -> dict:
    """`make run` into a fresh run directory; its training time comes from summary.json."""
    with tempfile.TemporaryDirectory(prefix="budget-run-") as tmp:
        proc, wall = _make("run", f"RUN_DIR={tmp}/run")
        summary_path = Path(tmp) / "run" / "summary.json"
        if proc.returncode != 0 or not summary_path.exists():
            raise SystemExit(f"error: make run failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        summary = json.loads(summary_path.read_text())
    return {"what": "make run: training (run_start -> run_stop)", "seconds": summary["time_to_train_s"],
            "budget_s": BUDGETS_S["run"], "detail": f"{summary['epochs']} epochs, {summary['status']}, "
            f"make run wall {wall:.0f} s (synthetic data made if missing)"}


def measure_test() -> dict:
    """`make test`, wall time; pytest's own closing line says what ran."""
    proc, wall = _make("test")
    found = PYTEST_SUMMARY.findall(proc.stdout)
    if proc.returncode != 0 or not found:
        raise SystemExit(f"error: make test failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}")
    return {"what": "make test: the fast tier (wall)", "seconds": wall, "budget_s": BUDGETS_S["test"],
            "detail": found[-1][0]}


def measure_ci() -> dict:
    """`bash .ci/run` in a fresh clone of HEAD (what CI runs after a stop), wall time."""
    with tempfile.TemporaryDirectory(prefix="budget-ci-") as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
        start = time.perf_counter()
        proc = subprocess.run(["bash", ".ci/run"], cwd=clone, capture_output=True, text=True,
                              env=dict(os.environ, CI="true"))
        wall = time.perf_counter() - start
    found = PYTEST_SUMMARY.findall(proc.stdout)
    if proc.returncode != 0:
        raise SystemExit(f"error: .ci/run failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}")
    return {"what": ".ci/run: fresh clone, install + every tier (wall)", "seconds": wall,
            "budget_s": BUDGETS_S["ci"], "detail": "; ".join(summary for summary, _ in found)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", choices=["run", "test", "ci"], help="measure only this command")
    p.add_argument("--json", default=str(REPO / "runs" / "bench" / "time_budgets.json"),
                   help="where to write the figures as JSON")
    args = p.parse_args(argv)

    # `make` starts new Python processes that decide oneDNN themselves (common/cpu.py);
    # this one has not loaded TensorFlow, so it reports the variable they inherit.
    machine = {k: v for k, v in cpu.describe().items() if k != "onednn"}
    machine |= {"cores": cpu.cores(), cpu.ONEDNN_ENV: os.environ.get(cpu.ONEDNN_ENV, "unset")}
    rows = []
    for name, measure in (("run", measure_run), ("test", measure_test), ("ci", measure_ci)):
        if args.only in (None, name):
            print(f"[budget] measuring {'.ci/run' if name == 'ci' else 'make ' + name} ...", flush=True)
            rows.append(measure())
            print(f"[budget] {rows[-1]['what']}: {rows[-1]['seconds']:.0f} s", flush=True)

    print(f"\nTime budgets on {machine['cpu']} ({machine['isa']}, bf16 {machine['bf16']}, "
          f"{machine['cores']} cores, {cpu.ONEDNN_ENV}={machine[cpu.ONEDNN_ENV]})")
    print(f"{'measurement':46s} {'seconds':>8s} {'budget':>8s}  verdict  detail")
    over = False
    for row in rows:
        row["within_budget"] = row["seconds"] <= row["budget_s"]
        over |= not row["within_budget"]
        print(f"{row['what']:46s} {row['seconds']:8.0f} {row['budget_s']:8d}  "
              f"{'ok     ' if row['within_budget'] else 'OVER   '}  {row['detail']}")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, json.dumps({"machine": machine, "measurements": rows}, indent=2))
    print(f"[budget] written {out}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
