"""Spatial parallelism on this machine: memory per rank, samples/s and the halo's cost, K = 1, 2, 4.

  python bench/spatial.py                          # 128^3 at K = 1, 2, 4 and 256^3 at K = 1, 2
  python bench/spatial.py --sizes 128 --ks 1,2     # every size with every K given

K=4 is left out at 256^3 by default: four 256^3 ranks on a 24 GiB machine were killed by the
OOM killer (5.4 GB resident each, beside other work).

For each (edge N, K) it starts K ranks under horovodrun (Gloo; K > cores oversubscribes),
each building the CosmoFlow model of that size (the reference's 5 conv layers at 128^3,
log2(N) - 2 capped at 256 filters above: cosmoflow_spatial_256.yaml's model) split K ways,
and times training steps of the real TrainStep on one sample of random counts, twice: with
the halo exchange, and with it replaced by local zero padding (the same arithmetic without
the collectives), whose difference is the halo's share of the step. Peak RSS is each rank's
high-water mark (ru_maxrss) after the steps; "above import" subtracts the process's RSS
once TensorFlow and Horovod are loaded, so it counts the model, its activations and the
allocator's caches. Halo bytes: what one rank sends per step (forward and backward).
Writes bench/results/spatial_<ISA>.json and .md.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from common import benchmarks, launchers  # noqa: E402
from offline.projection.spatial import BENCHMARK  # noqa: E402  (the one benchmark whose samples are split)
RESULTS = REPO / "bench" / "results"
DEFAULT_PLAN = [(128, 1), (128, 2), (128, 4), (256, 1), (256, 2)]


def _rss_gib() -> float:
    """This process's peak resident set so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _current_rss_gib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


def model_config(edge: int, spatial_ranks: int):
    """The config of the model measured at this edge: the reference's below 256, the spatial configs' above."""
    from common.config_loading import load_config
    layers = max(5, edge.bit_length() - 1 - 2)   # log2(edge) - 2
    return load_config(benchmarks.config_class(BENCHMARK), overrides={
        "data.data_dir": "unused", "data.batch_size": 1, "data.sample_shape": (edge, edge, edge, 4),
        "data.n_train": 1, "data.n_valid": 1,
        "model.n_conv_layers": layers, "model.max_channels": None if layers == 5 else 256, "model.dropout": 0.0,
        "parallel.spatial_ranks": spatial_ranks})


def halo_bytes_per_step(net) -> int:
    """Bytes one interior rank sends per step: 2 halos of kernel // 2 planes per split conv, forward and backward."""
    total = 0
    for layer in net.layers:
        if getattr(layer, "holds_slab", False):
            _, _, y, x, c = layer.input.shape
            total += 2 * (layer.kernel_size[0] // 2) * y * x * c * 4
    return 2 * total


def worker(args) -> int:
    import numpy as np
    import tensorflow as tf
    from common.parallel.distribution import Distribution
    from common.parallel.spatial import gradient_scales
    from common.run.steps import TrainStep
    dist = Distribution()
    tf.config.threading.set_intra_op_parallelism_threads(max(1, (os.cpu_count() or 1) // dist.size))
    mesh = dist.spatial_mesh(args.spatial_ranks)
    base_rss = _current_rss_gib()
    cfg = model_config(args.size, args.spatial_ranks)
    task = benchmarks.task_class(BENCHMARK)(cfg, mesh if mesh.is_split else None)
    net = task.build_model(None)
    optimizer, _ = task.build_optimizer(1, steps_per_epoch=100)
    step = TrainStep(net, optimizer, task.build_losses(), dist, preprocess=task.preprocess_batch,
                     gradient_scales=gradient_scales(net))
    spec = task.input_specs()
    rng = np.random.default_rng(0)
    x = tf.constant(rng.poisson(2.0, size=spec[0].shape).astype(np.int16))
    y = tf.constant(rng.uniform(-1, 1, size=spec[1].shape).astype(np.float32))

    def timed(n):
        float(step(iter([(x, y)])).loss)  # warm-up (traces)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(n):
            loss = step(iter([(x, y)])).loss
        float(loss)
        return float(dist.allreduce_max([time.perf_counter() - start])[0]) / n

    seconds = timed(args.steps)
    peak = _rss_gib()
    no_halo = None
    if mesh.is_split:
        # The same steps with the neighbours' planes replaced by zeros: no collective, same arithmetic.
        mesh.exchange_halo = lambda t, halo, name: tf.pad(t, [[0, 0], [halo, halo], [0, 0], [0, 0], [0, 0]])
        step = TrainStep(net, optimizer, task.build_losses(), dist, preprocess=task.preprocess_batch,
                         gradient_scales=gradient_scales(net))
        no_halo = timed(args.steps)
    record = {"rank": dist.rank, "size": args.size, "spatial_ranks": mesh.size, "seconds_per_step": seconds,
              "seconds_per_step_without_halo": no_halo, "peak_rss_gib": peak, "import_rss_gib": base_rss,
              "halo_bytes_per_step": halo_bytes_per_step(net) if mesh.is_split else 0,
              "parameters": int(sum(np.prod(v.shape) for v in net.trainable_variables)),
              "threads": tf.config.threading.get_intra_op_parallelism_threads()}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"rank-{dist.rank:05d}.json").write_text(json.dumps(record))
    dist.barrier()
    return 0


def measure(size: int, k: int, steps: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench_spatial.") as tmp:
        cmd = [sys.executable, __file__, "--worker", "--sizes", str(size), "--ks", str(k), "--steps", str(steps),
               "--out", tmp]
        cmd = launchers.on_this_host(cmd, k)
        print(f"[bench] {size}^3, K={k}: {' '.join(cmd)}", flush=True)
        env = os.environ | {"PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}
        code = subprocess.run(cmd, cwd=REPO, env=env).returncode
        if code != 0:
            raise RuntimeError(f"{size}^3, K={k}: exited with status {code} (its output is above)")
        ranks = [json.loads(p.read_text()) for p in sorted(Path(tmp).glob("rank-*.json"))]
    r = ranks[0]
    with_halo, without = r["seconds_per_step"], r["seconds_per_step_without_halo"]
    return {"size": size, "spatial_ranks": k, "parameters": r["parameters"], "threads_per_rank": r["threads"],
            "samples_per_s": 1.0 / with_halo, "seconds_per_step": with_halo,
            "peak_rss_gib_per_rank": max(x["peak_rss_gib"] for x in ranks),
            "peak_rss_above_import_gib": max(x["peak_rss_gib"] - x["import_rss_gib"] for x in ranks),
            "halo_mib_per_step_per_rank": r["halo_bytes_per_step"] / 2**20,
            "halo_share_of_step": None if without is None else max(0.0, (with_halo - without) / with_halo)}


def markdown(machine: dict, rows: list[dict]) -> str:
    lines = [f"# Spatial parallelism: {machine['isa']}", "",
             f"CPU {machine['cpu']} ({machine['isa']}), {machine['cores']} core(s), TensorFlow {machine['tensorflow']}, "
             f"Horovod over Gloo on one machine; measured {machine['date']} by `python bench/spatial.py`. "
             "One sample per step (local batch 1), fp32; K ranks share the cores (K=4 oversubscribes 2 cores).", "",
             "| edge | K | params | threads/rank | samples/s | peak RSS/rank GiB | above import GiB | vs K=1 "
             "| halo MiB/step/rank | halo share of step |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    base = {r["size"]: r["peak_rss_above_import_gib"] for r in rows if r["spatial_ranks"] == 1}
    for r in rows:
        ratio = r["peak_rss_above_import_gib"] / base[r["size"]] if r["size"] in base else float("nan")
        share = "-" if r["halo_share_of_step"] is None else f"{100 * r['halo_share_of_step']:.0f}%"
        lines.append(f"| {r['size']}^3 | {r['spatial_ranks']} | {r['parameters']:,} | {r['threads_per_rank']} | "
                     f"{r['samples_per_s']:.3f} | {r['peak_rss_gib_per_rank']:.2f} | {r['peak_rss_above_import_gib']:.2f} | "
                     f"{ratio:.2f}x | {r['halo_mib_per_step_per_rank']:.1f} | {share} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", help="sample edges, comma-separated (with --ks: every pair)")
    p.add_argument("--ks", help="spatial ranks, comma-separated")
    p.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up step")
    p.add_argument("--json", help="also write the rows here (bench/report.py)")
    p.add_argument("--out-dir", default=str(RESULTS))
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        args.size, args.spatial_ranks = int(args.sizes), int(args.ks)
        return worker(args)
    if args.sizes or args.ks:
        plan = [(int(n), int(k)) for n in (args.sizes or "128").split(",") for k in (args.ks or "1,2").split(",")]
    else:
        plan = DEFAULT_PLAN
    rows = []
    for size, k in plan:
        rows.append(measure(size, k, args.steps))
        print(f"[bench] {json.dumps(rows[-1])}", flush=True)   # each row as it is measured
    from common import cpu
    from common.files import write_text_atomic
    import tensorflow as tf
    machine = cpu.describe() | {"cores": cpu.cores(), "tensorflow": tf.__version__, "date": time.strftime("%Y-%m-%d")}
    table = markdown(machine, rows)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = "spatial_" + machine["isa"].replace(" ", "_")
    write_text_atomic(out / f"{name}.json", json.dumps({"machine": machine, "rows": rows}, indent=2))
    write_text_atomic(out / f"{name}.md", table)
    if args.json:
        write_text_atomic(args.json, json.dumps({"machine": machine, "rows": rows}, indent=2))
    print("\n" + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
