"""Input pipelines alone, at full sample size: samples/s per rank and per CPU core, before and after staging.

  python bench/input_pipeline.py                          # both benchmarks, every variant
  python bench/input_pipeline.py --benchmark cosmoflow --n-samples 32 --json out.json

A GPU node feeds each of its devices from its CPU cores: an H100 consumes ~206
CosmoFlow or ~82 DeepCAM samples/s (published v3.0 logs), so 4 devices need
~820 or ~330 samples/s from the node. The figure to read is samples/s per core:
multiply it by the cores a node gives each device.

Each variant is the pipeline a training run builds (the benchmark's make_dataset,
training order, cache off so that every sample is read again), drawn without a
model, on files in the page cache (one untimed pass first), the median of --repeats timings
beside the slowest and fastest of them. The load average is printed before and after each
benchmark's variants: on a machine shared with other jobs, read the figures with it.
The consumer takes each batch and drops it, as a train step would after using it
(x.numpy() would copy it into fresh memory: a cost of the bench, not of the pipeline).
Each benchmark's variants live in the module its entry of common/benchmarks.py names
(`input_bench`, e.g. cosmoflow/input_bench.py, whose docstring lists them); its `Options`
fields are its flags here, --<benchmark>-<field> (--cosmoflow-size, --deepcam-height...).
Staging runs once per variant before the clock (its own figure is bench/staging_throughput.py).

Last, per benchmark, the train step's check for NaN and Inf (common.run.steps.all_finite) alone,
on one preprocessed batch in memory (float32, the model's input shape), timed as the step
runs it: it lives in the compiled step, not in the pipeline, so the readers' rows do not
include it; the printout says what it would cost beside the readers, as a share of each
current reader's time per sample.
"""

import argparse
import dataclasses
import importlib
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import tensorflow as tf  # noqa: E402

from common import (
    benchmarks,  # noqa: E402
    cpu,  # noqa: E402  (sets the oneDNN default before TensorFlow is imported)
)
from common.inputs.bench_timing import CHECK_VARIANT, Run  # noqa: E402


def input_benches() -> dict:
    """{benchmark: its input-bench module} of every entry that names one, in table order."""
    return {
        name: importlib.import_module(benchmarks.get(name).input_bench)
        for name in benchmarks.names_with("input_bench")
    }


def add_options(parser, name: str, options_class) -> None:
    """A benchmark's `Options` fields as --<name>-<field> flags, dest <name>_<field>."""
    for field in dataclasses.fields(options_class):
        parser.add_argument(
            f"--{name}-{field.name.replace('_', '-')}",
            dest=f"{name}_{field.name}",
            type=type(field.default),
            default=field.default,
            help=field.metadata.get("help"),
        )


def options_of(args, name: str, options_class):
    """The benchmark's `Options` from its --<name>-<field> flags."""
    return options_class(
        **{f.name: getattr(args, f"{name}_{f.name}") for f in dataclasses.fields(options_class)}
    )


def row(benchmark: str, r) -> dict:
    """A variant's Row as the table and the JSON hold it."""
    return {
        "benchmark": benchmark,
        "variant": r.variant,
        "sample": r.sample,
        "samples_per_s": r.samples_per_s,
        "samples_per_s_per_core": r.samples_per_s / cpu.cores(),
        "mb_per_file": r.mb_per_file,
        "mb_per_s": r.samples_per_s * r.mb_per_file,
        "slowest_fastest": list(r.spread),
    }


def print_rows(rows) -> None:
    print(
        f"\n{'benchmark':10s} {'variant':68s} {'sample':22s} {'samples/s':>10s} {'min-max':>13s} "
        f"{'per core':>9s} {'MB/s':>8s}"
    )
    for r in rows:
        spread = "-".join(f"{v:.1f}" for v in r["slowest_fastest"])
        print(
            f"{r['benchmark']:10s} {r['variant']:68s} {r['sample']:22s} {r['samples_per_s']:10.1f} {spread:>13s} "
            f"{r['samples_per_s_per_core']:9.1f} {r['mb_per_s']:8.0f}"
        )
    by = {}
    for r in rows:
        by.setdefault(r["benchmark"], []).append(r)
    for name, rs in by.items():
        readers = [r for r in rs if r["variant"] != CHECK_VARIANT]
        print(
            f"{name}: last variant / first = {readers[-1]['samples_per_s'] / readers[0]['samples_per_s']:.2f}x"
        )
        for check in (r for r in rs if r["variant"] == CHECK_VARIANT):
            for reader in readers[-2:]:  # the current unstaged and staged readers
                print(
                    f"{name}: the NaN/Inf check takes {reader['samples_per_s'] / check['samples_per_s']:.1%} of "
                    f"the time per sample of '{reader['variant']}' (were it run beside it on these cores)"
                )


def main(argv=None) -> int:
    modules = input_benches()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--benchmark", choices=(*modules, "all"), default="all")
    p.add_argument("--data-dir", default="data/bench_input")
    p.add_argument(
        "--n-samples", type=int, default=32, help="training files written and read per pass"
    )
    p.add_argument("--passes", type=int, default=2, help="passes over the files per timing")
    p.add_argument(
        "--repeats", type=int, default=3, help="timings per variant; the median is reported"
    )
    p.add_argument(
        "--readers",
        type=int,
        default=4,
        help="files in flight (data.read_parallelism / data.readers)",
    )
    for name, module in modules.items():
        add_options(p, name, module.Options)
    p.add_argument("--json", help="also write the rows and the machine here")
    args = p.parse_args(argv)
    rows, loads = [], {}
    with tempfile.TemporaryDirectory(prefix="bench_input.") as stage_root:
        run = Run(
            Path(args.data_dir),
            Path(stage_root),
            args.n_samples,
            args.passes,
            args.repeats,
            args.readers,
        )
        for name, module in modules.items():
            if args.benchmark in (name, "all"):
                before = load_average(f"{name}: before its variants")
                rows += [
                    row(name, r)
                    for r in module.variants(run, options_of(args, name, module.Options))
                ]
                loads[name] = {
                    "before": before,
                    "after": load_average(f"{name}: after its variants"),
                }
    facts = cpu.describe()
    print(
        f"\nInput pipelines alone, {cpu.cores()} core(s): CPU {facts['cpu']} ({facts['isa']}), "
        f"TensorFlow {tf.__version__}, files in page cache, cache off; load average (1, 5, 15 min) "
        + "; ".join(
            f"{name} {fmt(v['before'])} before, {fmt(v['after'])} after"
            for name, v in loads.items()
        )
    )
    print_rows(rows)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"machine": facts | {"cores": cpu.cores()}, "load_average": loads, "rows": rows},
                indent=2,
            )
        )
    return 0


def load_average(when: str) -> list[float]:
    """The 1, 5 and 15 minute load averages, printed: above the core count, other work shares the cores."""
    load = [round(x, 2) for x in os.getloadavg()]
    busy = (
        f" (above the {cpu.cores()} core(s): the figures share them)"
        if load[0] > cpu.cores()
        else ""
    )
    print(f"[input] load average {fmt(load)} {when}{busy}", flush=True)
    return load


def fmt(load) -> str:
    return " ".join(f"{x:.2f}" for x in load)


if __name__ == "__main__":
    sys.exit(main())
