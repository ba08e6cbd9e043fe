"""Shared test helpers: writing CosmoFlow records with TensorFlow's own writer, running train.py."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
HOROVODRUN = str(Path(sys.executable).with_name("horovodrun"))


def write_tfrecord(path, x: np.ndarray, y, gzip: bool = True) -> None:
    """One sample in the public layout, written with tf.io.TFRecordWriter directly
    (not with the project's writer, so the reader is checked against the format)."""
    import tensorflow as tf
    example = tf.train.Example(features=tf.train.Features(feature={
        "x": tf.train.Feature(bytes_list=tf.train.BytesList(value=[x.astype(np.int16).tobytes()])),
        "y": tf.train.Feature(float_list=tf.train.FloatList(value=list(np.asarray(y, np.float32)))),
    }))
    with tf.io.TFRecordWriter(str(path), tf.io.TFRecordOptions(compression_type="GZIP" if gzip else "")) as w:
        w.write(example.SerializeToString())


def env() -> dict:
    e = dict(os.environ)
    e["TF_CPP_MIN_LOG_LEVEL"] = "2"
    e["PYTHONPATH"] = str(REPO)
    return e


def run(cmd, timeout=600, cwd=REPO, environ=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=environ or env(), capture_output=True, text=True,
                          timeout=timeout)


def train_cmd(bench: str, config, *args) -> list:
    return [PYTHON, REPO / bench / "train.py", config, *args]


def horovodrun(np_: int, cmd, timeout=600) -> subprocess.CompletedProcess:
    return run([HOROVODRUN, "-np", str(np_), "-H", f"localhost:{np_}", "--gloo", *cmd], timeout=timeout)


def mpirun(np_: int, cmd, timeout=600) -> subprocess.CompletedProcess:
    # CI runs as root; OpenMPI refuses that unless told it is deliberate.
    return run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np_), "-x", "PYTHONPATH",
                "-x", "TF_CPP_MIN_LOG_LEVEL", *cmd], timeout=timeout)


def horovod_has_mpi() -> bool:
    """Whether Horovod was built with the MPI controller and mpirun exists."""
    import shutil
    probe = run([PYTHON, "-c", "import horovod.tensorflow as h; print(h.mpi_built())"], timeout=120)
    return shutil.which("mpirun") is not None and probe.stdout.strip().endswith("True")


LAUNCHERS = {"gloo": horovodrun, "mpi": mpirun}


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "error:" in line]


def _rank_pid(rank: int, marker: bytes):
    """PID of the training process of `rank`, found by its command line and launcher variables."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if marker not in (d / "cmdline").read_bytes():
                continue
            environ = dict(kv.split(b"=", 1) for kv in (d / "environ").read_bytes().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        for key in (b"HOROVOD_RANK", b"OMPI_COMM_WORLD_RANK", b"SLURM_PROCID"):
            if key in environ:
                if int(environ[key]) == rank:
                    return int(d.name)
                break
    return None


def kill_a_rank_mid_epoch(cmd, out_dir: Path, rank: int = 1, environ=None, timeout: float = 300):
    """Starts a multi-rank training `cmd`, kills `rank` with SIGKILL once an epoch is under way,
    and times how long the job takes to end. Returns (exit code, seconds, output)."""
    import signal
    import time
    proc = subprocess.Popen([str(c) for c in cmd], cwd=REPO, env=environ or env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    partial = Path(out_dir) / "mlperf.log.partial"
    deadline = time.monotonic() + timeout
    while not (partial.exists() and "epoch_start" in partial.read_text()):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("training never started an epoch:\n" + proc.communicate()[0][-3000:])
        time.sleep(0.2)
    time.sleep(2.0)   # mid-epoch, steps in flight
    pid = _rank_pid(rank, b"/train.py")
    assert pid is not None, f"no process of rank {rank} found"
    start = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"the job hung after rank {rank} was killed") from None
    return proc.returncode, time.monotonic() - start, output
