"""The table of benchmarks: one entry per benchmark, read by Python and the sbatch scripts.

  python -m common.benchmarks names                        # cosmoflow deepcam
  python -m common.benchmarks get deepcam data_flag        # --data_dir_prefix
  python -m common.benchmarks get deepcam train_script data_flag   # one field a line
  python -m common.benchmarks job-config deepcam 8         # what a job of 8 ranks runs, and why

A benchmark is its folder (`<name>/train.py`, `<name>/configs/`, its task, config and synthetic
data generator), one entry here and its block of Makefile rules (data, run, bench); slurm/*.sbatch,
offline/, bench/ and the tests take everything else they need from this table. This module imports
neither TensorFlow nor the benchmark packages: classes are named by "module:Class" strings and
imported only when asked for (`task_class`, `config_class`, `load`), so shell can read the table
cheaply.
"""

import dataclasses
import importlib
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class PublishedRate:
    """A published training rate per accelerator, which a site's first job stands beside
    (slurm/first_job.sbatch, offline/first_job.py).

    Attributes:
      samples_per_s: training samples/s per accelerator.
      accelerator: the accelerator, as the result's system description names it.
      accelerators: how many trained the model (the log's nodes x accelerators per node).
      nodes: the nodes they were in.
      local_batch: samples an accelerator took a step: the global batch over the accelerators and the
        gradient accumulation.
      precision: the arithmetic the run trained in.
      log: the MLPerf log the rate is read from, a path in github.com/mlcommons/hpc_results_v3.0
        (tests/fixtures/hpc_results_v3.0_nvidia holds a copy; tests/test_first_job.py reads it again).
      how: how the rate is read from the log, and the spread of the result set it belongs to.
    """

    samples_per_s: float
    accelerator: str
    accelerators: int
    nodes: int
    local_batch: int
    precision: str
    log: str
    how: str


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """One benchmark. Paths are relative to the repository root.

    Attributes:
      name: folder, `--bench` value and BENCH of make and sbatch.
      submission_name: the MLPerf benchmark name (submission layout, result summarizer, RCP tables).
      train_script: the training entry point.
      task_class: "module:Class" of the benchmark's Task.
      config_class: "module:Class" of its config dataclass.
      data_flag: train.py's flag for the data directory.
      output_flag: train.py's flag for the run directory.
      stage_flag: train.py's flag for the node-local staging directory.
      local_batch_key: the config key of the per-rank batch (ranks x it = train.global_batch_size).
      synthetic_config: the config that the Makefile's run target trains (synthetic data, CPU).
      closed_configs: glob of the closed-division configs, one per RCP global batch.
      generator: module writing synthetic data (`python -m <generator> --output-dir DIR ...`).
      generator_args: the generator's arguments for data of the synthetic config's sample shape (the
        Makefile's data target passes the same).
      closed_generator_args: the generator's arguments for data of the closed configs' sample shape
        (slurm/first_job.sbatch's synthetic data).
      published_rate: the published per-accelerator training rate a first job is compared with.
      throughput_bench: the script `make bench-<name>` runs; '' when there is none.
      published_train_samples: training samples of the full data set as published (offline.projection's
        epoch); 0 when unknown.
      published_eval_samples: its validation samples (offline.projection's evaluation pass).
      published_dataset_bytes: its size as published, the bytes offline.projection stages.
      throughput_args: that script's arguments for the compute rows of `make bench` (bench/report.py).
      full_model_config: a closed config to build the full-size model and optimizer from
        (offline/measure_model_costs.py, bench/checkpoint_cost.py); the architecture is the same in
        every closed config of a benchmark. '' leaves the benchmark out of both.
      one_core_reader: "module:function" (cfg, workdir, n) -> tf.data.Dataset: the benchmark's reader,
        one tf.data thread, on n synthetic full-size samples it writes into workdir (the input figure of
        offline/measure_model_costs.py); '' measures no input figure.
      one_core_reader_samples: samples that figure times, after one untimed.
      input_bench: the module of the benchmark's variants in bench/input_pipeline.py, imported when that
        bench runs: its frozen dataclass `Options` (the bench's --<name>-<field> flags, defaults and help)
        and `variants(run: bench.bench_timing.Run, options: Options) -> list[bench.bench_timing.Row]`;
        '' leaves it out of that bench.
      spatial_split: the axis along which `parallel.spatial_ranks` K (train.py's spatial-ranks flag)
        splits every sample across K ranks: 'depth' (a volume's z) or 'height' (a map's rows); '' when the benchmark
        cannot split. offline/projection picks the network it rebuilds by it (`split_along`).
      spatial_bench: the configs bench/spatial.py builds its models from (a benchmark with a spatial_split),
        each measured unsplit and split 2 ways: the sizes its rows show; () leaves the benchmark out.
    """

    name: str
    submission_name: str
    train_script: str
    task_class: str
    config_class: str
    data_flag: str
    output_flag: str
    stage_flag: str
    local_batch_key: str
    synthetic_config: str
    closed_configs: str
    generator: str
    generator_args: tuple[str, ...]
    closed_generator_args: tuple[str, ...] = ()
    published_rate: PublishedRate | None = None
    throughput_bench: str = ""
    published_train_samples: int = 0
    published_eval_samples: int = 0
    published_dataset_bytes: float = 0.0
    throughput_args: tuple[str, ...] = ()
    full_model_config: str = ""
    one_core_reader: str = ""
    one_core_reader_samples: int = 4
    input_bench: str = ""
    spatial_split: str = ""
    spatial_bench: tuple[str, ...] = ()


SPLIT_AXES = ("depth", "height")  # the values spatial_split may take besides ''

BENCHMARKS = (
    Benchmark(
        name="cosmoflow",
        submission_name="cosmoflow",
        train_script="cosmoflow/train.py",
        task_class="cosmoflow.task:CosmoFlowTask",
        config_class="cosmoflow.config:CosmoFlowConfig",
        data_flag="--data-dir",
        output_flag="--output-dir",
        stage_flag="--stage-dir",
        local_batch_key="data.batch_size",
        synthetic_config="cosmoflow/configs/cosmoflow_synthetic_cpu.yaml",
        closed_configs="cosmoflow/configs/cosmoflow_closed_gbs*.yaml",
        generator="cosmoflow.synthetic",
        generator_args=("--size", "32", "--n-train", "4096", "--n-valid", "512"),
        closed_generator_args=("--size", "128"),  # 128^3 x 4, the closed configs' sample_shape
        # NVIDIA's v3.0 closed result on 64 DGX H100: global batch 512 on 512 GPUs.
        published_rate=PublishedRate(
            samples_per_s=201.2,
            accelerator="NVIDIA H100 80GB HBM3",
            accelerators=512,
            nodes=64,
            local_batch=1,
            precision="AMP (training.amp of NVIDIA's cosmoflow configs)",
            log="NVIDIA/results/eos_n64_ngc23.09_pytorch/strong/cosmoflow/result_0.txt",
            how=(
                "the median of the log's tracked_stats throughput (an epoch's training samples over "
                "its training time) over epochs 2-23, those of the timed run (run_stop at epoch 23), "
                "over the 512 GPUs; the set's 10 runs give 198.8-202.5. The log goes on past "
                "run_stop to epoch 119; with those epochs the median is 206.7"
            ),
        ),
        throughput_bench="bench/cosmoflow_throughput.py",
        # Sample counts: train_samples / eval_samples of every published v3.0 log read. 1.7 TB: the gzip
        # TFRecord tarball cosmoUniverse_2019_05_4parE_tf_v2.tar with its train, validation and test
        # folders (mlcommons/hpc, cosmoflow/README.md); the runs do not stage the test split.
        published_train_samples=524_288,
        published_eval_samples=65_536,
        published_dataset_bytes=1.7e12,
        throughput_args=("--batch-size", "2", "--n-samples", "16"),  # the closed model, 128^3 x 4
        full_model_config="cosmoflow/configs/cosmoflow_closed_gbs512.yaml",
        one_core_reader="cosmoflow.input_bench:one_core_reader",
        one_core_reader_samples=8,
        input_bench="cosmoflow.input_bench",
        spatial_split="depth",
        # The reference's model at 128^3 (the closed configs') and the 256^3 config's.
        spatial_bench=(
            "cosmoflow/configs/cosmoflow_closed_gbs512.yaml",
            "cosmoflow/configs/cosmoflow_spatial_256.yaml",
        ),
    ),
    Benchmark(
        name="deepcam",
        submission_name="deepcam",
        train_script="deepcam/train.py",
        task_class="deepcam.task:DeepCAMTask",
        config_class="deepcam.config:DeepCAMConfig",
        data_flag="--data_dir_prefix",
        output_flag="--output_dir",
        stage_flag="--stage_dir",
        local_batch_key="data.local_batch_size",
        synthetic_config="deepcam/configs/deepcam_synthetic_cpu.yaml",
        closed_configs="deepcam/configs/deepcam_closed_gbs*.yaml",
        generator="deepcam.synthetic",
        generator_args=(
            "--height",
            "128",
            "--width",
            "192",
            "--n-train",
            "512",
            "--n-valid",
            "64",
            "--cyclone-fraction",
            "0.003",
        ),
        # 768 x 1152 x 16 fields, as the closed configs' data.
        closed_generator_args=("--height", "768", "--width", "1152"),
        # NVIDIA's v3.0 closed result on 256 DGX H100: global batch 2048 on 2048 GPUs.
        published_rate=PublishedRate(
            samples_per_s=30.9,
            accelerator="NVIDIA H100 80GB HBM3",
            accelerators=2048,
            nodes=256,
            local_batch=1,
            precision="AMP (the log's precision_mode)",
            log="NVIDIA/results/eos_n256_ngc23.09_pytorch/strong/deepcam/result_0.txt",
            how=(
                "the median of the log's tracked_stats throughput (an epoch's training samples over "
                "its training time) over epochs 2-24, all of the timed run, over the 2048 GPUs; the "
                "set's 5 runs give 29.9-30.9"
            ),
        ),
        throughput_bench="bench/deepcam_throughput.py",
        # Sample counts: as cosmoflow's. 8.8 TB: MLCommons' MLPerf HPC v0.7 announcement
        # (mlcommons.org/en/news/mlperf-hpc-v07), a test split included.
        published_train_samples=121_266,
        published_eval_samples=15_158,
        published_dataset_bytes=8.8e12,
        # The full 56,454,720-parameter model at 192x288.
        throughput_args=("--height", "192", "--width", "288", "--n-samples", "8"),
        full_model_config="deepcam/configs/deepcam_closed_gbs1024.yaml",
        one_core_reader="deepcam.input_bench:one_core_reader",
        one_core_reader_samples=4,
        input_bench="deepcam.input_bench",
        spatial_split="height",
        # The full-size model, 768x1152 (its row split exchanges before each convolution).
        spatial_bench=("deepcam/configs/deepcam_closed_gbs1024.yaml",),
    ),
)
FIELDS = tuple(f.name for f in dataclasses.fields(Benchmark))


def names() -> tuple[str, ...]:
    """Every benchmark's name, in table order."""
    return tuple(b.name for b in BENCHMARKS)


def names_with(field: str) -> tuple[str, ...]:
    """The names of the benchmarks whose entry sets `field` (not '' or empty), in table order."""
    return tuple(b.name for b in BENCHMARKS if getattr(b, field))


def get(name: str) -> Benchmark:
    """The entry of benchmark `name`.

    Raises:
      KeyError: no benchmark has that name (the message lists those that do).
    """
    for b in BENCHMARKS:
        if b.name == name:
            return b
    raise KeyError(f"unknown benchmark {name!r}; known: {', '.join(names())}")


def split_along(axis: str) -> str:
    """The benchmark whose samples split along `axis` (a value of SPLIT_AXES).

    Raises:
      KeyError: no benchmark, or more than one, splits along it.
    """
    found = [b.name for b in BENCHMARKS if b.spatial_split == axis]
    if len(found) != 1:
        raise KeyError(
            f"{len(found)} benchmarks split along {axis!r} ({', '.join(found) or 'none'}); one expected"
        )
    return found[0]


def closed_configs(name: str) -> list[Path]:
    """The benchmark's closed-division config files, sorted."""
    return sorted(REPO.glob(get(name).closed_configs))


def load(spec: str):
    """What a "module:attribute" string of the table names, imported now."""
    module, _, attribute = spec.partition(":")
    return getattr(importlib.import_module(module), attribute)


def task_class(name: str):
    """The benchmark's Task class (imports the benchmark package, and so TensorFlow)."""
    return load(get(name).task_class)


def config_class(name: str):
    """The benchmark's config dataclass."""
    return load(get(name).config_class)


def closed_config_for_ranks(
    name: str, ranks: int, local_batch: int | None = None, accumulation: int | None = None
) -> Path | None:
    """The closed config whose RCP global batch `ranks` ranks run: ranks x local batch x accumulation
    == train.global_batch_size, with the config's local batch and accumulation unless given.

    Returns None when no closed config of the benchmark fits that many ranks.
    """
    for path, global_batch, config_local, config_accumulation in closed_config_batches(name):
        per_rank = (local_batch or config_local or 0) * (accumulation or config_accumulation)
        if global_batch and per_rank * ranks == global_batch:
            return path
    return None


def closed_config_for(task, overrides: dict, ranks: int) -> str:
    """The closed config whose train.global_batch_size this job gives; ConfigError if none does."""
    from common.errors import ConfigError

    bench = get(task.name)
    local_batch = overrides.get(bench.local_batch_key)
    accumulation = overrides.get("train.gradient_accumulation_frequency")
    # Ranks that split samples add no data parallelism: the global batch counts their groups.
    spatial = int(overrides.get("parallel.spatial_ranks", 1))
    if spatial > 1 and ranks % spatial == 0:
        ranks //= spatial
    path = closed_config_for_ranks(
        task.name,
        ranks,
        int(local_batch) if local_batch else None,
        int(accumulation) if accumulation else None,
    )
    if path is not None:
        return str(path)
    offered = ", ".join(
        f"{p.name} (global batch {gbs})" for p, gbs, _, _ in closed_config_batches(task.name)
    )
    raise ConfigError(
        f"no config given and no closed config of {task.name} has this job's global batch "
        f"({ranks} ranks): give a config file, or launch as one of {offered}"
    )


def closed_config_batches(name: str) -> list[tuple[Path, int | None, int | None, int]]:
    """(path, train.global_batch_size, local batch, gradient accumulation) of each closed config."""
    import yaml  # here, not at the top: the rest of the table needs nothing outside the standard library

    section, _, key = get(name).local_batch_key.partition(".")
    out = []
    for path in closed_configs(name):
        cfg = yaml.safe_load(path.read_text()) or {}
        train = cfg.get("train") or {}
        out.append(
            (
                path,
                train.get("global_batch_size"),
                (cfg.get(section) or {}).get(key),
                int(train.get("gradient_accumulation_frequency") or 1),
            )
        )
    return out


@dataclasses.dataclass(frozen=True)
class JobConfig:
    """What a job of `ranks` ranks runs when it is given no config (slurm/env.sh's job_config).

    Closed: `path`'s RCP global batch, reached as ranks x local_batch x accumulation; a local batch
    or accumulation other than the config's is a train.py override, the hyperparameters stay.
    Open: no closed config fits, so `path`'s hyperparameters at the global batch nearest its own.
    """

    path: Path
    ranks: int
    local_batch: int
    accumulation: int
    global_batch: int  # the config's train.global_batch_size (its RCP entry)
    closed: bool
    overrides: tuple[str, ...]  # train.py's arguments after the config: --set KEY=VALUE ...

    def describe(self) -> str:
        """One line for the job's log: the config, the division and how the global batch is reached."""
        run_batch = self.ranks * self.local_batch * self.accumulation
        shape = (
            f"{self.ranks} ranks x local batch {self.local_batch} x gradient accumulation "
            f"{self.accumulation} = global batch {run_batch}"
        )
        config = self.path.relative_to(REPO)
        if self.closed:
            return f"{config}, closed division: {shape}, its RCP's"
        return (
            f"{config}, OPEN division: no RCP global batch is a multiple of {self.ranks} ranks x a "
            f"local batch the closed configs use; {shape}, with the hyperparameters of global batch "
            f"{self.global_batch}"
        )


def job_config(name: str, ranks: int) -> JobConfig:
    """The config a job of `ranks` ranks runs: closed where one fits, else the nearest open one.

    Closed: the RCP global batch reached with the least gradient accumulation, at the config's own
    local batch or a divisor of it (what the closed configs fit in a GPU's memory), the larger local
    batch first: 32 DeepCAM ranks run global batch 128 at local batch 4 as its config says, one node
    of 4 runs it at accumulation 8. Open, when no RCP global batch is a multiple of ranks x such a
    local batch: at a config's own local batch, the accumulation that brings the job nearest (by
    ratio) to the config's global batch; of those, the config that needs the least accumulation.
    """
    key = get(name).local_batch_key
    configs = [c for c in closed_config_batches(name) if c[1] and c[2]]
    # (accumulation, -local batch, ...): the least accumulation first, then the larger local batch.
    fits = [
        (gbs // (ranks * lb), -lb, gbs, path, local, acc)
        for path, gbs, local, acc in configs
        for lb in range(local, 0, -1)
        if local % lb == 0 and gbs % (ranks * lb) == 0
    ]
    if fits:
        accumulation, minus_lb, gbs, path, local, config_accumulation = min(fits)
        lb, closed = -minus_lb, True
    else:

        def accumulation_and_distance(config):
            _, gbs, local, _ = config
            accumulation = max(1, round(gbs / (ranks * local)))
            return accumulation, abs(math.log(ranks * local * accumulation / gbs))

        path, gbs, local, config_accumulation = min(configs, key=accumulation_and_distance)
        accumulation, _ = accumulation_and_distance((path, gbs, local, 1))
        lb, closed = local, False
    sets = [f"{key}={lb}"] if lb != local else []
    if accumulation != config_accumulation:
        sets.append(f"train.gradient_accumulation_frequency={accumulation}")
    if not closed:
        sets.append("mlperf.division=open")
    overrides = tuple(arg for item in sets for arg in ("--set", item))
    return JobConfig(path, ranks, lb, accumulation, gbs, closed, overrides)


def _value(b: Benchmark, field: str) -> str:
    value = getattr(b, field)
    return " ".join(value) if isinstance(value, tuple) else str(value)


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("names", help="every benchmark's name, one a line")
    get_parser = commands.add_parser("get", help="fields of a benchmark's entry, one a line")
    get_parser.add_argument("name", choices=names())
    get_parser.add_argument("fields", nargs="+", choices=FIELDS, metavar="field")
    job = commands.add_parser(
        "job-config",
        help="what a job of RANKS ranks runs without CONFIG: a line saying it, the config, its "
        "train.py overrides",
    )
    job.add_argument("name", choices=names())
    job.add_argument("ranks", type=int)
    args = parser.parse_args(argv)
    if args.command == "names":
        print("\n".join(names()))
    elif args.command == "get":
        print("\n".join(_value(get(args.name), field) for field in args.fields))
    elif args.command == "job-config":
        if args.ranks < 1:
            print(f"error: RANKS must be >= 1, got {args.ranks}", file=sys.stderr)
            return 2
        plan = job_config(args.name, args.ranks)
        print("\n".join([plan.describe(), str(plan.path.relative_to(REPO)), *plan.overrides]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
