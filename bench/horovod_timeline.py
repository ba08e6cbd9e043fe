"""Reading a Horovod timeline (Chrome trace JSON, written by Distribution.timeline on rank 0)."""

import json
from pathlib import Path


def activities(path) -> dict:
    """Per tensor name: when each of its activities (NEGOTIATE_ALLREDUCE, ALLTOALL, ...) began and
    ended on rank 0, as {"<ACTIVITY>_begin": us, "<ACTIVITY>_end": us} (the first of each), in
    microseconds since the timeline started. A tensor's negotiation begins when rank 0 submits it
    and ends when every rank has; its collective's activity follows. An activity the timeline saw
    begin but not end (it stopped first) has its begin alone; one it saw end alone is left out."""
    text = Path(path).read_text().rstrip().rstrip(",")
    events = json.loads(
        text if text.endswith("]") else text + "]"
    )  # a stopped timeline may lack its "]"
    names = {
        e["pid"]: e["args"]["name"]
        for e in events
        if e.get("name") == "process_name" and "name" in e["args"]
    }
    tensors = {}
    open_activity = {}
    for e in sorted((e for e in events if e.get("ph") in ("B", "E")), key=lambda e: e["ts"]):
        t = tensors.setdefault(names[e["pid"]], {})
        if e["ph"] == "B":
            open_activity.setdefault(e["pid"], []).append(e["name"])
            t.setdefault(e["name"] + "_begin", e["ts"])
        elif open_activity.get(e["pid"]):
            name = open_activity[e["pid"]].pop()
            t.setdefault(name + "_end", e["ts"])
        # else: the end of an activity that began before the timeline did (another rank submitted
        # the tensor first): left out, its begin unknown.
    return tensors
