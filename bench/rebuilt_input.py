"""A stack of halo convolutions, each run as autodiff would keep it and as common.parallel.rebuilt_input
runs it: peak RSS and step time of forward and backward, one fresh process per variant and size.

  python bench/rebuilt_input.py                       # 4 and 12 layers of a 384 x 576 x 64 slab
  python bench/rebuilt_input.py --rows 192 --layers 8

Each layer convolves (3x3, 'valid') its slab with one halo row above and below and zero columns each
side, then ReLU. `autodiff` keeps each layer's padded input for backward beside the slab the layer
before keeps; `rebuilt` keeps the slab and the two rows and builds the padded input again in backward.
The peak's growth per layer says what each keeps (one slab is rows x width x channels x 4 bytes), and
equal step times say that the convolution the rebuilt backward records on its tape is pruned, not run.
"""

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def measure(variant: str, rows: int, width: int, channels: int, layers: int, steps: int = 3) -> str:
    """One variant in this process: 'peak_gib step_s'."""
    import resource
    import time

    import numpy as np
    import tensorflow as tf
    sys.path.insert(0, str(REPO))
    from common.parallel.rebuilt_input import convolve_rebuilding_input

    rng = np.random.default_rng(0)
    slab = tf.constant(rng.normal(size=(1, rows, width, channels)).astype(np.float32))
    above, below = (tf.constant(rng.normal(size=(1, 1, width, channels)).astype(np.float32)) for _ in range(2))
    kernel = tf.Variable(rng.normal(0.0, 0.05, size=(3, 3, channels, channels)).astype(np.float32))

    def assemble(top, x, bottom):
        return tf.pad(tf.concat([top, x, bottom], axis=1), [[0, 0], [0, 0], [1, 1], [0, 0]])

    def conv(x, k):
        return tf.nn.conv2d(x, k, 1, "VALID")

    def layer(x):
        if variant == "autodiff":
            return conv(assemble(above, x, below), kernel)
        return convolve_rebuilding_input([above, x, below], assemble, tf.convert_to_tensor(kernel), conv)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            for _ in range(layers):
                x = tf.nn.relu(layer(x))
            loss = tf.reduce_sum(x * x)
        return tape.gradient(loss, [x, kernel])

    step(slab)
    start = time.perf_counter()
    for _ in range(steps):
        [g.numpy() for g in step(slab)]
    seconds = (time.perf_counter() - start) / steps
    return f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.3f} {seconds:.2f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=384)
    p.add_argument("--width", type=int, default=576)
    p.add_argument("--channels", type=int, default=64)
    p.add_argument("--layers", type=int, nargs="+", default=[4, 12])
    p.add_argument("--variant", help=argparse.SUPPRESS)   # run one variant here (the child)
    args = p.parse_args(argv)
    if args.variant:
        print(measure(args.variant, args.rows, args.width, args.channels, args.layers[0]))
        return 0
    slab_mib = args.rows * args.width * args.channels * 4 / 2**20
    print(f"slab {args.rows} x {args.width} x {args.channels} float32 ({slab_mib:.0f} MiB); "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'variant':<9} {'layers':>6} {'peak RSS GiB':>12} {'step s':>7}")
    peaks = {}
    for variant in ("autodiff", "rebuilt"):
        for n in args.layers:
            out = subprocess.run([sys.executable, __file__, "--variant", variant, "--rows", str(args.rows),
                                  "--width", str(args.width), "--channels", str(args.channels), "--layers", str(n)],
                                 capture_output=True, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
            if out.returncode:
                print(f"error: {variant} at {n} layers failed: {out.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
                return 1
            peak, seconds = out.stdout.split()[-2:]
            peaks[variant, n] = float(peak)
            print(f"{variant:<9} {n:>6} {peak:>12} {seconds:>7}", flush=True)
    if len(args.layers) > 1:
        low, high = min(args.layers), max(args.layers)
        for variant in ("autodiff", "rebuilt"):
            per_layer = (peaks[variant, high] - peaks[variant, low]) / (high - low) * 1024
            print(f"{variant}: {per_layer:.0f} MiB more per layer ({per_layer / slab_mib:.2f} slabs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
