"""The GPUs this process sees, by UUID through NVML (docs/scaling.md#gpus-and-cpu-binding; no two
ranks of a host share one: common.parallel.gpu_sharing). NVML comes with the driver, lists the
node's GPUs in PCI bus order and ignores CUDA_VISIBLE_DEVICES, which `visible` applies as CUDA does.
Imports neither TensorFlow nor Horovod.
"""

import ctypes
import dataclasses
import os

LIBRARY = "libnvidia-ml.so.1"
_UUID_BUFFER = 96  # NVML_DEVICE_UUID_V2_BUFFER_SIZE
_SUCCESS = 0  # NVML_SUCCESS


@dataclasses.dataclass(frozen=True)
class RankGpu:
    """The GPU one rank uses (uuid: None without NVML or a GPU) and how many it sees (`visible`:
    NVML's as CUDA_VISIBLE_DEVICES leaves them, TensorFlow's without NVML)."""

    rank: int
    host: str
    local_rank: int
    uuid: str | None
    visible: int


def nvml_uuids(library: str = LIBRARY) -> tuple[str, ...] | None:
    """The UUIDs of the node's GPUs in NVML's order (PCI bus), or None without a working NVML."""
    try:
        nvml = ctypes.CDLL(library)
    except OSError:
        return None
    nvml.nvmlDeviceGetHandleByIndex_v2.argtypes = [ctypes.c_uint, ctypes.POINTER(ctypes.c_void_p)]
    nvml.nvmlDeviceGetUUID.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint]
    if nvml.nvmlInit_v2() != _SUCCESS:
        return None
    try:
        count = ctypes.c_uint()
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != _SUCCESS:
            return None
        uuids = []
        for index in range(count.value):
            handle = ctypes.c_void_p()
            text = ctypes.create_string_buffer(_UUID_BUFFER)
            if (
                nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != _SUCCESS
                or nvml.nvmlDeviceGetUUID(handle, text, _UUID_BUFFER) != _SUCCESS
            ):
                return None
            uuids.append(text.value.decode())
        return tuple(uuids)
    finally:
        nvml.nvmlShutdown()


def visible(uuids: tuple[str, ...], cuda_visible_devices: str | None) -> tuple[str, ...]:
    """The GPUs of `uuids` (NVML's order) that CUDA_VISIBLE_DEVICES leaves, in CUDA's order: all
    when unset; entries are indices, UUIDs or unique prefixes (a 'MIG-...' kept as written), and
    the list ends at the first naming no GPU or one already listed, as CUDA reads it."""
    if cuda_visible_devices is None:
        return tuple(uuids)
    chosen = []
    for entry in (e.strip() for e in cuda_visible_devices.split(",")):
        if entry.isdigit():
            found = [uuids[int(entry)]] if int(entry) < len(uuids) else []
        elif entry.startswith("MIG-"):
            found = [entry]
        else:
            found = [u for u in uuids if entry and u.startswith(entry)]
        if len(found) != 1 or found[0] in chosen:
            break
        chosen.append(found[0])
    return tuple(chosen)


def visible_uuids(environ=None, library: str = LIBRARY) -> tuple[str, ...] | None:
    """The UUIDs of the GPUs this process sees, in CUDA's order; None without NVML."""
    environ = os.environ if environ is None else environ
    uuids = nvml_uuids(library)
    return None if uuids is None else visible(uuids, environ.get("CUDA_VISIBLE_DEVICES"))


def index_for(local_rank: int, count: int) -> int:
    """The index of the GPU a rank uses among the `count` it sees: its local rank's, or the only one
    (wrapping onto another rank's, which common.parallel.gpu_sharing then refuses)."""
    return local_rank % count
