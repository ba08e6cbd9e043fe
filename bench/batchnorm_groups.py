"""What group batch norm's chain of collectives costs a step: DeepCAM's tiny config on 2 ranks under
horovodrun (Gloo), `--benchmark`, without groups and with `--batchnorm_group_size 2` at several
Horovod cycle times.

  python bench/batchnorm_groups.py --data DEEPCAM_DATA            # the 64x96 set of the tests
  python bench/batchnorm_groups.py --data DIR --cycles-ms 0.1,1 --steps 30

With groups, every batch-norm layer waits in its forward for one allreduce (the group's E[x] and
E[x^2] stacked) and in its backward for another (common/parallel/sync_batchnorm.py): two negotiated
collectives per layer and step, one after the other, each waiting for a cycle of Horovod's background
thread, and each cycle of a run with groups also allgathers the dynamic process sets' state
(bench/horovod_cycle.py). A row is one launch; its figure is rank 0's samples/s per rank from the
`[benchmark]` line. Refuses to measure (one `error:` line, exit 2) when the load average is above 0.5
per core; --allow-load measures anyway. Writes bench/results/batchnorm_groups_<ISA>.md (--out-dir),
naming the CPU and the load per core before each row.
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
from common.files import write_text_atomic  # noqa: E402

CONFIG = REPO / "tests" / "configs" / "deepcam_tiny.yaml"
RATE = re.compile(r"\[benchmark\].*?: ([0-9.]+) samples/s per rank")
CYCLE = re.compile(r"cycle time ([^;]*)")


def measure(data: str, group: int, cycle_ms: str, steps: int) -> dict:
    """One launch of 2 ranks: {'group', 'cycle', 'samples_per_s'} (cycle as the [init] line says it)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    if cycle_ms:
        env["HOROVOD_CYCLE_TIME"] = cycle_ms
    with tempfile.TemporaryDirectory() as out:
        cmd = launchers.horovodrun(2) + [
            sys.executable,
            str(REPO / "deepcam" / "train.py"),
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
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    rate, cycle = RATE.search(proc.stdout), CYCLE.search(proc.stdout)
    if proc.returncode != 0 or not rate:
        raise RuntimeError(f"the run failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return {"group": group, "cycle": cycle[1] if cycle else "?", "samples_per_s": float(rate[1])}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="a DeepCAM set of the tiny config's 64x96 samples")
    p.add_argument("--cycles-ms", default="0.1,1,0.01", help="HOROVOD_CYCLE_TIME of the group rows")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--out-dir", default=str(REPO / "bench" / "results"))
    p.add_argument("--allow-load", action="store_true", help="measure on a busy machine anyway")
    args = p.parse_args(argv)
    refusal = machine_load.refusal(args.allow_load)
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    plan = [(1, "")] + [(2, ms) for ms in args.cycles_ms.split(",")]
    rows = []
    for group, ms in plan:
        load = machine_load.per_core()
        rows.append(measure(args.data, group, ms, args.steps) | {"load_per_core": load})
        print(f"[bench] {rows[-1]}", flush=True)
    machine = cpu.describe() | lscpu()
    base = rows[0]["samples_per_s"]
    lines = [
        "# Group batch norm on 2 ranks: the chain of collectives",
        "",
        f"CPU: {machine['model_name']}, {os.cpu_count()} CPUs ({' '.join(machine['avx'])}). DeepCAM's "
        f"tiny config (64x96, width 1/8, 31 batch-norm layers), local batch 2, 2 ranks under horovodrun "
        f"(Gloo), `--benchmark {args.steps}`: `python bench/batchnorm_groups.py --data DIR "
        f"--cycles-ms {args.cycles_ms}`.",
        "",
        "| batch-norm group | Horovod cycle | samples/s per rank | vs no group | load per core before |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['group']} | {r['cycle']} | {r['samples_per_s']:.2f} | "
        f"{r['samples_per_s'] / base:.2f}x | {r['load_per_core']:.2f} |"
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
