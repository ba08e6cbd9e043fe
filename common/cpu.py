"""What this CPU can do, and TensorFlow's oneDNN switch, settled before TensorFlow loads.

TensorFlow turns its oneDNN kernels on by default only on x86 CPUs with
AVX-512 VNNI or newer. Elsewhere (every AVX2-only CPU, AMD EPYC up to Zen 3
among them) convolutions fall back to TensorFlow's own im2col + small-GEMM path:
a CosmoFlow Conv3D training step measured 4.1x slower on a 2-core AVX2 EPYC.
That matters where the CPU trains: `prefer_onednn()` turns oneDNN on for x86
hosts where no GPU is visible, and leaves TensorFlow's default where one is
(the model then runs on the GPU; oneDNN would only change the input pipeline's
CPU ops). Whether a GPU is visible is read without TensorFlow: the NVIDIA
driver's device list in /proc, narrowed by CUDA_VISIBLE_DEVICES.
TensorFlow reads `TF_ENABLE_ONEDNN_OPTS` once, when it is first imported, so
`prefer_onednn()` must run before that; the packages of this repository call it
in their `__init__`, which every entry point (train.py, bench/, `python -m`
tools, the tests) imports first. A value the user set is left alone.

When TensorFlow was imported before this project (a notebook's first line), it
is too late: TensorFlow has registered its kernels, and setting the variable
then would only make `IsMklEnabled()`, which reads it on its first call, claim
oneDNN kernels that do not run (DeepCAM's model would pick the dilated
convolution that only oneDNN can differentiate, and fail). So the variable is
left unset, code that depends on the kernels asks `onednn_enabled()`, and one
line on stderr says what that costs and how to avoid it.

This module imports nothing heavy: it must be importable before TensorFlow.
"""

import functools
import os
import platform
import sys

ONEDNN_ENV = "TF_ENABLE_ONEDNN_OPTS"
_X86_64 = ("x86_64", "amd64")
# Instruction-set levels, best first, by the /proc/cpuinfo flag that marks each.
_ISA_LEVELS = (("amx_tile", "AMX"), ("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"))
_BF16_FLAGS = ("amx_bf16", "avx512_bf16")

# Whether prefer_onednn() set the variable (as opposed to the user), for the report.
_set_here = False
# Whether prefer_onednn() left TensorFlow's default because a GPU is visible.
_gpu_seen = False
NVIDIA_GPUS = "/proc/driver/nvidia/gpus"  # a folder per GPU, where the NVIDIA driver is loaded
# Whether TensorFlow was imported before prefer_onednn() could choose.
_tensorflow_first = False
# Training samples/s on the 2-core AVX2 EPYC, oneDNN on vs off (bench/results/AVX2.md).
_ONEDNN_SPEEDUP = "3.7x (DeepCAM) to 4.4x (CosmoFlow)"


@functools.cache
def _cpuinfo() -> tuple[str, frozenset]:
    """(model name, flags) of the first processor in /proc/cpuinfo; ('', {}) where there is none."""
    model, flags = "", frozenset()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = " ".join(value.split())
                elif key == "flags":
                    flags = frozenset(value.split())
                    break  # the first processor's flags: all cores of a node share them
    except OSError:
        pass
    return model, flags


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
    try:
        if not os.listdir(gpus_dir):
            return False
    except OSError:
        return False
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    return visible is None or visible.strip() not in ("", "-1")


def prefer_onednn(environ=None, machine=None, gpus_dir: str = NVIDIA_GPUS) -> bool:
    """Turns TensorFlow's oneDNN kernels on for x86-64 hosts without a visible GPU, unless the user
    chose; True if it set it.

    Args:
      environ: the environment to update (default: os.environ).
      machine: platform.machine() to decide on (default: this one's).
      gpus_dir: where the NVIDIA driver lists its GPUs (gpu_visible).
    """
    global _set_here, _tensorflow_first, _gpu_seen
    environ = os.environ if environ is None else environ
    machine = (machine or platform.machine()).lower()
    if ONEDNN_ENV in environ or machine not in _X86_64:
        return False
    if gpu_visible(environ, gpus_dir):
        if environ is os.environ:
            _gpu_seen = True
        return False
    if environ is os.environ and "tensorflow" in sys.modules:
        _tensorflow_first = True
        if not onednn_enabled():
            print(
                f"warning: TensorFlow was imported before this project could set {ONEDNN_ENV}=1, so its "
                f"oneDNN kernels stay off on this {isa()} CPU and training runs {_ONEDNN_SPEEDUP} slower "
                f"(bench/results/AVX2.md); import common, cosmoflow or deepcam before tensorflow, or start "
                f"Python with {ONEDNN_ENV}=1 set",
                file=sys.stderr,
                flush=True,
            )
        return False
    environ[ONEDNN_ENV] = "1"
    if environ is os.environ:
        _set_here = True
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


def onednn_runs_bfloat16(flags=None) -> bool:
    """Whether TensorFlow's oneDNN kernels take bfloat16 on this CPU: only with AVX-512 (TensorFlow
    logs "oneDNN supports DT_BFLOAT16 only on platforms with AVX-512" and falls back to its Eigen
    kernels elsewhere)."""
    flags = _cpuinfo()[1] if flags is None else flags
    return "avx512f" in flags or "amx_tile" in flags


def describe() -> dict:
    """The CPU, its ISA, bf16 support and oneDNN state, for the [init] line and summary.json."""
    model, flags = _cpuinfo()
    onednn = onednn_enabled()
    if onednn is None:
        state = "unknown"
    else:
        if _set_here:
            who = f"{ONEDNN_ENV}=1 set by this project"
        elif _gpu_seen:
            who = "TensorFlow's default: a GPU is visible, so this project left it"
        elif _tensorflow_first and ONEDNN_ENV not in os.environ:
            who = "TensorFlow imported before this project could choose"
        elif ONEDNN_ENV in os.environ:
            who = f"{ONEDNN_ENV}={os.environ[ONEDNN_ENV]} set by the user"
        else:
            who = "TensorFlow's default"
        state = f"{'on' if onednn else 'off'} ({who})"
    return {
        "cpu": model or platform.processor() or platform.machine(),
        "isa": isa(flags),
        "bf16": "native" if has_native_bf16(flags) else "emulated",
        "onednn": state,
    }
