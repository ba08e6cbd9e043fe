"""Runtime knobs (device, threads, precision), set in one place and reported."""

import contextlib
import os
import platform

import tensorflow as tf
import tf_keras

from common import cpu
from common.inputs import pipeline


def configure(runtime, dist) -> dict:
    """Applies a RuntimeConfig; returns what was set. Must run before any other TensorFlow op.

    The launcher calls it right after Horovod's init (which pinned the device:
    `dist.device`) and before the first collective, since TensorFlow's thread pools
    are made by its first op and cannot be resized after (the threads note says so).
    Intra-op threads default to the rank's own CPUs (its affinity), divided among the node's
    ranks only where they share them (common.cpu): a task the launcher bound keeps
    its cores, and two unbound ranks on one node do not each spawn a pool as large as the machine.
    Then every rank checks that no two of a host use one GPU (a collective: after the pools).
    """
    device = dist.device
    threads = cpu.intra_op_threads(os.environ, cpu.affinity(), dist.local_size)
    intra, inter, kept = _size_thread_pools(
        runtime.intra_op_threads or threads.threads, runtime.inter_op_threads
    )
    rule = (
        f"runtime.intra_op_threads={runtime.intra_op_threads} (the default would be {threads.threads}: "
        f"{threads.rule})"
        if runtime.intra_op_threads
        else threads.rule
    )
    threads_note = "; ".join(filter(None, [kept, f"intra-op threads {intra}: {rule}"]))
    dist.check_one_rank_per_gpu()
    precision, why = choose_precision(runtime, device)
    # Random layers (dropout) draw from a tf.random.Generator, whose state a
    # checkpoint can hold (common.checkpoints), not from stateful ops whose
    # state lives in the kernels and restarts with the process.
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
    """The TensorFlow, Keras and Python a run computes with, for its console and summary.json:
    'TensorFlow 2.21.0, Keras 2.21.0 (tf_keras), Python 3.12.1'."""
    return f"TensorFlow {tf.__version__}, Keras {tf_keras.__version__} (tf_keras), Python {platform.python_version()}"


def container_image() -> dict:
    """The container image a run computes in, for summary.json ({} outside one): the commit it was
    built from (docker/Dockerfile*'s GIT_COMMIT build argument, MLPERF_HPC_COMMIT inside), and
    an Apptainer image's path and SHA-256 (slurm/env.sh passes the one `make sif` wrote beside it;
    else that file where it is visible) or a Docker image's ID where its runner passes it
    (`docker run -e MLPERF_HPC_IMAGE_ID=...`: an image cannot hold its own ID)."""
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
    """Sizes TensorFlow's thread pools; returns the sizes they have and a note ('' when as asked).

    In a process where TensorFlow already runs (a notebook, a test that trains in-process)
    the pools are made and cannot change: they stay as they are, their sizes are returned
    (0: TensorFlow's default) and the note says so.
    """
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
    """The Keras dtype policy a run should use, and why, in one line ('' when it is as asked).

    `--amp` alone (amp_dtype 'auto') means float16 with loss scaling on GPUs and
    bfloat16 on CPUs that compute it in hardware (AVX512_BF16, AMX). On other
    CPUs bf16 is emulated and trained CosmoFlow 7-14x slower than float32 on an
    AVX2 EPYC, so the run stays float32 and says so; an explicit amp_dtype
    forces the dtype anyway.

    Args:
      runtime: the RuntimeConfig (amp, amp_dtype).
      device: 'gpu' or 'cpu'.
      native_bf16: whether the CPU has hardware bf16 (default: this CPU's answer).
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
    """Builds the layers made under it with the Keras dtype policy `policy`, then restores the old one.

    The policy is chosen once (`configure` -> its "precision") and passed to the
    model builders; nothing outside this block sees it.
    """
    previous = tf_keras.mixed_precision.global_policy()
    tf_keras.mixed_precision.set_global_policy(policy)
    try:
        yield
    finally:
        tf_keras.mixed_precision.set_global_policy(previous)


def wrap_optimizer(optimizer, policy):
    """Adds dynamic loss scaling when `policy` (a name or Policy) computes in float16 (bf16 needs none)."""
    if (
        tf_keras.mixed_precision.Policy(
            policy if isinstance(policy, str) else policy.name
        ).compute_dtype
        == "float16"
    ):
        return tf_keras.mixed_precision.LossScaleOptimizer(optimizer)
    return optimizer


def accelerators_per_node(device: str, dist) -> int:
    """0 on CPU-only nodes, as the MLPerf HPC rules ask; else the GPUs used on this node."""
    if device != "gpu":
        return 0
    return dist.local_size
