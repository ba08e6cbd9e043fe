"""Runs many `<bench>/train.py` invocations from one Python process (the input fuzz test, and
every single-rank train.py run of the tests through tests.helpers.run).

  python tests/train_driver.py CASES.json RESULTS.json
  python tests/train_driver.py --serve WORKDIR     # one case per line on stdin, one result per line on stdout
  python tests/train_driver.py --zygote SOCKET     # the ranks of horovodrun jobs (tests/rank_client.py)

CASES.json is a list of {"id", "bench", "argv", "timeout"}; RESULTS.json gets, per case,
{"id", "exit_code", "timed_out", "seconds", "stdout", "stderr"}. With --serve, each line of
stdin is one case and each line written back is its result, until stdin closes.

Starting train.py costs 10-20 s here, nearly all of it importing TensorFlow. This
driver imports everything once and then forks one child per case, which runs exactly
what train.py runs, `common.run.trainer.main(Task, argv)`, with its stdout and stderr in
files, and leaves with the exit code train.py would give (main's return value, or
main's own `os._exit` on an error). Forking after importing TensorFlow is safe as
long as the parent never runs an op (no eager context, no thread pools) and never
initializes Horovod: the parent here only imports and waits.

With --zygote, the children are the ranks of a test's `horovodrun ... python tests/rank_client.py
BENCH/train.py ARGS` job (or tests/*_probe.py ARGS, or -m offline.preflight ARGS, run as __main__),
and the tests' single-rank probes: each rank's client connects to SOCKET with its argv,
environment, working directory and standard streams; a monitor forked per connection forks the
rank, tells the client its pid, and sends back how it ended (and kills it if the client goes
first). A client whose environment differs from this process's (but for what the
launcher sets per rank) is told to run as a process of its own: TensorFlow here was imported under
this environment.
"""

import importlib
import io
import json
import os
import runpy
import select
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path

# The environment before anything was imported: a rank's must match it (--zygote).
ENV_AT_START = dict(os.environ)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
# As train.py sets it before importing TensorFlow.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

from common import benchmarks  # noqa: E402
from common.errors import ExitCode  # noqa: E402
from common.run.trainer import main  # noqa: E402

# What a run imports at its end, the training curve's matplotlib (0.3 s): once here, not per child.
importlib.import_module("matplotlib.pyplot")

TASKS = {name: benchmarks.task_class(name) for name in benchmarks.names()}
# What `sys.exit(main(Task))` in train.py turns an uncaught exception into.
EXIT_UNCAUGHT = ExitCode.CRASH
# Where the children's temporary directories go: the serving process's own folder (set below).
SCRATCH = Path(tempfile.gettempdir())


def _scratch(pid: int) -> Path:
    """A forked child's temporary directory. TensorFlow's autograph writes a file per converted
    function there and leaves its removal to an atexit hook, which os._exit skips: the child's
    parent removes the directory once the child has ended."""
    return SCRATCH / f"child-{pid}"


def _exit_as_python(setup, body) -> None:
    """In a forked child: setup(), then body() -> exit code, ended as `python SCRIPT` ends (a
    SystemExit's code; 1 and the traceback for an uncaught exception), its temporary files in
    _scratch(its pid); never returns."""
    code = EXIT_UNCAUGHT
    try:
        tempfile.tempdir = str(_scratch(os.getpid()))
        os.makedirs(tempfile.tempdir, exist_ok=True)
        setup()
        try:
            code = body()
        except SystemExit as e:  # argparse's usage errors, as under sys.exit
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if e.code is not None and not isinstance(e.code, int):
                print(e.code, file=sys.stderr)
        except BaseException:  # what the interpreter would print before exiting 1
            traceback.print_exc()
            code = EXIT_UNCAUGHT
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _child(task, argv, stdout_path, stderr_path) -> None:
    """In the forked child: train.py's body with its output in two files; never returns."""

    def setup():
        for fd, path in ((1, stdout_path), (2, stderr_path)):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(target, fd)
            os.close(target)
        sys.argv = [str(REPO / task.name / "train.py"), *argv]

    _exit_as_python(setup, lambda: main(task, argv))


def run_case(case: dict, workdir: Path) -> dict:
    """Forks, runs one case in the child, waits at most case['timeout'] seconds."""
    stdout_path = workdir / f"{case['id']}.stdout"
    stderr_path = workdir / f"{case['id']}.stderr"
    sys.stdout.flush()
    sys.stderr.flush()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.setpgid(0, 0)  # its own group: a timeout kills the child and anything it started
        _child(TASKS[case["bench"]], [str(a) for a in case["argv"]], stdout_path, stderr_path)
    deadline = start + float(case["timeout"])
    timed_out = False
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            timed_out = True
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _, status = os.waitpid(pid, 0)
            break
        time.sleep(0.05)
    shutil.rmtree(_scratch(pid), ignore_errors=True)
    code = os.waitstatus_to_exitcode(status)
    return {
        "id": case["id"],
        "exit_code": code,
        "timed_out": timed_out,
        "seconds": round(time.monotonic() - start, 2),
        "stdout": stdout_path.read_text(errors="replace") if stdout_path.exists() else "",
        "stderr": stderr_path.read_text(errors="replace") if stderr_path.exists() else "",
    }


def run_cases(cases: list[dict], workdir: Path) -> list[dict]:
    workdir.mkdir(parents=True, exist_ok=True)
    results = []
    for case in cases:
        results.append(run_case(case, workdir))
        print(
            f"[fuzz] {case['id']}: exit {results[-1]['exit_code']} in {results[-1]['seconds']} s",
            flush=True,
        )
    return results


def serve(workdir: Path) -> None:
    """Runs the cases read from stdin one at a time, each result a line on stdout, until stdin closes."""
    workdir.mkdir(parents=True, exist_ok=True)
    replies = os.fdopen(os.dup(1), "w")  # the children write to files; this stream is the answers
    for line in sys.stdin:
        if line.strip():
            replies.write(json.dumps(run_case(json.loads(line), workdir)) + "\n")
            replies.flush()


# What horovodrun sets per rank (its HOROVOD_* wiring, and the four below) and the tests' own keys:
# not compared between a rank's environment and the zygote's.
PER_RANK = ("LC_CTYPE", "NCCL_SOCKET_IFNAME", "PWD", "PYTHONUNBUFFERED", "PYTEST_CURRENT_TEST")


def _compared(environ: dict) -> dict:
    return {
        k: v
        for k, v in environ.items()
        if k not in PER_RANK and not k.startswith(("HOROVOD_", "TESTS_RANK_ZYGOTE"))
    }


def _reply(conn, message: dict) -> None:
    conn.sendall(json.dumps(message).encode() + b"\n")


def _request(conn) -> tuple[dict, list]:
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    size = int.from_bytes(data[:8], "big")
    data = data[8:]
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the client left mid-request")
        data += chunk
    return json.loads(data), fds


def _rank(argv, fds, environ, cwd) -> None:
    """In the rank's process: the client's streams, directory and environment, then the script's
    body (train.py's `main`, a probe or module run as __main__); never returns."""
    script = Path(argv[0])

    def setup():
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(environ)
        if environ.get("PYTHONUNBUFFERED"):  # as python -u makes them: no buffer before the fd
            sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
            sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True)
        sys.argv = argv

    def body() -> int:
        if script.name == "train.py":
            return main(TASKS[script.parent.name], argv[1:])
        if argv[0] == "-m":  # python -m MODULE ARGS: the working directory first, argv[0] its file
            sys.argv = argv[1:]
            sys.path.insert(0, cwd)
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
            return 0
        sys.path.insert(0, str(script.parent))  # as `python SCRIPT` puts it first
        runpy.run_path(str(script), run_name="__main__")
        return 0

    _exit_as_python(setup, body)


def _monitor(conn, added: dict) -> None:
    """In a child per connection: runs one rank, reports how it ended; never returns."""
    try:
        request, fds = _request(conn)
        argv, environ = request["argv"], request["env"]
        # What runs here is tests.helpers' choice (_forks); this process only checks the environment.
        if _compared(environ) != _compared(ENV_AT_START):
            differs = sorted(set(_compared(environ).items()) ^ set(_compared(ENV_AT_START).items()))
            _reply(conn, {"fallback": f"another environment: {differs[:4]}"})
            os._exit(0)
        pid = os.fork()
        if pid == 0:
            conn.close()
            _rank(argv, fds, environ | added, request["cwd"])
        for fd in fds:
            os.close(fd)
        _reply(conn, {"pid": pid})
        ended = os.pidfd_open(pid)
        ready, _, _ = select.select([ended, conn], [], [])
        if ended not in ready:  # the client is gone (killed): its rank goes too
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        shutil.rmtree(_scratch(pid), ignore_errors=True)
        _reply(conn, {"exit": os.waitstatus_to_exitcode(status)})
    finally:
        os._exit(0)


def zygote(path: Path) -> None:
    """Serves ranks on the Unix socket `path` (see the module's docstring) until the parent ends."""
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: end with the test process
    added = {k: v for k, v in os.environ.items() if ENV_AT_START.get(k) != v}  # what importing set
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(64)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the monitors, reaped as they end
    print("ready", flush=True)
    while True:
        conn, _ = server.accept()
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() == 0:
            server.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _monitor(conn, added)
        conn.close()


if __name__ == "__main__":
    if sys.argv[1] == "--zygote":
        SCRATCH = Path(sys.argv[2]).parent
        zygote(Path(sys.argv[2]))
    if sys.argv[1] == "--serve":
        SCRATCH = Path(sys.argv[2])
        serve(SCRATCH)
        sys.exit(0)
    cases_path, results_path = Path(sys.argv[1]), Path(sys.argv[2])
    SCRATCH = results_path.parent / "fuzz_output"
    results = run_cases(json.loads(cases_path.read_text()), SCRATCH)
    results_path.write_text(json.dumps(results, indent=1))
