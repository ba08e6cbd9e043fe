"""Where DeepCAM's height split spends memory: per variant, its peak RSS over --steps train steps (one
process; 2 by default), then TensorFlow's own count (another process, its BFC allocator on the CPU): the
peak of the bytes in use over the last step (what a GPU's allocator would count) and the bytes held
before it.

  python bench/deepcam_split_memory.py                      # 384 x 576, K = 2, mixed bf16 where native
  python bench/deepcam_split_memory.py --height 768 --width 1152 --precision float32 --optimizer LAMB
  python bench/deepcam_split_memory.py ... --only "split K" "split K, sharded"    # some variants
  python bench/deepcam_split_memory.py ... --steps 6        # the RSS once later steps wrote their pages

Variants, each in a fresh process (peak RSS is a process's high-water mark):
  unsplit H      the reference model on whole samples (H rows): what one rank holds at K = 1
  unsplit H/K    the reference model on H / K rows: what a perfect split would hold per rank
  split K        one rank of a K-way split (deepcam.model with a mesh) whose neighbours are stubbed
                 (zeros for their rows, the local map for the gathered one, x K for group sums): the
                 split's own layers, copies and group batch norm, without Horovod
  split K, BN    the same with Keras' fused batch norm instead of the group one: the share of
                 GroupBatchNormalization's unfused kernel (its statistics would then be the slab's)
  split K, sharded  `split K` with the optimizer sharded over the group (parallel.shard_optimizer,
                 common.parallel.sharded_optimizer): the slots of this rank's variables only, the
                 others' gradients reduced to their norm and finiteness, the updated variables
                 allgathered (a stub handing back zeros for the other rank's: the same bytes)
The real split's memory across ranks (input pipeline, Horovod) is measured with deepcam/train.py
--benchmark under /usr/bin/time -v (bench/results/deepcam_split_memory_AVX-512.md) and by bench/spatial.py;
this script's 768 x 1152 LAMB figures on an AVX2 CPU: bench/results/deepcam_split_memory_AVX2.md.
"""

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench import tensor_count  # noqa: E402
from bench.tensor_count import COUNT_TENSORS  # noqa: E402

VARIANTS = ("unsplit H", "unsplit H/K", "split K", "split K, BN", "split K, sharded")


def measure(height: int, width: int, rows: int, k: int, precision: str, group_bn: bool, optimizer: str,
            sharded: bool = False, steps: int = 2) -> str:
    """One variant in this process, `steps` train steps: 'peak_rss_gib last_step_s', or under
    COUNT_TENSORS 'peak_gib_of_the_last_step gib_held_before_it'."""
    import importlib
    import resource
    import time

    from common import benchmarks, optimizers   # before TensorFlow: its oneDNN kernels on, as in training
    import tensorflow as tf
    from common.parallel.distribution import NeighbourPlanes, RankGroup
    from common.parallel.sharded_optimizer import ShardedUpdate
    model = importlib.import_module(f"{benchmarks.split_along('height')}.model")   # the table names it
    tf.keras.mixed_precision.set_global_policy(precision)
    tensor_bytes = COUNT_TENSORS.items() <= os.environ.items()

    class StubMesh:   # one rank of a K-way split whose neighbours send zeros
        size, index, is_split, groups, group = k, 0, k > 1, 1, 0

        def neighbour_planes(self, x, halo, name):
            rows = tf.zeros_like(x[:, :halo])
            return NeighbourPlanes(below=rows, above=rows, sent=x)

        def gather(self, x, name):
            return tf.concat([x] * k, axis=1)

        def sum(self, x, name):
            return x * k

    bn_group = None
    if k > 1 and group_bn:
        bn_group = RankGroup(k, None)
        bn_group.sum = lambda t, name=None: t * float(k)
    net = model.build_model(height, width, 16, bn_group=bn_group, mesh=StubMesh() if k > 1 else None)
    optimizer = optimizers.build_optimizer(optimizer, learning_rate=0.01, weight_decay=0.01,
                                           max_grad_norm=1.0)
    x, y = tf.random.normal((1, rows, width, 16)), tf.zeros((1, rows, width), tf.int32)
    # Sharded: this rank owns 1/K of the variables; the others' values come back as zeros from the
    # stub allgather (the real one returns the owners' updates: the same bytes).
    shard = None
    if sharded:
        # (tf.pad, not a concat with tf.zeros: a constant that size would be folded into the graph and held)
        elements = sum(v.shape.num_elements() for v in net.trainable_variables)
        shard = ShardedUpdate(net.trainable_variables, 0, k, lambda flat: tf.pad(flat, [[0, elements - flat.shape[0]]]))
        clip, optimizer.global_clipnorm = optimizer.global_clipnorm, None
        optimizer.build(shard.owned_variables())

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            logits = tf.cast(net(x, training=True), tf.float32)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
        grads = tape.gradient(loss, net.trainable_variables)
        if shard is None:
            optimizer.apply_gradients(zip(grads, net.trainable_variables))
        else:
            owned, finite = shard.prepare(grads, clip)

            def update():
                optimizer.apply_gradients(zip(owned, shard.owned_variables()))

            tf.cond(finite, update, lambda: None)
            shard.share()
        return loss

    for _ in range(steps - 1):   # the first builds the slots and traces the graph
        step(x, y)
    if tensor_bytes:   # the last step alone: what every later step holds and peaks at
        peak, between = tensor_count.over(lambda: step(x, y))
        return f"{peak / 2**30:.2f} {between / 2**30:.2f}"
    start = time.perf_counter()
    step(x, y)
    seconds = time.perf_counter() - start
    return f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} {seconds:.1f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--height", type=int, default=384)
    p.add_argument("--width", type=int, default=576)
    p.add_argument("--k", type=int, default=2)
    p.add_argument("--precision", default="mixed_bfloat16")
    p.add_argument("--optimizer", default="SGD", help="SGD (no slots) or the closed configs' LAMB (two slots, a "
                   "global norm clip)")
    p.add_argument("--only", nargs="+", choices=VARIANTS, help="these variants only")
    p.add_argument("--steps", type=int, default=2, help="train steps per process (default 2): peak RSS over all "
                   "of them, TensorFlow's count over the last (a pool's pages, once written, stay in the RSS, "
                   "and the placement of later steps can write more of them)")
    p.add_argument("--variant", help=argparse.SUPPRESS)   # run one variant here (the child)
    args = p.parse_args(argv)
    h, w, k = args.height, args.width, args.k
    variants = {"unsplit H": (h, 1, True), "unsplit H/K": (h // k, 1, True), "split K": (h, k, True),
                "split K, BN": (h, k, False), "split K, sharded": (h, k, True)}
    if args.variant:
        height, kk, group_bn = variants[args.variant]
        print(measure(height, w, height // kk, kk, args.precision, group_bn, args.optimizer,
                      sharded=args.variant.endswith("sharded"), steps=args.steps))
        return 0
    if args.steps < 2:
        print("error: --steps must be at least 2 (the first builds the slots and traces)", file=sys.stderr)
        return 2
    print(f"DeepCAM {h} x {w} x 16, K = {k}, {args.precision}, batch 1, {args.optimizer}, {args.steps} steps; "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'variant':<17} {'peak RSS GiB':>12} {'step s':>7} {'tensors GiB':>11} {'held GiB':>8}")
    for name in (args.only or variants):
        figures = []
        for bfc in ({}, COUNT_TENSORS):   # RSS, then the allocator's own count
            out = subprocess.run([sys.executable, __file__, "--height", str(h), "--width", str(w), "--k", str(k),
                                  "--precision", args.precision, "--optimizer", args.optimizer, "--variant", name,
                                  "--steps", str(args.steps)],
                                 capture_output=True, text=True,
                                 env=dict(os.environ, TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2", **bfc))
            if out.returncode:
                print(f"error: variant '{name}' failed: {out.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
                return 1
            figures += out.stdout.split()[-2:]
        print(f"{name:<17} {figures[0]:>12} {figures[1]:>7} {figures[2]:>11} {figures[3]:>8}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
