"""Weak scaling (MLPerf HPC "throughput"): M model instances train at once, each on its own ranks.

  python -m offline.weak_scaling --bench deepcam --config CONFIG --data-dir DATA \
      --instances 4 --ranks 2 --output DIR

Starts M independent Horovod jobs concurrently on this machine (horovodrun over Gloo, R ranks
each; slurm/weak_scaling.sbatch does the same with one `srun` step per instance inside one
allocation). Instance i writes DIR/instances/instance_<i>/ with seed seed_base + i, and logs
`instance_id`, `number_of_instances` and `number_of_ranks` (a directory an earlier run left
there is moved to DIR/instances.previous/ first). The instances meet in DIR/instances/start/
before run_start (common.run.instance_start): the set's time_to_train_all counts from the first
run_start, so none starts before the others are ready; this launcher marks each instance gone
there when its job ends, so one that fails at init does not hold the others. Its MLPerf log is copied to
DIR/<org>/results/<system>/weak/<bench>/result_<i>.txt whatever became of the run (a failed one
with result_<i>.txt.failed saying why: offline/run_logs.py), then the set is scored with
offline.scoring: number of models, instance scale, time_to_train_all and models per minute.
Exit status: 0 every instance converged, 3 one or more did not converge, 1 one or more failed.
"""

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from common import benchmarks
from common.errors import ExitCode
from common.run.instance_start import GONE, write_marker
from offline import run_logs, scoring
from offline.result_set import REPO, collect, earlier_results, fresh_run_dir, run_command
from offline.run_logs import submission_folder


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bench", required=True, choices=benchmarks.names())
    parser.add_argument("--config", required=True)
    parser.add_argument("--data-dir", help="sets data.data_dir")
    parser.add_argument(
        "--instances", type=int, required=True, help="models trained concurrently (M)"
    )
    parser.add_argument("--ranks", type=int, default=1, help="ranks per instance")
    parser.add_argument("--output", required=True)
    parser.add_argument("--seed-base", type=int, default=1)
    parser.add_argument("--system", help="system name in the submission layout")
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="-- then more train.py flags")
    args = parser.parse_args(argv)
    extra = [a for a in args.extra if a != "--"]
    output = Path(args.output)
    folder = submission_folder(
        output,
        Path(args.config),
        args.bench,
        args.system,
        args.ranks * args.instances,
        scaling="weak",
    )
    refusal = earlier_results(folder)
    if refusal:
        print(f"error: {refusal}", file=sys.stderr)
        return ExitCode.INPUT_ERROR
    run_dirs = [output / "instances" / f"instance_{i}" for i in range(args.instances)]
    for run_dir in run_dirs:  # all before the first start: instances start together
        fresh_run_dir(run_dir, "weak-scaling")
    barrier = (
        output / "instances" / "start"
    )  # an earlier set's markers would let this one start unmet
    shutil.rmtree(barrier, ignore_errors=True)
    barrier.mkdir(parents=True)
    procs = []
    for i, run_dir in enumerate(run_dirs):
        run_dir.mkdir(parents=True, exist_ok=True)
        cmd = run_command(
            args.bench,
            Path(args.config),
            run_dir,
            args.seed_base + i,
            args.data_dir,
            args.ranks,
            extra
            + [
                "--set",
                f"mlperf.instance_id={i}",
                "--set",
                f"mlperf.number_of_instances={args.instances}",
                "--set",
                f"mlperf.start_barrier_dir={barrier}",
            ],
        )
        print(f"[weak-scaling] instance {i}: {' '.join(cmd)}", flush=True)
        # Each instance's output goes to its own file: M interleaved streams are unreadable.
        out = open(run_dir / "stdout.txt", "w")
        procs.append(
            (
                i,
                run_dir,
                out,
                subprocess.Popen(
                    cmd,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=dict(os.environ, PYTHONPATH=str(REPO)),
                ),
            )
        )
    start = time.perf_counter()
    codes = {}
    while len(codes) < len(
        procs
    ):  # in the order they end: an instance gone early frees the others' start
        for i, run_dir, out, proc in procs:
            if i in codes or proc.poll() is None:
                continue
            codes[i] = proc.returncode
            write_marker(barrier, i, GONE)
            out.close()
            print(
                f"[weak-scaling] instance {i} ended {time.perf_counter() - start:.0f} s after the start",
                flush=True,
            )
            collect(run_dir, folder, i, codes[i], "weak-scaling")
        if len(codes) < len(procs):
            time.sleep(0.2)
    codes = [codes[i] for i in range(len(procs))]
    print(
        f"\n[weak-scaling] {args.instances} instance(s) done; exit codes {codes}. Score:\n",
        flush=True,
    )
    print("\n\n".join(scoring.format_set(s) for s in scoring.score_path(folder)))
    return run_logs.exit_status(codes)


if __name__ == "__main__":
    sys.exit(main())
