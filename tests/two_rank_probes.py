"""Runs several tests/*_probe.py scripts of 2 ranks in one launch (tests.conftest's
two_rank_probes): each rank imports TensorFlow and joins Horovod once for all of them.

  two_rank_probes.py OUT_DIR NAME...   # NAME: a PROBES key; its results go to OUT_DIR/NAME

Each probe runs as its own script would (`runpy`, as __main__, its arguments as sys.argv), one after
the other on every rank. Their Distribution() finds Horovod initialised by the first and keeps it: a
job of 2 ranks registers no process set for groups of 2 (the job is the group), so each probe gets
the init its own launch gave it. What some read at Horovod's init is set here, before the first: a
dynamic timeline (timeline_probe.py, overlap_probe.py) and a 1 ms cycle (overlap_probe.py).
"""

import os
import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

# NAME -> (script, its arguments before the output folder)
PROBES = {
    "bn": ("bn_probe.py", []),
    "fingerprint": ("fingerprint_probe.py", []),
    "group_bn_grad": ("group_bn_grad_probe.py", []),
    "halo_overlap": ("halo_overlap_probe.py", ["--out"]),
    "timeline": ("timeline_probe.py", []),
    "overlap": ("overlap_probe.py", ["--out"]),
    "sharded_optimizer": ("sharded_optimizer_probe.py", ["--out"]),
}


def main() -> int:
    # Here, not at import: tests.conftest imports PROBES into the pytest worker, whose later runs
    # would inherit them (and its single-rank train.py runs would stop forking from the driver,
    # whose environment would no longer be theirs).
    os.environ["HOROVOD_TIMELINE"] = "DYNAMIC"
    os.environ["HOROVOD_CYCLE_TIME"] = "1"
    out = Path(sys.argv[1])
    for name in sys.argv[2:]:
        script, args = PROBES[name]
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        sys.argv = [str(HERE / script), *args, str(folder)]
        try:
            runpy.run_path(str(HERE / script), run_name="__main__")
        except SystemExit as e:  # a probe's sys.exit(main())
            if e.code not in (0, None):
                raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
