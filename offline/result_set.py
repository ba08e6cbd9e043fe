"""Runs N seeded runs of a benchmark config one after the other, as an MLPerf result set.

  python -m offline.result_set --bench cosmoflow --config CONFIG --data-dir DATA --runs 10 --output DIR
  python -m offline.result_set ... --only 3        # just run 3 (one task of a SLURM job array)

Each run gets its own seed (seed_base + index, logged as `seed`) and run directory
(DIR/runs/run_<i>/; one an earlier run left there is moved to DIR/runs.previous/ first). Its
MLPerf log is copied into the submission layout DIR/<org>/results/<system>/strong/<bench>/
result_<i>.txt whatever became of the run: a run that crashed or was killed stays in the set,
with result_<i>.txt.failed saying why (offline/run_logs.py). At the end the set is scored with
offline.scoring (olympic mean, checker verdicts, failed runs, RCP for closed division). Exit
status: 0 every run converged, 3 one or more did not converge, 1 one or more failed.
"""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from common import benchmarks, launchers
from offline import run_logs, scoring
from offline.run_logs import submission_folder

REPO = Path(__file__).resolve().parents[1]


def run_command(
    bench: str, config: Path, run_dir: Path, seed: int, data_dir, ranks: int, extra
) -> list:
    cmd = [
        sys.executable,
        str(REPO / benchmarks.get(bench).train_script),
        str(config),
        "--set",
        f"output_dir={run_dir}",
        "--set",
        f"train.seed={seed}",
    ]
    if data_dir:
        cmd += ["--set", f"data.data_dir={data_dir}"]
    cmd += list(extra)
    return launchers.on_this_host(cmd, ranks)


def fresh_run_dir(run_dir: Path, tag: str) -> None:
    """Moves what an earlier run left in `run_dir` aside, so that every log there is the new run's."""
    moved = run_logs.set_aside(run_dir)
    if moved:
        print(f"[{tag}] {run_dir} held an earlier run's files: moved to {moved}", flush=True)


def earlier_results(folder: Path) -> str | None:
    """Why a whole set must not be written into `folder`, or None when it may."""
    if any(folder.glob("result_*")):
        return f"{folder} holds an earlier set's results, which would be scored with this one: choose another --output"
    return None


def collect(run_dir: Path, folder: Path, index: int, code: int, tag: str) -> None:
    run = run_logs.collect(run_dir, folder, index, code)
    print(
        f"[{tag}] run {index}: exit code {code}, {run.name}"
        + (f" FAILED: {run.failure}" if run.failure else ""),
        flush=True,
    )


def run_one(index: int, args, folder: Path) -> int:
    seed = args.seed_base + index
    run_dir = Path(args.output) / "runs" / f"run_{index}"
    fresh_run_dir(run_dir, "result-set")
    cmd = run_command(
        args.bench, Path(args.config), run_dir, seed, args.data_dir, args.np, args.extra
    )
    print(f"[result-set] run {index} (seed {seed}): {' '.join(cmd)}", flush=True)
    start = time.perf_counter()
    code = subprocess.call(cmd, env=dict(os.environ, PYTHONPATH=str(REPO)))
    print(f"[result-set] run {index} ended after {time.perf_counter() - start:.0f} s", flush=True)
    collect(run_dir, folder, index, code, "result-set")
    return code


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bench", required=True, choices=benchmarks.names())
    parser.add_argument("--config", required=True)
    parser.add_argument("--data-dir", help="sets data.data_dir")
    parser.add_argument(
        "--runs", type=int, default=0, help="runs in the set (default: what the rules require)"
    )
    parser.add_argument("--output", required=True)
    parser.add_argument("--seed-base", type=int, default=1, help="run i uses seed seed_base + i")
    parser.add_argument(
        "--np", type=int, default=1, help="ranks per run (horovodrun over Gloo when > 1)"
    )
    parser.add_argument("--system", help="system name in the submission layout")
    parser.add_argument(
        "--only", type=int, help="run only this index (SLURM job arrays); no scoring"
    )
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="-- then more train.py flags")
    args = parser.parse_args(argv)
    args.extra = [a for a in args.extra if a != "--"]
    submission_name = benchmarks.get(args.bench).submission_name
    runs = args.runs or scoring.get_result_file_counts(scoring.USAGE)[submission_name]
    folder = submission_folder(
        Path(args.output), Path(args.config), args.bench, args.system, args.np
    )
    if args.only is not None:  # one task of a job array: the set's folder is shared by design
        return run_one(args.only, args, folder)
    refusal = earlier_results(folder)
    if refusal:
        print(f"error: {refusal}", file=sys.stderr)
        return 2
    codes = [run_one(i, args, folder) for i in range(runs)]
    print(f"\n[result-set] {runs} run(s) done; exit codes {codes}. Score:\n", flush=True)
    print("\n\n".join(scoring.format_set(s) for s in scoring.score_path(folder)))
    return run_logs.exit_status(codes)


if __name__ == "__main__":
    sys.exit(main())
