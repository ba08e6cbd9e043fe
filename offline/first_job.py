"""A site's first job (slurm/first_job.sbatch): its synthetic data's size, and its report.

  python -m offline.first_job counts BENCH RANKS CONFIG [--set KEY=VALUE ...]   # prints N_TRAIN N_VALID
  python -m offline.first_job report --output-dir DIR [--gpus FILE] [--nccl-tests FILE] RUN_DIR...

`counts`: the synthetic set a job of RANKS ranks benchmarks CONFIG on: one global batch of training
samples (benchmark mode reads them again, step after step) and RANKS x local batch validation samples.

`report`: each RUN_DIR is a `train.py --benchmark` run; its summary.json gives samples/s. Writes
DIR/first_job.md (also printed) and DIR/first_job.json, each under a temporary name then renamed:
samples/s per GPU beside the benchmark's published per-GPU rate (common.benchmarks' published_rate,
its scale, local batch and log named), the input pipeline's rate alone, NCCL's version and network
from the runs' NCCL_DEBUG=INFO files (RUN_DIR/nccl/), the Horovod timeline (RUN_DIR/timeline.json),
nccl-tests' all_reduce_perf output (--nccl-tests) and the GPUs `nvidia-smi -L` listed (--gpus). A run
directory that is missing, or whose run failed, is refused: one `error:` line naming each, exit 2.
"""

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path

import yaml

from common import benchmarks
from common.cli import tool_main
from common.errors import ExitCode, InputError, write_text_atomic
from common.inputs.synthetic_files import MARKER

REPORT = "first_job"  # DIR/first_job.md and DIR/first_job.json
RESULTS = "https://github.com/mlcommons/hpc_results_v3.0/blob/main/"
# train.py --benchmark's summary.json: the throughput figures the report reads.
THROUGHPUT_KEYS = (
    "samples_per_s",
    "input_samples_per_s_per_rank",
    "ranks",
    "steps",
    "seconds",
    "local_batch_size",
    "gradient_accumulation",
    "global_batch_size",
    "precision",
)


class _Parser(argparse.ArgumentParser):
    """Flag errors as one `error:` line (tool_main), not argparse's usage and exit."""

    def error(self, message):
        raise InputError(message)


# --- counts -----------------------------------------------------------------------------------


def synthetic_counts(name: str, ranks: int, config: Path, overrides: dict) -> tuple[int, int]:
    """(training, validation) samples of the synthetic set a job of `ranks` ranks runs `config` on,
    with train.py's --set `overrides`: one global batch, and a local batch for every rank."""
    bench = benchmarks.get(name)
    try:
        raw = yaml.safe_load(config.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise InputError(f"{config}: {e}") from None
    local = int(_config_value(name, raw, overrides, bench.local_batch_key))
    accumulation = int(_config_value(name, raw, overrides, "train.gradient_accumulation_frequency"))
    return ranks * local * accumulation, ranks * local


def _config_value(name: str, raw: dict, overrides: dict, key: str):
    """`key` of a config: the override, else the YAML's value, else the config class's default."""
    if key in overrides:
        return overrides[key]
    node = raw
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if node is not None:
        return node
    value = benchmarks.config_class(name)()
    for part in key.split("."):
        value = getattr(value, part)
    return value


# --- report -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class NcclInfo:
    """What a run's NCCL_DEBUG=INFO files (RUN_DIR/nccl/, one a process) say of NCCL."""

    files: int
    version: str | None = None
    network: str | None = None  # "IB", "Socket", or a plugin's name


@dataclasses.dataclass(frozen=True)
class Run:
    """One benchmark run of the job, as its summary.json (and config.yaml) say."""

    benchmark: str
    run_dir: str
    device: str  # the ranks' device: 'gpu' or 'cpu'
    cpu: str
    nodes: int
    ranks: int
    local_batch: int
    accumulation: int
    global_batch: int
    precision: str
    steps: int
    seconds: float
    samples_per_s: float  # the job's, all ranks
    input_samples_per_s_per_rank: float
    data: str  # the data set, and whether it is synthetic
    timeline: str | None  # Horovod's timeline of the run, when one was written
    nccl: NcclInfo
    published: benchmarks.PublishedRate | None

    @property
    def samples_per_s_per_rank(self) -> float:
        """The job's samples/s over its ranks: per GPU, a rank to a GPU."""
        return self.samples_per_s / self.ranks

    @property
    def ratio(self) -> float | None:
        """Samples/s per rank over the published rate per accelerator."""
        if self.published is None:
            return None
        return self.samples_per_s_per_rank / self.published.samples_per_s


@dataclasses.dataclass(frozen=True)
class NcclTests:
    """nccl-tests' all_reduce_perf: bus bandwidth at its largest size, and its average."""

    file: str
    ranks: int
    largest_bytes: int
    busbw_out_of_place: float  # GB/s
    busbw_in_place: float
    average_busbw: float
    wrong: int  # results that did not check out (its #wrong columns): a fault, not a figure


def read_run(run_dir: Path) -> Run:
    """The run in `run_dir`. Raises InputError naming the file when it is missing or its run failed."""
    if not run_dir.is_dir():
        raise InputError(f"{run_dir}: no such run directory")
    path = run_dir / "summary.json"
    if not path.is_file():
        raise InputError(
            f"{path}: missing: the run did not finish (its lines are in the job's output)"
        )
    started = run_dir / ".started"
    if started.exists() and path.stat().st_mtime_ns < started.stat().st_mtime_ns:
        raise InputError(f"{path}: older than the run's start ({started}): an earlier run's")
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: not JSON: {e}") from None
    status = summary.get("status")
    if status != "benchmarked":
        why = (summary.get("failure") or {}).get("message")
        raise InputError(
            f"{path}: status {status!r}, not 'benchmarked': the run failed"
            + (f": {why}" if why else "")
        )
    t = summary.get("throughput") or {}
    missing = [k for k in THROUGHPUT_KEYS if k not in t]
    if missing:
        raise InputError(
            f"{path}: no throughput.{missing[0]} (not a train.py --benchmark run of this code)"
        )
    try:
        bench = benchmarks.get(summary.get("benchmark", ""))
    except KeyError as e:
        raise InputError(f"{path}: {e.args[0]}") from None
    runtime = summary.get("runtime") or {}
    timeline = run_dir / "timeline.json"
    return Run(
        benchmark=bench.name,
        run_dir=str(run_dir),
        device=runtime.get("device", "?"),
        cpu=_cpu(runtime.get("cpu")),
        nodes=int(summary.get("nodes", 1)),
        ranks=int(t["ranks"]),
        local_batch=int(t["local_batch_size"]),
        accumulation=int(t["gradient_accumulation"]),
        global_batch=int(t["global_batch_size"]),
        precision=str(t["precision"]),
        steps=int(t["steps"]),
        seconds=float(t["seconds"]),
        samples_per_s=float(t["samples_per_s"]),
        input_samples_per_s_per_rank=float(t["input_samples_per_s_per_rank"]),
        data=_data_set(run_dir),
        timeline=str(timeline) if timeline.is_file() else None,
        nccl=nccl_info(run_dir / "nccl"),
        published=bench.published_rate,
    )


def _cpu(described) -> str:
    """summary.json's runtime.cpu (common.cpu.describe: model, ISA, ...) as one phrase."""
    if isinstance(described, dict):
        return f"{described.get('cpu', 'unknown')} ({described.get('isa', 'ISA unknown')})"
    return str(described or "unknown")


def _data_set(run_dir: Path) -> str:
    """The run's data set (config.yaml's data.data_dir), said synthetic where the generator's marker is."""
    try:
        data_dir = (yaml.safe_load((run_dir / "config.yaml").read_text()) or {})["data"]["data_dir"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return "unknown (no config.yaml)"
    if (Path(data_dir) / MARKER).is_file():
        return f"synthetic, {data_dir}"
    return str(data_dir)


def nccl_info(folder: Path) -> NcclInfo:
    """NCCL's version and network, as the first of its NCCL_DEBUG=INFO lines in `folder` say them."""
    files = sorted(folder.glob("*")) if folder.is_dir() else []
    text = "\n".join(path.read_text(errors="replace") for path in files)
    version = re.search(r"NCCL version (\S+)", text)
    network = re.search(r"NCCL INFO Using network (\S+)", text)
    return NcclInfo(len(files), version and version.group(1), network and network.group(1))


def read_nccl_tests(path: Path) -> NcclTests:
    """all_reduce_perf's output in `path`. Raises InputError when it did not finish."""
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    rows, average, ranks, wrong = [], None, 0, 0
    for line in path.read_text(errors="replace").splitlines():
        fields = line.split()
        if line.lstrip().startswith("#"):
            m = re.search(r"Avg bus bandwidth\s*:\s*([0-9.]+)", line)
            average = float(m.group(1)) if m else average
            ranks += bool(re.match(r"#\s+Rank\s+\d+ ", line))
        elif len(fields) >= 12 and fields[0].isdigit():
            # size count type redop [root] time algbw busbw #wrong time algbw busbw #wrong
            rows.append((int(fields[0]), float(fields[-6]), float(fields[-2])))
            wrong += sum(int(f) for f in (fields[-5], fields[-1]) if f.isdigit())
    if average is None or not rows:
        raise InputError(f"{path}: no 'Avg bus bandwidth' line: all_reduce_perf did not finish")
    size, out_of_place, in_place = max(rows)
    return NcclTests(str(path), ranks, size, out_of_place, in_place, average, wrong)


def gpus_listed(path: Path) -> list[str]:
    """The GPU names of `nvidia-smi -L`'s lines in `path`."""
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    names = re.findall(r"^GPU \d+: (.*?)(?: \(UUID: [^)]*\))?$", path.read_text(), re.M)
    if not names:
        raise InputError(f"{path}: no 'GPU <n>: <name>' line (nvidia-smi -L's)")
    return names


def device_line(runs: list[Run], gpus: list[str] | None) -> str:
    """What the ranks ran on: the batch host's GPUs, else the runs' CPU."""
    if gpus:
        names = sorted(set(gpus))
        return f"{len(gpus)} x {' / '.join(names)} a node (nvidia-smi -L on the first node)"
    return f"CPU: {runs[0].cpu}" if runs[0].device == "cpu" else runs[0].device


def _per(run: Run) -> str:
    return "GPU" if run.device == "gpu" else "rank"


def comparison_line(run: Run) -> str:
    """One line: the run's samples/s per GPU beside the published rate, each with its scale and batch."""
    here = (
        f"{run.benchmark}: {run.samples_per_s_per_rank:.1f} samples/s per {_per(run)} on {run.ranks} "
        f"{_per(run)}s ({run.nodes} node(s)), local batch {run.local_batch} x accumulation "
        f"{run.accumulation}, {run.precision}"
    )
    p = run.published
    if p is None:
        return here + "; no published rate to compare with"
    return (
        f"{here} = {run.ratio:.2f} x NVIDIA's v3.0 {p.samples_per_s:.1f} per {p.accelerator} on "
        f"{p.accelerators} GPUs ({p.nodes} nodes), local batch {p.local_batch}"
        + ("" if run.device == "gpu" else f" (a {run.device} rank's against a GPU's)")
    )


def markdown(runs: list[Run], device: str, nccl_tests: NcclTests | None, files: list[str]) -> str:
    nodes, ranks = max(r.nodes for r in runs), max(r.ranks for r in runs)
    lines = [
        f"# First job: {nodes} node(s), {ranks} ranks",
        "",
        f"Device: {device}.",
        "",
        *(f"- {comparison_line(r)}" for r in runs),
        "",
        "| benchmark | ranks (nodes) | local batch x accumulation | precision | steps timed "
        "| samples/s | per rank | input pipeline alone, per rank | published per GPU | ratio |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        p = r.published
        published = (
            f"{p.samples_per_s:.1f} ({p.accelerators} x {p.accelerator}, local batch {p.local_batch})"
            if p
            else "none"
        )
        ratio = f"{r.ratio:.2f}" if r.ratio is not None else "-"
        lines.append(
            f"| {r.benchmark} | {r.ranks} ({r.nodes}) | {r.local_batch} x {r.accumulation} "
            f"| {r.precision} | {r.steps} ({r.seconds:.1f} s) | {r.samples_per_s:.1f} "
            f"| {r.samples_per_s_per_rank:.1f} | {r.input_samples_per_s_per_rank:.1f} "
            f"| {published} | {ratio} |"
        )
    lines += ["", "## The published rates", ""]
    for r in runs:
        if r.published:
            p = r.published
            lines.append(
                f"- {r.benchmark}: [{p.log}]({RESULTS}{p.log}) ({p.nodes} nodes, {p.accelerators} x "
                f"{p.accelerator}, local batch {p.local_batch}, {p.precision}): {p.how}."
            )
    lines += [
        "",
        "Not like for like: a published rate is whole training epochs of the real data on "
        "NVIDIA's PyTorch code at its scale and local batch, gradients reduced across all its GPUs; "
        "this job's is `train.py --benchmark` steps after warm-up at this job's scale and local "
        "batch, on the data below. A rate per rank near the input pipeline's alone is input-bound.",
        "",
        *(f"- {r.benchmark} data: {r.data}" for r in runs),
        "",
        "## Collectives",
        "",
    ]
    for r in runs:
        n = r.nccl
        said = (
            f"NCCL {n.version or '(version not said)'}, network {n.network or '(not said)'}"
            if n.files
            else "no NCCL_DEBUG file (no NCCL: a CPU run, or NCCL_DEBUG_FILE elsewhere)"
        )
        timeline = r.timeline or "none written"
        lines.append(f"- {r.benchmark}: {said}; Horovod timeline: {timeline}")
    if nccl_tests is None:
        lines.append("- all_reduce_perf: not run (none on PATH or in NCCL_TESTS_DIR)")
    else:
        t = nccl_tests
        lines.append(
            f"- all_reduce_perf ({t.ranks or '?'} ranks, {t.file}): at {t.largest_bytes} B, bus "
            f"bandwidth {t.busbw_out_of_place:.2f} GB/s out of place, {t.busbw_in_place:.2f} in "
            f"place; average {t.average_busbw:.2f} GB/s"
            + (f"; {t.wrong} WRONG results (nccl-tests' #wrong): a fault" if t.wrong else "")
        )
    lines += [
        "",
        "## What to send back",
        "",
        "This report (first_job.md, first_job.json), the job's output file (first_job-<job id>.out) "
        "and the run directories' files:",
        "",
        *(f"- {f}" for f in files),
        "",
    ]
    return "\n".join(lines)


def files_to_send(out: Path, runs: list[Run], nccl_tests: NcclTests | None) -> list[str]:
    files = [str(out / f"{REPORT}.md"), str(out / f"{REPORT}.json")]
    for r in runs:
        run_dir = Path(r.run_dir)
        files += [
            str(p)
            for p in (run_dir / "summary.json", run_dir / "config.yaml", run_dir / "timeline.json")
            if p.is_file()
        ]
        if r.nccl.files:
            files.append(f"{run_dir / 'nccl'}/ ({r.nccl.files} files)")
    if nccl_tests is not None:
        files.append(nccl_tests.file)
    return files


def write_report(out: Path, runs: list[Run], device: str, nccl_tests: NcclTests | None) -> str:
    """Writes DIR/first_job.md and .json (temporary name, then rename); returns the markdown."""
    files = files_to_send(out, runs, nccl_tests)
    text = markdown(runs, device, nccl_tests, files)
    data = {
        "device": device,
        "runs": [
            dataclasses.asdict(r)
            | {
                "ratio": r.ratio,
                "samples_per_s_per_rank": r.samples_per_s_per_rank,
                "line": comparison_line(r),
            }
            for r in runs
        ],
        "nccl_tests": dataclasses.asdict(nccl_tests) if nccl_tests else None,
        "send_back": files,
    }
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / f"{REPORT}.json", json.dumps(data, indent=2) + "\n")
    write_text_atomic(out / f"{REPORT}.md", text)
    return text


# --- command line -----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m offline.first_job",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    counts = commands.add_parser(
        "counts", help="the synthetic set's training and validation samples"
    )
    counts.add_argument("name", choices=benchmarks.names())
    counts.add_argument("ranks", type=int)
    counts.add_argument("config", type=Path)
    counts.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    report = commands.add_parser("report", help="the job's report from its benchmark runs")
    report.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR")
    report.add_argument("--output-dir", type=Path, required=True)
    report.add_argument("--gpus", type=Path, help="nvidia-smi -L's output on the first node")
    report.add_argument("--nccl-tests", type=Path, help="all_reduce_perf's output")
    return p


@tool_main()
def main(argv=None) -> int:
    """Returns 0; 2 after one `error:` line (a missing or failed run, an unfinished all_reduce_perf)."""
    args = build_parser().parse_args(argv)
    if args.command == "counts":
        if args.ranks < 1:
            raise InputError(f"RANKS must be at least 1, got {args.ranks}")
        overrides = dict(kv.partition("=")[::2] for kv in args.overrides)
        print(*synthetic_counts(args.name, args.ranks, args.config, overrides))
        return ExitCode.OK
    # Every bad input is named in the one error line, not only the first.
    runs, problems = [], []
    for run_dir in args.run_dirs:
        try:
            runs.append(read_run(run_dir))
        except InputError as e:
            problems.append(str(e))
    nccl_tests = gpus = None
    try:
        nccl_tests = read_nccl_tests(args.nccl_tests) if args.nccl_tests else None
        gpus = gpus_listed(args.gpus) if args.gpus else None
    except InputError as e:
        problems.append(str(e))
    if problems:
        raise InputError("; ".join(problems))
    print(write_report(args.output_dir, runs, device_line(runs, gpus), nccl_tests), end="")
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
