"""python -m offline.preflight: its flags and the order every rank runs it in (offline/preflight/__init__.py).

Every rank makes every collective, in the same order; rank 0 alone prints and writes
<output>/preflight.json (and <output>/machine.yaml when it measured this host).
"""

import argparse
import dataclasses
import functools
import json
import shlex
import subprocess
import sys
from pathlib import Path

from common import benchmarks, cpu
from common.cli import tool_main
from common.errors import ExitCode, InputError
from offline.preflight import host, ranks, sweep, verdict
from offline.projection import inputs

TAG = "[preflight]"


class _Parser(argparse.ArgumentParser):
    """Flag errors as one `error:` line (tool_main), not argparse's usage and exit."""

    def error(self, message):
        raise InputError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m offline.preflight",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--bench",
        default="cosmoflow",
        choices=benchmarks.names(),
        help="the benchmark (default cosmoflow)",
    )
    p.add_argument(
        "--config", help="the config to benchmark (default: the benchmark's synthetic config)"
    )
    p.add_argument(
        "--data-dir",
        help="its data set (default: a few synthetic samples written under --output-dir "
        "on each node, for the synthetic config only)",
    )
    p.add_argument(
        "--output-dir",
        default="runs/preflight",
        help="where the benchmark run, machine.yaml and preflight.json go (default runs/preflight)",
    )
    p.add_argument("--steps", type=int, default=20, help="timed benchmark steps (default 20)")
    p.add_argument(
        "--tiny", action="store_true", help="shrink the config into a smoke run (train.py --tiny)"
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override for the benchmark (train.py --set; repeatable)",
    )
    p.add_argument(
        "--machine",
        help="machines/*.yaml (a path or a name of machines/) to project on (default: "
        "a file describing this host, measured now)",
    )
    p.add_argument(
        "--tolerance",
        type=float,
        default=2.0,
        help="measured/projected step within this factor either way is 'within' (default 2)",
    )
    p.add_argument(
        "--expect-gpus",
        type=int,
        metavar="N",
        help="exit 1 unless every rank's TensorFlow sees N GPUs",
    )
    p.add_argument(
        "--sweep-sizes",
        default=",".join(map(str, sweep.DEFAULT_SIZES)),
        help="allreduce sizes in bytes, e.g. 8,64K,1M (default 8 B to 64 MiB, x8 apart)",
    )
    p.add_argument(
        "--sweep-iterations", type=int, default=10, help="timed allreduces per size (default 10)"
    )
    p.add_argument(
        "--no-benchmark", action="store_true", help="the ranks' facts and the sweep only"
    )
    return p


def check_args(args, bench) -> str:
    """The config to benchmark, after the checks that need no TensorFlow (InputError: one line)."""
    for name, value, least in (
        ("--steps", args.steps, 1),
        ("--sweep-iterations", args.sweep_iterations, 1),
        ("--expect-gpus", args.expect_gpus, 0),
    ):
        if value is not None and value < least:
            raise InputError(f"{name} must be at least {least}, got {value}")
    if not args.tolerance > 1:
        raise InputError(f"--tolerance is a factor above 1, got {args.tolerance}")
    synthetic = benchmarks.REPO / bench.synthetic_config
    config = Path(args.config) if args.config else synthetic
    if not config.is_file():
        raise InputError(f"--config {config}: no such file")
    if args.data_dir is None and config.resolve() != synthetic.resolve() and not args.no_benchmark:
        raise InputError(
            f"--config {config} needs --data-dir: the preflight writes synthetic data for "
            f"{bench.synthetic_config} only"
        )
    if args.data_dir is not None and not Path(args.data_dir).is_dir():
        raise InputError(f"--data-dir {args.data_dir}: no such directory")
    return str(config)


@tool_main()
def main(argv=None) -> int:
    """Returns 0; 1 when --expect-gpus is not met; 2 after one `error:` line (bad input, a GPU two ranks share)."""
    args = build_parser().parse_args(argv)
    sizes = sweep.parse_sizes(args.sweep_sizes)
    bench = benchmarks.get(args.bench)
    config = check_args(args, bench)
    machine = (
        inputs.load_machine(args.machine) if args.machine else None
    )  # an unknown file fails here

    # TensorFlow and Horovod once the input is known to be good.
    import horovod.tensorflow as hvd
    import tensorflow as tf

    from common import config as config_lib
    from common import runtime as runtime_lib
    from common.parallel.distribution import Distribution
    from common.run import trainer

    task_class = benchmarks.task_class(bench.name)
    dist = Distribution()
    say = functools.partial(print, flush=True) if dist.is_root else _silent
    out = Path(args.output_dir)
    data_dir = Path(args.data_dir) if args.data_dir else out / "data" / f"node-{dist.node_rank}"
    train_argv = [
        config,
        bench.data_flag,
        str(data_dir),
        bench.output_flag,
        str(out / "benchmark"),
        "--benchmark",
        str(args.steps),
        *(["--tiny"] if args.tiny else []),
        *[a for kv in args.overrides for a in ("--set", kv)],
    ]
    config_path, overrides = config_lib.parse_overrides(task_class, train_argv)
    cfg, _ = config_lib.load_run_config(task_class, config_path, overrides, dist.size)
    # As the benchmark's trainer will: pin the device, size the threads, refuse a GPU two ranks share.
    runtime = runtime_lib.configure(cfg.runtime, dist)

    facts = dist.allgather_object(
        ranks.this_rank(dist, runtime, len(tf.config.list_physical_devices("GPU")))
    )
    built = {"nccl": hvd.nccl_built(), "mpi": hvd.mpi_built(), "gloo": hvd.gloo_built()}
    say(
        f"{TAG} {dist.describe()}; Horovod built with "
        + ", ".join(
            f"{name} {'yes' if built[key] else 'no'}"
            for key, name in (("nccl", "NCCL"), ("mpi", "MPI"), ("gloo", "Gloo"))
        )
    )
    say(ranks.facts_table(facts))
    report = {
        "ranks": [dataclasses.asdict(f) for f in facts],
        "horovod": dist.describe(),
        "built": built,
    }
    short = ranks.too_few_gpus(facts, args.expect_gpus)
    if short:
        if dist.is_root:
            _write_report(out, report)
            print(f"error: {short}", file=sys.stderr, flush=True)
        dist.barrier()
        return ExitCode.CRASH

    rows = sweep.run_sweep(dist, sizes, args.sweep_iterations)
    say(
        sweep.sweep_table(
            rows,
            f"{TAG} allreduce sweep: single eager Horovod allreduces ({dist.controller()}, "
            f"{dist.size} ranks on {dist.num_nodes} node(s)), float32 sum, each timed end to end "
            f"(Horovod's cycle and negotiation included: not bare NCCL, for which run nccl-tests' "
            f"all_reduce_perf), {args.sweep_iterations} timed after 2 untimed; "
            f"busbw = algbw x 2(n-1)/n",
        )
        if rows
        else f"{TAG} allreduce sweep: one rank, nothing to reduce"
    )
    report["sweep"] = [dataclasses.asdict(r) for r in rows]
    if args.no_benchmark:
        if dist.is_root:
            _write_report(out, report)
        dist.barrier()
        return ExitCode.OK

    if machine is None:
        machine = _measure_this_host(dist, runtime["device"], rows, out, argv)
        say(
            f"{TAG} no --machine: wrote {out / 'machine.yaml'} for this host (matmul peak and memory measured now)"
        )
    if args.data_dir is None:  # a few synthetic samples per node, written by its first rank
        task = task_class(cfg, None)
        per_step = dist.size * task.local_batch_size * cfg.train.gradient_accumulation_frequency
        counts = {"data.n_train": 2 * per_step, "data.n_valid": dist.size * task.local_batch_size}
        if dist.local_rank == 0:
            _write_synthetic(bench, data_dir, counts["data.n_train"], counts["data.n_valid"])
        train_argv += [a for key, n in counts.items() for a in ("--set", f"{key}={n}")]
        dist.barrier()
    say(f"{TAG} benchmark: {bench.train_script} {shlex.join(train_argv)}")
    code = trainer.main(
        task_class, train_argv
    )  # the real trainer, every rank (its own barrier at the end)
    if code != ExitCode.OK:
        return code
    if dist.is_root:
        throughput = json.loads((out / "benchmark" / "summary.json").read_text())["throughput"]
        config_path, overrides = config_lib.parse_overrides(task_class, train_argv)
        run_cfg, _ = config_lib.load_run_config(task_class, config_path, overrides, dist.size)
        judged = verdict.judge(
            machine,
            verdict.model_costs(task_class(run_cfg, None)),
            bench.name,
            throughput,
            dist.num_nodes,
            runtime["device"],
            args.tolerance,
        )
        print(f"{TAG} verdict: {judged.line()}", flush=True)
        report["benchmark"] = throughput
        report["verdict"] = dataclasses.asdict(judged) | {
            "ratio": judged.ratio,
            "within": judged.within,
        }
        _write_report(out, report)
    dist.barrier()  # the ranks leave together, as train.py's do: none is ended by the launcher mid-write
    return ExitCode.OK


def _silent(*args, **kwargs) -> None:
    pass


def _write_report(out: Path, report: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "preflight.json").write_text(json.dumps(report, indent=2, default=str) + "\n")


def _measure_this_host(dist, device: str, rows, out: Path, argv):
    """Every rank measures its device at once; rank 0 writes <out>/machine.yaml and returns it loaded (others: None)."""
    import tensorflow as tf

    dist.barrier()
    peaks = dist.allgather_object(host.measure(device))
    path = out / "machine.yaml"
    if dist.is_root:
        node_cpu, source = host.lscpu()
        if device == "gpu":
            details = tf.config.experimental.get_device_details(
                tf.config.list_physical_devices("GPU")[0]
            )
            name = details.get("device_name", "GPU")
        else:
            name = f"{node_cpu.model or 'CPU'}, {cpu.cores()} CPU(s) per rank"
        rows = list(rows)
        latency = rows[0].seconds / (2 * (dist.size - 1)) if rows else None
        out.mkdir(parents=True, exist_ok=True)
        path.write_text(
            host.machine_yaml(
                host=dist.hostname,
                cpu=node_cpu,
                cpu_source=source,
                device_name=name,
                matmul_edge=host.matmul_edge(device),
                peaks=peaks,
                devices_per_node=dist.local_size,
                busbw=rows[-1].busbw if rows else None,
                latency_s=latency,
                ranks=dist.size,
                command="python -m offline.preflight " + shlex.join(argv or sys.argv[1:]),
            )
        )
    dist.barrier()
    return inputs.load_machine(path) if dist.is_root else None


def _write_synthetic(bench, data_dir: Path, n_train: int, n_valid: int) -> None:
    """The benchmark's generator (common/benchmarks.py), with the synthetic config's sample shape, few samples."""
    cmd = [
        sys.executable,
        "-m",
        bench.generator,
        "--output-dir",
        str(data_dir),
        *bench.generator_args,
        "--n-train",
        str(n_train),
        "--n-valid",
        str(n_valid),
        "--workers",
        "1",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{shlex.join(cmd)} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}"
        )
