"""The CPU's features, TensorFlow's oneDNN switch, and a rank's intra-op threads. Standard library
only: `prefer_onednn` runs (from `import common`) before TensorFlow reads TF_ENABLE_ONEDNN_OPTS at
its import (docs/figures.md#cpus); the thread rules follow the launcher's CPU binding
(docs/scaling.md).
"""

import contextlib
import dataclasses
import functools
import os
import platform
import sys
from collections.abc import Mapping

ONEDNN_ENV = "TF_ENABLE_ONEDNN_OPTS"
_X86_64 = ("x86_64", "amd64")
# Instruction-set levels, best first, by the /proc/cpuinfo flag that marks each.
_ISA_LEVELS = (("amx_tile", "AMX"), ("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"))
_BF16_FLAGS = ("amx_bf16", "avx512_bf16")

NVIDIA_GPUS = "/proc/driver/nvidia/gpus"  # a folder per GPU, where the NVIDIA driver is loaded
_decided = ""  # who chose oneDNN's state, where prefer_onednn() did or could not (describe())


@functools.cache
def _cpuinfo() -> tuple[str, frozenset]:
    """(model name, flags) of the first processor in /proc/cpuinfo; ('', {}) where there is none."""
    fields = {}
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value)
            if "flags" in fields:  # the first processor's: all cores of a node share them
                break
    model, flags = fields.get("model name", ""), fields.get("flags", "")
    return " ".join(model.split()), frozenset(flags.split())


def affinity() -> frozenset:
    """The CPUs this process may run on: its affinity mask, as a SLURM task or container sees it."""
    return frozenset(os.sched_getaffinity(0))


def cores() -> int:
    """How many CPUs this process may run on (its affinity)."""
    return len(affinity())


def isa(flags=None) -> str:
    """The best vector instruction set: 'AMX', 'AVX-512', 'AVX2', 'AVX', or the machine name."""
    flags = _cpuinfo()[1] if flags is None else flags
    for flag, name in _ISA_LEVELS:
        if flag in flags:
            return name
    return platform.machine() or "unknown"


def has_native_bf16(flags=None) -> bool:
    """Whether the CPU computes bf16 in hardware (AVX512_BF16 or AMX-BF16); else it is emulated."""
    flags = _cpuinfo()[1] if flags is None else flags
    return any(flag in flags for flag in _BF16_FLAGS)


def gpu_visible(environ=None, gpus_dir: str = NVIDIA_GPUS) -> bool:
    """Whether this process would see an NVIDIA GPU, told without importing TensorFlow: the driver
    lists one, and CUDA_VISIBLE_DEVICES (if set) does not hide them all ('' or '-1')."""
    environ = os.environ if environ is None else environ
    with contextlib.suppress(OSError):
        visible = environ.get("CUDA_VISIBLE_DEVICES")
        return bool(os.listdir(gpus_dir)) and (visible is None or visible.strip() not in ("", "-1"))
    return False


def prefer_onednn(environ=None, machine=None, gpus_dir: str = NVIDIA_GPUS) -> bool:
    """Sets TF_ENABLE_ONEDNN_OPTS=1 on x86-64 hosts without a visible GPU, unless the user chose or
    TensorFlow is already imported (then it warns); True if it set it. `environ` defaults to
    os.environ, `machine` to platform.machine()."""
    global _decided
    environ = os.environ if environ is None else environ
    machine = (machine or platform.machine()).lower()
    ours = environ is os.environ
    if ONEDNN_ENV in environ or machine not in _X86_64:
        return False
    if gpu_visible(environ, gpus_dir):
        if ours:
            _decided = "TensorFlow's default: a GPU is visible, so this project left it"
        return False
    if ours and "tensorflow" in sys.modules:
        _decided = "TensorFlow imported before this project could choose"
        if not onednn_enabled():
            print(
                f"warning: TensorFlow was imported before this project could set {ONEDNN_ENV}=1, "
                f"so its oneDNN kernels stay off on this {isa()} CPU and training runs 3.7-4.4x "
                f"slower (docs/figures.md); import common, cosmoflow or deepcam before tensorflow, "
                f"or start Python with {ONEDNN_ENV}=1 set",
                file=sys.stderr,
                flush=True,
            )
        return False
    environ[ONEDNN_ENV] = "1"
    if ours:
        _decided = f"{ONEDNN_ENV}=1 set by this project"
    return True


def onednn_enabled():
    """Whether the imported TensorFlow runs its oneDNN kernels; None if it cannot tell."""
    if "tensorflow" not in sys.modules:
        return None
    try:
        from tensorflow.python.util import _pywrap_util_port  # TF's own answer, private API

        return bool(_pywrap_util_port.IsMklEnabled())
    except (ImportError, AttributeError):
        return None


def onednn_runs_bfloat16() -> bool:
    """Whether TensorFlow's oneDNN kernels take bfloat16 on this CPU: only with AVX-512."""
    return bool({"avx512f", "amx_tile"} & _cpuinfo()[1])


def describe() -> dict:
    """The CPU, its ISA, bf16 support and oneDNN state, for the [init] line and summary.json."""
    model, flags = _cpuinfo()
    onednn = onednn_enabled()
    if onednn is None:
        state = "unknown"
    else:
        who = _decided or (
            f"{ONEDNN_ENV}={os.environ[ONEDNN_ENV]} set by the user"
            if ONEDNN_ENV in os.environ
            else "TensorFlow's default"
        )
        state = f"{'on' if onednn else 'off'} ({who})"
    return {
        "cpu": model or platform.processor() or platform.machine(),
        "isa": isa(flags),
        "bf16": "native" if has_native_bf16(flags) else "emulated",
        "onednn": state,
    }


# A rank's intra-op threads: the CPUs of its affinity mask, divided among the node's ranks unless
# its launcher says it bound each rank to CPUs of its own (docs/scaling.md): srun's
# SLURM_CPU_BIND_TYPE/_LIST (believed only where the mask is this process's affinity), mpirun's
# OMPI_MCA_* binding variables; horovodrun binds nothing.


@dataclasses.dataclass(frozen=True)
class ThreadChoice:
    """How many intra-op threads a rank gets, and the rule that chose it (for the [init] line)."""

    threads: int
    rule: str


def intra_op_threads(environ: Mapping, affinity, local_size: int) -> ThreadChoice:
    """The rank's intra-op threads: its affinity's CPUs, divided among the local ranks sharing them.

    Args:
      environ: the process environment (the launcher's variables).
      affinity: the CPUs this process may run on (os.sched_getaffinity(0)).
      local_size: the ranks on this node (Horovod's local size).
    """
    cpus = frozenset(affinity)
    n, local_size = len(cpus), max(1, int(local_size))
    bind_type = environ.get("SLURM_CPU_BIND_TYPE", "").strip().lower()
    if "OMPI_COMM_WORLD_SIZE" in environ or "OMPI_MCA_orte_bound_at_launch" in environ:
        from common.parallel import cpu_binding  # launched by mpirun

        choice = cpu_binding.open_mpi(environ, n)
    elif "HOROVOD_RANK" in environ:
        choice = "horovodrun binds no CPUs"
    elif bind_type:
        from common.parallel import cpu_binding  # launched by srun

        choice = cpu_binding.slurm(environ, bind_type, cpus, local_size)
    else:
        choice = "no launcher binding seen"
    return choice if isinstance(choice, ThreadChoice) else divided(n, local_size, choice)


def divided(n: int, ranks: int, why: str, who: str = "the node's") -> ThreadChoice:
    threads = max(1, n // ranks)
    if ranks == 1:
        return ThreadChoice(
            threads, f"{why}: the task's {cores_text(n)}, the only rank on its node"
        )
    return ThreadChoice(
        threads,
        f"{why}: the task's {cores_text(n)} shared by {who} {ranks} ranks -> {threads} each",
    )


def own(n: int, how: str) -> ThreadChoice:
    return ThreadChoice(n, f"{how}: the task's own {cores_text(n)}, not divided")


def cores_text(n: int) -> str:
    return f"{n} CPU{'s' if n != 1 else ''}"
