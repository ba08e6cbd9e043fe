"""CosmoFlow bound to its config for the common trainer: the single-replica view of training."""

import numpy as np
import tensorflow as tf

from common import optimizers
from common.config import check_global_batch
from common.inputs import pipeline
from common.inputs.pipeline import check_divisible, fits_in_memory, list_files, select_and_shard
from common.optimizers import scale_lr
from common.task import TINY_LOOP, EvalMetric, Flag, Shards, Task
from cosmoflow import data, model
from cosmoflow.config import CosmoFlowConfig

# The reference's flag names, each mapped onto the config key it overrides.
FLAGS = (
    Flag(
        ("--output-dir", "-o"),
        "output_dir",
        "output directory (log, config, checkpoints go to its run_tag folder)",
    ),
    Flag(("--run-tag",), "run_tag", "the run's folder inside the output directory (default: none)"),
    Flag(("--data-dir",), "data.data_dir", "directory with train/ and validation/"),
    Flag(("--n-train",), "data.n_train", "training samples"),
    Flag(("--n-valid",), "data.n_valid", "validation samples"),
    Flag(("--batch-size",), "data.batch_size", "local (per rank) batch size"),
    Flag(("--n-epochs",), "train.n_epochs", "maximum epochs"),
    Flag(("--stage-dir",), "staging.stage_dir", "node-local directory to stage the data into"),
    Flag(
        ("--stage-verify",),
        "staging.verify",
        "re-stage a file whose SHA-256 changed even under the "
        "same size and mtime (reads every source on every run)",
        is_switch=True,
    ),
    Flag(("--seed",), "train.seed", "random seed (shared by all ranks)"),
    Flag(("--resume",), "train.resume", "resume from the newest checkpoint", is_switch=True),
    Flag(
        ("--checkpoint",),
        "train.resume_from",
        "resume from this checkpoint folder, or start from "
        "a model-only one (python -m cosmoflow.import_reference)",
    ),
    Flag(
        ("--evaluate",),
        "train.evaluate_only",
        "evaluate the model once on the validation set and stop (with --checkpoint)",
        is_switch=True,
    ),
    Flag(
        ("--amp",),
        "runtime.amp",
        "mixed precision (fp16 on GPU; bf16 on a CPU with native bf16, else fp32)",
        is_switch=True,
    ),
    Flag(("--xla",), "runtime.xla", "XLA-compile the train step", is_switch=True),
    Flag(("--checkpoint-every",), "train.checkpoint_every", "epochs between checkpoints (0: none)"),
    Flag(
        ("--checkpoint-steps",),
        "train.checkpoint_steps",
        "optimizer steps between checkpoints, mid-epoch included (0: none)",
    ),
    Flag(
        ("--spatial-ranks",),
        "parallel.spatial_ranks",
        "split every sample along depth across groups of this "
        "many consecutive ranks (spatial parallelism); the ranks / K groups do data parallelism",
    ),
    Flag(
        ("--shard-optimizer",),
        "parallel.shard_optimizer",
        "with --spatial-ranks: keep the optimizer's slots "
        "once per spatial group, each variable's on the rank that updates it",
        is_switch=True,
    ),
    Flag(
        ("--deterministic",),
        "runtime.deterministic",
        "op determinism and in-order reading: a resumed run "
        "ends bitwise equal to an uninterrupted one",
        is_switch=True,
    ),
)


# The quality metric, under its MLPerf key: validation MAE.
METRIC_NAME = "eval_error"


class CosmoFlowTask(Task):
    """CosmoFlow: 3D CNN regressing 4 cosmological parameters, MSE loss, validation MAE."""

    name = "cosmoflow"
    metric_name = METRIC_NAME
    config_class = CosmoFlowConfig
    flags = FLAGS

    @classmethod
    def tiny_overrides(cls, cfg) -> dict:
        # Batch 1 on 8 samples (any rank count up to 8), a 2-filter model.
        return {
            **TINY_LOOP,
            "data.batch_size": 1,
            "data.n_train": 8,
            "data.n_valid": 8,
            "model.conv_size": 2,
        }

    @property
    def local_batch_size(self) -> int:
        return self.cfg.data.batch_size

    def shard(self, rank: int, size: int) -> Shards:
        cfg, d = self.cfg, self.cfg.data
        check_global_batch(
            cfg, d.batch_size * size * cfg.train.gradient_accumulation_frequency, d.batch_size, size
        )
        check_divisible(
            d.n_train, size, d.batch_size, "n_train", cfg.train.gradient_accumulation_frequency
        )
        check_divisible(d.n_valid, size, d.batch_size, "n_valid")
        train = list_files(f"{d.data_dir}/train", data.SUFFIXES)
        valid = list_files(f"{d.data_dir}/validation", data.SUFFIXES)
        seed = cfg.train.seed
        return Shards(
            train_files=select_and_shard(train, d.n_train, rank, size, seed, "n_train"),
            valid_files=select_and_shard(valid, d.n_valid, rank, size, seed + 1, "n_valid"),
            n_train=d.n_train,
            n_valid=d.n_valid,
            local_batch_size=d.batch_size,
        )

    def _slab(self):
        """This rank's (index, count) z-slab, None when samples are not split."""
        mesh = self.mesh
        return (mesh.index, mesh.size) if mesh is not None and mesh.is_split else None

    def _read_shape(self) -> tuple:
        """The shape of one sample as this rank keeps it: the whole volume, or its z-slab."""
        shape = tuple(self.cfg.data.sample_shape)
        slab = self._slab()
        return shape if slab is None else (shape[0] // slab[1],) + shape[1:]

    def _staged_slabs(self) -> bool:
        """Staged files hold this rank's slab only (staged_layout)."""
        return self._slab() is not None and bool(
            self.cfg.staging.stage_dir and self.cfg.staging.convert
        )

    def input_specs(self) -> tuple:
        d = self.cfg.data
        return (
            tf.TensorSpec((d.batch_size, *self._read_shape()), tf.int16),
            tf.TensorSpec((d.batch_size, 4), tf.float32),
        )

    def preprocess_batch(self, x, y):
        # int16 counts -> log(1 + x) (or x / mean) in float32, inside the compiled step.
        return data.TRANSFORMS[self.cfg.data.transform](x), y

    def staged_layout(self):
        slab = self._slab()
        if slab is None:
            from common.inputs.staging_layouts import GUNZIP  # a run that stages only

            return GUNZIP
        from cosmoflow.prepare import slab_conversion  # a split run that stages only

        return slab_conversion(*slab, self.cfg.data.sample_shape)

    def input_cache_bytes(self, shards: Shards, local_size: int) -> int:
        # The decoded int16 samples (or slabs) of the shard, train and valid.
        nbytes = (
            (len(shards.train_files) + len(shards.valid_files))
            * int(np.prod(self._read_shape()))
            * 2
        )
        cache = {"true": True, "false": False}.get(self.cfg.staging.cache)
        if cache is None:
            cache = fits_in_memory(nbytes, local_size)
        return nbytes if cache else 0

    def build_inputs(self, shards: Shards, rank: int, local_size: int, start=None):
        cfg, d = self.cfg, self.cfg.data
        cache = self.input_cache_bytes(shards, local_size) > 0
        # The ranks of a spatial group must hold slabs of the same sample at each place of a
        # batch: they read in order, as exact resume does (files still read in parallel).
        in_order = cfg.runtime.deterministic or self._slab() is not None
        # A rank of a spatial group keeps its slab: cut from each whole sample, or staged as one.
        staged_slabs = self._staged_slabs()
        common = dict(
            sample_shape=self._read_shape() if staged_slabs else d.sample_shape,
            slab=None if staged_slabs else self._slab(),
            batch_size=d.batch_size,
            cache=cache,
            parallelism=d.read_parallelism,
            prefetch=d.prefetch,
        )
        # data.compression describes the sources; staged files were inflated (GUNZIP) on the way.
        staged_plain = bool(cfg.staging.stage_dir and cfg.staging.convert)
        compression = "none" if staged_plain else d.compression
        train = data.make_dataset(
            shards.train_files,
            training=True,
            seed=cfg.train.seed + rank,
            compression=data.resolve_compression(compression, shards.train_files),
            start=start or pipeline.Position(),
            deterministic=in_order,
            batches_per_epoch=pipeline.batches_per_epoch(
                len(shards.train_files), d.batch_size, cfg.train.gradient_accumulation_frequency
            ),
            **common,
        )
        valid = data.make_dataset(
            shards.valid_files,
            training=False,
            compression=data.resolve_compression(compression, shards.valid_files),
            **common,
        )
        return train, valid

    def find_bad_file(self, files):
        from cosmoflow.sample_files import find_bad_file  # a failing run only

        shape = self._read_shape() if self._staged_slabs() else self.cfg.data.sample_shape
        return find_bad_file(files, shape, self.cfg.data.transform)

    def build_model(self, bn_group):
        del bn_group  # no batch norm
        return model.from_config(self.cfg, self.mesh)

    def build_losses(self):
        return mean_squared_error

    def build_metrics(self) -> EvalMetric:
        return mean_absolute_error()

    def build_optimizer(self, global_batch_size: int, steps_per_epoch: int):
        o = self.cfg.optimizer
        peak, start = learning_rates(self.cfg, global_batch_size)
        schedule = optimizers.build_schedule(
            "epoch_warmup_step_decay",
            peak_lr=peak,
            init_lr=start,
            warmup_epochs=o.warmup_epochs,
            boundaries=o.decay_boundary_epochs,
            factors=o.decay_factors,
            steps_per_epoch=steps_per_epoch,
        )
        return optimizers.build_optimizer(
            o.name, learning_rate=schedule, momentum=o.momentum
        ), schedule

    @property
    def target(self) -> float:
        return self.cfg.target_mae

    def mlperf_hyperparameters(self, global_batch_size: int) -> dict:
        """What this run does, under the names of the RCP table (rcps_cosmoflow.json)."""
        cfg, o = self.cfg, self.cfg.optimizer
        peak, start = learning_rates(cfg, global_batch_size)
        return {
            "opt_name": o.name,
            "opt_base_learning_rate": peak,
            "opt_learning_rate_warmup_epochs": o.warmup_epochs,
            "opt_learning_rate_warmup_factor": peak / start,
            "opt_learning_rate_decay_boundary_epochs": list(o.decay_boundary_epochs),
            "opt_learning_rate_decay_factor": list(o.decay_factors),
            "dropout": cfg.model.dropout,
            "opt_weight_decay": o.weight_decay,
        }


def learning_rates(cfg: CosmoFlowConfig, global_batch_size: int) -> tuple[float, float]:
    """(LR after warmup, LR at epoch 0) for this run's global batch: at train.global_batch_size,
    base_learning_rate and base / warmup_factor; at another, the LR after warmup scales and the
    warmup start stays (the reference's unscaled base LR), so the warmup factor the log reports is
    their ratio, as the reference logs it (global / base batch; with no warmup epochs, the scaling)."""
    o = cfg.optimizer
    start = o.base_learning_rate / o.warmup_factor
    reference_batch = cfg.train.global_batch_size or global_batch_size
    peak = scale_lr(o.base_learning_rate, global_batch_size, reference_batch, o.scaling)
    return peak, start


def mean_squared_error(y, pred):
    return tf.reduce_mean(tf.square(tf.cast(pred, tf.float32) - y))


def mean_absolute_error() -> EvalMetric:
    """Mean absolute error over all samples and the 4 parameters (lower is better)."""
    return EvalMetric(
        name=METRIC_NAME,
        update=lambda y, pred: tf.stack(
            [tf.reduce_sum(tf.abs(tf.cast(pred, tf.float32) - y)), tf.cast(tf.size(y), tf.float32)]
        ),
        finalize=lambda sums: float(sums[0] / sums[1]),
        lower_is_better=True,
    )
