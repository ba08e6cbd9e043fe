"""Evaluation: the metric over every rank's validation files, after an epoch or as a run mode (--evaluate)."""

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
        for x, y in valid_ds:
            sums = sums + ctx.eval_step(x, y)
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


def run_evaluation(ctx, valid_ds, start_epoch: int) -> RunResult:
    """--evaluate: one pass over the validation set with the model as restored (of `start_epoch`);
    rank 0's report says the result (no run, so no run events)."""
    try:
        metric = evaluate(ctx, valid_ds, ctx.state.epoch)[0]
    except RunFailed as e:  # no run started: bad input like any other
        raise InputError(e.failure.message) from None
    return RunResult(status="evaluated", epochs=start_epoch, metric=metric)
