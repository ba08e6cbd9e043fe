"""In-process measurements of a finished run for characterization (seed paper: staging, I/O, compute, network).

The trainer (common.run.trainer) calls `characterize_run` after run_stop (outside the timed region) when
`runtime.characterize` is set. Every rank calls it: it contains collectives.
FLOPs are counted by TensorFlow's profiler on the model's forward graph (ops with
registered FLOP statistics: convolutions, matmuls, element-wise arithmetic); a training
step is counted as 3x forward (backward ~ 2x forward). Memory traffic is a lower-bound
model: each layer reads its inputs and weights and writes its outputs once in the
forward pass, and the backward pass moves twice that.
"""

import math
import resource
import time

import numpy as np
import tensorflow as tf

FLOPS_METHOD = "TF profiler float_operation on the forward graph; training step = 3x forward"
TRAFFIC_METHOD = (
    "forward: layer inputs + outputs + weights once each; training = 3x forward (lower bound)"
)


def forward_flops_per_sample(model, sample_shape) -> int:
    """Forward-pass FLOPs of one sample, from TensorFlow's profiler."""
    spec = tf.TensorSpec([1, *sample_shape], tf.float32)
    graph = (
        tf.function(lambda x: model(x, training=False), autograph=False)
        .get_concrete_function(spec)
        .graph
    )
    options = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
    options["output"] = "none"
    return int(tf.compat.v1.profiler.profile(graph=graph, options=options).total_float_ops)


def forward_bytes_per_sample(model) -> int:
    """Lower-bound memory traffic of one sample's forward pass (see module docstring)."""
    total = 0
    for layer in model.layers:
        for tensors in (layer.input, layer.output):
            for t in tf.nest.flatten(tensors):
                if t.shape.rank:
                    total += int(np.prod([d or 1 for d in t.shape[1:]])) * t.dtype.size
        total += sum(int(np.prod(w.shape)) * w.dtype.size for w in layer.weights)
    return total


def peak_host_memory_bytes() -> int:
    """Peak resident memory of this process (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def pipeline_samples_per_s(
    iterator, batch_size: int, n_batches: int, warmup_batches: int = 2
) -> float:
    """Samples/s a tf.data iterator delivers alone (each batch materialized; warm-up not timed)."""
    for _ in range(warmup_batches):
        next(iterator)
    start = time.perf_counter()
    for _ in range(n_batches):
        next(iterator)[0].numpy()
    return n_batches * batch_size / (time.perf_counter() - start)


def allreduce_seconds(dist, variables, compression: str, repeats: int = 5) -> float:
    """Seconds one grouped allreduce of gradient-sized tensors takes (0 on one rank)."""
    if dist.size == 1:
        return 0.0
    grads = [tf.ones_like(v) for v in variables]
    reduce = tf.function(lambda g: dist.average_gradients(g, compression, grouped=True))
    tf.nest.map_structure(lambda t: t.numpy(), reduce(grads))  # warm-up: negotiation, buffers
    start = time.perf_counter()
    for _ in range(repeats):
        out = reduce(grads)
    out[0].numpy()
    return (time.perf_counter() - start) / repeats


def characterize_run(trainer, train_ds, staging) -> dict:
    """Every rank (collectives), after run_stop of a completed run with runtime.characterize: the
    run's figures for offline.characterize. `staging`: the StageStats, None when nothing was staged."""
    trainer.events.on_characterization_start()
    model, dist, shards = trainer.model, trainer.dist, trainer.shards
    sample_shape = train_ds.element_spec[0].shape[1:]
    history, local_batch_size = trainer.history, shards.local_batch_size
    compression = trainer.cfg.runtime.gradient_compression
    global_batch_size, files_read = trainer.info.global_batch_size, shards.train_files
    samples_read = len(files_read)

    def make_train_dataset():
        return trainer.task.build_inputs(shards, trainer.mesh.group, dist.local_size)[0]

    forward = forward_flops_per_sample(model, sample_shape)
    timed = history[1:] or history  # epoch 1 includes warm-up (graph optimization, caches)
    train_rate = float(np.mean([h["samples_per_s"] for h in timed])) if timed else 0.0
    local_input = pipeline_samples_per_s(
        iter(make_train_dataset()), local_batch_size, n_batches=8, warmup_batches=1
    )
    input_rate = float(dist.allreduce_sum([local_input])[0])
    params = int(sum(np.prod(v.shape) for v in model.trainable_variables))
    grad_bytes = params * (2 if compression == "fp16" else 4)
    reduce_s = float(
        dist.allreduce_max([allreduce_seconds(dist, model.trainable_variables, compression)])[0]
    )
    step_s = global_batch_size / train_rate if train_rate else float("nan")
    bytes_on_disk, samples = dist.allreduce_sum([sum(_size(f) for f in files_read), samples_read])
    return {
        "ranks": dist.size,
        "flops_per_sample_forward": forward,
        "flops_per_sample_train": 3 * forward,
        "flops_method": FLOPS_METHOD,
        "train_samples_per_s": train_rate,
        "achieved_flop_per_s": 3 * forward * train_rate,
        "memory_bytes_per_sample_train": 3 * forward_bytes_per_sample(model),
        "memory_traffic_method": TRAFFIC_METHOD,
        "input_samples_per_s": input_rate,
        "bytes_read_per_sample": float(bytes_on_disk / samples) if samples else 0.0,
        "peak_host_memory_bytes": int(dist.allreduce_max([peak_host_memory_bytes()])[0]),
        "parameters": params,
        "gradient_bytes_per_step": grad_bytes,
        "allreduce_seconds_per_step": reduce_s,
        "step_seconds": step_s,
        "allreduce_share": reduce_s / step_s if math.isfinite(step_s) and step_s > 0 else 0.0,
        "staging": staging.as_dict() if staging else {},
    }


def _size(path) -> int:
    try:
        return tf.io.gfile.stat(path).length
    except tf.errors.OpError:
        return 0
