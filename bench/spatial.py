"""Spatial parallelism on this machine: samples/s, memory per rank and the halo's share of the step,
each splitting benchmark's models unsplit (K=1) and split K=2 ways, the halo overlapped and not.

  python bench/spatial.py                                  # every row: the quiet run (~25 min, 2 cores)
  python bench/spatial.py --configs cosmoflow/configs/cosmoflow_spatial_256.yaml --ks 2 --halo-overlap on
  python bench/spatial.py --configs cosmoflow/configs/cosmoflow_spatial_256.yaml --slab-control   # + the control
  python bench/spatial.py --configs deepcam/configs/deepcam_closed_gbs1024.yaml --halo-overlap on --shard-optimizer
  python bench/spatial.py --allow-load --steps 1 --configs cosmoflow/configs/cosmoflow_closed_gbs512.yaml \\
      --set data.sample_shape=32,32,32,4 --out-dir /tmp/smoke      # a smoke run on a busy machine

Rows: the configs of each benchmark's `spatial_bench` in common/benchmarks.py (CosmoFlow: the
reference's model at 128^3, the 256^3 config's; DeepCAM: its full model at 768x1152), at local
batch 1, fp32, each K in --ks, and for K > 1 with parallel.halo_overlap on and off (off is left
out where the overlapped row overlapped no layer: DeepCAM's split exchanges first either way).
A row is its own launch of K ranks under horovodrun (Gloo), so that its peak RSS is its own; its
data.data_dir a one-sample synthetic set (a preprocessing may read its statistics); the rows
measured so far are written after each one.

Per row, after one warm-up step: --steps timed training steps of the real TrainStep on random
inputs of the task's shapes (samples/s: one group's samples over the slowest rank's time), then
one more step under a Horovod timeline (HOROVOD_TIMELINE=DYNAMIC, Distribution.timeline) whose
rank-0 view gives the halo's share of that step: the union of the alltoalls' time in flight
(submitted by rank 0 until done, forward and backward) and of their transfers alone (waiting for
the other rank and for Horovod's cycle left out), over the step's wall time. In flight is not
lost time when overlapped: the samples/s of the two K=2 rows say what the overlap saves here;
Gloo over loopback shares the cores with the convolutions it overlaps, so that is this host's
answer, not a GPU node's. Peak RSS is each rank's high-water mark (ru_maxrss); "above import"
subtracts the RSS once TensorFlow and Horovod are loaded. What every rank holds whole whatever K
(weights, optimizer slots, one set of gradients, the gathered activations) is listed with its
size beside each row: it is why K=2 holds more than half of K=1. Halo bytes: what each exchange
sends forward, recorded as the model is built; backward sends as much again per exchange but
those on the model's input (the alltoalls/step column counts both directions).

Refuses to measure (one `error:` line, exit 2) when the load average is above 0.5 per core;
--allow-load measures anyway and the table says the load. Writes bench/results/spatial_<ISA>.md
and .json (--out-dir), and --json for bench/report.py.

--slab-control adds, for each K > 1, a control row: K ranks training the unsplit model data-parallel,
each on one slab of the sample (1/K of its depth or height), one thread each, the gradients averaged
over the K ranks as the split's are. That is a split with its halo exchanges and gathers taken out:
what K one-thread processes do with the split's share of the work on the same cores. The split's
samples/s against the control's is what its own collectives cost; the control's against K=1 is what
running the work as K one-thread processes instead of one K-thread process costs (its head sees a
slab's features, so it has fewer parameters than the split's, which gathers before the head).
"""

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench import horovod_timeline, machine_load  # noqa: E402
from common import benchmarks, launchers  # noqa: E402

RESULTS = REPO / "bench" / "results"
GIB = 2**30


def _rss_gib() -> float:
    """This process's peak resident set so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _current_rss_gib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / GIB


def plan(
    configs: list[str] | None,
    ks: list[int],
    overlaps: list[bool],
    slab_control: bool = False,
    shard_optimizer: bool = False,
) -> list[dict]:
    """The rows, in order: per config of the table (or of `configs`, each one of the table's), each K
    and, for K > 1, each halo_overlap (with `shard_optimizer`, the optimizer sharded over the group), then
    the slab control (`slab_control`: K ranks, unsplit, on a slab each)."""
    owners = {c: b.name for b in benchmarks.BENCHMARKS for c in b.spatial_bench}
    for c in configs or ():
        if c not in owners:
            raise SystemExit(
                f"error: --configs {c}: not a spatial_bench config of common/benchmarks.py "
                f"(those are: {', '.join(owners)})"
            )
    rows = []
    for c in configs or owners:
        for k in ks:
            rows += [
                {
                    "benchmark": owners[c],
                    "config": c,
                    "spatial_ranks": k,
                    "ranks": k,
                    "halo_overlap": overlap,
                }
                | ({"shard_optimizer": True} if k > 1 and shard_optimizer else {})
                for overlap in (overlaps if k > 1 else [None])
            ]
            if k > 1 and slab_control:
                rows.append(
                    {
                        "benchmark": owners[c],
                        "config": c,
                        "spatial_ranks": 1,
                        "ranks": k,
                        "halo_overlap": None,
                        "slab_control": k,
                    }
                )
    return rows


def slab_overrides(row: dict, overrides: dict) -> dict:
    """A slab control row's config overrides: the sample cut to 1/K along the benchmark's split axis."""
    from common.config import load_model_config

    k, b = row["slab_control"], benchmarks.get(row["benchmark"])
    whole = load_model_config(
        benchmarks.config_class(row["benchmark"]), REPO / row["config"], overrides
    ).data
    if b.spatial_split == "depth":
        shape = list(whole.sample_shape)
        shape[0] //= k
        return {"data.sample_shape": ",".join(map(str, shape))}
    return {"data.height": whole.height // k}


def row_config(row: dict, sets: list[str]):
    from common.config import load_model_config

    b = benchmarks.get(row["benchmark"])
    overrides = dict(s.split("=", 1) for s in sets)
    if row.get("slab_control"):
        overrides |= slab_overrides(row, overrides)
    overrides |= {b.local_batch_key: 1, "parallel.spatial_ranks": row["spatial_ranks"]}
    if row["halo_overlap"] is not None:
        overrides["parallel.halo_overlap"] = row["halo_overlap"]
    if row.get("shard_optimizer"):
        overrides["parallel.shard_optimizer"] = True
    return load_model_config(
        benchmarks.config_class(row["benchmark"]), REPO / row["config"], overrides
    )


def build_recording_sends(task, bn_group, mesh) -> tuple:
    """(the task's model, the bytes each of its halo exchanges sends forward): every exchange of either
    benchmark goes through mesh.neighbour_planes, whose input's static shape is known as the model is
    built (on the wire in float32). Backward sends as much again for each exchange whose input needs
    a gradient (all but one reading the model's input)."""
    sends, exchange = [], mesh.neighbour_planes

    def recording(x, halo, name):
        planes = exchange(x, halo, name)
        sends.append(
            4 * math.prod(d for d in planes.sent.shape if d is not None)
        )  # per sample: batch 1
        return planes

    mesh.neighbour_planes = recording
    try:
        net = task.build_model(bn_group)
    finally:
        mesh.neighbour_planes = exchange
    return net, sends


def replicated_bytes(net, optimizer) -> dict:
    """What every rank of a group holds whole, whatever K: the weights, the optimizer's slots, one set
    of gradients, and the gathered activations (per sample): the gathers' outputs and CosmoFlow's head
    after its gather."""
    from common.parallel.spatial import GatherSlabs
    from common.parallel.spatial_rows import GatherRows

    def size(tensors) -> int:  # per sample: a layer's output has no batch size
        return int(
            sum(t.shape[int(t.shape[0] is None) :].num_elements() * t.dtype.size for t in tensors)
        )

    first = next(
        (i for i, layer in enumerate(net.layers) if isinstance(layer, GatherSlabs)), len(net.layers)
    )
    gathered = [
        layer for i, layer in enumerate(net.layers) if i >= first or isinstance(layer, GatherRows)
    ]
    slots = [v for v in optimizer.variables if v.shape.rank]  # the step counter aside
    return {
        "weights": size(net.weights),
        "optimizer_slots": size(slots),
        "gradients": size(net.trainable_weights),
        "gathered_activations": size([layer.output for layer in gathered]),
    }


def halo_shares(timeline: Path, step_seconds: float) -> dict:
    """The alltoalls' share of the step under the timeline: in flight (rank 0 submitted it, to done)
    and transferring (the collective's own activity), each the union over the step's alltoalls."""

    def union(spans) -> float:
        total, end = 0.0, float("-inf")
        for b, e in sorted(spans):
            total += max(0.0, e - max(b, end))
            end = max(end, e)
        return total

    halos = [t for t in horovod_timeline.activities(timeline).values() if "ALLTOALL_end" in t]
    in_flight = union((t["NEGOTIATE_ALLTOALL_begin"], t["ALLTOALL_end"]) for t in halos)
    transfer = union((t["ALLTOALL_begin"], t["ALLTOALL_end"]) for t in halos)
    return {
        "alltoalls": len(halos),
        "halo_in_flight_share": in_flight / 1e6 / step_seconds,
        "halo_transfer_share": transfer / 1e6 / step_seconds,
    }


def worker(args) -> int:
    os.environ["HOROVOD_TIMELINE"] = (
        "DYNAMIC"  # read at hvd.init: a timeline started and stopped at will
    )
    import numpy as np
    import tensorflow as tf

    from common.parallel.distribution import Distribution
    from common.parallel.sharded_optimizer import optimizer_shard
    from common.parallel.spatial_mesh import split_mesh
    from common.run.steps import TrainStep
    from common.run.trainer import batchnorm_group

    row = json.loads(args.row)
    cfg = row_config(row, args.set)
    k = row["spatial_ranks"]
    # The spatial groups and the trainer's batch-norm groups (batchnorm_group_size x K).
    dist = Distribution(group_sizes=(k, k * getattr(cfg.model, "batchnorm_group_size", 1)))
    tf.config.threading.set_intra_op_parallelism_threads(max(1, (os.cpu_count() or 1) // dist.size))
    mesh = split_mesh(dist, k)  # k = 1 too: the unsplit row runs the same recording code
    base_rss = _current_rss_gib()
    task = benchmarks.task_class(row["benchmark"])(cfg, mesh if mesh.is_split else None)
    # The trainer's batch-norm group (a split sample's statistics over its K slabs) and optimizer shard.
    net, sends = build_recording_sends(task, batchnorm_group(dist, task), mesh)
    optimizer, _ = task.build_optimizer(1, steps_per_epoch=100)
    # TrainStep builds the optimizer for the shard's variables.
    shard = optimizer_shard(net, mesh) if cfg.parallel.shard_optimizer else None
    step = TrainStep(
        net,
        optimizer,
        task.build_losses(),
        dist,
        preprocess=task.preprocess_batch,
        gradient_scales=task.gradient_scales(net),
        shard=shard,
    )
    specs = task.input_specs()
    rng = np.random.default_rng(
        0
    )  # small non-negative integers (counts, classes), floats in [-1, 1)
    batch = tuple(
        tf.constant(
            rng.integers(0, 3, s.shape) if s.dtype.is_integer else rng.uniform(-1, 1, s.shape),
            dtype=s.dtype,
        )
        for s in specs
    )

    def seconds(steps: int) -> float:
        dist.barrier()
        start = time.perf_counter()
        for _ in range(steps):
            loss = step(iter([batch])).loss
        float(loss)
        return time.perf_counter() - start

    seconds(1)  # warm-up: traces the step
    timed = float(dist.allreduce_max([seconds(args.steps)])[0]) / args.steps
    record = {}
    if mesh.is_split:
        with tempfile.TemporaryDirectory(prefix="bench_spatial_timeline.") as tmp:
            path = Path(tmp) / "timeline.json"  # rank 0's; every rank enters the block
            with dist.timeline(path):
                under_timeline = seconds(1)
            if dist.rank == 0:
                record = halo_shares(path, under_timeline)
    slab = specs[0].shape  # [B, Zs, ...spatial, C]: split along its first spatial axis
    slabs = row.get("slab_control") or mesh.size  # a control rank holds a slab too, unsplit
    record |= {
        "rank": dist.rank,
        "seconds_per_step": timed,
        "peak_rss_gib": _rss_gib(),
        "import_rss_gib": base_rss,
        "sample": [slab[1] * slabs, *slab[2:-1]],
        "halo_bytes_forward": sum(sends),
        "halo_exchanges_forward": len(sends),
        "overlapping_layers": sum(bool(getattr(layer, "overlaps", False)) for layer in net.layers),
        "parameters": int(sum(np.prod(v.shape) for v in net.trainable_variables)),
        "replicated_bytes": replicated_bytes(net, optimizer),
        "threads": tf.config.threading.get_intra_op_parallelism_threads(),
    }
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"rank-{dist.rank:05d}.json").write_text(json.dumps(record))
    dist.barrier()
    return 0


def synthetic_data(benchmark: str, folder: Path, env: dict) -> Path:
    """A one-sample synthetic set of the benchmark's generator (common/benchmarks.py) in `folder`: the
    steps train on random tensors, but a task's preprocessing may read the set's statistics (DeepCAM's
    normalization reads stats.h5)."""
    b = benchmarks.get(benchmark)
    cmd = [
        sys.executable,
        "-m",
        b.generator,
        "--output-dir",
        str(folder),
        *b.generator_args,
        "--n-train",
        "1",
        "--n-valid",
        "1",
    ]  # the last flags win
    subprocess.run(cmd, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL)
    return folder


def launch(row: dict, steps: int, sets: list[str], settle: bool) -> tuple[float, list[dict]]:
    """One launch of the row's ranks: the load per core before it and each rank's record."""
    env = os.environ | {"PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}
    with tempfile.TemporaryDirectory(prefix="bench_spatial.") as tmp:
        data = synthetic_data(row["benchmark"], Path(tmp) / "data", env)
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            json.dumps(row),
            "--steps",
            str(steps),
            "--out",
            tmp,
            f"--set=data.data_dir={data}",
            *[f"--set={s}" for s in sets],
        ]
        cmd = launchers.on_this_host(cmd, row["ranks"])
        # The previous row's own load out of the 1-minute average first (not for a smoke run: --allow-load).
        load = machine_load.settle() if settle else machine_load.per_core()
        print(f"[bench] load {load:.2f} per core: {' '.join(cmd)}", flush=True)
        code = subprocess.run(cmd, cwd=REPO, env=env).returncode
        if code != 0:
            raise RuntimeError(f"{row}: exited with status {code} (its output is above)")
        return load, [json.loads(p.read_text()) for p in sorted(Path(tmp).glob("rank-*.json"))]


def measure(row: dict, steps: int, sets: list[str], settle: bool = True) -> dict:
    load, ranks = launch(row, steps, sets, settle)
    r = ranks[0]
    dims = r["sample"]
    return row | {
        "sample": dims,
        "sample_name": f"{dims[0]}^{len(dims)}"
        if len(set(dims)) == 1
        else "x".join(map(str, dims)),
        "halo": halo_label(row, r["overlapping_layers"]),
        "overlapping_layers": r["overlapping_layers"],
        "parameters": r["parameters"],
        "threads_per_rank": r["threads"],
        "samples_per_s": 1.0 / r["seconds_per_step"],
        "seconds_per_step": r["seconds_per_step"],
        "load_per_core_before": load,
        "peak_rss_gib_per_rank": max(x["peak_rss_gib"] for x in ranks),
        "peak_rss_above_import_gib": max(x["peak_rss_gib"] - x["import_rss_gib"] for x in ranks),
        "import_rss_gib": max(x["import_rss_gib"] for x in ranks),
        "replicated_gib": {key: value / GIB for key, value in r["replicated_bytes"].items()},
        "halo_mib_forward_per_rank": r["halo_bytes_forward"] / 2**20,
        "halo_exchanges_forward": r["halo_exchanges_forward"],
        "alltoalls_per_step": r.get("alltoalls"),
        "halo_in_flight_share": r.get("halo_in_flight_share"),
        "halo_transfer_share": r.get("halo_transfer_share"),
    }


def halo_label(row: dict, overlapping_layers: int) -> str:
    """The table's halo column: how the row's exchanges ran, and whether its optimizer was sharded."""
    if row.get("slab_control"):
        return f"none: {row['ranks']} slabs unsplit (control)"
    if row["halo_overlap"] is None:
        return "-"
    label = "exchanged first"
    if row["halo_overlap"]:
        label = "overlapped" if overlapping_layers else "exchanged first (nothing overlaps)"
    return label + ("; optimizer sharded" if row.get("shard_optimizer") else "")


def same_split(a: dict, b: dict) -> bool:
    return (a["config"], a["spatial_ranks"], a.get("slab_control")) == (
        b["config"],
        b["spatial_ranks"],
        b.get("slab_control"),
    )


def with_unsplit_ratios(rows: list[dict]) -> list[dict]:
    """Each row with its peak RSS above import and its samples/s over those of the unsplit row (one
    rank, K=1) of its config and sample."""
    unsplit = {(r["config"], r["sample_name"]): r for r in rows if r["ranks"] == 1}
    out = []
    for r in rows:
        base = unsplit.get((r["config"], r["sample_name"]))
        out.append(
            r
            | {
                "above_import_vs_unsplit": base
                and r["peak_rss_above_import_gib"] / base["peak_rss_above_import_gib"],
                "speed_vs_unsplit": base and r["samples_per_s"] / base["samples_per_s"],
            }
        )
    return out


def _share(value) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _ratio(value) -> str:
    return "-" if value is None else f"{value:.2f}x"


def fusion_buffer(environ) -> str:
    """Horovod's fusion buffer the rows' ranks get, as Horovod reads it at init. On this CPU its size
    moves a split rank's peak RSS (Gloo reduces fused gradients in it), so the table says it."""
    value = environ.get("HOROVOD_FUSION_THRESHOLD")
    return f"HOROVOD_FUSION_THRESHOLD={value} B" if value else "128 MiB (Horovod's default)"


def markdown(machine: dict, rows: list[dict], command: str) -> str:
    loads = [r["load_per_core_before"] for r in rows]
    quiet = max(loads) <= machine_load.QUIET_PER_CORE
    lines = [
        f"# Spatial parallelism: {machine['isa']}",
        "",
        f"CPU {machine['cpu']} ({machine['isa']}), {machine['cores']} core(s), "
        f"TensorFlow {machine['tensorflow']}, Horovod over Gloo on one machine, its fusion buffer "
        f"{machine['fusion_buffer']}; measured {machine['date']} "
        f"by `{command}`. One sample per step (local batch 1), fp32; K ranks share the cores. "
        f"Load average per core before the rows: "
        f"{min(loads):.2f}-{max(loads):.2f}"
        + (
            "."
            if quiet
            else f" (NOT QUIET, above {machine_load.QUIET_PER_CORE}: a smoke run, its timings are not figures)."
        ),
        "",
        "| benchmark | sample | K | halo | params | threads/rank | samples/s | speed vs K=1 | peak RSS/rank GiB "
        "| above import GiB | vs K=1 | halo MiB/rank forward | exchanges forward | alltoalls/step "
        "| halo in flight | halo transfer |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ratio, speed = _ratio(r["above_import_vs_unsplit"]), _ratio(r["speed_vs_unsplit"])
        lines.append(
            f"| {r['benchmark']} | {r['sample_name']} | {r['ranks']} | {r['halo']} | "
            f"{r['parameters']:,} | {r['threads_per_rank']} | {r['samples_per_s']:.3f} | {speed} | "
            f"{r['peak_rss_gib_per_rank']:.2f} | {r['peak_rss_above_import_gib']:.2f} | {ratio} | "
            f"{r['halo_mib_forward_per_rank']:.1f} | {r['halo_exchanges_forward'] or '-'} | "
            f"{r['alltoalls_per_step'] or '-'} | "
            f"{_share(r['halo_in_flight_share'])} | {_share(r['halo_transfer_share'])} |"
        )
    lines += [
        "",
        "Held whole by every rank, whatever K (GiB; gradients: one set, during the step; gathered: the "
        "gathers' outputs and the layers after a gathered head, per sample, saved for backward):",
        "",
        "| benchmark | sample | K | TF + Horovod at import | weights | optimizer slots | gradients | gathered |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        g = r["replicated_gib"]
        if r["halo_overlap"] is not False and not r.get(
            "slab_control"
        ):  # one line per sample and K
            lines.append(
                f"| {r['benchmark']} | {r['sample_name']} | {r['spatial_ranks']} | "
                f"{r['import_rss_gib']:.2f} | {g['weights']:.3f} | {g['optimizer_slots']:.3f} | "
                f"{g['gradients']:.3f} | {g['gathered_activations']:.3f} |"
            )
    unsplit = [name for name in benchmarks.names() if not benchmarks.get(name).spatial_bench]
    if unsplit:
        lines += [
            "",
            f"Not measured: {', '.join(unsplit)} (samples not split; its entry in common/benchmarks.py "
            "names the configs once they are).",
        ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--configs",
        help="comma-separated: some of the table's spatial_bench configs (default: all)",
    )
    p.add_argument("--ks", default="1,2", help="spatial ranks, comma-separated (default 1,2)")
    p.add_argument(
        "--halo-overlap", default="on,off", help="for K > 1: on, off or both (default on,off)"
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override for every row (e.g. data.sample_shape=32,32,32,4 for a smoke run)",
    )
    p.add_argument(
        "--slab-control",
        action="store_true",
        help="for each K > 1, also K unsplit ranks on a slab each: the split without its collectives",
    )
    p.add_argument(
        "--shard-optimizer",
        action="store_true",
        help="for K > 1, the optimizer's state sharded over the group (parallel.shard_optimizer)",
    )
    p.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up step")
    p.add_argument(
        "--allow-load",
        action="store_true",
        help="measure above 0.5 load per core (a smoke run: the table says the load)",
    )
    p.add_argument("--json", help="also write the rows here (bench/report.py)")
    p.add_argument("--out-dir", default=str(RESULTS))
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        args.row = args.worker
        return worker(args)
    refusal = machine_load.refusal(args.allow_load)
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    overlaps = [{"on": True, "off": False}[v] for v in args.halo_overlap.split(",")]
    import tensorflow as tf

    from common import cpu
    from common.errors import write_text_atomic

    machine = cpu.describe() | {
        "cores": cpu.cores(),
        "tensorflow": tf.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "fusion_buffer": fusion_buffer(os.environ),
    }
    command = "python bench/spatial.py" + "".join(f" {a}" for a in (argv or sys.argv[1:]))
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = "spatial_" + machine["isa"].replace(" ", "_")
    rows = []
    for row in plan(
        args.configs.split(",") if args.configs else None,
        [int(k) for k in args.ks.split(",")],
        overlaps,
        args.slab_control,
        args.shard_optimizer,
    ):
        if not row["halo_overlap"] and any(
            same_split(r, row) and r["halo_overlap"] and not r["overlapping_layers"] for r in rows
        ):
            continue  # its overlapped row overlapped nothing (DeepCAM's rows exchange first): the same run
        rows.append(measure(row, args.steps, args.set, settle=not args.allow_load))
        print(f"[bench] {json.dumps(rows[-1])}", flush=True)
        # Written after every row, so that a row that fails (out of memory) leaves those before it.
        measured = with_unsplit_ratios(rows)
        table = markdown(machine, measured, command)
        record = json.dumps({"machine": machine, "rows": measured}, indent=2)
        write_text_atomic(out / f"{name}.json", record)
        write_text_atomic(out / f"{name}.md", table)
    if args.json:
        write_text_atomic(args.json, record)
    print("\n" + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
