"""Runtime knobs (device, threads, precision), set in one place and reported."""

import contextlib
import os
import platform

import tensorflow as tf
import tf_keras

from common import cpu
from common.inputs import pipeline


def configure(runtime, dist) -> dict:
    """Applies a RuntimeConfig and returns what was set: after Horovod's init pinned the device and
    before any other TensorFlow op (the first op fixes the thread pools; docs/gpu.md). Intra-op
    threads default to common.cpu.intra_op_threads. Then checks one rank per GPU (a collective).
    """
    device = dist.device
    threads = cpu.intra_op_threads(os.environ, cpu.affinity(), dist.local_size)
    intra, inter, kept = _size_thread_pools(
        runtime.intra_op_threads or threads.threads, runtime.inter_op_threads
    )
    rule = threads.rule
    if runtime.intra_op_threads:
        asked = runtime.intra_op_threads
        rule = f"runtime.intra_op_threads={asked} (the default would be {threads.threads}: {rule})"
    threads_note = "; ".join(filter(None, [kept, f"intra-op threads {intra}: {rule}"]))
    dist.check_one_rank_per_gpu()
    precision, why = choose_precision(runtime, device)
    # Dropout draws from a tf.random.Generator, whose state a checkpoint holds (common.checkpoints).
    tf_keras.backend.experimental.enable_tf_random_generator()
    if runtime.deterministic:
        tf.config.experimental.enable_op_determinism()
    return {
        "device": device,
        "cpu": cpu.describe(),
        "intra_op_threads": intra,
        "deterministic": runtime.deterministic,
        "inter_op_threads": inter,
        # tf.data's private thread pool (common.inputs.pipeline.host_options): the rank's cores.
        "input_threads": threads.threads,
        "threads_note": threads_note,
        "precision": precision,
        "precision_note": why,
        "xla": runtime.xla,
        "gradient_compression": runtime.gradient_compression,
        "gradient_allreduce": runtime.gradient_allreduce,
        # Where the input pipeline's last stage puts the batches ('off': each step copies its own).
        "prefetch_to_device": pipeline.target_device(runtime.prefetch_to_device, device),
        "stack": software_stack(),
        "image": container_image(),
    }


def software_stack() -> str:
    """'TensorFlow 2.21.0, Keras 2.21.0 (tf_keras), Python 3.12.1', for the console and summary."""
    keras, python = tf_keras.__version__, platform.python_version()
    return f"TensorFlow {tf.__version__}, Keras {keras} (tf_keras), Python {python}"


def container_image() -> dict:
    """The container image a run computes in, for summary.json ({} outside one): the commit it was
    built from (MLPERF_HPC_COMMIT), and an Apptainer image's path and SHA-256
    (MLPERF_HPC_IMAGE_SHA256, else the `<image>.sha256` file `make sif` wrote) or a Docker image's
    MLPERF_HPC_IMAGE_ID."""
    sif = os.environ.get("APPTAINER_CONTAINER") or os.environ.get("SINGULARITY_CONTAINER")
    if sif:
        sha256 = os.environ.get("MLPERF_HPC_IMAGE_SHA256", "")
        with contextlib.suppress(OSError):
            sha256 = sha256 or open(f"{sif}.sha256").read().split()[0]
        image = {"runtime": "apptainer", "image": sif, "sha256": sha256}
    elif os.path.exists("/.dockerenv"):
        image = {"runtime": "docker", "image_id": os.environ.get("MLPERF_HPC_IMAGE_ID", "")}
    else:
        return {}
    return image | {"commit": os.environ.get("MLPERF_HPC_COMMIT", "")}


def _size_thread_pools(intra: int, inter: int) -> tuple[int, int, str]:
    """Sizes TensorFlow's thread pools; returns the sizes they have (0: TensorFlow's default) and a
    note, '' when as asked (where TensorFlow already ran an op, the pools stay as they are)."""
    try:
        tf.config.threading.set_intra_op_parallelism_threads(intra)
        tf.config.threading.set_inter_op_parallelism_threads(inter)
    except RuntimeError:
        kept = (
            tf.config.threading.get_intra_op_parallelism_threads(),
            tf.config.threading.get_inter_op_parallelism_threads(),
        )
        return (
            *kept,
            f"TensorFlow was running before the runtime was configured: its thread pools stay "
            f"{kept[0]} intra-op / {kept[1]} inter-op (0: its default), not {intra} / {inter}",
        )
    return intra, inter, ""


def choose_precision(runtime, device: str, native_bf16=None) -> tuple[str, str]:
    """The Keras dtype policy of a run of `runtime` (amp, amp_dtype) on `device` ('gpu' or 'cpu'),
    and why in one line ('' when as asked). `--amp` alone: float16 on GPUs, bfloat16 on CPUs with
    native bf16 (`native_bf16`, default this CPU's), else float32 (docs/figures.md#cpus).
    """
    if not runtime.amp:
        return "float32", ""
    if runtime.amp_dtype != "auto":
        return f"mixed_{runtime.amp_dtype}", ""
    if device == "gpu":
        return "mixed_float16", ""
    if native_bf16 is None:
        native_bf16 = cpu.has_native_bf16()
    if native_bf16:
        return "mixed_bfloat16", ""
    return "float32", (
        f"--amp: this {cpu.isa()} CPU has no native bf16 (no avx512_bf16 or amx_bf16), "
        "so training stays float32; --set runtime.amp_dtype=bfloat16 forces emulated bf16"
    )


@contextlib.contextmanager
def dtype_policy(policy: str):
    """Builds the layers made under it with the Keras dtype policy `policy`, then restores the old."""
    previous = tf_keras.mixed_precision.global_policy()
    tf_keras.mixed_precision.set_global_policy(policy)
    try:
        yield
    finally:
        tf_keras.mixed_precision.set_global_policy(previous)


def wrap_optimizer(optimizer, policy):
    """Adds dynamic loss scaling when `policy` (a name or Policy) computes in float16."""
    name = policy if isinstance(policy, str) else policy.name
    if tf_keras.mixed_precision.Policy(name).compute_dtype == "float16":
        return tf_keras.mixed_precision.LossScaleOptimizer(optimizer)
    return optimizer
