"""Run under horovodrun by tests/test_deepcam_split.py: DeepCAM split along height, its results per rank.

  horovodrun -np N python tests/deepcam_split_probe.py --out DIR JOB [JOB ...]

A JOB is step:K[:no-halo]: the DeepCAM model (deepcam.model, at HEIGHT x WIDTH, a 1/16-width
network) bound to its Task on a mesh of K spatial ranks; one train step (the real TrainStep,
its gradients allreduced with the task's scales, traced once) on the data-parallel group's part
of a fixed global batch. Batch norm's statistics span the whole job (batchnorm_group_size = the groups), so
every split computes the one-rank function of the whole batch. Results in DIR/JOB/rank-NNNNN.npz:
this rank's logits before the step (its rows of its group's samples), loss, per-sample IoU, the reduced
gradients, every variable after one SGD step (batch-norm running statistics included).
no-halo: the neighbours' rows replaced by zeros (the negative control: the comparison must fail).
--control-out DIR: the jobs again on one intra-op thread, in a child forked before TensorFlow's
runtime starts (one launch, one import): the noise floor of the comparison (summation order).

At HEIGHT 192 the stride-16 map has 12 rows: 6 per rank at K=2, where ASPP rate 6 takes its
halo from the neighbour and rates 12 and 18 read the gathered map; 3 per rank at K=4 (all gathered).
"""

import argparse
import copy
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

from common.parallel.distribution import Distribution  # noqa: E402
from common.parallel.spatial_mesh import split_mesh  # noqa: E402

GLOBAL_SAMPLES = 4
HEIGHT, WIDTH, CHANNELS = 192, 32, 4


def _without_halo(mesh):
    """The negative control: the neighbours' rows replaced by zeros (as if every slab were a whole sample)."""
    from common.parallel.spatial_mesh import NeighbourPlanes

    def zeros(x, halo, name):
        del name
        rows = tf.zeros_like(x[:, :halo])
        return NeighbourPlanes(below=rows, above=rows, sent=x)

    mesh.neighbour_planes = zeros


def _task(mesh, groups: int):
    from common.config import ParallelConfig
    from deepcam.config import DataConfig, DeepCAMConfig, ModelConfig
    from deepcam.task import DeepCAMTask

    cfg = DeepCAMConfig(
        data=DataConfig(
            data_dir="unused",
            local_batch_size=GLOBAL_SAMPLES // groups,
            height=HEIGHT,
            width=WIDTH,
            channels=tuple(range(CHANNELS)),
        ),
        model=ModelConfig(width=0.0625, middle_blocks=1, batchnorm_group_size=groups),
        parallel=ParallelConfig(spatial_ranks=mesh.size),
    )
    cfg.validate()
    return DeepCAMTask(cfg, mesh if mesh.is_split else None)


def step(mesh, dist) -> dict:
    from common.run.steps import TrainStep
    from common.run.trainer import batchnorm_group
    from deepcam.task import per_sample_iou

    task = _task(mesh, mesh.groups)
    net = task.build_model(
        batchnorm_group(dist, task)
    )  # the trainer's: the data-parallel groups' ranks x K
    rng = np.random.default_rng(5)
    for v in net.trainable_variables:  # the same start on every rank and split
        fan_in = int(np.prod(v.shape[:-1])) if v.shape.rank > 1 else 100
        v.assign(rng.normal(0.0, 1.0 / np.sqrt(fan_in), v.shape).astype(np.float32))
    data = np.random.default_rng(11)
    x_all = data.normal(0.0, 1.0, size=(GLOBAL_SAMPLES, HEIGHT, WIDTH, CHANNELS)).astype(np.float32)
    # Labels in bands of rows, so that every class meets every slab boundary.
    y_all = (
        np.arange(HEIGHT)[None, :, None] // 5 + data.integers(0, 3, size=(GLOBAL_SAMPLES, 1, WIDTH))
    ) % 3
    batch = GLOBAL_SAMPLES // mesh.groups
    rows = HEIGHT // mesh.size
    samples = slice(mesh.group * batch, (mesh.group + 1) * batch)
    cut = slice(mesh.index * rows, (mesh.index + 1) * rows)
    x, y = tf.constant(x_all[samples, cut]), tf.constant(y_all[samples, cut].astype(np.int32))
    train_step = TrainStep(
        net,
        tf_keras.optimizers.SGD(0.5),
        task.build_losses(),
        dist,
        gradient_scales=task.gradient_scales(net),
    )
    logits = net(x, training=False)  # before the step: the weights all ranks start from
    iou = tf.function(lambda y, p: per_sample_iou(y, p, mesh=task.mesh))(y, logits)

    @tf.function
    def fused(x, y):  # TrainStep's own step (_fused_py), its reduced gradients returned too
        loss, _, grads = train_step._loss_and_grads(x, y)
        reduced = train_step.reduce_gradients(grads)
        train_step._update(reduced)
        return loss, reduced

    loss, reduced = fused(x, y)
    out = dict(
        logits=logits.numpy(),
        loss=loss.numpy(),
        iou=iou.numpy(),
        group=mesh.group,
        groups=mesh.groups,
        layers=np.array([layer.name for layer in net.layers]),
        halos=np.array([layer.name for layer in net.layers if getattr(layer, "row_halo", None)]),
        plan=task.describe_split(net) if mesh.is_split else "",
    )
    for i, g in enumerate(reduced):
        out[f"grad_{i}"] = g.numpy()
    for i, v in enumerate(net.variables):
        out[f"var_{i}"] = v.numpy()
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("jobs", nargs="+", help="step:K[:no-halo]")
    parser.add_argument("--out", required=True)
    parser.add_argument(
        "--control-out",
        help="also the jobs on 1 intra-op thread (the control: the same step, summed in another "
        "order), into this DIR, by a child forked before TensorFlow starts its runtime",
    )
    args = parser.parse_args()
    # No grappler rewrites: the split and unsplit steps compared as traced (a whole run's comparison,
    # grappler on, is tests/test_deepcam_split.py's slow test); the 1-rank launch a third shorter.
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
    out = Path(args.out)
    if (
        args.control_out
    ):  # the parent has only imported TensorFlow: a fork is safe (train_driver.py)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                tf.config.threading.set_intra_op_parallelism_threads(1)
                code = run_jobs(args.jobs, Path(args.control_out))
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0:
            return 1
    return run_jobs(args.jobs, out)


def run_jobs(jobs, root: Path) -> int:
    # The jobs' spatial groups; batch norm spans the whole job (Horovod's global set).
    dist = Distribution(group_sizes=[int(job.split(":")[1]) for job in jobs])
    meshes = {}
    for job in jobs:
        mode, k, *flags = job.split(":")
        if int(k) not in meshes:
            meshes[int(k)] = split_mesh(dist, int(k))  # k = 1 too: the split code's reference
        mesh = copy.copy(meshes[int(k)])
        if flags == ["no-halo"]:
            _without_halo(mesh)
        tf_keras.backend.clear_session()
        result = {"step": lambda m: step(m, dist)}[mode](mesh)
        out = root / job
        out.mkdir(parents=True, exist_ok=True)
        np.savez(out / f"rank-{dist.rank:05d}.npz", index=mesh.index, **result)
        dist.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
