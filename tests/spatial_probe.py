"""Run under horovodrun by tests/test_spatial.py: spatially split computations, their results per rank.

  horovodrun -np N python tests/spatial_probe.py --out DIR [--data-dir D] JOB [JOB ...]

A JOB is MODE:K[:FLAG...] (e.g. `layer:2`, `model:2:no-halo`, `model:2:no-overlap`): MODE
on a mesh of K spatial ranks, its results in DIR/JOB/rank-NNNNN.npz. One launch runs every
job its rank count needs, one after the other (a launch costs more than most jobs).

halo:   the halo exchange alone (float32 and bfloat16) against the zero-padded whole tensor.
layer:  one SpatialConv3D on integer data (16 planes: at K=4 too a slab has an interior to
        overlap): the output slab, and the gradients of a fixed linear function of it with
        respect to the input slab and the (partial) kernel.
        Every rank also writes the whole tensor's Conv3D ('same' padding) results.
model:  the CosmoFlow model at 64^3 bound to its Task: predictions, loss, the gradients
        after the train step's allreduce, and the weights after one SGD step on the
        data-parallel group's part of a fixed global batch.
labels: two epochs of the real input pipeline (shards by group): each step's labels.
Flags:
no-halo:    the halo exchange returns zeros instead of the neighbours' planes
            (the negative control: the comparison must then fail).
no-overlap: the split convolutions exchange first, then convolve (parallel.halo_overlap=false);
            without it they compute their interior while the halo is in flight (the default).
"""

import argparse
import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

from common.parallel.distribution import Distribution  # noqa: E402
from common.parallel.spatial_mesh import split_mesh  # noqa: E402

GLOBAL_SAMPLES = 4  # the fixed global batch of `model` (split over the groups)
EDGE = 64


def _without_halo(mesh):
    """The negative control: neighbours' planes replaced by zeros (as if every slab were a whole volume),
    for both ways of convolving."""
    from common.parallel.spatial_mesh import NeighbourPlanes

    def zeros(x, halo, name):
        del name
        planes = tf.zeros_like(x[:, :halo])
        return NeighbourPlanes(below=planes, above=planes, sent=x)

    mesh.neighbour_planes = zeros


def layer(mesh, overlap: bool) -> dict:
    from common.parallel.spatial import SpatialConv3D

    rng = np.random.default_rng(3)
    x = rng.integers(-3, 4, size=(2, 16, 6, 5, 3)).astype(np.float32)
    kernel = rng.integers(-2, 3, size=(3, 3, 3, 3, 4)).astype(np.float32)
    bias = rng.integers(-2, 3, size=4).astype(np.float32)
    weights = rng.integers(-2, 3, size=(2, 16, 6, 5, 4)).astype(np.float32)  # d(loss)/d(output)
    planes = x.shape[1] // mesh.size
    z = slice(mesh.index * planes, (mesh.index + 1) * planes)

    def run(conv, inputs, out_weights):
        inputs = tf.constant(inputs)
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            out = conv(inputs)
            loss = tf.reduce_sum(out * out_weights)
        d_input, d_kernel, d_bias = tape.gradient(loss, [inputs, conv.kernel, conv.bias])
        return out.numpy(), d_input.numpy(), d_kernel.numpy(), d_bias.numpy()

    split = SpatialConv3D(4, 3, mesh, overlap=overlap, name="conv1")
    split.build((None, planes, 6, 5, 3))
    split.set_weights([kernel, bias])
    whole = tf_keras.layers.Conv3D(4, 3, padding="same", name="conv1")
    whole.build((None, 16, 6, 5, 3))
    whole.set_weights([kernel, bias])
    out, d_x, d_k, d_b = run(split, x[:, z], weights[:, z])
    w_out, w_dx, w_dk, w_db = run(whole, x, weights)
    return dict(
        out=out,
        d_input=d_x,
        d_kernel=d_k,
        d_bias=d_b,
        whole_out=w_out[:, z],
        whole_d_input=w_dx[:, z],
        whole_d_kernel=w_dk,
        whole_d_bias=w_db,
    )


def _with_halo(planes, slab):
    return tf.concat([planes.below, slab, planes.above], axis=1)


def halo(mesh) -> dict:
    """The exchange alone, in float32 and bfloat16 (which Horovod cannot send: cast on the wire)."""
    rng = np.random.default_rng(4)
    x = rng.integers(-100, 100, size=(2, 8, 3, 2, 2)).astype(np.float32)
    planes = x.shape[1] // mesh.size
    z = slice(mesh.index * planes, (mesh.index + 1) * planes + 2)
    padded = np.pad(x, [(0, 0), (1, 1), (0, 0), (0, 0), (0, 0)])[
        :, z
    ]  # the halo planes of the whole tensor
    out = {"want": padded}
    for dtype in (tf.float32, tf.bfloat16):
        slab = tf.cast(x[:, mesh.index * planes : (mesh.index + 1) * planes], dtype)
        got = tf.function(lambda t: _with_halo(mesh.neighbour_planes(t, 1, name="probe.halo"), t))(
            slab
        )
        out[f"got_{dtype.name}"] = tf.cast(got, tf.float32).numpy()
        out[f"dtype_{dtype.name}"] = got.dtype.name
    return out


def _model_config(spatial_ranks: int, batch_size: int, halo_overlap: bool):
    from common.config import ParallelConfig
    from cosmoflow.config import CosmoFlowConfig, DataConfig, ModelConfig

    cfg = CosmoFlowConfig(
        data=DataConfig(
            data_dir="unused",
            batch_size=batch_size,
            sample_shape=(EDGE, EDGE, EDGE, 4),
            n_train=GLOBAL_SAMPLES,
            n_valid=GLOBAL_SAMPLES,
        ),
        model=ModelConfig(conv_size=2, n_conv_layers=5, fc1_size=8, fc2_size=4, dropout=0.0),
        parallel=ParallelConfig(spatial_ranks=spatial_ranks, halo_overlap=halo_overlap),
    )
    cfg.validate()
    return cfg


def model(mesh, dist, overlap: bool) -> dict:
    from common.parallel.spatial import gradient_scales
    from common.run.steps import TrainStep
    from cosmoflow.task import CosmoFlowTask

    batch = GLOBAL_SAMPLES // mesh.groups
    task = CosmoFlowTask(_model_config(mesh.size, batch, overlap), mesh if mesh.is_split else None)
    net = task.build_model(None)
    rng = np.random.default_rng(5)
    for v in net.trainable_variables:  # the same start on every rank and split, scaled by fan-in
        fan_in = int(np.prod(v.shape[:-1])) if v.shape.rank > 1 else 100
        v.assign(rng.normal(0.0, 1.0 / np.sqrt(fan_in), v.shape).astype(np.float32))
    data = np.random.default_rng(11)
    x_all = data.poisson(2.0, size=(GLOBAL_SAMPLES, EDGE, EDGE, EDGE, 4)).astype(np.int16)
    y_all = data.uniform(-1, 1, size=(GLOBAL_SAMPLES, 4)).astype(np.float32)
    samples = slice(mesh.group * batch, (mesh.group + 1) * batch)
    planes = EDGE // mesh.size
    x = tf.constant(x_all[samples, mesh.index * planes : (mesh.index + 1) * planes])
    y = tf.constant(y_all[samples])
    optimizer, _ = task.build_optimizer(GLOBAL_SAMPLES, steps_per_epoch=10)
    step = TrainStep(
        net,
        optimizer,
        task.build_losses(),
        dist,
        preprocess=task.preprocess_batch,
        gradient_scales=gradient_scales(net),
    )
    pred = net(task.preprocess_batch(x, y)[0], training=False).numpy()
    loss, _, grads = step._loss_and_grads(x, y)  # (loss, inputs finite, gradients)
    reduced = step.reduce_gradients(grads)
    step(iter([(x, y)]))
    out = dict(
        pred=pred,
        loss=loss.numpy(),
        group=mesh.group,
        groups=mesh.groups,
        scales=np.array(gradient_scales(net)),
        layers=np.array([layer.name for layer in net.layers]),
        overlapped=np.array(
            [layer.name for layer in net.layers if getattr(layer, "overlaps", False)]
        ),
    )
    for i, (g, v) in enumerate(zip(reduced, net.trainable_variables)):
        out[f"grad_{i}"] = g.numpy()
        out[f"weight_{i}"] = v.numpy()
    return out


def labels(mesh, data_dir: str) -> dict:
    from common.config import load_config
    from cosmoflow.task import CosmoFlowTask

    cfg = load_config(
        CosmoFlowTask.config_class,
        Path(__file__).parent / "configs" / "cosmoflow_tiny.yaml",
        {
            "data.data_dir": data_dir,
            "data.n_train": 16,
            "data.n_valid": 8,
            "data.batch_size": 2,
            "parallel.spatial_ranks": mesh.size,
        },
    )
    task = CosmoFlowTask(cfg, mesh if mesh.is_split else None)
    shards = task.shard(mesh.group, mesh.groups)
    train, _ = task.build_inputs(shards, mesh.group, 1)
    steps = 2 * len(shards.train_files) // cfg.data.batch_size  # two epochs
    ys, xs = [], []
    for (x, y), _ in zip(train, range(steps)):
        ys.append(y.numpy())
        xs.append(x.numpy())
    return dict(labels=np.stack(ys), slabs=np.stack(xs), group=mesh.group)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("jobs", nargs="+", help="MODE:K[:no-halo][:no-overlap]")
    parser.add_argument("--out", required=True)
    parser.add_argument("--data-dir")
    args = parser.parse_args()
    # The jobs' spatial groups, which batch norm's groups are too (CosmoFlow: K x 1).
    dist = Distribution(group_sizes=[int(job.split(":")[1]) for job in args.jobs])
    meshes = {}  # one per K: the placement check is a collective
    for job in args.jobs:
        mode, k, *flags = job.split(":")
        if int(k) not in meshes:
            meshes[int(k)] = split_mesh(dist, int(k))  # k = 1 too: the split code's reference
        mesh = copy.copy(meshes[int(k)])  # a job's no-halo patch stays its own
        if not set(flags) <= {"no-halo", "no-overlap"}:
            raise SystemExit(f"{job}: unknown flag(s) {flags}")
        if "no-halo" in flags:
            _without_halo(mesh)
        overlap = "no-overlap" not in flags
        tf_keras.backend.clear_session()  # each job's layers get the names they would get alone
        result = {
            "halo": lambda m, o: halo(m),
            "layer": lambda m, o: layer(m, o),
            "model": lambda m, o: model(m, dist, o),
            "labels": lambda m, o: labels(m, args.data_dir),
        }[mode](mesh, overlap)
        out = Path(args.out) / job
        out.mkdir(parents=True, exist_ok=True)
        np.savez(
            out / f"rank-{dist.rank:05d}.npz", index=mesh.index, described=mesh.describe(), **result
        )
        dist.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
