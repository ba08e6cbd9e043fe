"""Ops the device cannot run as the steps ask, warm-up's checks: the one line for an op without a
kernel (`missing_kernel`), and on a GPU, where TensorFlow placed the steps' ops (none may fall back
to the CPU).

An op without a GPU kernel (at all, or for its dtype) is placed on the CPU without a word (soft
placement): the step still runs, slower, copying the op's inputs from the GPU's memory to the host
every step. Warm-up makes the steps' first calls with TensorFlow's graph collection on (the
mechanism of its own `context.collect_graphs`), which records each function as it is instantiated:
its partition graphs, one per device, every node with the device it was placed on, and the
_Send/_Recv pairs that carry tensors between them.

An op on the CPU that reads a tensor copied out of the GPU's memory (a _Recv whose _Send is on the
GPU) fell back, unless it is of a type that belongs on the host (HOST_OPS) or runtime.allow_cpu_ops
names it. What Grappler moves to the host on purpose (shape arithmetic and scalars of at most 64
elements, computed from constants and tensors the GPU keeps in host memory: a _HostSend) reads
nothing from the GPU's memory, and passes.
"""

import collections
import dataclasses
import re

import tensorflow as tf
from tensorflow.python.eager import context  # graph collection: private, no public API in TF 2.x

from common.errors import ConfigError

# Op types that rightly run on the host: a function's arguments and results, the copies between
# devices, constants and ops that compute nothing, shape metadata, the input pipeline's iterator,
# and Horovod's scalar ops (sizes and ranks).
HOST_OPS = frozenset(
    {
        "_Arg",
        "_Retval",
        "_DeviceArg",
        "_DeviceRetval",
        "_Send",
        "_Recv",
        "_HostSend",
        "_HostRecv",
        "Const",
        "NoOp",
        "Identity",
        "IdentityN",
        "Shape",
        "ShapeN",
        "Size",
        "Rank",
        "IteratorGetNext",
        "IteratorGetNextSync",
        "OptionalGetValue",
        "OptionalHasValue",
        "MultiDeviceIteratorGetNextFromShard",
        "HorovodSize",
        "HorovodLocalSize",
        "HorovodRank",
        "HorovodLocalRank",
        "HorovodProcessSetIncluded",
    }
)
_DATASET_OP = re.compile(r"Dataset(V\d+)?$")  # TensorDataset, MapDataset, PrefetchDataset, ...

ALLOW_KEY = "runtime.allow_cpu_ops"


@dataclasses.dataclass(frozen=True)
class PlacedOp:
    """One node of a function's partition graphs, as TensorFlow placed it."""

    name: str  # 'gradient_tape/model/conv3d/Conv3DBackpropFilterV2'
    type: str  # 'Conv3DBackpropFilterV2'
    device: str  # '/job:localhost/replica:0/task:0/device:GPU:0'
    inputs: tuple[str, ...] = ()  # the nodes whose outputs it reads (control inputs left out)
    tensor_name: str = ""  # a _Send, _HostSend or _Recv: the tensor the pair carries
    function: int = 0  # which function it belongs to (node names are unique within one)

    @property
    def on_cpu(self) -> bool:
        return tf.DeviceSpec.from_string(self.device).device_type == "CPU"


def placement_of(run) -> list[PlacedOp]:
    """Calls `run()` collecting graphs: every node of each function it instantiates, as placed.

    A function called before is not instantiated again and shows nothing: call this with the
    functions' first calls.
    """
    ctx = context.context()
    ctx.enable_graph_collection()
    try:
        run()
    finally:
        metadata = ctx.export_run_metadata()
        ctx.disable_graph_collection()
    return [
        PlacedOp(
            node.name,
            node.op,
            node.device,
            tuple(i.split(":")[0] for i in node.input if not i.startswith("^")),
            node.attr["tensor_name"].s.decode() if "tensor_name" in node.attr else "",
            index,
        )
        for index, function in enumerate(metadata.function_graphs)
        for graph in function.partition_graphs
        for node in graph.node
    ]


def cpu_fallbacks(placement, allowed=()) -> list[PlacedOp]:
    """The ops of `placement` on the CPU that read a tensor copied from the GPU's memory, but host
    ops (HOST_OPS, the input pipeline's datasets) and types in `allowed`."""
    copied = {
        (op.function, op.tensor_name) for op in placement if op.type == "_Send" and not op.on_cpu
    }
    from_gpu = {
        (op.function, op.name)
        for op in placement
        if op.type == "_Recv" and op.on_cpu and (op.function, op.tensor_name) in copied
    }
    return [
        op
        for op in placement
        if op.on_cpu
        and op.type not in HOST_OPS
        and not _DATASET_OP.search(op.type)
        and op.type not in allowed
        and any((op.function, name) in from_gpu for name in op.inputs)
    ]


def fallback_message(fallbacks) -> str:
    """The one line that ends a run whose steps have `fallbacks` (cpu_fallbacks' answer)."""
    by_type = collections.defaultdict(list)
    for op in fallbacks:
        by_type[op.type].append(op)
    named = []
    for kind, ops in by_type.items():
        hint = (
            ": Horovod built without GPU operations (HOROVOD_GPU_OPERATIONS=NCCL)"
            if kind.startswith("Horovod")
            else ""
        )
        named.append(f"{kind} x{len(ops)} (e.g. {ops[0].name}{hint})")
    return (
        f"warm-up: {len(fallbacks)} op(s) of the steps run on the CPU on data copied from the "
        f"GPU (no GPU kernel for their type or dtype): {', '.join(named)}; the copies and the "
        f"ops cost time every step. To run so anyway: --set {ALLOW_KEY}={','.join(by_type)} "
        f"(docs/gpu.md)"
    )


def run_without_fallbacks(run_steps, allowed) -> None:
    """Makes the steps' first calls (`run_steps`), their functions placed as they are instantiated;
    ConfigError when an op of theirs fell back to the CPU and is not `allowed`."""
    placed = placement_of(run_steps)
    if not placed:
        raise RuntimeError("warm-up: no placement recorded: the steps ran before warm-up")
    fallbacks = cpu_fallbacks(placed, allowed)
    if fallbacks:
        raise ConfigError(fallback_message(fallbacks))


def missing_kernel(message: str) -> str | None:
    """The one line for an op this device cannot run in this dtype or form (float16 pooling on a
    CPU), which the first step that runs meets and tracing does not; None for any other error."""
    advice = "(on a CPU: --set runtime.amp_dtype=bfloat16, or --xla, whose kernels cover float16)"
    found = re.search(r"No OpKernel was registered to support Op '(\w+)'", message)
    if found:
        dtype = re.search(r"\bT=DT_(\w+)", message)
        devices = re.search(r"Registered devices: \[([^\]]*)\]", message)
        return (
            f"warm-up: TensorFlow has no kernel for {found.group(1)}"
            f"{' in ' + dtype.group(1).lower() if dtype else ''} on this host's devices "
            f"({devices.group(1) if devices else 'unknown'}): this precision and device cannot train the "
            f"model {advice}"
        )
    found = re.search(r"(Current CPU implementations do not yet support [^\n]*)", message)
    if found:
        node = re.search(r"\{\{node ([^}]+)\}\}", message)
        return (
            f"warm-up: {found.group(1).rstrip('.')} ({node.group(1) if node else 'an op'}): this precision "
            f"and device cannot train the model {advice}"
        )
    return None
