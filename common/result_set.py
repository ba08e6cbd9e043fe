"""Runs N seeded runs of a benchmark config one after the other, as an MLPerf result set.

  python -m common.result_set --bench cosmoflow --config CONFIG --data-dir DATA --runs 10 --output DIR
  python -m common.result_set ... --only 3        # just run 3 (one task of a SLURM job array)

Each run gets its own seed (seed_base + index, logged as `seed`) and run directory
(DIR/runs/run_<i>/); its MLPerf log is copied into the submission layout
DIR/<org>/results/<system>/strong/<bench>/result_<i>.txt. At the end the set is scored
with common.scoring (olympic mean, checker verdicts, RCP for closed division).
"""

import argparse
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

from common import scoring

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = ("cosmoflow", "deepcam")


def submission_folder(output: Path, config: Path, bench: str, system: str | None, ranks: int,
                      scaling: str = "strong") -> Path:
    mlperf = (yaml.safe_load(config.read_text()) or {}).get("mlperf", {}) or {}
    org = mlperf.get("org", "reference")
    platform = mlperf.get("platform", "unknown")
    system = system or (platform if platform != "unknown" else f"{socket.gethostname()}_{ranks}ranks")
    return output / org / "results" / system / scaling / bench


def run_command(bench: str, config: Path, run_dir: Path, seed: int, data_dir, ranks: int, extra) -> list:
    cmd = [sys.executable, str(REPO / bench / "train.py"), str(config), "--set", f"output_dir={run_dir}",
           "--set", f"train.seed={seed}"]
    if data_dir:
        cmd += ["--set", f"data.data_dir={data_dir}"]
    cmd += list(extra)
    if ranks > 1:
        horovodrun = str(Path(sys.executable).with_name("horovodrun"))
        cmd = [horovodrun, "-np", str(ranks), "-H", f"localhost:{ranks}", "--gloo"] + cmd
    return cmd


def run_one(index: int, args, folder: Path) -> int:
    seed = args.seed_base + index
    run_dir = Path(args.output) / "runs" / f"run_{index}"
    cmd = run_command(args.bench, Path(args.config), run_dir, seed, args.data_dir, args.np, args.extra)
    print(f"[result-set] run {index} (seed {seed}): {' '.join(cmd)}", flush=True)
    start = time.perf_counter()
    code = subprocess.call(cmd, env=dict(os.environ, PYTHONPATH=str(REPO)))
    found = collect_log(run_dir, folder, index)
    print(f"[result-set] run {index} ended with exit code {code} after {time.perf_counter() - start:.0f} s"
          + ("" if found else " (no MLPerf log)"), flush=True)
    return code


def collect_log(run_dir: Path, folder: Path, index: int) -> bool:
    """Copies run_dir/mlperf.log to folder/result_<index>.txt (temporary name, then rename)."""
    log = Path(run_dir) / "mlperf.log"
    if not log.exists():
        return False
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".result_{index}.txt.tmp"
    shutil.copy(log, tmp)
    os.replace(tmp, folder / f"result_{index}.txt")
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bench", required=True, choices=BENCHMARKS)
    parser.add_argument("--config", required=True)
    parser.add_argument("--data-dir", help="sets data.data_dir")
    parser.add_argument("--runs", type=int, default=0, help="runs in the set (default: what the rules require)")
    parser.add_argument("--output", required=True)
    parser.add_argument("--seed-base", type=int, default=1, help="run i uses seed seed_base + i")
    parser.add_argument("--np", type=int, default=1, help="ranks per run (horovodrun over Gloo when > 1)")
    parser.add_argument("--system", help="system name in the submission layout")
    parser.add_argument("--only", type=int, help="run only this index (SLURM job arrays); no scoring")
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="-- then more train.py flags")
    args = parser.parse_args(argv)
    args.extra = [a for a in args.extra if a != "--"]
    runs = args.runs or scoring.get_result_file_counts(scoring.USAGE)[args.bench]
    folder = submission_folder(Path(args.output), Path(args.config), args.bench, args.system, args.np)
    indices = [args.only] if args.only is not None else range(runs)
    codes = [run_one(i, args, folder) for i in indices]
    if args.only is not None:
        return codes[0]
    print(f"\n[result-set] {runs} run(s) done; exit codes {codes}. Score:\n", flush=True)
    print("\n\n".join(scoring.format_set(s) for s in scoring.score_path(folder)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
