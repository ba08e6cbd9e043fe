"""Shared test helpers: writing CosmoFlow records with TensorFlow's own writer, running train.py."""

import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from common import launchers

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


def write_tfrecord(path, x: np.ndarray, y, gzip: bool = True) -> None:
    """One sample in the public layout, written with tf.io.TFRecordWriter directly
    (not with the project's writer, so the reader is checked against the format)."""
    import tensorflow as tf

    example = tf.train.Example(
        features=tf.train.Features(
            feature={
                "x": tf.train.Feature(
                    bytes_list=tf.train.BytesList(value=[x.astype(np.int16).tobytes()])
                ),
                "y": tf.train.Feature(
                    float_list=tf.train.FloatList(value=list(np.asarray(y, np.float32)))
                ),
            }
        )
    )
    with tf.io.TFRecordWriter(
        str(path), tf.io.TFRecordOptions(compression_type="GZIP" if gzip else "")
    ) as w:
        w.write(example.SerializeToString())


def read_tfrecord(path) -> tuple[np.ndarray, np.ndarray, bool]:
    """(x int16 flat, y float32 [4], gzipped) of a one-sample CosmoFlow file, read with TensorFlow's own ops."""
    import tensorflow as tf

    gzip = Path(path).read_bytes()[:2] == b"\x1f\x8b"
    record = next(iter(tf.data.TFRecordDataset(str(path), compression_type="GZIP" if gzip else "")))
    features = tf.io.parse_single_example(
        record,
        {"x": tf.io.FixedLenFeature([], tf.string), "y": tf.io.FixedLenFeature([4], tf.float32)},
    )
    return np.frombuffer(features["x"].numpy(), np.int16), features["y"].numpy(), gzip


def spoil_cosmoflow_target(path, value: float, index: int = 0) -> None:
    """Rewrites a CosmoFlow sample with target y[index] = value (NaN, Inf), the rest as it was."""
    x, y, gzip = read_tfrecord(path)
    y = y.copy()
    y[index] = value
    write_tfrecord(path, x, y, gzip=gzip)


def spoil_deepcam_sample(path, value: float, where=(0, 0, 0)) -> None:
    """Sets one value of a DeepCAM sample's climate/data (height, width, channel) to `value` in place."""
    import h5py

    with h5py.File(path, "r+") as f:
        f["climate/data"][where] = value


def spoil_deepcam_stats(path, value: float, key: str = "climate/maxval", channel: int = 0) -> None:
    """Sets one channel's entry of a stats.h5 vector to `value` in place."""
    import h5py

    with h5py.File(path, "r+") as f:
        f[key][channel] = value


def copy_deepcam_subset(src, dst, n_train: int, n_valid: int) -> list:
    """The first n_train / n_valid HDF5 samples of a DeepCAM data set and its stats.h5, copied into
    dst (a tree a test may damage); returns the copied training files."""
    import shutil

    for split, n in (("train", n_train), ("validation", n_valid)):
        (Path(dst) / split).mkdir(parents=True)
        for f in sorted((Path(src) / split).glob("*.h5"))[:n]:
            shutil.copy(f, Path(dst) / split / f.name)
    shutil.copy(Path(src) / "stats.h5", Path(dst) / "stats.h5")
    return sorted((Path(dst) / "train").glob("*.h5"))


def env() -> dict:
    e = dict(os.environ)
    e["TF_CPP_MIN_LOG_LEVEL"] = "2"
    e["PYTHONPATH"] = str(REPO)
    return e


def run(cmd, timeout=600, cwd=REPO, environ=None) -> subprocess.CompletedProcess:
    """Runs `cmd` to its end. A single-rank train.py run (`train_cmd`) in the tests' own environment
    runs as a child forked from one process that imported TensorFlow once (tests/train_driver.py):
    the same `common.run.trainer.main` train.py runs, its exit code and output, without the 5-10 s
    of start-up; a probe of tests/ forks from the zygote, as the ranks of `horovodrun` below do.
    TESTS_FORKED_TRAIN=0 runs every one as its own process."""
    environ = environ or env()
    if cwd == REPO and _forks(cmd):
        if isinstance(cmd, TrainCommand):
            driver = _train_driver()
            if _comparable(driver.environ) == _comparable(environ):
                return driver.run(cmd, timeout)
        else:
            # A probe or the preflight: its client hands it to the zygote, which runs it as its own
            # process where the environment differs from the zygote's.
            cmd, forked = rank_client(cmd)
            environ = environ | {"TESTS_RANK_ZYGOTE": forked["TESTS_RANK_ZYGOTE"]}
    return subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=environ, capture_output=True, text=True, timeout=timeout
    )


def failure_output(proc, chars: int = 3000) -> str:
    """What a failed run printed, for an assertion's message: its first traceback (in a multi-rank job
    the failing rank's, which the other ranks' shutdown errors follow and a tail alone cuts off), then
    the last `chars` of stdout and of stderr."""
    first = (proc.stdout + proc.stderr).find("Traceback")
    head = (proc.stdout + proc.stderr)[first : first + chars] + "\n[...]\n" if first >= 0 else ""
    return head + proc.stdout[-chars:] + proc.stderr[-chars:]


def _comparable(environ: dict) -> dict:
    return {k: v for k, v in environ.items() if k != "PYTEST_CURRENT_TEST"}  # pytest's, per test


class TrainCommand(list):
    """`python <bench>/train.py CONFIG ARGS...` as a list, which `run` may run forked (see there)."""

    @property
    def bench(self) -> str:
        return Path(self[1]).parent.name


def train_cmd(bench: str, config, *args) -> TrainCommand:
    return TrainCommand([PYTHON, REPO / bench / "train.py", config, *args])


class _TrainDriver:
    """The tests' one tests/train_driver.py --serve process: a case a line in, a result a line out."""

    def __init__(self):
        import atexit
        import tempfile

        self.environ = env()
        self.workdir = Path(tempfile.mkdtemp(prefix="train-driver-"))
        self.proc = subprocess.Popen(
            [PYTHON, REPO / "tests" / "train_driver.py", "--serve", self.workdir],
            cwd=REPO,
            env=self.environ,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.cases = 0
        atexit.register(self.close)

    def run(self, cmd: TrainCommand, timeout: float) -> subprocess.CompletedProcess:
        self.cases += 1
        case = {
            "id": f"case-{self.cases}",
            "bench": cmd.bench,
            "argv": [str(c) for c in cmd[2:]],
            "timeout": timeout,
        }
        self.proc.stdin.write(json.dumps(case) + "\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline()
        if not reply:
            raise RuntimeError(
                f"tests/train_driver.py ended (exit {self.proc.wait()}) before case {case}"
            )
        result = json.loads(reply)
        if result["timed_out"]:
            raise subprocess.TimeoutExpired(
                [str(c) for c in cmd], timeout, result["stdout"], result["stderr"]
            )
        return subprocess.CompletedProcess(
            [str(c) for c in cmd], result["exit_code"], result["stdout"], result["stderr"]
        )

    def close(self) -> None:
        import shutil

        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)
        shutil.rmtree(self.workdir, ignore_errors=True)


_driver = None


def _train_driver() -> _TrainDriver:
    global _driver
    if _driver is None or _driver.proc.poll() is not None:
        _driver = _TrainDriver()
    return _driver


class _Zygote:
    """The tests' one `tests/train_driver.py --zygote` process: the ranks of their horovodrun jobs
    of train.py and of probes fork from it (tests/rank_client.py)."""

    def __init__(self):
        import atexit
        import tempfile

        self.environ = env()
        self.socket = Path(tempfile.mkdtemp(prefix="rank-zygote-")) / "socket"
        self.proc = subprocess.Popen(
            [PYTHON, REPO / "tests" / "train_driver.py", "--zygote", self.socket],
            cwd=REPO,
            env=self.environ,
            stdout=subprocess.PIPE,
            text=True,
        )
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"tests/train_driver.py --zygote ended (exit {self.proc.wait()})")
        atexit.register(self.close)

    def close(self) -> None:
        import shutil

        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.socket.parent, ignore_errors=True)


_zygote = None


def zygote() -> _Zygote:
    global _zygote
    if _zygote is None or _zygote.proc.poll() is not None:
        _zygote = _Zygote()
    return _zygote


def _forks(cmd) -> bool:
    """Whether the zygote runs `cmd`'s ranks (the one place that decides): a train.py run, a probe
    of tests/, or the preflight."""
    if os.environ.get("TESTS_FORKED_TRAIN", "1") == "0":
        return False
    args = [str(c) for c in cmd[1:]] if len(cmd) > 1 and str(cmd[0]) == str(PYTHON) else [""]
    probe = Path(args[0]).parent == REPO / "tests" and args[0].endswith(("_probe.py", "_probes.py"))
    return isinstance(cmd, TrainCommand) or probe or args[:2] == ["-m", "offline.preflight"]


def rank_client(cmd) -> tuple[list, dict]:
    """What a launcher runs for `cmd`'s ranks to fork from the zygote, and in which environment."""
    forks = zygote()
    client = [PYTHON, REPO / "tests" / "rank_client.py", *cmd[1:]]
    return client, forks.environ | {"TESTS_RANK_ZYGOTE": str(forks.socket)}


def _launch(launcher: list, cmd, timeout) -> subprocess.CompletedProcess:
    """`cmd` under `launcher` (horovodrun); the ranks of a train.py run or a probe fork from the
    zygote (see tests/rank_client.py) unless TESTS_FORKED_TRAIN=0, and so does horovodrun itself:
    its check that Horovod was built with Gloo imports TensorFlow, 3 s of a 2-rank job's start."""
    if _forks(cmd):
        client, environ = rank_client(cmd)
        forked_launcher, _ = rank_client([PYTHON, *launcher])
        return run([*forked_launcher, *client], timeout=timeout, environ=environ)
    return run([*launcher, *cmd], timeout=timeout)


def horovodrun(np_: int, cmd, timeout=600) -> subprocess.CompletedProcess:
    return _launch(launchers.horovodrun(np_), cmd, timeout)


def mpirun(np_: int, cmd, timeout=600) -> subprocess.CompletedProcess:
    return run([*launchers.mpirun(np_), *cmd], timeout=timeout)


def two_nodes(ranks_per_node: int) -> str:
    """horovodrun's -H for two "nodes" of `ranks_per_node` ranks each, both on this machine: 'localhost'
    and '127.0.0.1' are two hosts to Horovod (two nodes, local sizes and cross ranks to match)."""
    return f"localhost:{ranks_per_node},127.0.0.1:{ranks_per_node}"


def horovodrun_two_nodes(np_: int, cmd, timeout=600) -> subprocess.CompletedProcess:
    return _launch(launchers.horovodrun(np_, hosts=two_nodes(np_ // 2)), cmd, timeout)


@functools.cache
def horovod_has_mpi() -> bool:
    """Whether Horovod was built with the MPI controller and mpirun exists (asked once per process:
    the answer imports TensorFlow in a subprocess)."""
    import shutil

    probe = run([PYTHON, "-c", "import horovod.tensorflow as h; print(h.mpi_built())"], timeout=120)
    return shutil.which("mpirun") is not None and probe.stdout.strip().endswith("True")


LAUNCHERS = {"gloo": horovodrun, "mpi": mpirun, "two-nodes": horovodrun_two_nodes}


def error_lines(text: str) -> list[str]:
    """The project's `error:` lines of `text` (TensorFlow's C++ log lines, which can hold 'error:' too,
    left out: grappler's remapper line, docs/running.md#the-remapper-line, once warm-up runs a step)."""
    return [line for line in own_lines(text) if "error:" in line]


# TensorFlow's C++ log lines (`I0000 00:00:1796188453.009072   25257 port.cc:153] ...`) and abseil's
# notice before them: TF >= 2.20 logs through abseil before its log level is read, so
# TF_CPP_MIN_LOG_LEVEL does not hide the first few (oneDNN's notice at import).
_TF_LOG_LINE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called"
    r"|[IWEF]\d{4} [\d:.]+ +\d+ [\w.]+:\d+\] )"
)


def own_lines(stderr: str) -> list[str]:
    """The lines of `stderr` that are not TensorFlow's C++ log: what the project itself wrote."""
    return [line for line in stderr.strip().splitlines() if not _TF_LOG_LINE.match(line)]


def _rank_pid(rank: int, run_dir):
    """PID of the training process of `rank` of the run writing to `run_dir`: a Python whose arguments
    hold run_dir, with the rank in its launcher variables. Never another test's rank, nor a launcher
    (srun, horovodrun) whose own arguments hold run_dir: CI runs two test files at once, and a search
    by "/train.py" alone would send SIGKILL and SIGTERM to the other file's ranks and srun."""
    wanted = b"\0" + str(run_dir).encode() + b"\0"
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmdline = b"\0" + (d / "cmdline").read_bytes()
            if wanted not in cmdline or not os.path.basename(cmdline.split(b"\0")[1]).startswith(
                b"python"
            ):
                continue
            environ = dict(
                kv.split(b"=", 1) for kv in (d / "environ").read_bytes().split(b"\0") if b"=" in kv
            )
        except OSError:
            continue
        for key in (b"HOROVOD_RANK", b"OMPI_COMM_WORLD_RANK", b"SLURM_PROCID"):
            if key in environ:
                if int(environ[key]) == rank:
                    return int(d.name)
                break
    return None


def saying_its_exit_code(cmd, before: str = "") -> list:
    """`cmd` for each rank of a launch, run by a shell that then prints "rank R exit CODE" (horovodrun
    reports 1 for any failure); `before`: shell commands to run first. Read back by `said_exit_codes`."""
    return [
        "sh",
        "-c",
        f'{before} "$0" "$@"; code=$?; echo "rank $HOROVOD_RANK exit $code"; exit $code',
        *map(str, cmd),
    ]


def said_exit_codes(output: str) -> dict:
    """{rank: exit code} of the ranks whose shell got to say it (`saying_its_exit_code`). Once the first
    rank exits, horovodrun terminates the rest, whose shells may then say nothing."""
    return {int(r): int(c) for r, c in re.findall(r"rank (\d+) exit (\d+)", output)}


def kill_a_rank_mid_epoch(cmd, out_dir: Path, rank: int = 1, environ=None, timeout: float = 300):
    """Starts a multi-rank training `cmd`, kills `rank` with SIGKILL once an epoch is under way,
    and times how long the job takes to end. Returns (exit code, seconds, output)."""
    import signal
    import time

    proc = subprocess.Popen(
        [str(c) for c in cmd],
        cwd=REPO,
        env=environ or env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    partial = Path(out_dir) / "mlperf.log.partial"
    deadline = time.monotonic() + timeout
    while not (partial.exists() and "epoch_start" in partial.read_text()):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(
                "training never started an epoch:\n" + proc.communicate()[0][-3000:]
            )
        time.sleep(0.2)
    time.sleep(2.0)  # mid-epoch, steps in flight
    pid = _rank_pid(rank, out_dir)
    assert pid is not None, f"no process of rank {rank} found"
    start = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"the job hung after rank {rank} was killed") from None
    return proc.returncode, time.monotonic() - start, output


def final_checkpoint_state(out: Path) -> dict:
    """Every tensor of a run's newest checkpoint (the state after its last step)."""
    import tensorflow as tf

    folders = sorted((Path(out) / "checkpoints").glob("step-??????????"))
    assert folders, f"no checkpoint in {out}"
    reader = tf.train.load_checkpoint(str(folders[-1] / "ckpt"))
    names = [
        n
        for n in reader.get_variable_to_shape_map()
        if not n.startswith(("save_counter", "_CHECKPOINTABLE"))
    ]
    return {n: reader.get_tensor(n) for n in names}


def assert_same_final_state(whole: Path, resumed: Path, bench: str) -> None:
    """A resumed run ends with an uninterrupted run's model, optimizer and generators, bit for bit,
    its log says it resumed, and its last epoch's loss is the same."""
    import json

    expected, got = final_checkpoint_state(whole), final_checkpoint_state(resumed)
    assert sorted(got) == sorted(expected)
    assert any(n.startswith("optimizer/") for n in got) and any(n.startswith("model/") for n in got)
    if bench == "cosmoflow":
        assert any(n.startswith("rng/") for n in got)  # the dropout generator's state
    differ = [n for n in expected if not np.array_equal(expected[n], got[n])]
    assert not differ, f"{len(differ)} of {len(expected)} tensors differ, e.g. {differ[:3]}"
    assert '"key": "resumed_from"' in (Path(resumed) / "mlperf.log").read_text()
    whole_history = json.loads((Path(whole) / "summary.json").read_text())["history"]
    history = json.loads((Path(resumed) / "summary.json").read_text())["history"]
    assert history[-1]["loss"] == whole_history[-1]["loss"]


# DeepCAM at 1/16 of the reference's width (the tiny config's half), for tests whose property does not
# depend on the width (flags running together, a resumed run ending bitwise equal): each trains less.
DEEPCAM_NARROW = ["--set", "model.width=0.0625"]


# A short CosmoFlow run for the resume tests (test_exact_resume.py, test_slurm.py): 3 epochs of
# 96 samples, a checkpoint every 3 steps, op determinism; dropout on, so that its generator's
# state must resume too; a target reached at once, so it exits 0 (horovodrun turns 3 into 1).
COSMOFLOW_EXACT_ARGS = [
    "--n-train",
    "96",
    "--n-valid",
    "32",
    "--batch-size",
    "4",
    "--n-epochs",
    "3",
    "--checkpoint-steps",
    "3",
    "--deterministic",
    "--set",
    "model.dropout=0.3",
    "--set",
    "train.stop_at_target=false",
    "--set",
    "target_mae=10",
    "--set",
    "runtime.check_log=false",
]


def checkpoint_after_epoch(run_dir, epoch: int) -> Path:
    """The checkpoint folder a run wrote at the end of `epoch` (its state.json says which)."""
    import json

    for folder in sorted((Path(run_dir) / "checkpoints").glob("step-??????????")):
        state = json.loads((folder / "state.json").read_text())
        if state["epoch"] == epoch and state["steps_done"] == state["steps_per_epoch"]:
            return folder
    raise AssertionError(f"no checkpoint of the end of epoch {epoch} in {run_dir}/checkpoints")


def two_ranks_json(out) -> list:
    """Both ranks' OUT/rank-R.json of a probe of 2 ranks (tests/two_rank_probes.py)."""
    return [json.loads((Path(out) / f"rank-{r}.json").read_text()) for r in (0, 1)]


class SingleProcess:
    """The Distribution of one process without Horovod, for TrainStep in unit tests."""

    size = 1

    @staticmethod
    def average_gradients(grads, compression="none", grouped=False):
        return grads


def train_to_summary(cmd, ranks: int, out) -> tuple:
    """Runs a train.py command on `ranks` ranks (horovodrun above 1) that must exit 0; (the process, out's summary)."""
    proc = horovodrun(ranks, cmd) if ranks > 1 else run(cmd)
    assert proc.returncode == 0, failure_output(proc)
    return proc, json.loads((Path(out) / "summary.json").read_text())


def final_model_weights(out) -> dict:
    """{checkpoint name: array} of the model's variables in the run folder's newest checkpoint."""
    import tensorflow as tf

    folder = sorted((Path(out) / "checkpoints").iterdir())[-1]
    reader = tf.train.load_checkpoint(str(folder / "ckpt"))
    return {
        n: reader.get_tensor(n)
        for n in reader.get_variable_to_shape_map()
        if n.startswith("model/")
    }


def rank_results(out, job: str, ranks: int) -> list[dict]:
    """Each rank's arrays of a probe's `job` (OUT/JOB/rank-NNNNN.npz, as tests/*_probe.py write them), in rank order."""
    found = []
    for rank in range(ranks):
        with np.load(Path(out) / job / f"rank-{rank:05d}.npz") as f:
            found.append({k: f[k] for k in f.files})
    return found
