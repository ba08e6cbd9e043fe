"""Group batch norm's collectives on 2 ranks of this machine: their latency against Horovod's cycle time, and
what they add to a training step.

  python bench/group_batchnorm.py                                # cycle times default, 0.1, 0; 3 rounds
  python bench/group_batchnorm.py --cycle-times default,0.1 --model --rounds 2   # and the full-depth model's step
  python bench/group_batchnorm.py --cycle-times launcher --rounds 1 --append     # add rows to the results file

Each (round, cycle time) starts 2 ranks under horovodrun (Gloo) with HOROVOD_CYCLE_TIME set, or unset for
Horovod's default, or ('launcher') set inside each rank before Distribution() as train.py does for a run with
batch-norm groups (common/parallel/cycle_time.py); 1 intra-op thread each (2 ranks share the cores). Each rank
measures, after untimed calls:
  - idle CPU: the cores its process keeps busy for 2 s while its Python thread sleeps (Horovod's loop
    coordinates the ranks every cycle, tensors or not);
  - chain: --chain sequential allreduces of a batch-norm layer's moments (2 x 64 float32, each depending
    on the last) over the group of both ranks, in one tf.function: milliseconds per collective;
  - stack: forward and backward of --layers (1x1 conv, batch norm, ReLU) layers on a 1x32x48x64 batch, as
    group batch norm of 2 ranks (one allreduce per layer forward, one backward), as the same unfused layer
    whose group sum is replaced by a local multiply (the arithmetic without the collectives), and as Keras's
    fused batch norm (what a run without groups uses);
  - with --model, the same three for a training step (the real TrainStep: LAMB, gradient allreduce) of the
    model of each benchmark with a batch-norm group key (the table's config with `model.batchnorm_group_size`)
    at its synthetic config's size, local batch 1, its reference depth (model.middle_blocks 16).
The load average is taken before each launch and the machine flagged busy above 0.5 per core. Each figure is
the median over every timing of every round, with the slowest and fastest beside it. Writes
bench/results/group_batchnorm_<ISA>.json and .md (--append adds to them, so short runs build up the rounds);
the CPU is `lscpu`'s model name.
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
from common import benchmarks, launchers  # noqa: E402
from common.parallel import cycle_time  # noqa: E402

RESULTS = REPO / "bench" / "results"
RANKS = 2
CHANNELS = 64
STACK_SHAPE = (1, 32, 48, CHANNELS)
MODEL_DEPTH = {"model.middle_blocks": 16, "data.local_batch_size": 1}
VARIANTS = ("group of 2", "no collective", "fused, no group")


# ------------------------------------------------------------------ worker (one rank)
class LocalGroup:
    """A group of `size` ranks whose sum is `size` x this rank's tensor: group batch norm's arithmetic
    (unfused kernel, stacked moments, unbiased count) with no collective."""

    def __init__(self, size: int):
        self.size = size
        self.process_set = None

    def sum(self, tensor):
        return tensor * float(self.size)


def _bn_group(variant: str, group):
    return {"group of 2": group, "no collective": LocalGroup(group.size), "fused, no group": None}[variant]


def _timed(dist, call, repeats: int, calls: int) -> list[float]:
    """Seconds per call of `call()` (which returns a tensor), `repeats` timings of `calls` calls each,
    the slower rank's; two untimed calls first (tracing, first-use allocations)."""
    for _ in range(2):
        call().numpy()
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(calls):
            out = call()
        out.numpy()
        times.append(float(dist.allreduce_max([time.perf_counter() - start])[0]) / calls)
    return times


def chain_seconds(dist, group, n: int, repeats: int) -> list[float]:
    """Seconds per collective of a chain of `n` allreduces, each of the previous one's result."""
    import tensorflow as tf

    @tf.function
    def chain(x):
        for _ in range(n):
            x = group.sum(x) * 0.5
        return x

    x = tf.fill([2, CHANNELS], float(dist.rank))
    return [t / n for t in _timed(dist, lambda: chain(x), repeats, 1)]


def idle_cpu_share(dist, seconds: float = 2.0) -> float:
    """The CPU time this process spends while its Python thread sleeps, per second: Horovod's
    background loop coordinating the ranks every cycle with nothing to reduce (and TensorFlow idle)."""
    import resource
    dist.barrier()
    before = resource.getrusage(resource.RUSAGE_SELF)
    time.sleep(seconds)
    after = resource.getrusage(resource.RUSAGE_SELF)
    return (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / seconds


def stack_seconds(dist, bn_group, layers: int, repeats: int, calls: int) -> list[float]:
    """Seconds per forward + backward of `layers` (1x1 conv, batch norm, ReLU) layers."""
    import tensorflow as tf

    from common.parallel.sync_batchnorm import GroupBatchNormalization
    tf.keras.utils.set_random_seed(1)
    net = []
    for _ in range(layers):
        net.append(tf.keras.layers.Conv2D(CHANNELS, 1, use_bias=False))
        net.append(tf.keras.layers.BatchNormalization() if bn_group is None else GroupBatchNormalization(bn_group))
    x = tf.random.normal(STACK_SHAPE)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = x
            for layer in net:
                y = layer(y, training=True)
                if not isinstance(layer, tf.keras.layers.Conv2D):
                    y = tf.nn.relu(y)
            loss = tf.reduce_sum(y * y)
        return tf.reduce_sum(tape.gradient(loss, x))

    return _timed(dist, lambda: step(x), repeats, calls)


def grouped_benchmarks() -> list[str]:
    """The table's benchmarks whose config has a batch-norm group key."""
    from common.config_loading import field_type
    from common.errors import ConfigError
    names = []
    for b in benchmarks.BENCHMARKS:
        try:
            field_type(benchmarks.config_class(b.name), "model.batchnorm_group_size")
        except ConfigError:
            continue
        names.append(b.name)
    return names


def model_seconds(dist, name: str, bn_group, repeats: int, calls: int) -> tuple[list[float], int]:
    """Seconds per training step of benchmark `name`'s model at its synthetic size, and its batch-norm layers."""
    import numpy as np
    import tensorflow as tf

    from common.config_loading import load_config
    from common.run.steps import TrainStep
    b = benchmarks.get(name)
    cfg = load_config(benchmarks.config_class(name), REPO / b.synthetic_config, {"data.data_dir": "unused",
                                                                                 **MODEL_DEPTH})
    task = benchmarks.task_class(name)(cfg, None)
    tf.keras.utils.set_random_seed(1)
    net = task.build_model(bn_group)
    optimizer, _ = task.build_optimizer(RANKS, steps_per_epoch=100)
    step = TrainStep(net, optimizer, task.build_losses(), dist)
    rng = np.random.default_rng(0)
    batch = [tf.constant(rng.uniform(0, 1, s.shape).astype(s.dtype.as_numpy_dtype)) if s.dtype.is_floating
             else tf.constant(rng.integers(0, 3, s.shape).astype(s.dtype.as_numpy_dtype)) for s in task.input_specs()]
    batch[1] = tf.cast(batch[1], tf.int32)   # the labels as preprocess_batch gives them (classes)
    layers = sum(1 for layer in net.submodules if getattr(layer, "moving_mean", None) is not None)
    return _timed(dist, lambda: step(iter([tuple(batch)])).loss, repeats, calls), layers


def worker(args) -> int:
    import tensorflow as tf

    from common.parallel.distribution import Distribution
    if args.as_launcher:   # what common.run.launch does for a run with batch-norm groups, before Horovod's init
        cycle_time.set_for_batchnorm_groups(RANKS)
    dist = Distribution()
    seen = dist.cycle_time
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    group = dist.rank_group(RANKS)
    record = {"cycle_time_ms": seen.ms, "cycle_time": seen.describe(), "idle_cpu_share": idle_cpu_share(dist),
              "chain_s_per_collective": chain_seconds(dist, group, args.chain, args.repeats), "stack": {}, "model": {}}
    for variant in VARIANTS:
        record["stack"][variant] = stack_seconds(dist, _bn_group(variant, group), args.layers, args.repeats,
                                                 args.calls)
    if args.model:
        for name in grouped_benchmarks():
            record["model"][name] = {}
            for variant in VARIANTS:
                seconds, layers = model_seconds(dist, name, _bn_group(variant, group), args.repeats, args.calls)
                record["model"][name][variant] = seconds
                record["model"][name]["batchnorm_layers"] = layers
    if dist.is_root:
        Path(args.out).write_text(json.dumps(record))
    dist.barrier()
    return 0


# ------------------------------------------------------------------ driver
def lscpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no lscpu)"
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")),
                "unknown")


def load() -> dict:
    one, five, fifteen = os.getloadavg()
    cores = os.cpu_count() or 1
    return {"load_1m": one, "load_5m": five, "load_15m": fifteen, "per_core": one / cores,
            "busy": one / cores > 0.5}


def launch(cycle: str, args, model: bool) -> dict:
    """One 2-rank run at `cycle` ('default': HOROVOD_CYCLE_TIME unset); its rank 0 record and the load before it."""
    env = {k: v for k, v in os.environ.items() if k != cycle_time.ENV}
    if cycle not in ("default", "launcher"):
        env[cycle_time.ENV] = cycle
    env |= {"PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}
    before = load()
    with tempfile.TemporaryDirectory(prefix="bench_gbn.") as tmp:
        out = Path(tmp) / "rank0.json"
        cmd = launchers.horovodrun(RANKS) + [sys.executable, __file__, "--worker", "--out", str(out),
                                             "--chain", str(args.chain), "--layers", str(args.layers),
                                             "--repeats", str(args.repeats), "--calls", str(args.calls)]
        if model:
            cmd.append("--model")
        if cycle == "launcher":
            cmd.append("--as-launcher")
        print(f"[bench] load average {before['load_1m']:.2f}; {cycle_time.ENV}={cycle}: {' '.join(cmd)}", flush=True)
        start = time.time()
        code = subprocess.run(cmd, cwd=REPO, env=env, check=False).returncode
        if code != 0:
            raise RuntimeError(f"{cycle_time.ENV}={cycle}: exited with status {code} (its output is above)")
        record = json.loads(out.read_text())
    return record | {"load_before": before, "wall_s": time.time() - start, "requested": cycle}


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summarize(launches: list[dict]) -> list[dict]:
    """One row per cycle time: medians over every timing of every round, and their spread."""
    rows = []
    for cycle in dict.fromkeys(r["requested"] for r in launches):
        runs = [r for r in launches if r["requested"] == cycle]
        row = {"requested": cycle, "cycle_time": runs[0]["cycle_time"], "cycle_time_ms": runs[0]["cycle_time_ms"],
               "rounds": len(runs), "load_1m": [r["load_before"]["load_1m"] for r in runs],
               "idle_cpu_share": spread([r["idle_cpu_share"] for r in runs]),
               "chain_ms_per_collective": spread([1e3 * t for r in runs for t in r["chain_s_per_collective"]]),
               "stack_ms": {v: spread([1e3 * t for r in runs for t in r["stack"][v]]) for v in VARIANTS}}
        model_runs = [r for r in runs if r["model"]]
        if model_runs:
            row["model_ms"] = {name: {v: spread([1e3 * t for r in model_runs for t in r["model"][name][v]])
                                      for v in VARIANTS} | {"batchnorm_layers": model_runs[0]["model"][name]
                                                            ["batchnorm_layers"]}
                               for name in model_runs[0]["model"]}
        rows.append(row)
    return rows


def settings(args) -> dict:
    """What a launch's figures depend on besides the cycle time: launches appended together must agree."""
    return {"chain": args.chain, "layers": args.layers, "repeats": args.repeats, "calls": args.calls}


def _fig(s: dict) -> str:
    return f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})"


def markdown(machine: dict, args, rows: list[dict]) -> str:
    loads = [x for r in rows for x in r["load_1m"]]
    busy = max(loads) / machine["cores"] > 0.5
    lines = [f"# Group batch norm's collectives: {machine['cpu']} ({machine['isa']})", "",
             f"CPU `{machine['cpu']}` (lscpu), {machine['isa']}, {machine['cores']} core(s); {machine['stack']}; "
             f"Horovod {machine['horovod']} over Gloo, {RANKS} ranks on this machine, 1 intra-op thread each; measured "
             f"{machine['date']} by " + "; ".join(f"`python bench/group_batchnorm.py{' ' + a if a else ''}`"
                                                 for a in machine["argv"]) + ".", "",
             f"Load average (1 min) before the launches: {min(loads):.2f}-{max(loads):.2f} on {machine['cores']} "
             f"cores" + (": **above 0.5 per core: the machine was busy** (shared with other jobs), so these figures "
                         "carry their noise; read the spread beside each median." if busy else "."), "",
             ("Figures: median over every timing of every round (min-max in brackets); milliseconds. Idle CPU: "
              "cores one rank's process keeps busy while its Python thread sleeps (Horovod's loop coordinating "
              "the ranks each cycle). Per collective in the stack: (group of 2 - no collective) / "
              f"(2 x {args.layers}), one forward and one backward per layer."), "",
             f"| HOROVOD_CYCLE_TIME | as read at init | rounds | load 1 min | idle CPU | chain: ms per collective "
             f"| stack of {args.layers}: " + " | ".join(VARIANTS) + " | stack: ms per collective |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        s = r["stack_ms"]
        per = (s["group of 2"]["median"] - s["no collective"]["median"]) / (2 * args.layers)
        lines.append(f"| {r['requested']} | {r['cycle_time']} | {r['rounds']} | "
                     f"{', '.join(f'{x:.1f}' for x in r['load_1m'])} | {r['idle_cpu_share']['median']:.2f} | "
                     f"{_fig(r['chain_ms_per_collective'])} | " + " | ".join(_fig(s[v]) for v in VARIANTS)
                     + f" | {per:.2f} |")
    model_rows = [r for r in rows if "model_ms" in r]
    if model_rows:
        lines += ["", ("Training step (TrainStep, LAMB, gradient allreduce), local batch 1, "
                       f"{', '.join(f'{k}={v}' for k, v in MODEL_DEPTH.items())}, the synthetic config's size:"), "",
                  "| HOROVOD_CYCLE_TIME | model | BN layers | " + " | ".join(VARIANTS)
                  + " | group of 2 minus no collective |", "|---|---|---:|---:|---:|---:|---:|"]
        for r in model_rows:
            for name, m in r["model_ms"].items():
                extra = m["group of 2"]["median"] - m["no collective"]["median"]
                lines.append(f"| {r['requested']} | {name} | {m['batchnorm_layers']} | "
                             + " | ".join(_fig(m[v]) for v in VARIANTS) + f" | {extra:+.1f} ms |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cycle-times", default="default,0.1,0",
                   help="HOROVOD_CYCLE_TIME values in ms, comma-separated; 'default' leaves it unset; 'launcher' "
                        "leaves it to what train.py sets for batch-norm groups, in the process before Horovod's init")
    p.add_argument("--rounds", type=int, default=3,
                   help="launches per cycle time, in alternating order (0 with --append: rewrite the table only)")
    p.add_argument("--chain", type=int, default=200, help="collectives in the timed chain")
    p.add_argument("--layers", type=int, default=76, help="layers of the stack (76: the reference DeepCAM's BNs)")
    p.add_argument("--repeats", type=int, default=3, help="timings per figure in each launch")
    p.add_argument("--calls", type=int, default=3, help="calls per stack or model timing")
    p.add_argument("--model", action="store_true", help="also time the full-depth model's training step")
    p.add_argument("--append", action="store_true",
                   help="add to the launches already in the results file (short runs that build up the rounds)")
    p.add_argument("--out-dir", default=str(RESULTS))
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--as-launcher", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    cycles = args.cycle_times.split(",")
    import horovod

    from common import cpu, runtime
    from common.files import write_text_atomic
    out = Path(args.out_dir)
    path = out / f"group_batchnorm_{cpu.isa().replace(' ', '_')}.json"
    launches, argvs = [], []
    if args.append and path.exists():
        previous = json.loads(path.read_text())
        launches, argvs = previous["launches"], previous["machine"]["argv"]
        if previous["machine"]["settings"] != settings(args):
            p.error(f"--append: {path} was measured with {previous['machine']['settings']}, not {settings(args)}")
    for rnd in range(args.rounds):
        for cycle in (cycles if rnd % 2 == 0 else cycles[::-1]):   # a drift of the machine falls on every value
            launches.append(launch(cycle, args, args.model))
            print(f"[bench] round {rnd + 1}: {json.dumps(launches[-1])}", flush=True)
    machine = {"cpu": lscpu_model(), "isa": cpu.isa(), "cores": os.cpu_count(), "stack": runtime.software_stack(),
               "horovod": horovod.__version__, "date": time.strftime("%Y-%m-%d"),
               "settings": settings(args),
               "argv": argvs + ([" ".join(argv if argv is not None else sys.argv[1:])] if args.rounds else [])}
    rows = summarize(launches)
    table = markdown(machine, args, rows)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps({"machine": machine, "rows": rows, "launches": launches}, indent=2))
    write_text_atomic(path.with_suffix(".md"), table)
    print("\n" + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
