"""Measures the closed models' cost per sample on this CPU, for the scaling projection (offline.projection).

  python -m offline.measure_model_costs                       # both benchmarks, input pipeline included
  python -m offline.measure_model_costs --bench deepcam --no-input-pipeline

Writes offline/model_costs/<benchmark>.json: FLOPs and memory traffic per training sample of the
closed-division model at full size, its gradient bytes, the input pipeline's samples/s on one
core, and the machine, TensorFlow version and command that measured them. Nothing is trained:
  - FLOPs: TensorFlow's profiler (float_operation) on the traced forward graph of one sample, the
    method of common/run/characterization.py; a training step is 3x forward (backward computes the
    input and the weight gradients, each as costly as the forward for convolutions and matmuls).
    The profiler's count of the traced train-step graph is stored beside it, with the op types
    it counts as 0 (TensorFlow registers no FLOP statistics for Conv3D or depthwise backprop),
    which is why it is not used.
  - Memory traffic: a lower bound per layer, split in two because they scale differently with
    the batch: activations (each layer's inputs and outputs, read or written once, per sample)
    and weights (read once per step whatever the batch); a training step moves 3x the forward.
    Counted in float32; the projection scales activations to the precision it projects.
  - Input pipeline: this project's own tf.data reader (cosmoflow.data / deepcam.data) on a few
    synthetic full-size files just written (so in the page cache), one tf.data thread: samples/s
    per core. Synthetic data: the real CosmoFlow files compress differently, which changes the
    inflate cost; and the figure is only as quiet as the machine was.
The runs are short: one trace per model and a few samples through the reader.
"""

import argparse
import datetime
import json
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path

import common  # noqa: F401  (oneDNN on before TensorFlow is imported)
from common import benchmarks, cpu
from common.config import load_config
from common.errors import write_text_atomic

OUT_DIR = Path(__file__).resolve().parent / "model_costs"
TRAIN_FLOPS_FACTOR = 3


def build_closed_model(bench: str):
    """The closed config (the table's full_model_config) and its full-size Keras model (float32)."""
    # No data is read: the data directory only has to be set for the config to validate.
    cfg = load_config(
        benchmarks.config_class(bench),
        benchmarks.REPO / benchmarks.get(bench).full_model_config,
        {"runtime.amp": "false", "data.data_dir": "unused"},
    )
    task = benchmarks.task_class(bench)(cfg)
    return cfg, task, task.build_model(None)


def profiled_flops(graph) -> int:
    import tensorflow as tf

    options = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
    options["output"] = "none"
    return int(tf.compat.v1.profiler.profile(graph=graph, options=options).total_float_ops)


def train_step_graph(model, loss_fn, y_spec):
    """The traced graph of one sample's loss and gradients (no optimizer update)."""
    import tensorflow as tf

    x_spec = tf.TensorSpec([1, *model.input_shape[1:]], tf.float32)

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        return tape.gradient(loss, model.trainable_variables)

    return tf.function(step, autograph=False).get_concrete_function(x_spec, y_spec).graph


def ops_without_flop_stats(graph) -> list[str]:
    """Backprop op types in `graph` that TensorFlow's profiler counts as 0 FLOPs."""
    from tensorflow.python.framework import ops

    missing = set()
    for op in graph.get_operations():
        if "Backprop" not in op.type:
            continue
        # An op type without registered statistics gets an empty OpStats (value None).
        if ops.get_stats_for_node_def(graph, op.node_def, "flops").value is None:
            missing.add(op.type)
    return sorted(missing)


def traffic_per_sample(model) -> tuple[int, int]:
    """(activation bytes, weight bytes) of one sample's forward pass in float32 (module docstring)."""
    import numpy as np
    import tensorflow as tf

    activations = weights = 0
    for layer in model.layers:
        for tensors in (layer.input, layer.output):
            for t in tf.nest.flatten(tensors):
                if t.shape.rank:
                    activations += int(np.prod([d or 1 for d in t.shape[1:]])) * 4
        weights += sum(int(np.prod(w.shape)) * 4 for w in layer.weights)
    return activations, weights


def input_samples_per_s_one_core(bench: str, cfg, workdir: Path) -> float:
    """Samples/s the benchmark's reader (the table's one_core_reader) delivers with one tf.data thread."""
    import tensorflow as tf

    entry = benchmarks.get(bench)
    n = entry.one_core_reader_samples + 1
    ds = benchmarks.load(entry.one_core_reader)(cfg, workdir, n)
    options = tf.data.Options()
    options.threading.private_threadpool_size = 1
    options.threading.max_intra_op_parallelism = 1
    batches = iter(ds.with_options(options))
    next(batches)[0].numpy()  # untimed: opening the pipeline
    start = time.perf_counter()
    for _ in range(n - 1):
        next(batches)[0].numpy()
    return (n - 1) / (time.perf_counter() - start)


def measure(bench: str, with_input_pipeline: bool) -> dict:
    import numpy as np
    import tensorflow as tf

    from common.run.characterization import forward_flops_per_sample

    entry = benchmarks.get(bench)
    cfg, task, model = build_closed_model(bench)
    shape = tuple(model.input_shape[1:])
    forward = forward_flops_per_sample(model, shape)
    y = task.input_specs()[1]
    # The loss takes integer labels as int32 (the pipeline may hand over a narrower type).
    y_spec = tf.TensorSpec([1, *y.shape[1:]], tf.int32 if y.dtype.is_integer else y.dtype)
    graph = train_step_graph(model, task.build_losses(), y_spec)
    activations, weights = traffic_per_sample(model)
    params = int(sum(np.prod(v.shape) for v in model.trainable_variables))
    out = {
        "benchmark": bench,
        "config": entry.full_model_config,
        "sample_shape": list(shape),
        "parameters": params,
        "flops_per_sample_forward": forward,
        "flops_per_sample_train": TRAIN_FLOPS_FACTOR * forward,
        "flops_method": f"TF profiler float_operation on the traced forward graph of one sample; "
        f"training step = {TRAIN_FLOPS_FACTOR}x forward",
        "profiler_flops_train_step_graph": profiled_flops(graph),
        "train_step_ops_without_flop_stats": ops_without_flop_stats(graph),
        "activation_bytes_per_sample_forward_fp32": activations,
        "weight_bytes_fp32": weights,
        "activation_bytes_per_sample_train_fp32": TRAIN_FLOPS_FACTOR * activations,
        "weight_bytes_per_step_train_fp32": TRAIN_FLOPS_FACTOR * weights,
        "traffic_method": "per layer: inputs + outputs once (per sample) and weights once (per step), "
        "float32; training = 3x forward (lower bound)",
        "gradient_bytes_fp32": 4 * params,
    }
    if with_input_pipeline and entry.one_core_reader:
        with tempfile.TemporaryDirectory(prefix=f"model_costs_{bench}_") as tmp:
            out["input_samples_per_s_per_core"] = input_samples_per_s_one_core(
                bench, cfg, Path(tmp)
            )
        out["input_method"] = (
            f"{bench}.data.make_dataset, one tf.data thread, batch 1, "
            f"{entry.one_core_reader_samples} synthetic full-size samples timed after 1"
        )
    return out


def machine_record(argv) -> dict:
    import tensorflow as tf

    described = cpu.describe()
    return {
        "cpu": described["cpu"],
        "isa": described["isa"],
        "onednn": described["onednn"],
        "tensorflow": tf.__version__,
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
        "command": "python -m offline.measure_model_costs " + shlex.join(argv),
    }


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    measurable = benchmarks.names_with("full_model_config")
    parser.add_argument(
        "--bench",
        choices=measurable,
        action="append",
        help="benchmark to measure (repeat for several; default: all with a full_model_config)",
    )
    parser.add_argument(
        "--no-input-pipeline", action="store_true", help="skip the input-pipeline figure"
    )
    parser.add_argument("--out-dir", default=str(OUT_DIR))
    args = parser.parse_args(argv)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for bench in args.bench or measurable:
        start = time.perf_counter()
        costs = measure(bench, not args.no_input_pipeline)
        costs["measured_on"] = machine_record(argv)
        path = out_dir / f"{bench}.json"
        write_text_atomic(path, json.dumps(costs, indent=2) + "\n")
        print(
            f"{bench}: {costs['flops_per_sample_train'] / 1e9:.1f} GFLOP/sample (train), "
            f"{costs['activation_bytes_per_sample_train_fp32'] / 1e9:.2f} GB activations/sample, "
            f"{costs['parameters']:,} parameters ({time.perf_counter() - start:.0f} s) -> {path}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
