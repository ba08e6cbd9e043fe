"""Forward and backward time of DeepCAM's layer kinds on this stack, one layer at a time.

  python bench/layer_kinds.py                     # with the venv's Python of the stack to time
  .venv-tf2.15/bin/python bench/layer_kinds.py    # the older stack, for a side-by-side

Each layer (depthwise 3x3 at stride 1 and 2 and dilation 2, 1x1 and strided 3x3 convolutions,
batch norm, transposed convolution; shapes from the 192x288 model) runs forward and backward in a
tf.function, 3 untimed calls then --calls timed, on 2 intra-op threads, oneDNN as the project sets
it. bench/stacks.py times whole training steps; this says which layer kind a difference comes from.
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import common  # noqa: E402,F401  (oneDNN and Keras 2 before TensorFlow loads)
import tensorflow as tf  # noqa: E402

layers = tf.keras.layers
CASES = {
    "depthwise 3x3, stride 1, 96x144x64": (lambda: layers.DepthwiseConv2D(3, padding="same", use_bias=False),
                                           (1, 96, 144, 64)),
    "depthwise 3x3, dilation 2, 24x36x256": (lambda: layers.DepthwiseConv2D(3, padding="same", dilation_rate=2,
                                                                            use_bias=False), (1, 24, 36, 256)),
    "depthwise 3x3, stride 2, 98x146x64": (lambda: layers.DepthwiseConv2D(3, strides=2, use_bias=False),
                                           (1, 98, 146, 64)),
    "conv 1x1, 96x144x64 -> 128": (lambda: layers.Conv2D(128, 1, use_bias=False), (1, 96, 144, 64)),
    "conv 3x3, stride 2, 194x290x16 -> 32": (lambda: layers.Conv2D(32, 3, strides=2, use_bias=False),
                                             (1, 194, 290, 16)),
    "batch norm, 96x144x128": (lambda: layers.BatchNormalization(), (1, 96, 144, 128)),
    "transposed conv 3x3, stride 2, 48x72x64": (lambda: layers.Conv2DTranspose(64, 3, strides=2, padding="same"),
                                                (1, 48, 72, 64)),
}


def time_layer(make, shape, calls: int) -> float:
    """Milliseconds per forward + backward call of the layer `make()` on a random batch of `shape`."""
    layer = make()
    x = tf.random.normal(shape)
    layer(x)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, training=True)
            loss = tf.reduce_sum(y * y)
        return tape.gradient(loss, [x, *layer.trainable_variables])

    for _ in range(3):
        step(x)
    start = time.perf_counter()
    for _ in range(calls):
        grads = step(x)
    _ = [g.numpy() for g in grads]   # wait for the last call
    return (time.perf_counter() - start) / calls * 1e3


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=30, help="timed calls per layer")
    args = p.parse_args(argv)
    tf.config.threading.set_intra_op_parallelism_threads(2)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    from common import runtime
    print(runtime.software_stack())
    for name, (make, shape) in CASES.items():
        print(f"{name:42s} {time_layer(make, shape, args.calls):8.2f} ms", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
