"""How N ranks are started on this host: each launcher's command prefix, in one place.

  python -m common.launchers horovodrun 2    # /path/.venv/bin/horovodrun -np 2 -H localhost:2 --gloo
  python -m common.launchers mpirun 2        # mpirun --allow-run-as-root --oversubscribe -np 2 -x ...
  python -m common.launchers srun 2          # srun --mpi=pmix -N 1 -n 2 --kill-on-bad-exit=1

The Makefile's LAUNCH, offline/result_set.py and weak_scaling.py, bench/ and the tests put the
prefix before a train.py command line. A new launcher is one function here and its entry in
LAUNCHERS. Standard library only: it answers in a fraction of a second, TensorFlow never loaded.
"""

import shlex
import sys
from pathlib import Path

# The horovodrun beside the running Python is the one installed with its Horovod.
HOROVODRUN = str(Path(sys.executable).with_name("horovodrun"))


def horovodrun(ranks: int, hosts: str | None = None) -> list[str]:
    """horovodrun over Gloo (no MPI needed), all `ranks` on this host unless `hosts` says otherwise."""
    return [HOROVODRUN, "-np", str(ranks), "-H", hosts or f"localhost:{ranks}", "--gloo"]


def mpirun(ranks: int) -> list[str]:
    """Open MPI's mpirun, wiring Horovod through MPI; the ranks see this shell's PYTHONPATH."""
    # CI runs as root, which Open MPI refuses unless told it is deliberate; more ranks than
    # cores is what a 2-core machine needs for 4-rank tests.
    return [
        "mpirun",
        "--allow-run-as-root",
        "--oversubscribe",
        "-np",
        str(ranks),
        "-x",
        "PYTHONPATH",
        "-x",
        "TF_CPP_MIN_LOG_LEVEL",
    ]


def srun(ranks: int) -> list[str]:
    """One SLURM job step of `ranks` tasks on one node, wired by PMIx (as slurm/env.sh's run_ranks)."""
    # --kill-on-bad-exit: a rank that dies takes the others with it, instead of leaving them in a collective.
    return ["srun", "--mpi=pmix", "-N", "1", "-n", str(ranks), "--kill-on-bad-exit=1"]


LAUNCHERS = {"horovodrun": horovodrun, "mpirun": mpirun, "srun": srun}


def prefix(launcher: str, ranks: int) -> list[str]:
    """The command that starts `ranks` copies of what follows it, under `launcher`.

    Raises:
      ValueError: no launcher has that name (the message lists those that do).
    """
    if launcher not in LAUNCHERS:
        raise ValueError(f"unknown launcher {launcher!r}; known: {', '.join(LAUNCHERS)}")
    return LAUNCHERS[launcher](ranks)


def on_this_host(cmd: list, ranks: int) -> list[str]:
    """`cmd` as `ranks` ranks on this host: alone for one rank, else under horovodrun over Gloo."""
    cmd = [str(c) for c in cmd]
    return cmd if ranks <= 1 else horovodrun(ranks) + cmd


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("launcher", choices=LAUNCHERS)
    parser.add_argument("ranks", type=int)
    args = parser.parse_args(argv)
    print(shlex.join(prefix(args.launcher, args.ranks)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
