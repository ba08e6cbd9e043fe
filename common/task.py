"""What a benchmark hands the generic trainer: the single-replica view of training."""

import dataclasses
from typing import Callable, Optional

import numpy as np


@dataclasses.dataclass(frozen=True)
class Flag:
    """A command-line flag that overrides one config key (`--batch-size` -> data.batch_size)."""
    names: tuple[str, ...]
    key: str
    help: str = ""
    is_switch: bool = False   # a flag without value that sets True
    # Turns the flag's value into {config key: value}, for flags that set
    # several keys at once (DeepCAM's --lr_schedule type=multistep,milestones=...).
    parse: Optional[Callable[[str], dict]] = None


@dataclasses.dataclass(frozen=True)
class Shards:
    """The files this rank reads, and the global sample counts."""
    train_files: list
    valid_files: list
    n_train: int
    n_valid: int
    local_batch_size: int
    # The training set's size, logged as train_samples, when each epoch uses a
    # subset (DeepCAM drops the remainder of files / ranks, as the reference).
    train_set_size: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class EvalMetric:
    """A quality metric computed from per-batch sums, so ranks can add them up.

    `update(y, pred)` returns a float tensor of sums for one batch (traced in
    tf.function); `finalize(sums)` turns the sums of all batches of all ranks
    into the metric value.
    """
    name: str                     # the MLPerf key: eval_error, eval_accuracy
    update: Callable
    finalize: Callable[[np.ndarray], float]
    lower_is_better: bool
    n_sums: int = 2               # length of update()'s vector (a rank without data adds zeros)


@dataclasses.dataclass(frozen=True)
class Task:
    """One benchmark: everything the trainer needs, as builders without side effects.

    Attributes:
      name: MLPerf benchmark name ('cosmoflow').
      config_class: root config dataclass; it has sections `data` (with
        data_dir, batch_size), `train`, `runtime`, `staging`, `mlperf` and
        a field `output_dir`.
      flags: command-line flags mapped onto config keys.
      shard: (cfg, rank, size) -> Shards.
      make_datasets: (cfg, Shards with readable paths, rank, local_size[, start]) -> (train_ds, valid_ds);
        train_ds is endless, epoch after epoch, from `start` (a common.epochs.Position:
        the order of each epoch depends on the seed and the epoch only), valid_ds is one pass.
      build_model: (cfg, bn_group) -> tf.keras.Model; bn_group is the RankGroup
        that shares batch-norm statistics (see batchnorm_group_size).
      build_optimizer: (cfg, global_batch_size, steps_per_epoch) -> (optimizer, schedule)
        where schedule.at_step(step) gives the LR for logging.
      loss: cfg -> (y, pred) -> scalar loss.
      metric: cfg -> EvalMetric.
      target: cfg -> target value of the metric.
      mlperf_hyperparameters: (cfg, global_batch_size) -> {mllog key: value}.
      find_bad_file: (cfg, files) -> message naming the first unreadable file, or None.
      batchnorm_group_size: cfg -> ranks that share batch-norm statistics (1: local).
    """
    name: str
    config_class: type
    flags: tuple
    shard: Callable
    make_datasets: Callable
    build_model: Callable
    build_optimizer: Callable
    loss: Callable
    metric: Callable
    target: Callable
    mlperf_hyperparameters: Callable
    find_bad_file: Optional[Callable] = None
    batchnorm_group_size: Callable = lambda cfg: 1
