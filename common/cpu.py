"""What this CPU can do, TensorFlow's oneDNN switch (settled before TensorFlow loads), and how many
intra-op threads a rank takes from the CPUs its launcher bound it to (`intra_op_threads`). Standard
library only.

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


# How a rank is bound to CPUs: the intra-op threads a rank takes from its own CPU affinity
# (the NUMA-local binding slurm/env.sh gives srun is common/parallel/gpu_binding.py).
#
# The threads: a rank may run on the CPUs of its affinity mask (os.sched_getaffinity). Whether the
# node's other ranks run on the same CPUs is something only the launcher knows, and says in the
# variables it exports; the mask's size cannot tell, since a job-wide cgroup (SLURM's task/cgroup, a
# container's --cpuset-cpus) shrinks every rank's mask to the same cores. `intra_op_threads` reads:
#
# - srun: SLURM's task/affinity plugin turns --cpu-bind=cores (or sockets, threads, its automatic
#   binding) into one CPU mask per local task and exports what it applied:
#   SLURM_CPU_BIND_TYPE=mask_cpu: and SLURM_CPU_BIND_LIST=0x3,0xc (slurm src/plugins/task/affinity/
#   dist_tasks.c). A task owns its mask, or shares it with the local tasks given the same CPUs
#   (--cpu-bind=sockets; or one mask for all when it binds nothing). SLURM_CPU_BIND_TYPE=cores (the
#   option itself, not a mask) means no plugin applied it: the one-node SLURM of
#   tools/local_slurm.sh (task/none) exports it, says "cluster configuration lacks support for cpu
#   binding" and leaves every task on all CPUs. --cpu-bind=map_ldom:/mask_ldom: (a site binding each
#   task to its GPU's NUMA domain) stays as written: tasks given the same domain share it.
# - mpirun (Open MPI 4): OMPI_MCA_orte_bound_at_launch=1 when it bound the process, with
#   OMPI_MCA_hwloc_base_binding_policy when --bind-to was given (seen on Open MPI 4.1.4). core and
#   hwthread give each rank CPUs of its own; socket, numa, a cache or board bind a domain that the
#   node's ranks may share. Its default (no --bind-to) is core for up to 2 processes, socket for more,
#   none when oversubscribed (mpirun(1)).
# - horovodrun (Gloo) binds nothing and exports nothing about it.
# A mask the launcher says it applied is believed only if it is this process's affinity: variables
# inherited from an enclosing step (a launcher started inside an srun task) describe another process.
#
# Pure: no TensorFlow, no Horovod, only the standard library (common.runtime calls intra_op_threads
# with os.environ, os.sched_getaffinity(0) and Horovod's local size).

# Open MPI's --bind-to levels that give each rank CPUs of its own.
_OMPI_OWN = ("core", "hwthread", "cpu")


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
    if "OMPI_COMM_WORLD_SIZE" in environ or "OMPI_MCA_orte_bound_at_launch" in environ:
        return _open_mpi(environ, n, local_size)
    if "HOROVOD_RANK" in environ:
        return _divided(n, local_size, "horovodrun binds no CPUs")
    bind_type = environ.get("SLURM_CPU_BIND_TYPE", "").strip().lower()
    if bind_type:
        return _slurm(environ, bind_type, cpus, local_size)
    return _divided(n, local_size, "no launcher binding seen")


def _divided(n: int, ranks: int, why: str, who: str = "the node's") -> ThreadChoice:
    threads = max(1, n // ranks)
    if ranks == 1:
        return ThreadChoice(threads, f"{why}: the task's {_cores(n)}, the only rank on its node")
    return ThreadChoice(
        threads, f"{why}: the task's {_cores(n)} shared by {who} {ranks} ranks -> {threads} each"
    )


def _own(n: int, how: str) -> ThreadChoice:
    return ThreadChoice(n, f"{how}: the task's own {_cores(n)}, not divided")


def _cores(n: int) -> str:
    return f"{n} CPU{'s' if n != 1 else ''}"


def _open_mpi(environ: Mapping, n: int, local_size: int) -> ThreadChoice:
    policy = environ.get("OMPI_MCA_hwloc_base_binding_policy", "").split(":")[0].strip().lower()
    if environ.get("OMPI_MCA_orte_bound_at_launch") != "1":
        return _divided(
            n, local_size, f"mpirun bound no CPUs{f' (--bind-to {policy})' if policy else ''}"
        )
    if policy in _OMPI_OWN:
        return _own(n, f"mpirun bound each rank (--bind-to {policy})")
    if (
        not policy
    ):  # mpirun(1) of Open MPI 4: "Bind to core: when the number of processes is <= 2"; else socket
        if int(environ.get("OMPI_COMM_WORLD_SIZE", "0") or 0) in (1, 2):
            return _own(n, "mpirun bound each rank to a core (its default for up to 2 processes)")
        return _divided(
            n,
            local_size,
            "mpirun bound the rank to a socket (its default for more than 2 processes) "
            "the node's ranks may share",
        )
    return _divided(
        n, local_size, f"mpirun bound the rank to a {policy} domain the node's ranks may share"
    )


def _slurm(environ: Mapping, bind_type: str, cpus: frozenset, local_size: int) -> ThreadChoice:
    n = len(cpus)
    if bind_type == "none":
        return _divided(n, local_size, "srun bound no CPUs (--cpu-bind=none)")
    kind = bind_type.rstrip(":")
    if kind in ("map_ldom", "mask_ldom"):
        return _numa(environ, kind, n, local_size)
    if kind not in ("mask_cpu", "map_cpu"):
        return _divided(
            n,
            local_size,
            f"SLURM_CPU_BIND_TYPE={bind_type} names a binding no task plugin "
            f"applied (it would be a mask_cpu: list)",
        )
    masks, local_id = _bind_list(environ, kind)
    if not masks:
        return _divided(
            n,
            local_size,
            f"SLURM_CPU_BIND_TYPE={bind_type} without a readable SLURM_CPU_BIND_LIST "
            f"and SLURM_LOCALID",
        )
    mine = masks[local_id % len(masks)]
    if mine != cpus:
        return _divided(
            n,
            local_size,
            f"SLURM's {kind} for local task {local_id} ({cpu_list(mine)}) is not this "
            f"process's affinity ({cpu_list(cpus)}): the variables describe another "
            f"process",
        )
    sharing = sum(1 for r in range(local_size) if masks[r % len(masks)] & mine)
    if sharing <= 1:
        return _own(n, f"srun bound each task ({kind} {cpu_list(mine)})")
    return _divided(
        n,
        sharing,
        f"srun bound local tasks to overlapping CPUs ({kind} {cpu_list(mine)})",
        who="its",
    )


def _bind_list(environ: Mapping, kind: str) -> tuple[list, int]:
    """SLURM_CPU_BIND_LIST's sets (CPUs, or NUMA nodes for the *_ldom kinds) and this task's SLURM_LOCALID;
    ([], -1) when either is missing or unreadable."""
    try:
        sets = [
            _cpu_set(kind, entry)
            for entry in environ.get("SLURM_CPU_BIND_LIST", "").split(",")
            if entry.strip()
        ]
        return sets, int(environ["SLURM_LOCALID"])
    except (KeyError, ValueError):
        return [], -1


def _numa(environ: Mapping, kind: str, n: int, local_size: int) -> ThreadChoice:
    """--cpu-bind=map_ldom:/mask_ldom: (a site's GPU-local NUMA domains): a task shares its domains with the
    local tasks given overlapping ones. The entries name NUMA nodes, not CPUs: nothing to hold the affinity to."""
    domains, local_id = _bind_list(environ, kind)
    if not domains:
        return _divided(
            n,
            local_size,
            f"SLURM_CPU_BIND_TYPE={kind}: without a readable SLURM_CPU_BIND_LIST and SLURM_LOCALID",
        )
    mine = domains[local_id % len(domains)]
    sharing = sum(1 for r in range(local_size) if domains[r % len(domains)] & mine)
    where = f"{kind} NUMA node(s) {cpu_list(mine)}"
    if sharing <= 1:
        return _own(n, f"srun bound each task ({where})")
    return _divided(
        n, sharing, f"srun bound local tasks to the same NUMA nodes ({where})", who="its"
    )


def _cpu_set(kind: str, entry: str) -> frozenset:
    """The members of one SLURM_CPU_BIND_LIST entry: a hex mask (mask_cpu, mask_ldom) or one number
    (map_cpu, map_ldom) of CPUs or NUMA nodes."""
    entry = entry.strip().lower()
    if kind.startswith("map_"):
        return frozenset([int(entry, 16) if entry.startswith("0x") else int(entry)])
    bits = int(entry, 16)
    return frozenset(i for i in range(bits.bit_length()) if bits >> i & 1)


def cpu_list(cpus) -> str:
    """A CPU set as lscpu and taskset write it: '0-3,8' for {0, 1, 2, 3, 8}."""
    out, run = [], []
    for c in sorted(cpus):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [c]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out) or "none"
