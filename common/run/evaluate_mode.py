"""Evaluation: the metric over every rank's validation files, after an epoch or as a run mode (--evaluate).

Every batch the eval step takes has the shape traced at init, which warm-up runs: a last, partial
batch (DeepCAM's validation keeps one) is padded to it, and the step counts its real samples only.
Another shape would be traced again, and on a GPU autotuned, in the timed region.
"""

import tensorflow as tf

from common.errors import InputError
from common.run.failures import RunFailed, fail_on_input, naming_bad_files
from common.run.result import RunResult
from common.run.steps import EvalSums


def evaluate(ctx, valid_ds, epoch: int) -> tuple[float, float]:
    """Every rank: (the metric, the per-sample mean loss) over every rank's validation files;
    RunFailed on every rank if a batch held NaN or Inf."""
    # Summed where the steps run and read once: a read per batch would wait for each.
    sums = tf.constant(EvalSums.zero_vector(ctx.metric.n_sums))
    with naming_bad_files(ctx.task, ctx.shards.valid_files):
        for x, y, n in valid_ds:
            sums = sums + ctx.eval_step(x, y, n)
        sums = sums.numpy()
    local = EvalSums.of(sums)
    # The ranks of a spatial group evaluate the same samples: each group counted once.
    total = EvalSums.of(ctx.dist.allreduce_sum(sums) / ctx.mesh.size)
    if total.non_finite_batches:
        culprit = ctx.dist.allreduce_max(
            [ctx.dist.rank + 1.0 if local.non_finite_batches else 0.0]
        )[0]
        fail_on_input(
            ctx.dist,
            ctx.task,
            int(culprit) - 1,
            ctx.shards.valid_files,
            epoch,
            None,
            "validation",
            ctx.state.global_step,
        )
    loss = float(total.loss / total.samples) if total.samples else float("nan")
    return float(ctx.metric.finalize(total.metric)), loss


def padded_batches(dataset: tf.data.Dataset, batch_size: int) -> tf.data.Dataset:
    """`dataset`'s batches (x, y) as (x, y, n), each of `batch_size` samples: the first n are the
    batch's, then copies of its last sample (finite where the batch is) up to `batch_size`."""

    def pad(x, y):
        n = tf.shape(x)[0]
        fill = tf.minimum(tf.range(batch_size), n - 1)  # 0, 1, ..., n - 1, n - 1, ...
        x, y = tf.cond(
            n < batch_size, lambda: (tf.gather(x, fill), tf.gather(y, fill)), lambda: (x, y)
        )
        return (
            tf.ensure_shape(x, (batch_size, *x.shape[1:])),
            tf.ensure_shape(y, (batch_size, *y.shape[1:])),
            n,
        )

    return dataset.map(pad)


def run_evaluation(ctx, valid_ds, start_epoch: int) -> RunResult:
    """--evaluate: one pass over the validation set with the model as restored (of `start_epoch`);
    rank 0's report says the result (no run, so no run events)."""
    try:
        metric = evaluate(ctx, valid_ds, ctx.state.epoch)[0]
    except RunFailed as e:  # no run started: bad input like any other
        raise InputError(e.failure.message) from None
    return RunResult(status="evaluated", epochs=start_epoch, metric=metric)
