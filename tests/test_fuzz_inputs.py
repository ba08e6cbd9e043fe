"""Bad input, fuzzed: one damaged file per run, through the real entry point.

Each case copies a small data set (or the tiny config), damages ONE file with a
seeded random damage (flip bytes, truncate, zero a range, append garbage; or, in a
file that stays well-formed, one NaN or Inf value: a DeepCAM field, a CosmoFlow
target, a stats.h5 entry), runs a one-epoch training and accepts exactly two endings:

  trained   exit 0 or 3: the damage left the input valid (a flipped float, a gzip
            header byte nobody checks);
  named     exit 2, no traceback, stderr's last line is the only `error:` line and
            names the damaged file (for a damaged config: the config file, a config
            key, or a data file that no longer matches the config's shapes).

Anything else (a traceback, exit 1, a signal, a hang past TIMEOUT_S, the wrong
file named) fails the test and prints the case's reproducer; so does a NaN or Inf
that trains (a non-finite value is never valid input).

The cases run in one `tests/train_driver.py` process, which imports TensorFlow once
and forks a child per case that runs `common.run.trainer.main(Task, argv)`, what
train.py runs; a few cases also run as `python <bench>/train.py` and must give the
same exit code and error line.
"""

import dataclasses
import json
import random
import re
import shutil
import time
from collections import Counter
from pathlib import Path

import pytest

from tests import helpers

SEED = 20240611
TIMEOUT_S = 120
# (bench, target, damage, cases in the fast tier, seeds drawn): 21 cases, 13 of them fast; every file
# kind meets every damage once. A DeepCAM case that trains costs ~10-30 s here (a CosmoFlow one
# ~3 s): the fast tier takes DeepCAM's cheap ones (stats.h5 and config damage that ends the run
# before the first step) and leaves to the slow tier its damaged samples and the stats.h5 damage that
# trains (zeroed with its seed; garbage appended, which HDF5 ignores past a file's end). A second seed
# of the same damage to the same kind of file found nothing the first did not, so each runs one; the
# second seeds are still drawn, not run, so that every case keeps its seed (its damage follows from it).
PLAN = (
    ("cosmoflow", "tfrecord", "flip", 1, 2),
    ("cosmoflow", "tfrecord", "truncate", 1, 2),
    ("cosmoflow", "tfrecord", "zero", 1, 2),
    ("cosmoflow", "tfrecord", "append", 1, 2),
    ("cosmoflow", "config", "flip", 1, 2),
    ("cosmoflow", "config", "truncate", 1, 2),
    ("deepcam", "sample", "flip", 0, 1),
    ("deepcam", "sample", "truncate", 0, 1),
    ("deepcam", "sample", "zero", 0, 1),
    ("deepcam", "sample", "append", 0, 1),
    ("deepcam", "stats", "flip", 1, 2),
    ("deepcam", "stats", "truncate", 1, 2),
    ("deepcam", "stats", "zero", 0, 2),
    ("deepcam", "stats", "append", 0, 1),
    ("deepcam", "config", "flip", 1, 2),
    ("deepcam", "config", "truncate", 1, 2),
    ("cosmoflow", "tfrecord", "nan", 1, 2),
    ("cosmoflow", "tfrecord", "inf", 1, 2),
    ("deepcam", "sample", "nan", 0, 1),
    ("deepcam", "sample", "inf", 0, 1),
    ("deepcam", "stats", "nan", 1, 2),
)
NON_FINITE = ("nan", "inf")  # damages that keep the file well-formed and put in one such value
N_TRAIN = {"cosmoflow": 16, "deepcam": 8}
N_VALID = {"cosmoflow": 8, "deepcam": 4}
SUFFIX = {"cosmoflow": ".tfrecord", "deepcam": ".h5"}
CONFIG = {
    "cosmoflow": helpers.REPO / "tests" / "configs" / "cosmoflow_tiny.yaml",
    "deepcam": helpers.REPO / "tests" / "configs" / "deepcam_tiny.yaml",
}


@dataclasses.dataclass(frozen=True)
class Case:
    bench: str
    target: str  # tfrecord, sample, stats or config
    damage: str
    seed: int
    fast: bool

    @property
    def id(self) -> str:
        return f"{self.bench}-{self.target}-{self.damage}-{self.seed}"


def plan_cases() -> list[Case]:
    cases = []
    seed = SEED
    for bench, target, damage, n_fast, n_seeds in PLAN:
        for i in range(n_seeds):
            if i < max(n_fast, 1):  # the fast tier's, else the slow tier's one
                cases.append(Case(bench, target, damage, seed=seed, fast=i < n_fast))
            seed += 1
    return cases


# ------------------------------------------------------------------ damage
def damage_bytes(raw: bytes, damage: str, rng: random.Random, config: bool) -> tuple[bytes, str]:
    """`raw` damaged as `damage` says; returns (new bytes, what was done)."""
    size = len(raw)
    if damage == "flip":
        k = rng.randint(1, 8 if config else 64)
        out = bytearray(raw)
        where = sorted(rng.randrange(size) for _ in range(k))
        for i in where:
            out[i] ^= rng.randint(1, 255)
        return bytes(out), f"flipped {k} byte(s) at {where[:8]}{'...' if k > 8 else ''}"
    if damage == "truncate":
        n = 0 if rng.random() < 0.15 else rng.randrange(size)
        return raw[:n], f"truncated {size} -> {n} bytes"
    if damage == "zero":
        start = rng.randrange(size)
        n = rng.randint(1, max(1, (size - start) // 2))
        return raw[:start] + bytes(n) + raw[start + n :], f"zeroed [{start}, {start + n}) of {size}"
    if damage == "append":
        n = rng.randint(1, 4096)
        return raw + rng.randbytes(n), f"appended {n} random bytes to {size}"
    raise ValueError(damage)


def put_non_finite(case: Case, victim: Path, rng: random.Random) -> str:
    """One NaN or (signed) Inf at a seeded place of a well-formed file; returns what was done."""
    value = float("nan") if case.damage == "nan" else rng.choice((1.0, -1.0)) * float("inf")
    if case.target == "tfrecord":
        index = rng.randrange(4)
        helpers.spoil_cosmoflow_target(victim, value, index)
        return f"target y[{index}] = {value}"
    if case.target == "stats":
        key, channel = rng.choice(("climate/minval", "climate/maxval")), rng.randrange(16)
        helpers.spoil_deepcam_stats(victim, value, key, channel)
        return f"{key}[{channel}] = {value}"
    where = (rng.randrange(64), rng.randrange(96), rng.randrange(16))  # the tests' 64x96x16 samples
    helpers.spoil_deepcam_sample(victim, value, where)
    return f"climate/data{list(where)} = {value}"


def prepare(case: Case, source: Path, root: Path) -> tuple[dict, Path, str]:
    """Copies the data (and config) into `root`, damages one file; returns (driver case, victim, damage)."""
    rng = random.Random(case.seed)
    data = root / "data"
    copied = []
    for split, n in (("train", N_TRAIN[case.bench]), ("validation", N_VALID[case.bench])):
        (data / split).mkdir(parents=True)
        for p in sorted((source / split).glob("*" + SUFFIX[case.bench]))[:n]:
            copied.append(Path(shutil.copy(p, data / split / p.name)))
    if case.bench == "deepcam":
        shutil.copy(source / "stats.h5", data / "stats.h5")
    config = Path(shutil.copy(CONFIG[case.bench], root / CONFIG[case.bench].name))
    victim = {"config": config, "stats": data / "stats.h5"}.get(case.target) or rng.choice(copied)
    if case.damage in NON_FINITE:
        done = put_non_finite(case, victim, rng)
    else:
        raw, done = damage_bytes(
            victim.read_bytes(), case.damage, rng, config=case.target == "config"
        )
        victim.write_bytes(raw)
    if case.bench == "cosmoflow":
        argv = [
            config,
            "--data-dir",
            data,
            "--output-dir",
            root / "run",
            "--n-train",
            N_TRAIN["cosmoflow"],
            "--n-valid",
            N_VALID["cosmoflow"],
            "--n-epochs",
            1,
            "--checkpoint-every",
            0,
        ]
    else:
        argv = [
            config,
            "--data_dir_prefix",
            data,
            "--output_dir",
            root / "run",
            "--max_epochs",
            1,
            "--save_frequency",
            0,
        ]
    argv += ["--set", "runtime.check_log=false"]
    return (
        {"id": case.id, "bench": case.bench, "argv": [str(a) for a in argv], "timeout": TIMEOUT_S},
        victim,
        done,
    )


# ----------------------------------------------------------------- verdict
def error_lines(stderr: str) -> list[str]:
    """Our error lines (TensorFlow's own log lines may hold 'error:' mid-line)."""
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def verdict(case: Case, victim: Path, data: Path, result: dict) -> tuple[str, str]:
    """('trained' | 'named' | 'FAIL', why)."""
    out = result["stdout"] + result["stderr"]
    code = result["exit_code"]
    if result["timed_out"]:
        return "FAIL", f"hang: no exit within {TIMEOUT_S} s"
    if "Traceback" in out:
        return "FAIL", f"traceback (exit {code})"
    if code in (0, 3):
        if case.damage in NON_FINITE:
            return "FAIL", f"a {case.damage} value trained (exit {code})"
        return "trained", f"exit {code}"
    if code != 2:
        return "FAIL", f"exit {code}"
    lines = [line for line in result["stderr"].splitlines() if line.strip()]
    errors = error_lines(result["stderr"])
    if not lines or not lines[-1].startswith("error:") or len(errors) != 1:
        return "FAIL", f"exit 2 but {len(errors)} error line(s), last line {lines[-1:]!r}"
    line = lines[-1]
    if victim.name in line:
        return "named", line
    if case.target == "config":
        key = re.search(r"config key '[\w.\[\]]+'", line)
        data_file = re.search(re.escape(str(data)) + r"/\S+", line)
        if key or data_file:
            return "named", line
    return "FAIL", f"error line does not name {victim.name}: {line}"


def run_driver(prepared: list[dict], tmp_path: Path) -> dict:
    cases_file, results_file = tmp_path / "cases.json", tmp_path / "results.json"
    cases_file.write_text(json.dumps(prepared))
    budget = 120 + sum(c["timeout"] for c in prepared)
    proc = helpers.run(
        [helpers.PYTHON, helpers.REPO / "tests" / "train_driver.py", cases_file, results_file],
        timeout=budget,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return {r["id"]: r for r in json.loads(results_file.read_text())}


def table(rows) -> str:
    """Outcomes by (file kind, damage): counts of trained / named / FAIL."""
    counts = Counter(
        (f"{case.bench}/{case.target}", case.damage, outcome) for case, outcome, _ in rows
    )
    kinds = sorted({(k, d) for k, d, _ in counts})
    lines = [f"{'file':<20}{'damage':<10}{'trained':>8}{'named':>7}{'FAIL':>6}"]
    for kind, damage in kinds:
        lines.append(
            f"{kind:<20}{damage:<10}"
            + "".join(
                f"{counts[(kind, damage, o)]:>{w}}"
                for o, w in (("trained", 8), ("named", 7), ("FAIL", 6))
            )
        )
    total = Counter(outcome for _, outcome, _ in rows)
    lines.append(f"{'total':<30}{total['trained']:>8}{total['named']:>7}{total['FAIL']:>6}")
    return "\n".join(lines)


def test_every_file_kind_meets_every_damage_with_a_seed_of_its_own():
    cases = plan_cases()
    assert {(c.bench, c.target, c.damage) for c in cases} == {row[:3] for row in PLAN}
    assert len({c.seed for c in cases}) == len(cases) == len({c.id for c in cases})
    assert sum(c.fast for c in cases) == sum(row[3] for row in PLAN)


@pytest.fixture(scope="module")
def driven(cosmo_data, deepcam_data, tmp_path_factory):
    """driven(tier) -> the tier's cases prepared and run in one driver (run once): (cases, prepared
    specs by id, {id: (victim, damage done)}, {id: result}, seconds, root)."""
    sources = {"cosmoflow": cosmo_data, "deepcam": deepcam_data}
    done = {}

    def run(tier: str):
        if tier not in done:
            root = tmp_path_factory.mktemp(f"fuzz-{tier}")
            cases = [c for c in plan_cases() if c.fast == (tier == "fast")]
            prepared, victims = {}, {}
            for case in cases:
                spec, victim, damage = prepare(case, sources[case.bench], root / case.id)
                prepared[case.id] = spec
                victims[case.id] = (victim, damage)
            start = time.monotonic()
            results = run_driver(list(prepared.values()), root)
            done[tier] = cases, prepared, victims, results, time.monotonic() - start, root
        return done[tier]

    return run


@pytest.mark.parametrize("tier", ["fast", pytest.param("slow", marks=pytest.mark.slow)])
def test_damaged_input_trains_or_names_the_file(tier, driven, capsys):
    cases, _, victims, results, seconds, root = driven(tier)
    rows, failures = [], []
    for case in cases:
        victim, done = victims[case.id]
        outcome, why = verdict(case, victim, root / case.id / "data", results[case.id])
        rows.append((case, outcome, why))
        if outcome == "FAIL":
            failures.append(
                f"{case.id}: {why}\n  reproduce: seed {case.seed}, {case.target} "
                f"{victim.relative_to(root / case.id)}, {done}\n  stderr tail: "
                f"{results[case.id]['stderr'][-1500:]}"
            )
    report = f"{tier} tier: {len(cases)} cases in {seconds:.0f} s\n{table(rows)}\n" + "\n".join(
        f"  {c.id}: {outcome}: {why[:160]}" for c, outcome, why in rows
    )
    with capsys.disabled():
        print("\n" + report)
    assert not failures, "\n".join(failures)


# The real entry point, as a subprocess: same exit code and error line as the driver's child.
REAL = (
    "cosmoflow-tfrecord-truncate",  # named mid-run, by the input pipeline
    "cosmoflow-config-flip",
    "deepcam-stats-flip",  # named before the first step
    "deepcam-stats-zero",  # trains
)


@pytest.mark.slow
def test_train_py_ends_as_the_driver_says(driven):
    # The cases as the tiers' driver ran them (three of the fast tier's, one of the slow's), each
    # again as a process of its own with the same arguments, on the same damaged files.
    for prefix in REAL:
        case = next(c for c in plan_cases() if c.id.startswith(prefix))
        _, prepared, _, results, _, _ = driven("fast" if case.fast else "slow")
        spec, mine = prepared[case.id], results[case.id]
        # A plain list: helpers.run forks a TrainCommand from the driver, which is what is compared.
        proc = helpers.run([*helpers.train_cmd(spec["bench"], *spec["argv"])], timeout=TIMEOUT_S)
        assert proc.returncode == mine["exit_code"], (
            spec["id"],
            proc.stderr[-2000:],
            mine["stderr"][-2000:],
        )
        assert error_lines(proc.stderr) == error_lines(mine["stderr"]), spec["id"]
