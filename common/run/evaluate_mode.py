"""Evaluation: the metric over every rank's validation files, after an epoch or as a run mode (--evaluate)."""

import numpy as np

from common.errors import InputError
from common.run.failures import RunFailed, fail_on_input, naming_bad_files
from common.run.result import RunResult


def evaluate(ctx, valid_ds, epoch: int) -> tuple[float, float]:
    """Every rank: (the metric, the per-sample mean loss) over every rank's validation files;
    RunFailed on every rank if a batch held NaN or Inf."""
    sums = np.zeros(ctx.metric.n_sums + 3)   # a rank may hold no validation file
    with naming_bad_files(ctx.task, ctx.shards.valid_files):
        for x, y in valid_ds:
            sums = sums + ctx.eval_step(x, y).numpy()
    # ..., loss x samples, samples, non-finite batches; the ranks of a spatial group evaluate
    # the same samples: each group counted once.
    total = ctx.dist.allreduce_sum(sums) / ctx.mesh.size
    if total[-1]:
        culprit = ctx.dist.allreduce_max([ctx.dist.rank + 1.0 if sums[-1] else 0.0])[0]
        fail_on_input(ctx.dist, ctx.task, int(culprit) - 1, ctx.shards.valid_files, epoch, None, "validation",
                      ctx.state.global_step)
    loss = float(total[-3] / total[-2]) if total[-2] else float("nan")
    return float(ctx.metric.finalize(total[:-3])), loss


def run_evaluation(ctx, valid_ds, start_epoch: int) -> RunResult:
    """--evaluate: one pass over the validation set with the model as restored (of `start_epoch`);
    rank 0's report says the result (no run, so no run events)."""
    try:
        ctx.result.metric = evaluate(ctx, valid_ds, ctx.state.epoch)[0]
    except RunFailed as e:   # no run started: bad input like any other
        raise InputError(e.failure.message) from None
    ctx.result.status = "evaluated"
    ctx.result.epochs = start_epoch
    ctx.check_weights_in_sync()
    return ctx.result
