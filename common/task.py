"""What a benchmark hands the generic trainer: the single-replica view of training."""

import dataclasses
from collections.abc import Callable
from typing import ClassVar

import numpy as np


@dataclasses.dataclass(frozen=True)
class Flag:
    """A command-line flag that overrides one config key (`--batch-size` -> data.batch_size)."""

    names: tuple[str, ...]
    key: str
    help: str = ""
    is_switch: bool = False  # a flag without value that sets True
    parse: Callable[[str], dict] | None = None  # value -> {config key: value}, for several keys


@dataclasses.dataclass(frozen=True)
class Shards:
    """The files this rank reads, and the global sample counts."""

    train_files: list
    valid_files: list
    n_train: int
    n_valid: int
    local_batch_size: int
    train_set_size: int | None = None  # logged as train_samples where an epoch uses a subset


@dataclasses.dataclass(frozen=True)
class EvalMetric:
    """A quality metric from per-batch sums that ranks add up: `update(y, pred)` gives one batch's
    float sums (traced), `finalize(sums)` the value from all batches of all ranks."""

    name: str  # the MLPerf key: eval_error, eval_accuracy
    update: Callable
    finalize: Callable[[np.ndarray], float]
    lower_is_better: bool
    n_sums: int = 2  # length of update()'s vector (a rank without data adds zeros)


# runtime.tiny's overrides every benchmark shares; Task.tiny_overrides adds samples, batch, width.
TINY_LOOP = {
    "train.n_epochs": 1,
    "train.global_batch_size": None,
    "train.checkpoint_every": 0,
    "train.checkpoint_steps": 0,
    "train.log_every_steps": 2,
    "train.stop_at_target": False,
    "runtime.check_log": False,
}


class Task:
    """One benchmark bound to its config (TF Model Garden's task): it builds the inputs, model,
    losses, metrics and optimizer, without side effects; common.run.trainer runs it. A subclass
    sets the class attributes and implements the `build_*` methods.
    """

    name: ClassVar[str]  # MLPerf benchmark name ('cosmoflow')
    metric_name: ClassVar[str]  # MLPerf key of its quality metric: build_metrics().name
    config_class: ClassVar[type]  # its common.config.BaseConfig
    flags: ClassVar[tuple[Flag, ...]] = ()  # command-line flags mapped onto config keys

    def __init__(self, cfg, mesh=None):
        self.cfg = cfg
        self.mesh = mesh  # a split run's SpatialMesh; None: each rank holds whole samples

    @classmethod
    def tiny_overrides(cls, cfg) -> dict:
        """{config key: value} that shrink `cfg` into a smoke run (runtime.tiny): fewer samples,
        a smaller batch and model, the data on disk as it is."""
        raise NotImplementedError

    @property
    def local_batch_size(self) -> int:
        """Samples per rank per forward pass."""
        raise NotImplementedError

    def shard(self, rank: int, size: int) -> Shards:
        """The files data-parallel group `rank` of `size` reads, and the global sample counts."""
        raise NotImplementedError

    def input_specs(self) -> tuple:
        """(x, y) `tf.TensorSpec`s of a local batch as the pipeline yields it (steps trace them)."""
        raise NotImplementedError

    def build_inputs(self, shards: Shards, rank: int, local_size: int, start=None) -> tuple:
        """(train, valid) datasets; `rank` is the data-parallel group's index. train is endless
        from `start` (a common.inputs.pipeline.Position), valid one pass."""
        raise NotImplementedError

    def input_cache_bytes(self, shards: Shards, local_size: int) -> int:
        """Bytes this rank's input pipelines cache in memory (build_inputs caches when above 0)."""
        del shards, local_size
        return 0

    def preprocess_batch(self, x, y):
        """(model input, labels) from a batch as the pipeline yields it, inside the compiled steps
        (on the device): the casts and normalization."""
        return x, y

    def staged_layout(self):
        """The Conversion (common.inputs.staging_layouts) of staged files; None copies them."""
        return None

    def find_bad_file(self, files) -> str | None:
        """A message naming the first unreadable file of `files`, or None."""
        del files
        return None

    @property
    def batchnorm_group_size(self) -> int:
        """Ranks that share batch-norm statistics (1: each rank its own)."""
        return 1

    @classmethod
    def requested_batchnorm_group_size(cls, config_path, overrides: dict) -> int:
        """The batchnorm_group_size a run of this config and overrides will have, read before
        hvd.init (which the cycle time depends on); 1 when unknown."""
        del config_path, overrides
        return 1

    def build_model(self, bn_group):
        """The tf_keras.Model, built under the run's dtype policy; `bn_group` is the RankGroup
        that shares batch-norm statistics."""
        raise NotImplementedError

    def gradient_scales(self, model) -> list:
        """A factor per trainable variable applied before the allreduce average: the spatial
        group's size where a rank's gradient is only its slab's part, else 1."""
        if self.mesh is None:  # data-parallel: no import of the split's layers
            return [1.0] * len(model.trainable_variables)
        from common.parallel.spatial import gradient_scales

        return gradient_scales(model)

    def describe_split(self, model) -> str:
        """What rank 0's [init] line says of a split run: how a sample is cut and gathered."""
        from common.parallel.spatial import describe_depth_split

        return describe_depth_split(model, self.mesh.size)

    def build_losses(self) -> Callable:
        """(y, pred) -> scalar training loss of one local batch."""
        raise NotImplementedError

    def build_metrics(self) -> EvalMetric:
        raise NotImplementedError

    def build_optimizer(self, global_batch_size: int, steps_per_epoch: int) -> tuple:
        """(optimizer, schedule); schedule.at_step(step) gives the LR for logging."""
        raise NotImplementedError

    @property
    def target(self) -> float:
        """The quality target of the metric."""
        raise NotImplementedError

    def mlperf_hyperparameters(self, global_batch_size: int) -> dict:
        """{mllog key: value} of what this run does, under the names of the RCP table."""
        raise NotImplementedError
