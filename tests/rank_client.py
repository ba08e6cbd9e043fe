"""One rank of a test's horovodrun job of train.py (or of a tests/*_probe.py), run by a child of
`tests/train_driver.py --zygote`, which imported TensorFlow once:
`horovodrun -np 2 python tests/rank_client.py BENCH/train.py ARGS...`. The job's horovodrun is one
too (`python tests/rank_client.py .venv/bin/horovodrun -np 2 ...`, tests.helpers._launch).

This process imports no TensorFlow. It hands the zygote its argv, environment, working directory
and standard streams (over the Unix socket TESTS_RANK_ZYGOTE names); a child forked there runs
train.py's `common.run.trainer.main` (a probe as __main__) with them as this rank, the real Horovod
rank of the job (its own process, its own Horovod init). Signals this process gets go to that rank;
its exit code, or the signal that ended it, is this process's. When this process is killed, the
zygote kills the rank. Where the zygote cannot run the rank as a fresh process would (another
environment, no zygote), this process becomes `python ARGS...` itself.
"""

import json
import os
import signal
import socket
import sys


def _line(sock) -> dict:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("the zygote closed the connection")
        data += chunk
    return json.loads(data)


def main() -> None:
    args = sys.argv[1:]
    reply = {"fallback": "no TESTS_RANK_ZYGOTE"}
    if os.environ.get("TESTS_RANK_ZYGOTE"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(os.environ["TESTS_RANK_ZYGOTE"])
        request = json.dumps({"argv": args, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
        socket.send_fds(sock, [len(request).to_bytes(8, "big") + request], [0, 1, 2])
        reply = _line(sock)
    if "fallback" in reply:
        os.execv(sys.executable, [sys.executable, *args])
    rank = reply["pid"]

    def forward(signum, _frame):
        try:
            os.kill(rank, signum)
        except ProcessLookupError:
            pass

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, forward)
    code = _line(sock)["exit"]
    if code < 0:  # ended by a signal: so is this process, as the launcher would see the rank end
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main()
