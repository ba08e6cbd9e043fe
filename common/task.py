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
    # Turns the flag's value into {config key: value}, for flags that set
    # several keys at once (DeepCAM's --lr_schedule type=multistep,milestones=...).
    parse: Callable[[str], dict] | None = None


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
    train_set_size: int | None = None


@dataclasses.dataclass(frozen=True)
class EvalMetric:
    """A quality metric computed from per-batch sums, so ranks can add them up.

    `update(y, pred)` returns a float tensor of sums for one batch (traced in
    tf.function); `finalize(sums)` turns the sums of all batches of all ranks
    into the metric value.
    """

    name: str  # the MLPerf key: eval_error, eval_accuracy
    update: Callable
    finalize: Callable[[np.ndarray], float]
    lower_is_better: bool
    n_sums: int = 2  # length of update()'s vector (a rank without data adds zeros)


# runtime.tiny, the part every benchmark shares: one epoch, no checkpoints, figures every 2
# steps, no stop at the target, no compliance check (a smoke run is no result). Each
# Task.tiny_overrides adds the samples, batch and model width.
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
    """One benchmark bound to its config: the single-replica view of training.

    The shape of TF Model Garden's `official/core` task: built once from a
    validated config (`Task(cfg)`), it builds the inputs, model, losses,
    metrics and optimizer; the generic trainer (common.run.trainer) runs it, and
    the trainer shards and stages its files before (common.inputs.staging.stage_shards). Builders have
    no side effects: no logging, no collectives, no global state.

    A subclass sets the class attributes and implements the `build_*` methods.
    """

    name: ClassVar[str]  # MLPerf benchmark name ('cosmoflow')
    metric_name: ClassVar[
        str
    ]  # the MLPerf key of its quality metric ('eval_error'): build_metrics().name
    # Root config dataclass (a common.config.BaseConfig with a `data` section).
    config_class: ClassVar[type]
    flags: ClassVar[tuple[Flag, ...]] = ()  # command-line flags mapped onto config keys

    def __init__(self, cfg, mesh=None):
        self.cfg = cfg
        # The spatial mesh (common.parallel.spatial_mesh.SpatialMesh) of a run whose samples are
        # split across ranks; None: each rank holds whole samples.
        self.mesh = mesh

    @classmethod
    def tiny_overrides(cls, cfg) -> dict:
        """{config key: value} that shrink `cfg` into a smoke run of a few small steps (runtime.tiny).

        The data on disk stays as it is (sample shape, channels); what shrinks is the
        number of samples, the batch, the epochs and the model's width.
        """
        raise NotImplementedError

    # ------------------------------------------------------------------ data
    @property
    def local_batch_size(self) -> int:
        """Samples per rank per forward pass."""
        raise NotImplementedError

    def shard(self, rank: int, size: int) -> Shards:
        """The files data-parallel group `rank` of `size` reads (a group: one rank, or the ranks
        that split its samples), and the global sample counts."""
        raise NotImplementedError

    def input_specs(self) -> tuple:
        """(x, y) `tf.TensorSpec`s of one local batch as the input pipeline yields it (before
        preprocess_batch): what the steps are traced for at init."""
        raise NotImplementedError

    def build_inputs(self, shards: Shards, rank: int, local_size: int, start=None) -> tuple:
        """(train, valid) datasets over readable paths; `rank` is the data-parallel group's index
        (every rank of a spatial group reads the same samples in the same order). train is endless, epoch after epoch from
        `start` (a common.inputs.pipeline.Position; each epoch's order depends on the seed and the epoch
        only); valid is one pass."""
        raise NotImplementedError

    def input_cache_bytes(self, shards: Shards, local_size: int) -> int:
        """The bytes this rank's input pipelines keep in memory after their first pass (train and
        valid), 0 without a cache: build_inputs caches exactly when this is above 0."""
        del shards, local_size
        return 0

    def preprocess_batch(self, x, y):
        """(model input, labels) from a batch as the input pipeline yields it; runs inside the
        compiled train and eval steps (on the accelerator when there is one), so the pipeline can
        hand over compact data (int16 counts, uint8 labels) and leave casts and normalization to
        the device."""
        return x, y

    def staged_layout(self):
        """The common.inputs.staging_layouts.Conversion staged files are written in (staging.convert); None copies."""
        return None

    def find_bad_file(self, files) -> str | None:
        """A message naming the first unreadable file of `files`, or None."""
        del files
        return None

    # ----------------------------------------------------------------- model
    @property
    def batchnorm_group_size(self) -> int:
        """Ranks that share batch-norm statistics (1: each rank its own)."""
        return 1

    @classmethod
    def requested_batchnorm_group_size(cls, config_path, overrides: dict) -> int:
        """The batchnorm_group_size a run of this config file and overrides will have, read before the
        config is (the launcher shortens Horovod's cycle time by it before hvd.init); 1 when unknown."""
        del config_path, overrides
        return 1

    def build_model(self, bn_group):
        """The tf_keras.Model; `bn_group` is the RankGroup that shares batch-norm statistics.

        Built under the run's dtype policy (the trainer's common.runtime.dtype_policy block).
        """
        raise NotImplementedError

    def gradient_scales(self, model) -> list:
        """A factor per trainable variable of `model`, applied before the gradients' allreduce average:
        the spatial group's size K where a rank's gradient is only its slab's part (the update needs the
        group's sum), 1 elsewhere. The default reads the split layers (common.parallel.spatial: CosmoFlow's
        depth split, whose gathered head is replicated); a network split end to end gives K to all."""
        if (
            self.mesh is None
        ):  # data-parallel: nothing to scale, and no import of the split's layers
            return [1.0] * len(model.trainable_variables)
        from common.parallel.spatial import gradient_scales

        return gradient_scales(model)

    def describe_split(self, model) -> str:
        """What rank 0's [init] line says of a split run: how a sample is cut and where it is gathered."""
        from common.parallel.spatial import GatherSlabs

        gathered = ", ".join(layer.name for layer in model.layers if isinstance(layer, GatherSlabs))
        return (
            f"each rank holds 1/{self.mesh.size} of every sample's depth; slabs gathered at {gathered}, "
            f"the layers after it run whole on every rank of a group"
        )

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
