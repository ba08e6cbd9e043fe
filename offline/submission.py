"""Turns result sets into an MLPerf HPC submission tree and runs the official package checker on it.

  python -m offline.submission --org ORG --system SYSTEM_NAME RESULT_SET_DIR... --out DIR \
      [--system-info system.yaml] [--impl tensorflow-horovod] [--allow-failed]

Each RESULT_SET_DIR is what `make result-set` / `make weak-scaling` (offline.result_set,
offline.weak_scaling) wrote, one of its benchmark folders, or a directory of run directories;
every result set found in it is packaged. DIR receives, as the MLPerf HPC v3.0 rules lay it out:

  systems/SYSTEM_NAME.json                  every field mlperf_logging's system_desc_checker
                                            requires: read from this machine where it can be
                                            (CPU, memory, disk, OS, software versions), taken
                                            from the logs (division, nodes, accelerators), the
                                            rest from the --system-info YAML, which also
                                            overrides anything read here (package on a login
                                            node: give the compute node's values)
  results/SYSTEM_NAME/{strong,weak}/BENCH/result_<i>.txt
  benchmarks/BENCH/implementations/IMPL/    the code that produced the results (the files git
                                            tracks in this repository)

then `python -m mlperf_logging.package_checker DIR hpc 3.0.0` runs on it and its verdict is
printed (its full log: DIR.package_checker.log). Refused, with one `error:` line each: a set with
a failed run (unless --allow-failed, and the rules still make it a valid result), a set that is
not a valid result (offline.scoring says why), a folder whose logs name more than one benchmark,
two sets of the same benchmark and scaling, sets of different divisions, system fields missing
(all listed), and an existing DIR. Exit status: 0 the package checker passed, 1 it found errors,
2 nothing was written.
"""

import argparse
import contextlib
import io
import json
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

import yaml
from mlperf_logging.system_desc_checker import system_desc_checker

from common.cli import tool_main
from offline import scoring

REPO = Path(__file__).resolve().parents[1]
USAGE = scoring.USAGE
DEFAULT_IMPL = "tensorflow-horovod"
# What is not code in this repository's tree: never copied into the snapshot when git is absent.
_NOT_CODE = {
    ".git",
    ".venv",
    "data",
    "runs",
    "wheelhouse",
    "wheelhouse.partial",
    "__pycache__",
    ".pytest_cache",
}
_PASSED = "PACKAGE CHECKER FOUND NO ERRORS"


class SubmissionError(ValueError):
    """Input that cannot become a submission; the message is the one line printed after `error:`."""


def required_fields(ruleset: str) -> list[str]:
    """The fields the official system_desc_checker requires, asked of the checker itself.

    It names each missing field of a description; shown an empty one, it names them all, so the
    list here can never fall behind the installed mlperf_logging.
    """
    with tempfile.TemporaryDirectory() as tmp:
        empty = Path(tmp) / "empty.json"
        empty.write_text("{}")
        with _captured_logging() as log:
            system_desc_checker.check_system_desc(str(empty), USAGE, ruleset)
    return re.findall(r"Missing field ([^'\",\]]+)", log.getvalue())


@contextlib.contextmanager
def _captured_logging():
    """The official checkers report through the root logger: collect what they say."""
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield buffer
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _cpuinfo() -> dict:
    """The first processor's fields of /proc/cpuinfo, plus the distinct physical ids (sockets)."""
    info, sockets = {}, set()
    for line in _read("/proc/cpuinfo").splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "physical id":
            sockets.add(value)
        info.setdefault(key, value)
    info["sockets"] = len(sockets) or 1
    return info


def _caches() -> str:
    """The caches one core sees, from sysfs (e.g. 'L1d 32K, L1i 32K, L2 512K, L3 32768K')."""
    parts = []
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        level, kind, size = (_read(index / name).strip() for name in ("level", "type", "size"))
        if level and size:
            suffix = {"Data": "d", "Instruction": "i"}.get(kind, "")
            parts.append(f"L{level}{suffix} {size}")
    return ", ".join(parts)


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return ""


def _first_line(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.strip().splitlines()[0] if out.strip() else ""


def probe_machine() -> dict:
    """The system fields this machine can tell about itself (the host side; GPUs via nvidia-smi)."""
    cpu = _cpuinfo()
    fields = {}
    if cpu.get("model name"):
        fields["host_processor_model_name"] = cpu["model name"]
        fields["host_processors_per_node"] = str(cpu["sockets"])
    if cpu.get("cpu cores"):
        fields["host_processor_core_count"] = cpu["cpu cores"]
    if cpu.get("siblings"):
        fields["host_processor_vcpu_count"] = cpu["siblings"]
    max_khz = _read("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").strip()
    if max_khz.isdigit():
        fields["host_processor_frequency"] = f"{int(max_khz) / 1e3:.0f} MHz"
    elif cpu.get("cpu MHz"):
        fields["host_processor_frequency"] = f"{float(cpu['cpu MHz']):.0f} MHz"
    if _caches():
        fields["host_processor_caches"] = _caches()
    mem = re.search(r"MemTotal:\s+(\d+) kB", _read("/proc/meminfo"))
    if mem:
        fields["host_memory_capacity"] = f"{int(mem[1]) / 2**20:.0f} GB"
    fields["host_storage_capacity"] = f"{shutil.disk_usage('/').total / 1e9:.0f} GB"
    os_name = re.search(r'^PRETTY_NAME="?([^"\n]*)', _read("/etc/os-release"), re.M)
    fields["operating_system"] = (
        f"{os_name[1] if os_name else platform.system()} (Linux {platform.release()})"
    )
    tf_version = _version("tensorflow-cpu") or _version("tensorflow")
    if tf_version:
        fields["framework"] = f"TensorFlow {tf_version}, Horovod {_version('horovod') or '?'}"
    stack = {
        "Python": platform.python_version(),
        "mlperf-logging": _version("mlperf-logging"),
        "numpy": _version("numpy"),
        "h5py": _version("h5py"),
    }
    mpi = _first_line(["mpirun", "--version"])
    if mpi:
        stack["MPI"] = mpi
    fields["other_software_stack"] = {k: v for k, v in stack.items() if v}
    gpus = [
        line.split(", ")
        for line in _first_lines(
            ["nvidia-smi", "--query-gpu=name,memory.total,clocks.max.sm", "--format=csv,noheader"]
        )
    ]
    if gpus and len(gpus[0]) == 3:
        (
            fields["accelerator_model_name"],
            fields["accelerator_memory_capacity"],
            fields["accelerator_frequency"],
        ) = gpus[0]
    return fields


def _first_lines(cmd: list[str]) -> list[str]:
    try:
        return (
            subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            .stdout.strip()
            .splitlines()
        )
    except (OSError, subprocess.TimeoutExpired):
        return []


def _log_values(rs: scoring.ResultSet, key: str) -> set:
    """Every value the runs of a set logged for `key` (first occurrence per run)."""
    values = set()
    for run in rs.runs:
        if run.file and Path(run.file).is_file():
            value = _logged(Path(run.file), key)
            if value is not None:
                values.add(value)
    return values


def _logged(log: Path, key: str):
    for line in log.read_text(errors="replace").splitlines():
        if f'"key": "{key}"' in line and ":::MLLOG" in line:
            try:
                return json.loads(line.split(":::MLLOG", 1)[1])["value"]
            except (json.JSONDecodeError, KeyError):
                return None
    return None


def _nodes(rs: scoring.ResultSet) -> int:
    """The nodes a set ran on: a weak-scaling set's instances each logged their own share."""
    per_run = max((int(v) for v in _log_values(rs, "number_of_nodes")), default=1)
    if rs.scaling == "weak":
        return per_run * max(
            (int(v) for v in _log_values(rs, "number_of_instances")), default=len(rs.runs)
        )
    return per_run


def load_sets(paths, ruleset: str, allow_failed: bool) -> list[scoring.ResultSet]:
    """The result sets under `paths`, each scored by offline.scoring.

    Args:
      paths: result-set directories (submission layout, a benchmark folder, or run directories).
      ruleset: the MLPerf HPC ruleset the logs are checked against.
      allow_failed: accept a set with failed runs when the rules still make it a valid result.

    Returns:
      One ResultSet per set found.

    Raises:
      SubmissionError: a set that cannot be submitted, or sets that cannot go in one package.
    """
    sets = []
    for path in paths:
        try:
            found = scoring.find_sets(path)
        except FileNotFoundError as e:
            raise SubmissionError(str(e)) from None
        if not found:
            raise SubmissionError(f"no result_*.txt, mlperf.log or mlperf.log.partial under {path}")
        for folder, entries in found:
            rs = scoring.score_set(folder, entries, ruleset)
            named = {}
            for run in rs.runs:
                bench = _logged(Path(run.file), "submission_benchmark") if run.file else None
                if bench is not None:
                    named.setdefault(bench, []).append(run.name)
            if len(named) > 1:
                which = "; ".join(
                    f"{bench}: {', '.join(names)}" for bench, names in sorted(named.items())
                )
                raise SubmissionError(
                    f"{folder} mixes benchmarks ({which}): one folder holds one result set"
                )
            if rs.failed and not (allow_failed and rs.valid):
                runs = "; ".join(f"{r.name}: {r.problem}" for r in rs.failed)
                hint = " (--allow-failed packages a set the rules still accept)" if rs.valid else ""
                raise SubmissionError(f"{folder} has failed runs, {runs}{hint}")
            if not rs.valid:
                why = "; ".join(
                    n.removeprefix("NOT A VALID RESULT: ") for n in rs.notes if "NOT A VALID" in n
                )
                raise SubmissionError(f"{folder} is not a valid result: {why}")
            sets.append(rs)
    seen = {}
    for rs in sets:
        key = (rs.scaling, rs.benchmark)
        if key in seen:
            raise SubmissionError(
                f"two {rs.scaling}-scaling {rs.benchmark} sets: {seen[key]} and {rs.folder}; "
                "a system submits one"
            )
        seen[key] = rs.folder
    divisions = {rs.division for rs in sets}
    if len(divisions) > 1:
        raise SubmissionError(
            f"the sets are of different divisions ({', '.join(sorted(divisions))}): "
            "one system description has one; package them separately"
        )
    return sets


def _checker_string(info_file, field: str, value) -> str | dict:
    """A --system-info value as the package checker reads every field: a string. YAML types
    `host_processor_core_count: 2` as an int, which the checker's string join dies on (every
    published system JSON holds "64", "8"); numbers and booleans are written as YAML spelled them."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    if isinstance(value, dict):  # other_software_stack: {"MPI": "...", ...}
        return {str(k): _checker_string(info_file, f"{field}.{k}", v) for k, v in value.items()}
    raise SubmissionError(
        f"--system-info {info_file}: field {field} must be a value or a mapping, "
        f"not {type(value).__name__} {value!r}"
    )


def describe_system(org: str, system: str, sets, info_file, ruleset: str) -> tuple[dict, list[str]]:
    """The system description, each field from the first of: the YAML, the logs, this machine.

    Args:
      org: the submitter.
      system: the system name.
      sets: the packaged sets (their logs give division, nodes and accelerators per node).
      info_file: the --system-info YAML, or None.
      ruleset: the ruleset whose system_desc_checker decides which fields are required.

    Returns:
      (the description in the checker's field order, lines saying where the fields came from).

    Raises:
      SubmissionError: the YAML is unreadable or has unknown fields, or required fields are missing.
    """
    required = required_fields(ruleset)
    user = {}
    if info_file:
        try:
            user = yaml.safe_load(Path(info_file).read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise SubmissionError(
                f"cannot read --system-info {info_file}: {' '.join(str(e).split())}"
            ) from None
        if not isinstance(user, dict):
            raise SubmissionError(f"--system-info {info_file} must be a mapping of field: value")
        unknown = sorted(set(user) - set(required))
        if unknown:
            raise SubmissionError(
                f"--system-info {info_file}: unknown fields {', '.join(unknown)} "
                f"(the checker knows {', '.join(required)})"
            )
        user = {field: _checker_string(info_file, field, value) for field, value in user.items()}
    probed = probe_machine()
    accelerators = max(
        (int(v) for rs in sets for v in _log_values(rs, "accelerators_per_node")), default=0
    )
    nodes = max(_nodes(rs) for rs in sets)
    from_logs = {
        "submitter": org,
        "system_name": system,
        "division": sets[0].division,
        "number_of_nodes": str(nodes),
        "accelerators_per_node": str(accelerators),
    }
    images = run_images(sets)
    if images:
        from_logs["sw_notes"] = "; ".join(images)
    if accelerators == 0:
        # CPU-only runs: nothing to describe about accelerators.
        from_logs |= {f: "" for f in required if f.startswith("accelerator_")}
    desc = {f: v for f, v in probed.items() if f in required} | from_logs | user
    missing = [f for f in required if f not in desc]
    if missing:
        raise SubmissionError(
            f"systems/{system}.json lacks {len(missing)} field(s) the system_desc_checker "
            f"requires: {', '.join(missing)}; give them in "
            f"{'--system-info ' + str(info_file) if info_file else 'a --system-info YAML'}"
        )
    probed_used = sorted(f for f in probed if f in required and f not in user)
    notes = [
        f"read from this machine (override in --system-info if it is not the system): {', '.join(probed_used)}",
        f"from the logs and the command line: {', '.join(sorted(set(from_logs) - set(user)))}",
    ]
    if user:
        notes.append(f"from {info_file}: {', '.join(sorted(user))}")
    return {f: desc[f] for f in required}, notes


def run_images(sets) -> list[str]:
    """The container images the runs computed in, as their summary.json beside the log names them
    (`runtime.image`: common/runtime.py), each once: 'image <path> sha256:<digest>, commit <sha>'."""
    images = []
    for rs in sets:
        for run in filter(lambda run: run.file, rs.runs):
            try:
                summary = json.loads((Path(run.file).parent / "summary.json").read_text())
                image = summary["runtime"]["image"]
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if image:
                said = (
                    f"{image.get('runtime', 'container')} image "
                    f"{image.get('image') or image.get('image_id') or '(id not given)'}"
                    f"{' sha256:' + image['sha256'] if image.get('sha256') else ''}, "
                    f"commit {image.get('commit') or 'unknown'}"
                )
                if said not in images:
                    images.append(said)
    return images


def code_files(repo: Path) -> list[Path]:
    """The files of the implementation: what git tracks, or (no git) the tree without runs, data, venvs."""
    proc = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-z"], capture_output=True, timeout=60
    )
    if proc.returncode == 0 and proc.stdout:
        return [
            repo / name
            for name in proc.stdout.decode().split("\0")
            if name and (repo / name).is_file()
        ]
    return [
        p
        for p in sorted(repo.rglob("*"))
        if p.is_file() and not _NOT_CODE & set(p.relative_to(repo).parts)
    ]


def write_tree(out: Path, org: str, system: str, sets, description: dict, impl: str) -> None:
    """Writes the submission tree to a temporary name beside `out`, then renames it to `out`."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        (tmp / "systems").mkdir()
        (tmp / "systems" / f"{system}.json").write_text(json.dumps(description, indent=4) + "\n")
        files = code_files(REPO)
        for rs in sets:
            folder = tmp / "results" / system / rs.scaling / rs.benchmark
            folder.mkdir(parents=True)
            for i, run in enumerate(rs.runs):
                # A failed run kept under --allow-failed: the log it left (empty if none), as the rules want.
                data = Path(run.file).read_bytes() if run.file else b""
                (folder / f"result_{i}.txt").write_bytes(data)
            scaling_json = Path(rs.folder) / "scaling.json"
            if scaling_json.exists():
                shutil.copy2(scaling_json, folder / "scaling.json")
            code = tmp / "benchmarks" / rs.benchmark / "implementations" / impl
            if not code.exists():
                for f in files:
                    dest = code / f.relative_to(REPO)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(f, dest)
        tmp.chmod(0o755)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def run_package_checker(out: Path, ruleset: str) -> tuple[bool, list[str], Path]:
    """Runs `python -m mlperf_logging.package_checker OUT hpc RULESET`.

    Its exit status is 0 whatever it finds, so the verdict is read from its closing line.

    Returns:
      (whether it found no errors, its ERROR lines, the path of its full log).
    """
    log = out.with_name(out.name + ".package_checker.log")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlperf_logging.package_checker",
            str(out),
            USAGE,
            ruleset,
            "--log_output",
            str(log),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    text = proc.stdout + proc.stderr
    errors = [
        line
        for line in text.splitlines()
        if line.startswith(("ERROR", "Traceback")) or "Error:" in line
    ]
    return proc.returncode == 0 and _PASSED in text, errors, log


@tool_main(SubmissionError, scoring.RulesetError)
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("result_sets", nargs="+", metavar="RESULT_SET_DIR")
    parser.add_argument("--org", required=True, help="the submitter (organisation) name")
    parser.add_argument(
        "--system", required=True, help="the system name: systems/SYSTEM.json, results/SYSTEM/"
    )
    parser.add_argument(
        "--out", required=True, help="the submission folder to write (must not exist)"
    )
    parser.add_argument(
        "--system-info", help="YAML of system description fields (overrides what is read here)"
    )
    parser.add_argument(
        "--impl", default=DEFAULT_IMPL, help=f"implementation name (default {DEFAULT_IMPL})"
    )
    parser.add_argument("--ruleset", default="3.0.0")
    parser.add_argument(
        "--allow-failed",
        action="store_true",
        help="package a set with failed runs when the rules still make it a valid result",
    )
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    scoring.check_ruleset(args.ruleset)
    for name, value in (("--org", args.org), ("--system", args.system), ("--impl", args.impl)):
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.+\-]*", value):
            raise SubmissionError(
                f"{name} '{value}' is not a folder name (letters, digits, _ . + -)"
            )
    if out.exists():
        raise SubmissionError(
            f"{out} exists: choose another --out (a package is written whole or not at all)"
        )
    if not out.parent.is_dir():
        raise SubmissionError(f"{out.parent} is not a directory")
    sets = load_sets(args.result_sets, args.ruleset, args.allow_failed)
    description, notes = describe_system(
        args.org, args.system, sets, args.system_info, args.ruleset
    )
    for rs in sets:
        orgs = _log_values(rs, "submission_org") - {args.org}
        if orgs:
            print(
                f"note: {rs.folder}: its logs name submission_org {', '.join(sorted(orgs))}, packaged as {args.org}"
            )
    write_tree(out, args.org, args.system, sets, description, args.impl)
    print(f"[submission] wrote {out}:")
    print(f"  systems/{args.system}.json")
    for note in notes:
        print(f"    {note}")
    for rs in sets:
        score = (
            f"{rs.score_minutes:.4f} min"
            if rs.score_minutes is not None
            else f"{rs.models_per_minute:.4f} models/min"
            if rs.models_per_minute
            else "-"
        )
        print(
            f"  results/{args.system}/{rs.scaling}/{rs.benchmark}/  {len(rs.runs)} runs, {rs.division} division, "
            f"score {score}"
        )
        print(f"  benchmarks/{rs.benchmark}/implementations/{args.impl}/")
    passed, errors, log = run_package_checker(out, args.ruleset)
    if passed:
        print(
            f"[submission] mlperf_logging.package_checker {out} {USAGE} {args.ruleset}: PASSED "
            f"(no errors; log {log})"
        )
        return 0
    print(
        f"[submission] mlperf_logging.package_checker {out} {USAGE} {args.ruleset}: FOUND ERRORS (log {log})"
    )
    for line in errors[:20]:
        print(f"  {line}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
