"""What Horovod's dynamic process sets cost each cycle: tiny allreduces on 2 ranks under plain
`hvd.init()` and under `hvd.init(process_sets="dynamic")`, at each cycle time.

  python bench/horovod_cycle.py                                  # 0.1 and 1 ms, 5 x 200 allreduces
  python bench/horovod_cycle.py --allow-load --cycles-ms 0.1     # on a busy machine: the table says so

Each row is one launch of 2 ranks under horovodrun (Gloo) with HOROVOD_CYCLE_TIME set, each rank
making common.parallel.distribution.Distribution: plain (its own init, as a data-parallel run's) or
dynamic (hvd.init(process_sets="dynamic") first, as runs with groups of ranks had before their
static sets; Distribution's init is then a no-op). Each rank then times --reps repetitions of --calls eager allreduces of one float64 (Distribution.allreduce_sum:
each is submitted, negotiated in the next cycle of Horovod's background thread, and reduced), after
20 untimed ones. A row's figure is rank 0's median over the repetitions of the time per allreduce,
and the CPU seconds per wall second the idle process burns over 2 s (the background thread cycling
with nothing to reduce). The two inits at one cycle time differ by what dynamic sets add to every
cycle: with them, Horovod 0.28.1's RunLoopOnce (horovod/common/operations.cc) first calls
ProcessSetTable::InitializeRegisteredAndRemoveMarkedIfReady, an allgather of two ints among all
ranks (Allgather2Ints, horovod/common/process_set.cc), in every cycle whether or not a set changes.

Refuses to measure (one `error:` line, exit 2) when the load average is above 0.5 per core;
--allow-load measures anyway and the table says the load. Writes bench/results/horovod_cycle_<ISA>.md
and .json (--out-dir).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import common  # noqa: E402,F401  (oneDNN on before TensorFlow loads: common/cpu.py)
from bench import machine_load  # noqa: E402

RESULTS = REPO / "bench" / "results"
RANKS = 2
WARMUP_CALLS = 20
IDLE_S = 2.0


def worker(dynamic: bool, calls: int, reps: int, out: str) -> None:
    """One rank: time the allreduces and the idle cycling, then write rank-N.json into `out`."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import horovod.tensorflow as hvd

    from common.parallel.distribution import Distribution

    if dynamic:  # first: Distribution's own init is then a no-op
        hvd.init(process_sets="dynamic")
    dist = Distribution()
    for _ in range(WARMUP_CALLS):
        dist.allreduce_sum([1.0])
    per_call = []
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(calls):
            dist.allreduce_sum([1.0])
        per_call.append((time.perf_counter() - start) / calls)
    dist.barrier()
    cpu, wall = time.process_time(), time.perf_counter()
    time.sleep(IDLE_S)
    idle = (time.process_time() - cpu) / (time.perf_counter() - wall)
    dist.barrier()
    record = {
        "rank": dist.rank,
        "cycle": dist.cycle_time.describe(),
        "per_call_s": per_call,
        "idle_cpu_s_per_s": idle,
    }
    (Path(out) / f"rank-{dist.rank}.json").write_text(json.dumps(record))


def measure(cycle_ms: str, dynamic: bool, calls: int, reps: int) -> dict:
    """One row: 2 ranks launched with HOROVOD_CYCLE_TIME=cycle_ms; rank 0's figures."""
    from common import launchers

    env = {k: v for k, v in os.environ.items() if k != "HOROVOD_DYNAMIC_PROCESS_SETS"}
    env |= {"HOROVOD_CYCLE_TIME": cycle_ms, "PYTHONPATH": str(REPO)}
    with tempfile.TemporaryDirectory() as tmp:
        cmd = launchers.horovodrun(RANKS) + [
            sys.executable,
            str(Path(__file__).resolve()),
            "--worker",
            "--dynamic" if dynamic else "--plain",
            "--calls",
            str(calls),
            "--reps",
            str(reps),
            "--out",
            tmp,
        ]
        proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"horovodrun failed ({proc.returncode}): {proc.stderr[-2000:]}")
        rank0 = json.loads((Path(tmp) / "rank-0.json").read_text())
    per_call = rank0["per_call_s"]
    return {
        "cycle_ms": float(cycle_ms),
        "init": "dynamic" if dynamic else "plain",
        "horovod_read": rank0["cycle"],
        "allreduce_ms_median": 1e3 * statistics.median(per_call),
        "allreduce_ms_min": 1e3 * min(per_call),
        "allreduce_ms_max": 1e3 * max(per_call),
        "idle_cpu_s_per_s": rank0["idle_cpu_s_per_s"],
    }


def lscpu() -> dict:
    """lscpu's Model name and the AVX flags among its Flags."""
    fields = dict(
        (key.strip(), value.strip())
        for key, _, value in (
            line.partition(":")
            for line in subprocess.check_output(["lscpu"], text=True).splitlines()
        )
    )
    return {
        "model_name": fields.get("Model name", "?"),
        "avx": sorted(f for f in fields.get("Flags", "").split() if f.startswith("avx")),
    }


def markdown(machine: dict, rows: list, command: str) -> str:
    loads = ", ".join(f"{r['load_per_core'] * machine['cores']:.2f}" for r in rows)
    lines = [
        "# Horovod's cycle: dynamic process sets against plain init, 2 ranks",
        "",
        f"CPU {machine['model_name']} (lscpu Model name), {machine['cores']} core(s), AVX flags "
        f"{' '.join(machine['avx'])}; Horovod {machine['horovod']} over Gloo on loopback, "
        f"TensorFlow {machine['tensorflow']}; measured {machine['date']} by `{command}`. "
        f"Load average (uptime, 1 min) before each row: {loads} on {machine['cores']} cores"
        + (
            "."
            if max(r["load_per_core"] for r in rows) <= machine_load.QUIET_PER_CORE
            else f" (NOT QUIET, above {machine_load.QUIET_PER_CORE} per core: the figures are "
            "upper bounds, other jobs shared the cores)."
        ),
        "",
        "Per row: rank 0's median time of one eager allreduce of one float64 over the "
        "repetitions (min-max beside it), and the CPU seconds per second the idle process burns.",
        "",
        "| HOROVOD_CYCLE_TIME | init | Horovod read | allreduce, ms (min-max) | idle CPU s/s |",
        "|---:|---|---|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['cycle_ms']:g} ms | {r['init']} | {r['horovod_read']} | "
            f"{r['allreduce_ms_median']:.3f} ({r['allreduce_ms_min']:.3f}-"
            f"{r['allreduce_ms_max']:.3f}) | {r['idle_cpu_s_per_s']:.2f} |"
        )
    lines.append("")
    for cycle in sorted({r["cycle_ms"] for r in rows}):
        by = {r["init"]: r for r in rows if r["cycle_ms"] == cycle}
        if {"plain", "dynamic"} <= by.keys():
            extra = by["dynamic"]["allreduce_ms_median"] - by["plain"]["allreduce_ms_median"]
            lines.append(
                f"At {cycle:g} ms, dynamic process sets add {extra:+.3f} ms to each allreduce "
                f"({by['dynamic']['allreduce_ms_median'] / by['plain']['allreduce_ms_median']:.2f}x "
                "plain init's)."
            )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--cycles-ms", default="0.1,1", help="HOROVOD_CYCLE_TIME values, comma-separated"
    )
    p.add_argument("--calls", type=int, default=200, help="allreduces per repetition")
    p.add_argument("--reps", type=int, default=5, help="repetitions per row")
    p.add_argument("--allow-load", action="store_true", help="measure on a busy machine")
    p.add_argument("--out-dir", default=str(RESULTS))
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--dynamic", action="store_true", help=argparse.SUPPRESS)
    mode.add_argument("--plain", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args.dynamic, args.calls, args.reps, args.out)
        return 0
    refusal = machine_load.refusal(args.allow_load)
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    import horovod
    import tensorflow as tf

    from common import cpu
    from common.errors import write_text_atomic

    machine = (
        cpu.describe()
        | lscpu()
        | {
            "cores": cpu.cores(),
            "horovod": horovod.__version__,
            "tensorflow": tf.__version__,
            "date": time.strftime("%Y-%m-%d"),
        }
    )
    command = "python bench/horovod_cycle.py" + "".join(f" {a}" for a in (argv or sys.argv[1:]))
    rows = []
    for cycle in args.cycles_ms.split(","):
        for dynamic in (False, True):
            load = machine_load.per_core()
            rows.append(measure(cycle, dynamic, args.calls, args.reps) | {"load_per_core": load})
            print(f"[bench] {json.dumps(rows[-1])}", flush=True)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = "horovod_cycle_" + machine["isa"].replace(" ", "_")
    write_text_atomic(
        out / f"{name}.json", json.dumps({"machine": machine, "rows": rows}, indent=2) + "\n"
    )
    write_text_atomic(out / f"{name}.md", markdown(machine, rows, command))
    print(markdown(machine, rows, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
