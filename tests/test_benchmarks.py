"""The benchmark table (common/benchmarks.py): its files exist, its CLI prints it, the Makefile's
rules of each benchmark name what its entry names, and the sbatch scripts resolve each benchmark's
script and flags from it.
"""

import ast
import dataclasses
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from common import benchmarks
from common.config import load_config
from tests.helpers import REPO

NAMES = benchmarks.names()
# Stands in for srun: writes its arguments, one a line, to $SRUN_ARGS and exits 0.
FAKE_SRUN = """#!/bin/bash
printf '%s\\n' "$@" > "$SRUN_ARGS"
"""


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "common.benchmarks", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _defines(spec: str, kind=ast.ClassDef) -> bool:
    """Whether the module file of a "module:name" spec defines that class or function (read, not imported)."""
    module, _, name = spec.partition(":")
    path = REPO / (module.replace(".", "/") + ".py")
    return path.is_file() and any(
        isinstance(node, kind) and node.name == name for node in ast.parse(path.read_text()).body
    )


def test_the_table_is_importable_without_tensorflow():
    code = "import sys; import common.benchmarks; print('tensorflow' in sys.modules)"
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stdout + proc.stderr


def test_names_are_unique():
    for field in ("name", "train_script"):
        values = [getattr(b, field) for b in benchmarks.BENCHMARKS]
        assert len(set(values)) == len(values), f"two benchmarks share {field}: {values}"
    with pytest.raises(KeyError, match="unknown benchmark 'nope'.*cosmoflow"):
        benchmarks.get("nope")


@pytest.mark.parametrize("name", NAMES)
def test_every_file_an_entry_names_exists(name):
    b = benchmarks.get(name)
    assert (REPO / b.train_script).is_file()
    assert (REPO / b.synthetic_config).is_file()
    closed = benchmarks.closed_configs(name)
    assert closed and all(p.is_file() for p in closed), b.closed_configs
    assert (REPO / (b.generator.replace(".", "/") + ".py")).is_file(), b.generator
    assert not b.throughput_bench or (REPO / b.throughput_bench).is_file()
    # The task class is named, not imported (importing it imports TensorFlow).
    assert _defines(b.task_class), b.task_class
    # Functions the measurement tools call, and the input bench's options and variants.
    assert not b.one_core_reader or _defines(b.one_core_reader, ast.FunctionDef), b.one_core_reader
    assert not b.input_bench or (
        _defines(f"{b.input_bench}:Options")
        and _defines(f"{b.input_bench}:variants", ast.FunctionDef)
    ), b.input_bench
    assert not b.full_model_config or REPO / b.full_model_config in closed, b.full_model_config
    assert bool(b.throughput_args) == bool(b.throughput_bench)
    assert dataclasses.is_dataclass(benchmarks.config_class(name))
    # The train script takes the flags the table gives it (make and sbatch pass them).
    assert (
        b.data_flag.startswith("--")
        and b.output_flag.startswith("--")
        and b.stage_flag.startswith("--")
    )


@pytest.mark.parametrize("name", NAMES)
def test_closed_configs_give_their_global_batch_and_the_cli_finds_them(name):
    section, _, key = benchmarks.get(name).local_batch_key.partition(".")
    for path in benchmarks.closed_configs(name):
        cfg = yaml.safe_load(path.read_text())
        global_batch, local_batch = cfg["train"]["global_batch_size"], cfg[section][key]
        assert global_batch % local_batch == 0, path
        ranks = global_batch // local_batch
        assert benchmarks.closed_config_for_ranks(name, ranks) == path
        # A job of the config's own launch runs it as it is: no override.
        plan = benchmarks.job_config(name, ranks)
        assert (plan.path, plan.closed, plan.overrides) == (path, True, ()), plan
        proc = cli("job-config", name, str(ranks))
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.splitlines()[1:] == [str(path.relative_to(REPO))]
    assert benchmarks.closed_config_for_ranks(name, 7) is None  # no RCP batch is 7 x a local batch
    assert cli("job-config", name, "0").returncode == 2


def test_a_job_no_closed_config_fits_runs_the_nearest_open_and_says_so():
    # 3 ranks: no RCP global batch (powers of 2) is a multiple of 3 x a local batch.
    plan = benchmarks.job_config("deepcam", 3)
    assert not plan.closed and plan.path.name == "deepcam_closed_gbs128.yaml"
    assert (plan.local_batch, plan.accumulation) == (4, 11)  # 132, the nearest to 128
    assert plan.overrides == (
        "--set",
        "train.gradient_accumulation_frequency=11",
        "--set",
        "mlperf.division=open",
    )
    assert "OPEN division" in plan.describe() and "global batch 132" in plan.describe()
    # More ranks than the largest RCP batch holds at local batch 1: that batch's config, open.
    plan = benchmarks.job_config("deepcam", 4096)
    assert not plan.closed and plan.global_batch == 2048 and plan.accumulation == 1


def test_names_with_a_field_skip_the_entries_that_leave_it_empty(monkeypatch):
    first, second = benchmarks.BENCHMARKS[:2]
    monkeypatch.setattr(
        benchmarks, "BENCHMARKS", (first, dataclasses.replace(second, throughput_bench=""))
    )
    assert benchmarks.names_with("throughput_bench") == (first.name,)
    assert benchmarks.names_with("name") == (first.name, second.name)


def test_cli_prints_what_the_table_holds():
    proc = cli("names")
    assert proc.returncode == 0 and proc.stdout.split() == list(NAMES)
    for b in benchmarks.BENCHMARKS:
        proc = cli("get", b.name, *benchmarks.FIELDS)
        assert proc.returncode == 0, proc.stderr
        values = (getattr(b, field) for field in benchmarks.FIELDS)  # a PublishedRate as itself
        expected = [" ".join(v) if isinstance(v, tuple) else str(v) for v in values]
        assert proc.stdout.splitlines() == expected
    assert cli("get", "nope", "data_flag").returncode != 0
    assert cli("get", NAMES[0], "no_such_field").returncode != 0


def make_n(*args) -> str:
    proc = subprocess.run(
        ["make", "-n", "-C", str(REPO), *args], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return " ".join(proc.stdout.replace("\\\n", " ").split())  # one line, single spaces


# Each benchmark's run target and the prefix of its Makefile variables (<prefix>_DATA, <prefix>_CONFIG),
# as the Makefile writes them by hand.
MAKE_RUN = {"cosmoflow": ("run", "COSMO"), "deepcam": ("run-deepcam", "DEEPCAM")}


def test_every_benchmark_has_makefile_rules():
    assert sorted(MAKE_RUN) == sorted(NAMES), (
        "a benchmark of the table without its block in the Makefile"
    )


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
@pytest.mark.parametrize("name", NAMES)
def test_the_makefiles_rules_name_what_the_table_names(name):
    b = benchmarks.get(name)
    target, prefix = MAKE_RUN[name]
    run = make_n(target)
    generate = re.search(
        rf"-m {re.escape(b.generator)} --output-dir (\S+) (.*?)(?= \S*python|$)", run
    )
    assert generate and generate.group(2).split() == list(b.generator_args), run
    data = generate.group(1)
    assert (
        f"{b.train_script} {b.synthetic_config} {b.data_flag} {data} {b.output_flag} runs/{name}-"
        in run
    )
    # The documented variables still override.
    run = make_n(target, f"{prefix}_DATA=/d", f"{prefix}_CONFIG=/c.yaml")
    assert f"{b.train_script} /c.yaml {b.data_flag} /d " in run
    for command in ("result-set", "weak-scaling"):
        text = make_n(command, f"BENCH={name}")
        assert generate.group(0) in text
        module = "offline.result_set" if command == "result-set" else "offline.weak_scaling"
        assert f"-m {module} --bench {name} " in text
        assert f"--config {b.synthetic_config} --data-dir {data}" in text
    if b.throughput_bench:
        assert b.throughput_bench in make_n(f"bench-{b.name}")


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_refuses_an_unknown_bench():
    proc = subprocess.run(
        ["make", "-n", "-C", str(REPO), "result-set", "BENCH=nope"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0 and "BENCH=nope is not a benchmark" in proc.stderr
    assert (
        f"known: {' '.join(NAMES)}." in proc.stderr
    )  # the Makefile's BENCHMARKS is the table's names


@pytest.fixture
def fake_slurm(tmp_path) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "srun").chmod(stat.S_IRWXU)
    (tmp_path / "config.yaml").write_text("mlperf: {org: reference}\n")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return environ | {
        "PATH": f"{bin_dir}{os.pathsep}{environ['PATH']}",
        "REPO": str(REPO),
        "VENV": str(Path(sys.executable).parent.parent),
        "DATA_DIR": "/data/set",
        "CONFIG": str(tmp_path / "config.yaml"),
        "OUTPUT_DIR": str(tmp_path / "out"),
        "STAGE_DIR": "/local/stage",
        "SRUN_ARGS": str(tmp_path / "srun_args"),
        "SYSTEM": "testbox",
    }


def sbatch_job(script: str, environ: dict) -> tuple[list[str], str]:
    """Runs slurm/<script> with the fake srun; the arguments srun was given, and the job's output."""
    proc = subprocess.run(
        ["bash", str(REPO / "slurm" / script)],
        env=environ,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    args = Path(environ["SRUN_ARGS"])
    assert args.exists(), proc.stdout + proc.stderr
    return args.read_text().splitlines(), proc.stdout


def sbatch(script: str, environ: dict) -> list[str]:
    """Runs slurm/<script> with the fake srun; the arguments srun was given."""
    return sbatch_job(script, environ)[0]


def _flag_value(args: list[str], flag: str) -> str:
    assert flag in args, args
    return args[args.index(flag) + 1]


@pytest.mark.parametrize("name", NAMES)
def test_env_sh_reads_each_benchmarks_script_and_flags(name):
    b = benchmarks.get(name)
    script = (
        'source slurm/env.sh >/dev/null; read_benchmark "$1"; printf "%s\\n" "$TRAIN_SCRIPT" "$DATA_FLAG" '
        '"$OUTPUT_FLAG" "$STAGE_FLAG"'
    )
    environ = dict(
        os.environ, REPO=str(REPO), DATA_DIR="/d", VENV=str(Path(sys.executable).parent.parent)
    )
    proc = subprocess.run(
        ["bash", "-c", script, "bash", name],
        env=environ,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [b.train_script, b.data_flag, b.output_flag, b.stage_flag]


@pytest.mark.parametrize("name", NAMES)
def test_train_sbatch_passes_the_tables_flags(fake_slurm, name):
    b = benchmarks.get(name)
    args = sbatch("train.sbatch", fake_slurm | {"BENCH": name})
    assert b.train_script in args
    assert _flag_value(args, b.data_flag) == "/data/set"
    assert _flag_value(args, b.output_flag) == fake_slurm["OUTPUT_DIR"]
    assert _flag_value(args, b.stage_flag) == "/local/stage"


def _rcp_global_batches(name: str) -> set[int]:
    import mlperf_logging

    table = Path(mlperf_logging.__file__).parent / "rcp_checker" / "hpc_3.0.0" / f"rcps_{name}.json"
    return {entry["BS"] for entry in json.loads(table.read_text()).values()}


# The job shapes a site starts with (nodes, GPUs a node: a rank each), as docs/running.md names them.
FIRST_SHAPES = [(1, 4), (1, 8), (2, 8)]


@pytest.mark.parametrize("nodes,per_node", FIRST_SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("name", NAMES)
def test_a_sites_first_job_shapes_run_a_closed_config_at_its_rcp_batch(
    fake_slurm, name, nodes, per_node
):
    """No CONFIG: the benchmark's own sbatch script reaches srun with a closed config, whose RCP global
    batch ranks x local batch x accumulation gives, and says so in its first lines."""
    ranks = nodes * per_node
    environ = {k: v for k, v in fake_slurm.items() if k != "CONFIG"} | {
        "SLURM_NNODES": str(nodes),
        "SLURM_NTASKS": str(ranks),
        "SLURM_NTASKS_PER_NODE": str(per_node),
    }
    b = benchmarks.get(name)
    args, output = sbatch_job(f"{name}.sbatch", environ)
    config = Path(args[args.index(b.train_script) + 1])
    overrides = dict(
        args[i + 1].split("=", 1)
        for i in range(args.index(b.train_script) + 2, args.index(b.data_flag), 2)
        if args[i] == "--set"
    )
    assert set(overrides) <= {"train.gradient_accumulation_frequency", b.local_batch_key}, overrides
    cfg = load_config(
        benchmarks.config_class(name), REPO / config, overrides | {"data.data_dir": "/d"}
    )
    section, _, key = b.local_batch_key.partition(".")
    local = getattr(getattr(cfg, section), key)
    accumulation = cfg.train.gradient_accumulation_frequency
    assert cfg.mlperf.division == "closed"
    assert ranks * local * accumulation == cfg.train.global_batch_size
    assert cfg.train.global_batch_size in _rcp_global_batches(b.submission_name)
    # The local batch is the config's own; one node reaches the batch by accumulation.
    assert local == yaml.safe_load((REPO / config).read_text())[section][key]
    said = [line for line in output.splitlines()[:6] if line.startswith("[sbatch] config: ")]
    assert said and said[0].startswith(f"[sbatch] config: {config}, closed division: ")
    assert f"{ranks} ranks x local batch {local} x gradient accumulation {accumulation} " in said[0]


def test_a_shape_no_closed_config_fits_still_reaches_srun_as_open(fake_slurm):
    """The negative control of the shapes above: 3 ranks reach no RCP global batch, and run open."""
    environ = {k: v for k, v in fake_slurm.items() if k != "CONFIG"} | {"SLURM_NTASKS": "3"}
    args, output = sbatch_job("deepcam.sbatch", environ)
    assert "mlperf.division=open" in args
    assert any("OPEN division" in line for line in output.splitlines()[:6]), output


@pytest.mark.parametrize(
    "script", sorted(p.name for p in (REPO / "slurm").glob("*.sbatch") if p.stem in NAMES)
)
def test_a_benchmarks_own_sbatch_runs_that_benchmark(fake_slurm, script):
    b = benchmarks.get(Path(script).stem)
    args = sbatch(script, fake_slurm | {"BENCH": "not-this-one"})  # the script's own benchmark wins
    assert b.train_script in args and _flag_value(args, b.data_flag) == "/data/set"


@pytest.mark.parametrize("name", NAMES)
def test_weak_scaling_sbatch_passes_the_tables_flags(fake_slurm, name):
    b = benchmarks.get(name)
    args = sbatch(
        "weak_scaling.sbatch",
        fake_slurm
        | {
            "BENCH": name,
            "INSTANCES": "1",
            "NODES_PER_INSTANCE": "1",
            "SLURM_NTASKS_PER_NODE": "1",
        },
    )
    assert b.train_script in args
    assert _flag_value(args, b.data_flag) == "/data/set"
    assert _flag_value(args, b.stage_flag) == "/local/stage/instance_0"
    start_dir = (
        Path(fake_slurm["OUTPUT_DIR"]) / "instances" / "start"
    )  # where the instances meet before run_start
    assert f"mlperf.start_barrier_dir={start_dir}" in args


def test_result_set_sbatch_runs_the_tables_script(fake_slurm):
    for name in NAMES:
        args = sbatch("result_set.sbatch", fake_slurm | {"BENCH": name, "SLURM_ARRAY_TASK_ID": "0"})
        assert benchmarks.get(name).train_script in args


# Files that are one benchmark's own tool, with the benchmark they may name: each compares or stages
# what only that benchmark has. A benchmark's throughput script (the table's throughput_bench) may name
# its benchmark too.
ONE_BENCHMARK_TOOLS = {
    "bench/deepcam_vs_reference.py": "deepcam",  # our model's step against the PyTorch reference's
    "bench/staging_throughput.py": "cosmoflow",  # its gzip TFRecords are the GUNZIP layout's sources
}
# The modules of the projection that rebuild a split network: each takes its benchmark from the table's
# spatial_split (bench/spatial.py and bench/report.py take their rows from spatial_bench).
SPLIT_MODULES = ("offline/projection/spatial.py", "offline/projection/height_split.py")


def _benchmark_names_in_code(source: str, names=NAMES) -> list[tuple[int, str, str]]:
    """(line, benchmark, text) of every name or string of `source`'s code that holds a benchmark's name:
    docstrings and comments (which ast drops) do not count; `BENCHMARK = "<name>"` is reported as "BENCHMARK"."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
        and isinstance(node.body[0].value.value, str)
    }
    constants = {
        id(node.value): node.targets[0].id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Constant)
    }
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
        ):
            text = node.value
        elif isinstance(node, ast.Name):
            text = node.id
        elif isinstance(node, ast.Attribute):
            text = node.attr
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            text = node.name
        elif isinstance(node, ast.alias):
            text = node.name
        elif isinstance(node, ast.ImportFrom):
            text = node.module or ""
        elif isinstance(node, ast.arg):
            text = node.arg
        else:
            continue
        for name in names:
            if name in text:
                found.append((getattr(node, "lineno", 0), name, constants.get(id(node), text)))
    return found


def test_the_benchmark_scan_finds_names_in_code_only():
    # The negative control: a name in a string, an import and an identifier are found; in docstrings and
    # comments they are not.
    source = (
        '"""cosmoflow: the module docstring."""\n'
        "import cosmoflow.data  # deepcam\n"
        "def deepcam_rows(x):\n"
        '    """deepcam: a docstring."""\n'
        '    return {"benchmark": "cosmoflow"}\n'
        'BENCHMARK = "cosmoflow"\n'
        "batch = args.deepcam_batch\n"
    )
    found = _benchmark_names_in_code(source, names=("cosmoflow", "deepcam"))
    assert sorted((line, name) for line, name, _ in found) == [
        (2, "cosmoflow"),
        (3, "deepcam"),
        (5, "cosmoflow"),
        (6, "cosmoflow"),
        (7, "deepcam"),
    ], found
    assert (6, "cosmoflow", "BENCHMARK") in found and (7, "deepcam", "deepcam_batch") in found
    assert not _benchmark_names_in_code('"""cosmoflow, deepcam."""\n# cosmoflow\nx = 1\n')


def test_bench_and_offline_take_every_benchmark_from_the_table():
    """bench/ and offline/ loop over common.benchmarks; a benchmark's name in their code is a second registry."""
    allowed = dict(ONE_BENCHMARK_TOOLS)
    for b in benchmarks.BENCHMARKS:
        if b.throughput_bench:
            allowed[b.throughput_bench] = b.name
    files = sorted(
        p
        for folder in ("bench", "offline", "offline/projection")
        for p in (REPO / folder).glob("*.py")
    )
    assert {REPO / m for m in SPLIT_MODULES} <= set(
        files
    ) and REPO / "bench" / "input_pipeline.py" in files
    stray, constants = [], []
    for path in files:
        rel = path.relative_to(REPO).as_posix()
        for line, name, text in _benchmark_names_in_code(path.read_text()):
            if text == "BENCHMARK":
                constants.append((rel, text))
            elif allowed.get(rel) != name:
                stray.append(f"{rel}:{line}: {text!r}")
    assert not stray, "bench/ and offline/ name a benchmark by hand:\n" + "\n".join(stray)
    assert constants == [], constants  # no `BENCHMARK = "<name>"`: the split modules read the table


def test_the_projection_splits_each_benchmark_along_its_table_axis():
    """spatial_split picks the rebuilt network: every axis a benchmark names has a projection, and each
    split module's BENCHMARK is the benchmark the table splits along its axis."""
    from offline.projection import cli, height_split, spatial

    axes = {b.name: b.spatial_split for b in benchmarks.BENCHMARKS if b.spatial_split}
    assert set(axes.values()) <= set(benchmarks.SPLIT_AXES) == set(cli.SPLIT_PROJECTIONS)
    assert {spatial.AXIS: spatial.BENCHMARK, height_split.AXIS: height_split.BENCHMARK} == {
        axis: name for name, axis in axes.items()
    }
    assert [benchmarks.split_along(axis) for axis in benchmarks.SPLIT_AXES] == [
        spatial.BENCHMARK,
        height_split.BENCHMARK,
    ]
    with pytest.raises(KeyError, match="0 benchmarks split along 'width'"):
        benchmarks.split_along("width")


def test_the_spatial_bench_configs_are_their_benchmarks_own():
    """bench/spatial.py's rows: each config lives in its benchmark's folder, and at least one benchmark splits."""
    assert benchmarks.names_with("spatial_bench")
    for b in benchmarks.BENCHMARKS:
        assert b.spatial_split or not b.spatial_bench, (
            b.name
        )  # rows only of a benchmark that splits
        for config in b.spatial_bench:
            assert config.startswith(f"{b.name}/configs/") and (REPO / config).is_file(), config
