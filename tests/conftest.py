import collections
import fcntl
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import common  # noqa: F401  (oneDNN on, for this process and every subprocess: common/cpu.py)
from tests import helpers

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _shared(tmp_path_factory, name: str, make) -> Path:
    """The folder `name` that `make(folder)` fills, once per test session: the pytest-xdist workers'
    base directories share a parent, the controller's, where the first worker to ask writes the data
    set while the others wait on its lock (a set costs 10-35 CPU seconds to write). `make` is a
    synthetic generator, which leaves a folder it has finished (its marker) as it is."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    out = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        out.mkdir(exist_ok=True)
        make(out)
    return out


# Small enough to write in seconds, large enough that the tiny config reaches
# the MLPerf target (MAE <= 0.124) in a few epochs.
TINY = dict(size=32, n_train=2048, n_valid=256, seed=7)


@pytest.fixture(scope="session")
def cosmo_data(tmp_path_factory):
    """A synthetic CosmoFlow data set in the public layout, made once per test session."""
    from cosmoflow import synthetic

    return _shared(
        tmp_path_factory,
        "cosmo_synth",
        lambda out: synthetic.generate(
            out,
            TINY["size"],
            TINY["n_train"],
            TINY["n_valid"],
            seed=TINY["seed"],
            progress=lambda msg: None,
        ),
    )


# For the runs whose subject is a launcher or a package, not learning, that must still end with a log
# the checker passes (it needs the target met): parameters drawn from [-0.1, 0.1], so the tiny
# config meets the target at its first evaluation (eval_error about 0.05 after one epoch of 256).
EASY = dict(size=32, n_train=256, n_valid=64, seed=7, target_spread=0.1)
# What a run on it passes train.py: the tiny config's own counts are the suite's set's.
EASY_ARGS = ["--n-train", str(EASY["n_train"]), "--n-valid", str(EASY["n_valid"])]


@pytest.fixture(scope="session")
def cosmo_easy_data(tmp_path_factory):
    """A synthetic CosmoFlow set of EASY's narrow parameters, made once per test session."""
    from cosmoflow import synthetic

    return _shared(
        tmp_path_factory,
        "cosmo_easy",
        lambda out: synthetic.generate(
            out,
            EASY["size"],
            EASY["n_train"],
            EASY["n_valid"],
            seed=EASY["seed"],
            target_spread=EASY["target_spread"],
            progress=lambda msg: None,
        ),
    )


@pytest.fixture(scope="session")
def tiny_config():
    return helpers.REPO / "tests" / "configs" / "cosmoflow_tiny.yaml"


# DeepCAM: 64x96 samples with events enlarged (tiny objects learn slowly at this size);
# the tiny config reaches IoU 0.82 on them in about 5 epochs (0.835 after 5 seen with the reference init).
DEEPCAM_TINY = dict(
    height=64,
    width=96,
    n_train=256,
    n_valid=32,
    seed=11,
    cyclone_fraction=0.01,
    river_fraction=0.03,
)


@pytest.fixture(scope="session")
def deepcam_data(tmp_path_factory):
    """A synthetic DeepCAM data set (train/, validation/, stats.h5), made once per test session."""
    from deepcam import synthetic

    return _shared(
        tmp_path_factory,
        "deepcam_synth",
        lambda out: synthetic.generate(out, progress=lambda *a, **k: None, **DEEPCAM_TINY),
    )


@pytest.fixture(scope="session")
def deepcam_config():
    return helpers.REPO / "tests" / "configs" / "deepcam_tiny.yaml"


# The 2-rank probes of several test files (tests/two_rank_probes.py), in one horovodrun launch per
# session: a launch's start-up (TensorFlow imported, Horovod's rendezvous on each rank) costs more
# than most probes. The first worker to ask launches it; the other waits on its lock and reads it.
def _launch_two_rank_probes(out: Path) -> None:
    import json

    from tests.two_rank_probes import PROBES

    if (out / "launch.json").exists():
        return
    proc = helpers.horovodrun(
        2,
        [helpers.PYTHON, helpers.REPO / "tests" / "two_rank_probes.py", out, *PROBES],
        timeout=900,
    )
    result = {"returncode": proc.returncode, "output": helpers.failure_output(proc)}
    (out / "launch.json").write_text(json.dumps(result))


@pytest.fixture(scope="session")
def two_rank_probe(tmp_path_factory):
    """two_rank_probe(name) -> the folder tests/two_rank_probes.py's probe `name` wrote."""
    import json

    out = _shared(tmp_path_factory, "two_rank_probes", _launch_two_rank_probes)
    launch = json.loads((out / "launch.json").read_text())

    def folder(name: str) -> Path:
        assert launch["returncode"] == 0, launch["output"]
        return out / name

    return folder


# A one-node SLURM cluster of this host's own (tools/local_slurm.sh), started once for the pytest
# process by the first test that asks for it and stopped at its end: tests/test_slurm.py and
# tests/test_images.py (its image's jobs). One per host at a time (its ports, munged): the scheduler
# below gives both files to one worker.
def _ensure_packages() -> str | None:
    """None when SLURM and munge are usable, else why not."""
    if os.geteuid() != 0:
        return "not root: cannot start munged/slurmctld/slurmd"
    if all(shutil.which(b) for b in ("munged", "slurmctld", "slurmd", "sbatch")):
        return None
    proc = subprocess.run(
        "apt-get install -y -qq slurm-wlm munge >/dev/null 2>&1 || "
        "(apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq slurm-wlm munge >/dev/null 2>&1)",
        shell=True,
        timeout=900,
    )
    if proc.returncode != 0 or not shutil.which("slurmctld"):
        return "cannot install slurm-wlm and munge with apt-get"
    return None


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    why = _ensure_packages()
    if why:
        print(f"SKIP (no SLURM cluster): {why}")
        pytest.skip(why)
    state = tmp_path_factory.mktemp("slurm")
    start = subprocess.run(
        ["bash", helpers.REPO / "tools" / "local_slurm.sh", "start", state],
        capture_output=True,
        text=True,
        timeout=180,
    )
    try:
        assert start.returncode == 0, start.stdout + start.stderr
        yield state / "slurm.conf"
    finally:  # the daemons go away whatever happened
        subprocess.run(
            ["bash", helpers.REPO / "tools" / "local_slurm.sh", "stop", state],
            capture_output=True,
            timeout=60,
        )


# The test files that cost most, the longest first (CI's figures: tools/test_costs.py prints them).
# pytest-xdist's --dist loadfile hands out files largest (most tests) first, which puts the CPU image
# and the SLURM cluster, files of 3-5 long tests, last: they then end a run on one
# busy core. Handed out first, they start at once and the short files fill in behind them.
HEAVY_FIRST = (
    "test_images.py",
    "test_slurm.py",
    "test_exact_resume.py",
    "test_deepcam_split.py",
    "test_cosmoflow_end_to_end.py",
    "test_deepcam_end_to_end.py",
    "test_fuzz_inputs.py",
    "test_spatial.py",
    "test_flag_combinations.py",
    "test_horovod.py",
    "test_results_tools.py",
    "test_sharded_optimizer.py",
)
_HEAVY_RANK = {name: i for i, name in enumerate(HEAVY_FIRST)}
SLURM_FILES = ("test_images.py", "test_slurm.py")  # each starts a cluster (slurm_cluster)


class _CostliestFilesFirst(collections.OrderedDict):
    """xdist's queue of files (scope -> tests); the file it takes next is the first of HEAVY_FIRST
    still queued, else the one xdist put first."""

    def popitem(self, last=True):
        if last or not self:
            return super().popitem(last)
        scope = min(
            self,
            key=lambda s: _HEAVY_RANK.get(os.path.basename(s.split("::")[0]), len(HEAVY_FIRST)),
        )
        return scope, self.pop(scope)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class OneClusterAtATime(LoadFileScheduling):
        def _split_scope(self, nodeid):  # SLURM_FILES as one scope: one worker, in turn
            scope = super()._split_scope(nodeid)
            return SLURM_FILES[0] if os.path.basename(scope) in SLURM_FILES else scope

    scheduler = OneClusterAtATime(config, log)
    scheduler.workqueue = _CostliestFilesFirst()
    return scheduler


def _cpu_busy_seconds() -> float:
    """Busy CPU time of the whole machine so far (/proc/stat), in seconds."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """TEST_COST_LOG=FILE: one JSON line per test, its wall seconds (setup, call and teardown) and
    the machine's busy CPU seconds meanwhile: its own CPU cost when it ran alone, what `.ci/run`
    prints per module (tools/test_costs.py) to say where CI's time goes."""
    log = os.environ.get("TEST_COST_LOG")
    if not log:
        yield
        return
    import json
    import time

    t0, cpu0 = time.monotonic(), _cpu_busy_seconds()
    yield
    record = {
        "test": item.nodeid,
        "wall_s": round(time.monotonic() - t0, 2),
        "machine_cpu_s": round(_cpu_busy_seconds() - cpu0, 2),
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
    }
    with open(log, "a") as f:
        f.write(json.dumps(record) + "\n")
