"""A machine file (machines/*.yaml, offline.projection's format) describing this host as the preflight measured it.

For a host no machine file describes (a CPU node, a new GPU), the projection needs one: the CPU from
lscpu, and per device the peak it reaches and its memory bandwidth, measured. A device is one rank:
a GPU, or on a CPU node one rank's share of it. Every rank measures at the same time, as a job's
ranks compute at once, so each figure is what a rank gets beside the others:
  peak      the best of repeated float32 matmuls (n x n, 2 n^3 FLOPs each) on the rank's device;
  memory    the best of repeated x + 1 over a 64 MiB float32 tensor (reads and writes it: 2 x 64 MiB);
  links     the sweep's bus bandwidth at its largest size and its latency at the smallest (sweep.py).
The efficiency is left at 1.0 (the roofline itself, uncalibrated), so the verdict's ratio reads as
how far the run is from the roofline; a calibrated figure needs a published result of this machine
(python -m offline.projection --calibrate).
"""

import dataclasses
import datetime
import os
import subprocess
import time

CPU_MATMUL_EDGE = 1024
GPU_MATMUL_EDGE = 8192
MEMORY_BYTES = 64 << 20


@dataclasses.dataclass(frozen=True)
class Lscpu:
    """What lscpu says of the node (zeros where it says nothing)."""

    model: str
    sockets: int
    cores_per_socket: int
    threads_per_core: int

    @property
    def cores(self) -> int:
        return self.sockets * self.cores_per_socket


@dataclasses.dataclass(frozen=True)
class DevicePeaks:
    """One rank's measured figures (FLOP/s, bytes/s)."""

    matmul_flop_per_s: float
    memory_bytes_per_s: float


def parse_lscpu(text: str) -> Lscpu:
    """lscpu's 'Key: value' lines -> Lscpu."""
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), " ".join(value.split()))

    def number(key):
        try:
            return int(fields.get(key, "0"))
        except ValueError:
            return 0

    return Lscpu(
        model=fields.get("Model name", ""),
        sockets=number("Socket(s)"),
        cores_per_socket=number("Core(s) per socket"),
        threads_per_core=number("Thread(s) per core"),
    )


def lscpu() -> tuple[Lscpu, str]:
    """This node's lscpu, and where its figures came from."""
    try:
        text = subprocess.run(
            ["lscpu"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
        return parse_lscpu(text), "lscpu"
    except (OSError, subprocess.SubprocessError):
        from common import cpu

        return Lscpu(cpu.describe()["cpu"], 0, 0, 0), "/proc/cpuinfo (no lscpu)"


def matmul_edge(device: str) -> int:
    """The matmul's edge: large enough to reach a GPU's peak, small enough for a CPU core's second."""
    return GPU_MATMUL_EDGE if device == "gpu" else CPU_MATMUL_EDGE


def measure(device: str, seconds: float = 0.5) -> DevicePeaks:
    """This rank's best matmul FLOP/s and x + 1 bytes/s on its device, each over about `seconds`."""
    import tensorflow as tf

    n = matmul_edge(device)
    a = tf.random.stateless_uniform([n, n], seed=[1, 2], dtype=tf.float32)
    matmul = _best(lambda: tf.linalg.matmul(a, a), seconds)
    x = tf.zeros([MEMORY_BYTES // 4], tf.float32)
    add = _best(lambda: x + 1.0, seconds)
    return DevicePeaks(
        matmul_flop_per_s=2 * n**3 / matmul, memory_bytes_per_s=2 * MEMORY_BYTES / add
    )


def _best(op, seconds: float) -> float:
    """The fastest of repeated runs of `op` (the first, warm-up, left out), each waited for."""
    op()[:1].numpy()
    best, deadline = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < deadline or best == float("inf"):
        start = time.perf_counter()
        op()[:1].numpy()
        best = min(best, time.perf_counter() - start)
    return best


def machine_yaml(
    *,
    host: str,
    cpu: Lscpu,
    cpu_source: str,
    device_name: str,
    matmul_edge: int,
    peaks: list[DevicePeaks],
    devices_per_node: int,
    busbw: float | None,
    latency_s: float | None,
    ranks: int,
    command: str,
) -> str:
    """The machine file's text: the figures of this host with where each came from (comments)."""
    peak = min(p.matmul_flop_per_s for p in peaks)
    memory = min(p.memory_bytes_per_s for p in peaks)
    link = busbw if busbw else memory
    link_note = (
        f"the preflight's busbw at its largest allreduce, {ranks} ranks"
        if busbw
        else "NOT MEASURED (one rank: no allreduce); the memory bandwidth stands in"
    )
    cores = cpu.cores or os.cpu_count()
    return "\n".join(
        [
            f"# {host} as the preflight measured it ({datetime.date.today().isoformat()}): not a published figure.",
            f"#   {command}",
            f"# CPU from {cpu_source}: {cpu.model or 'unknown'}, {cpu.sockets} socket(s) x {cpu.cores_per_socket} "
            f"core(s) x {cpu.threads_per_core} thread(s).",
            f"# A device is one rank ({devices_per_node} per node here). Every rank measured at once; the slowest "
            f"rank's figure is kept:",
            f"#   peak: the best float32 matmul ({matmul_edge} x {matmul_edge}, TensorFlow) on the rank's device; "
            f"memory: the best x + 1 over {MEMORY_BYTES >> 20} MiB.",
            f"name: {_quoted(f'{host}, measured by the preflight')}",
            f"device: {_quoted(device_name)}",
            "peak_flop_per_s:",
            f"  fp32: {peak:.4e}",
            f"memory_bytes_per_s: {memory:.4e}",
            f"devices_per_node: {devices_per_node}",
            f"cores_per_node: {cores}",
            f"nic_bytes_per_s: {link * devices_per_node:.4e}   # {link_note}, x the devices of a node",
            f"nic_latency_s: {latency_s or 0.0:.4e}   # the smallest allreduce's time / its 2(n-1) ring steps",
            f"intra_node_bytes_per_s: {link:.4e}   # {link_note}",
            "filesystem_bytes_per_s: null    # not measured",
            "node_local_write_bytes_per_s: null",
            "precision: fp32",
            "allreduce_overlap: 0.0",
            "efficiency: 1.0                  # not calibrated: the roofline itself",
            "",
        ]
    )


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
