"""Reading a TensorFlow profiler trace (tf.profiler.experimental.start/stop): when each op ran.

TensorFlow's executor records an op it runs as an event named 'scope/op_name:OpType' (after
grappler's rewrites, e.g. 'conv1/interior:_MklNativeFusedConv3D'), and an asynchronous kernel
(Horovod's collectives) as 'ExecutorState::ProcessAsync...' events carrying its `kernel_type` and
op `name`: one when the executor hands it its input (the launch), one ending in 'Done' when the
kernel says it finished. Times here are microseconds on the trace's clock.
"""

import dataclasses
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Op:
    """An op the executor ran: `name` its op name ('scope/name'), `kind` its type, begin and end."""

    name: str
    kind: str
    begin: float
    end: float


@dataclasses.dataclass(frozen=True)
class AsyncKernel:
    """An asynchronous kernel's launch (`done` False) or completion (`done` True), at `time`."""

    name: str
    kind: str
    time: float
    done: bool


def read(logdir) -> tuple[list[Op], list[AsyncKernel]]:
    """(ops, asynchronous kernel events) of the profile written under `logdir`, each in time order."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    space.ParseFromString(next(Path(logdir).rglob("*.xplane.pb")).read_bytes())
    ops, kernels = [], []
    for plane in space.planes:
        events, stats = plane.event_metadata, plane.stat_metadata
        for line in plane.lines:
            for event in line.events:
                begin = (line.timestamp_ns * 1000 + event.offset_ps) / 1e6
                label = events[event.metadata_id].name
                if label.startswith("ExecutorState::ProcessAsync::"):
                    args = {
                        stats[s.metadata_id].name: s.str_value or stats[s.ref_value].name
                        for s in event.stats
                    }
                    if "kernel_type" in args:
                        kernels.append(
                            AsyncKernel(
                                args.get("name", ""),
                                args["kernel_type"],
                                begin,
                                label.endswith("Done"),
                            )
                        )
                elif ":" in label and "::" not in label:
                    name, kind = label.rsplit(":", 1)
                    ops.append(Op(name, kind, begin, begin + event.duration_ps / 1e6))
    return sorted(ops, key=lambda o: o.begin), sorted(kernels, key=lambda k: k.time)
