"""What group batch norm's chain of collectives costs a step: DeepCAM's tiny config under horovodrun
(Gloo), `--benchmark`, without groups and with `--batchnorm_group_size 2` at Horovod cycle times.

  python bench/batchnorm_groups.py --data DEEPCAM_DATA                # 2 ranks, 0.1 ms
  python bench/batchnorm_groups.py --data DIR --ranks 2,4 --compare /tmp/before --steps 30

With groups, every batch-norm layer waits in its forward for one allreduce (the group's E[x] and
E[x^2] stacked) and in its backward for another (common/parallel/sync_batchnorm.py): two negotiated
collectives per layer and step, one after the other, each waiting for a cycle of Horovod's
background thread. On 2 ranks a group of 2 is the whole job (Horovod's global set, a plain
hvd.init()); on 4, groups of 2 are static process sets registered at init
(common/parallel/distribution.py), whose negotiation each cycle adds to the global set's.
--compare DIR runs each row also with another checkout's deepcam/train.py (e.g. `git archive` of an
older commit), alternately with this one's (after it; --compare-first: before it), so a load that
changes hits both alike. A row is one launch; its figure is rank 0's samples/s per rank from the
`[benchmark]` line; its process sets are as its `[init]` line says. Refuses to measure (one
`error:` line, exit 2) when the load average is above 0.5 per core; --allow-load measures anyway.
Writes bench/results/batchnorm_groups_<ISA>.md (--out-dir), naming the CPU and the load per core
before each row.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench import machine_load  # noqa: E402
from bench.horovod_cycle import lscpu  # noqa: E402
from common import cpu, launchers  # noqa: E402
from common.errors import write_text_atomic  # noqa: E402

CONFIG = REPO / "tests" / "configs" / "deepcam_tiny.yaml"
RATE = re.compile(r"\[benchmark\].*?: ([0-9.]+) samples/s per rank")
CYCLE = re.compile(r"cycle time ([^;(]*\([^)]*\))")


SETS = re.compile(r"(static process sets of [0-9, and]+ ranks|dynamic process sets)")


def measure(repo: Path, data: str, ranks: int, group: int, cycle_ms: str, steps: int) -> dict:
    """One launch of `ranks` ranks of `repo`'s deepcam/train.py: {'group', 'cycle', 'sets',
    'samples_per_s'} (the cycle and the process sets as the [init] line says them)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(repo))
    if cycle_ms:
        env["HOROVOD_CYCLE_TIME"] = cycle_ms
    with tempfile.TemporaryDirectory() as out:
        cmd = launchers.horovodrun(ranks) + [
            sys.executable,
            str(repo / "deepcam" / "train.py"),
            str(CONFIG),
            "--data_dir_prefix",
            data,
            "--output_dir",
            out,
            "--local_batch_size",
            "2",
            "--batchnorm_group_size",
            str(group),
            "--benchmark",
            str(steps),
        ]
        proc = subprocess.run(cmd, env=env, cwd=repo, capture_output=True, text=True, timeout=2400)
    rate, cycle, sets = (
        RATE.search(proc.stdout),
        CYCLE.search(proc.stdout),
        SETS.search(proc.stdout),
    )
    if proc.returncode != 0 or not rate:
        raise RuntimeError(f"the run failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return {
        "group": group,
        "cycle": cycle[1] if cycle else "?",
        "sets": sets[1] if sets else "none (plain hvd.init())",
        "samples_per_s": float(rate[1]),
    }


def label(repo: Path) -> str:
    """The checkout's name for the table: 'this tree' or the --compare directory's."""
    return "this tree" if repo == REPO else f"`{repo}`"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="a DeepCAM set of the tiny config's 64x96 samples")
    p.add_argument(
        "--ranks", default="2", help="the job sizes, comma-separated (4: oversubscribed)"
    )
    p.add_argument("--cycles-ms", default="0.1", help="HOROVOD_CYCLE_TIME of the group rows")
    p.add_argument("--compare", help="another checkout whose train.py runs each row too")
    p.add_argument("--compare-first", action="store_true", help="run --compare's before this one's")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--out-dir", default=str(REPO / "bench" / "results"))
    p.add_argument("--allow-load", action="store_true", help="measure on a busy machine anyway")
    args = p.parse_args(argv)
    refusal = machine_load.refusal(args.allow_load)
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    repos = [REPO] + ([Path(args.compare).resolve()] if args.compare else [])
    if args.compare_first:
        repos.reverse()
    plan = [
        (ranks, group, ms)
        for ranks in map(int, args.ranks.split(","))
        for group, ms in [(1, "")] + [(2, ms) for ms in args.cycles_ms.split(",")]
    ]
    rows = []
    for ranks, group, ms in plan:
        for repo in repos:  # alternately: a load that changes hits both
            load = machine_load.per_core()
            row = measure(repo, args.data, ranks, group, ms, args.steps)
            rows.append(row | {"ranks": ranks, "code": label(repo), "load_per_core": load})
            print(f"[bench] {rows[-1]}", flush=True)
    machine = cpu.describe() | lscpu()
    base = {(r["ranks"], r["code"]): r["samples_per_s"] for r in rows if r["group"] == 1}
    cores = os.cpu_count()
    oversubscribed = (
        f"; more ranks than the {cores} CPUs are oversubscribed"
        if max(r["ranks"] for r in rows) > cores
        else ""
    )
    lines = [
        "# Group batch norm: the chain of collectives",
        "",
        f"CPU: {machine['model_name']}, {cores} CPUs ({' '.join(machine['avx'])}). DeepCAM's "
        f"tiny config (64x96, width 1/8, 31 batch-norm layers), local batch 2, under horovodrun "
        f"(Gloo), `--benchmark {args.steps}`: `python bench/batchnorm_groups.py --data DIR "
        f"--ranks {args.ranks} --cycles-ms {args.cycles_ms}"
        f"{' --compare DIR' if args.compare else ''}"
        f"{' --compare-first' if args.compare_first else ''}`{oversubscribed}.",
        "",
        "| ranks | code | batch-norm group | process sets | Horovod cycle | samples/s per rank "
        "| vs no group | load per core before |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['ranks']} | {r['code']} | {r['group']} | {r['sets']} | {r['cycle']} | "
        f"{r['samples_per_s']:.2f} | {r['samples_per_s'] / base[r['ranks'], r['code']]:.2f}x | "
        f"{r['load_per_core']:.2f} |"
        for r in rows
    ]
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = "batchnorm_groups_" + machine["isa"].replace(" ", "_")
    write_text_atomic(out / f"{name}.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
