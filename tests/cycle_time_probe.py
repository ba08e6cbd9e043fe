"""Run by test_cycle_time.py: does a cycle time set in the process reach Horovod, and does Distribution report
what Horovod read?

  python tests/cycle_time_probe.py before|after TIMELINE.json

Sets HOROVOD_CYCLE_TIME as the launcher does for a run with batch-norm groups
(cycle_time.set_for_batchnorm_groups), before Distribution() (Horovod's init) or after it: the
negative control. Horovod's timeline, with every cycle marked, gives the period its background
loop runs at; the probe prints one JSON line: the cycle time Distribution reports, and the median
spacing of the cycle marks in microseconds.
"""

import itertools
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.parallel import cycle_time  # noqa: E402
from common.parallel.distribution import Distribution  # noqa: E402

when, timeline = sys.argv[1], Path(sys.argv[2])
os.environ["HOROVOD_TIMELINE"] = str(timeline)
os.environ["HOROVOD_TIMELINE_MARK_CYCLES"] = "1"
if when == "before":
    cycle_time.set_for_batchnorm_groups(2)
dist = Distribution()
if when == "after":
    cycle_time.set_for_batchnorm_groups(2)
time.sleep(0.5)  # a few hundred cycles; the timeline's writer thread writes them as they come
marks = [int(t) for t in re.findall(r'"CYCLE_START", "ts": (\d+)', timeline.read_text())]
print(
    json.dumps(
        {
            "reported_ms": dist.cycle_time.ms,
            "reported": dist.cycle_time.describe(),
            "marks": len(marks),
            "median_spacing_us": statistics.median(b - a for a, b in itertools.pairwise(marks)),
        }
    ),
    flush=True,
)
