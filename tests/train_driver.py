"""Runs many `<bench>/train.py` invocations from one Python process (the input fuzz test, and
every single-rank train.py run of the tests through tests.helpers.run).

  python tests/train_driver.py CASES.json RESULTS.json
  python tests/train_driver.py --serve WORKDIR     # one case per line on stdin, one result per line on stdout

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
"""

import importlib
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path

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


def _child(task, argv, stdout_path, stderr_path) -> None:
    """In the forked child: train.py's body with its output in two files; never returns."""
    code = EXIT_UNCAUGHT
    try:
        for fd, path in ((1, stdout_path), (2, stderr_path)):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(target, fd)
            os.close(target)
        sys.argv = [str(REPO / task.name / "train.py"), *argv]
        try:
            code = main(task, argv)
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


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        serve(Path(sys.argv[2]))
        sys.exit(0)
    cases_path, results_path = Path(sys.argv[1]), Path(sys.argv[2])
    results = run_cases(json.loads(cases_path.read_text()), results_path.parent / "fuzz_output")
    results_path.write_text(json.dumps(results, indent=1))
