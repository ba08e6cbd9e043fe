"""DeepCAM as a Task for the common trainer: single-replica view of training."""

import tensorflow as tf

from common import optimizers
from common.config import check_global_batch, peek
from common.errors import InputError
from common.inputs import pipeline
from common.inputs.pipeline import fits_in_memory, list_files, select_and_shard
from common.optimizers import StepWarmupSchedule
from common.task import TINY_LOOP, EvalMetric, Flag, Shards, Task
from deepcam import data, model
from deepcam.config import N_CLASSES, DeepCAMConfig
from deepcam.layout import SUFFIXES

# Pixel frequencies of background, cyclone, river in the real training set;
# the loss weighs class c by f_c^-0.125, as the reference.
CLASS_FREQUENCIES = (0.986267818390377, 0.0004578708870701058, 0.01327431072255291)
CLASS_WEIGHTS = tuple(f**-0.125 for f in CLASS_FREQUENCIES)


def _words(value: str) -> list[str]:
    """'0 1 2' or '0,1,2' -> ['0', '1', '2'] (the reference passes lists space-separated)."""
    return value.replace(",", " ").split()


def parse_lr_schedule(value: str) -> dict:
    """--lr_schedule type=multistep,milestones=800 1600,decay_rate=0.1 -> config overrides."""
    known = {"type", "milestones", "decay_rate", "t_max", "eta_min"}
    out = {}
    for item in filter(None, (p.strip() for p in value.split(","))):
        key, sep, val = item.partition("=")
        key = key.strip()
        if not sep or key not in known:
            raise InputError(
                f"--lr_schedule: cannot read '{item}' (keys: {', '.join(sorted(known))}; "
                f"e.g. type=multistep,milestones=800 1600,decay_rate=0.1)"
            )
        val = val.strip().strip("\"'")
        out[f"optimizer.lr_schedule.{key}"] = _words(val) if key == "milestones" else val
    return out


FLAGS = (
    Flag(("--data_dir_prefix",), "data.data_dir", "directory with train/, validation/, stats.h5"),
    Flag(("--output_dir",), "output_dir", "where run folders go"),
    Flag(("--run_tag",), "run_tag", "this run's folder inside --output_dir"),
    Flag(("--local_batch_size",), "data.local_batch_size", "samples per rank and step"),
    Flag(("--max_epochs",), "train.n_epochs", "maximum epochs"),
    Flag(("--optimizer",), "optimizer.name", "Adam, AdamW or LAMB"),
    Flag(("--start_lr",), "optimizer.start_lr", "learning rate after warmup"),
    Flag(("--weight_decay",), "optimizer.weight_decay", "weight decay"),
    Flag(
        ("--optimizer_betas",),
        "optimizer.betas",
        "beta1 beta2",
        parse=lambda v: {"optimizer.betas": _words(v)},
    ),
    Flag(
        ("--lr_schedule",),
        "optimizer.lr_schedule",
        "type=multistep,milestones=...,decay_rate=... "
        "or type=cosine_annealing,t_max=...,eta_min=...",
        parse=parse_lr_schedule,
    ),
    Flag(("--lr_warmup_steps",), "optimizer.lr_warmup_steps", "linear warmup steps"),
    Flag(("--lr_warmup_factor",), "optimizer.lr_warmup_factor", "warmup ends at start_lr x factor"),
    Flag(
        ("--batchnorm_group_size",),
        "model.batchnorm_group_size",
        "ranks sharing batch-norm statistics",
    ),
    Flag(
        ("--gradient_accumulation_frequency",),
        "train.gradient_accumulation_frequency",
        "local batches per optimizer step",
    ),
    Flag(
        ("--channels",),
        "data.channels",
        "input fields, e.g. '0 1 2 10' (default: all 16)",
        parse=lambda v: {"data.channels": _words(v)},
    ),
    Flag(("--seed",), "train.seed", "random seed (shared by all ranks)"),
    Flag(("--target_iou",), "target_iou", "stop when validation IoU reaches this"),
    Flag(
        ("--save_frequency",),
        "train.checkpoint_every",
        "epochs between checkpoints (0: none); the reference counts steps",
    ),
    Flag(
        ("--checkpoint_steps",),
        "train.checkpoint_steps",
        "optimizer steps between checkpoints, mid-epoch included (0: none)",
    ),
    Flag(
        ("--deterministic",),
        "runtime.deterministic",
        "op determinism and in-order reading: a resumed run "
        "ends bitwise equal to an uninterrupted one",
        is_switch=True,
    ),
    Flag(
        ("--checkpoint",),
        "train.resume_from",
        "resume from this checkpoint folder, or start from "
        "a model-only one (python -m deepcam.import_reference)",
    ),
    Flag(
        ("--evaluate",),
        "train.evaluate_only",
        "evaluate the model once on the validation set and stop (with --checkpoint)",
        is_switch=True,
    ),
    Flag(("--stage_dir",), "staging.stage_dir", "node-local directory to stage the data into"),
    Flag(
        ("--stage_verify",),
        "staging.verify",
        "re-stage a file whose SHA-256 changed even under the "
        "same size and mtime (reads every source on every run)",
        is_switch=True,
    ),
    Flag(
        ("--amp",),
        "runtime.amp",
        "mixed precision (fp16 on GPU; bf16 on a CPU with native bf16, else fp32)",
        is_switch=True,
    ),
    Flag(("--xla",), "runtime.xla", "XLA-compile forward and backward", is_switch=True),
    Flag(("--resume",), "train.resume", "resume from the newest checkpoint", is_switch=True),
    Flag(
        ("--spatial_ranks",),
        "parallel.spatial_ranks",
        "split every sample along its height across groups of "
        "this many consecutive ranks (spatial parallelism); the ranks / K groups do data parallelism",
    ),
    Flag(
        ("--shard_optimizer",),
        "parallel.shard_optimizer",
        "with --spatial_ranks: keep the optimizer's slots "
        "once per spatial group, each variable's on the rank that updates it",
        is_switch=True,
    ),
)


# The quality metric, under its MLPerf key: validation IoU.
METRIC_NAME = "eval_accuracy"


class DeepCAMTask(Task):
    """DeepCAM: DeepLabv3+ segmentation of climate fields, weighted cross-entropy, validation IoU."""

    name = "deepcam"
    metric_name = METRIC_NAME
    config_class = DeepCAMConfig
    flags = FLAGS

    def __init__(self, cfg, mesh=None):
        super().__init__(cfg, mesh)  # a split mesh cuts every sample's height (deepcam.model)
        self._normalization = (
            None  # (shift, scale) per channel, read from stats.h5 when first traced
        )

    @classmethod
    def tiny_overrides(cls, cfg) -> dict:
        # Batch 1 on 8 samples, a 1/16-width model with one middle block, no warmup.
        return {
            **TINY_LOOP,
            "data.local_batch_size": 1,
            "data.n_train": 8,
            "data.n_valid": 4,
            "model.width": 0.0625,
            "model.middle_blocks": 1,
            "optimizer.lr_warmup_steps": 0,
        }

    @property
    def local_batch_size(self) -> int:
        return self.cfg.data.local_batch_size

    def shard(self, rank: int, size: int) -> Shards:
        """Training: all files (data.n_train: 0) rounded down to a multiple of the ranks, as the
        reference's sampler drops the remainder; the full count is logged as train_samples.
        Validation: every file once, the first ranks taking one more when it does not divide."""
        cfg, d = self.cfg, self.cfg.data
        accumulation = cfg.train.gradient_accumulation_frequency
        check_global_batch(cfg, d.local_batch_size * size * accumulation, d.local_batch_size, size)
        train = list_files(f"{d.data_dir}/train", SUFFIXES)
        valid = list_files(f"{d.data_dir}/validation", SUFFIXES)
        if d.n_train and d.n_train % size:
            raise InputError(
                f"data.n_train={d.n_train} is not divisible by the {size} ranks; "
                f"use a multiple of {size} (or 0: all files)"
            )
        train_set = d.n_train or len(train)
        n_train = train_set // size * size
        per_step = size * d.local_batch_size * accumulation
        if n_train < per_step:
            raise InputError(
                f"data.n_train={n_train} is smaller than one global batch ({per_step} samples: "
                f"{size} ranks x local batch {d.local_batch_size} x accumulation {accumulation})"
            )
        n_valid = d.n_valid or len(valid)
        # Read with the file lists, before the steps are traced (preprocess_batch uses it): an
        # InputError raised while tracing would reach the user inside TensorFlow's trace.
        self.normalization()
        seed = cfg.train.seed
        train_files = select_and_shard(train, n_train, rank, size, seed, "data.n_train")
        # A config whose sizes are not the data's ends here, not after the model's warm-up.
        data.check_shapes(train_files[0], d.channels, d.height, d.width)
        return Shards(
            train_files=train_files,
            valid_files=select_and_shard(
                valid, n_valid, rank, size, seed + 1, "data.n_valid", even=False
            ),
            n_train=n_train,
            n_valid=n_valid,
            local_batch_size=d.local_batch_size,
            train_set_size=train_set,
        )

    @property
    def _split(self):
        """The split mesh, None when each rank holds whole samples."""
        return self.mesh if self.mesh is not None and self.mesh.is_split else None

    def _rows(self) -> int:
        """Rows of a sample this rank holds: the height, or its slab's."""
        return self.cfg.data.height // (self._split.size if self._split else 1)

    def input_specs(self) -> tuple:
        d = self.cfg.data
        return (
            tf.TensorSpec((d.local_batch_size, self._rows(), d.width, len(d.channels)), tf.float32),
            tf.TensorSpec((d.local_batch_size, self._rows(), d.width), tf.uint8),
        )

    def preprocess_batch(self, x, y):
        # Fields as stored -> (x - min) / (max - min); uint8 labels -> int32 classes.
        shift, scale = self.normalization()
        return data.normalize(x, shift, scale), tf.cast(y, tf.int32)

    def normalization(self):
        """(shift, scale) per selected channel, from DATA/stats.h5 (read once)."""
        if self._normalization is None:
            d = self.cfg.data
            self._normalization = data.load_normalization(d.data_dir, d.channels)
        return self._normalization

    def input_cache_bytes(self, shards: Shards, local_size: int) -> int:
        # What a rank reads and caches of each sample: its rows.
        d = self.cfg.data
        nbytes = (len(shards.train_files) + len(shards.valid_files)) * data.raw_sample_bytes(
            len(d.channels), self._rows(), d.width
        )
        cache = {"true": True, "false": False}.get(self.cfg.staging.cache)
        if cache is None:
            cache = fits_in_memory(nbytes, local_size)
        return nbytes if cache else 0

    def build_inputs(self, shards: Shards, rank: int, local_size: int, start=None):
        cfg, d = self.cfg, self.cfg.data
        split = self._split
        cache = self.input_cache_bytes(shards, local_size) > 0
        # The ranks of a height split read their rows of each sample; they must hold rows of the same
        # sample at each place of a batch, so they read in order (as exact resume does).
        common = dict(
            channels=d.channels,
            height=d.height,
            width=d.width,
            batch_size=d.local_batch_size,
            readers=d.readers,
            prefetch=d.prefetch,
            cache=cache,
            slab=(split.index, split.size) if split else None,
        )
        train = data.make_dataset(
            shards.train_files,
            training=True,
            seed=cfg.train.seed + rank,
            start=start or pipeline.Position(),
            deterministic=cfg.runtime.deterministic or split is not None,
            batches_per_epoch=pipeline.batches_per_epoch(
                len(shards.train_files),
                d.local_batch_size,
                cfg.train.gradient_accumulation_frequency,
            ),
            **common,
        )
        valid = data.make_dataset(shards.valid_files, training=False, **common)
        return train, valid

    def staged_layout(self):
        from deepcam.sample_files import raw_layout  # a run that stages only

        d = self.cfg.data
        return raw_layout(d.channels, d.height, d.width)

    def find_bad_file(self, files):
        from deepcam.sample_files import find_bad_file  # a failing run only

        d = self.cfg.data
        return find_bad_file(files, d.channels, d.height, d.width)

    @property
    def batchnorm_group_size(self) -> int:
        return self.cfg.model.batchnorm_group_size

    @classmethod
    def requested_batchnorm_group_size(cls, config_path, overrides: dict) -> int:
        # Without a config file the job's size picks a closed config: all have batchnorm_group_size 1.
        # A height split's batch norm sums over its spatial group as well (the trainer's K x group size):
        # its ~150 sequential allreduces a step wait on Horovod's cycle like a batch-norm group's.
        group = peek(cls.config_class, config_path, overrides, "model.batchnorm_group_size") or 1
        return group * (
            peek(cls.config_class, config_path, overrides, "parallel.spatial_ranks") or 1
        )

    def build_model(self, bn_group):
        return model.from_config(self.cfg, bn_group, self._split)

    def build_losses(self):
        if self._split is None:
            return weighted_cross_entropy
        from deepcam.height_split import split_weighted_cross_entropy

        return split_weighted_cross_entropy(self._split)

    def build_metrics(self) -> EvalMetric:
        return mean_iou(self._split)

    def gradient_scales(self, model) -> list:
        # Every layer computes its slab's rows: every gradient is a partial sum over the group.
        if self._split is None:
            return [1.0] * len(model.trainable_variables)
        from common.parallel.spatial_rows import all_partial_scales  # split runs only

        return all_partial_scales(model, self._split)

    def describe_split(self, model) -> str:
        from deepcam.height_split import describe_height_split

        return describe_height_split(model, self._split.size, self.cfg.data.height)

    def build_optimizer(self, global_batch_size: int, steps_per_epoch: int):
        del (
            global_batch_size,
            steps_per_epoch,
        )  # DeepCAM's schedule counts steps; no LR scaling rule
        o = self.cfg.optimizer
        schedule = build_schedule(self.cfg)
        optimizer = optimizers.build_optimizer(
            o.name,
            learning_rate=schedule,
            beta_1=o.betas[0],
            beta_2=o.betas[1],
            epsilon=o.eps,
            weight_decay=o.weight_decay,
            max_grad_norm=o.max_grad_norm,
        )
        return optimizer, schedule

    @property
    def target(self) -> float:
        return self.cfg.target_iou

    def mlperf_hyperparameters(self, global_batch_size: int) -> dict:
        del global_batch_size
        cfg = self.cfg
        o, s = cfg.optimizer, cfg.optimizer.lr_schedule
        keys = {
            "batchnorm_group_size": cfg.model.batchnorm_group_size,
            "gradient_accumulation_frequency": cfg.train.gradient_accumulation_frequency,
            "opt_name": o.name,
            "opt_lr": o.start_lr,
            "opt_betas": list(o.betas),
            "opt_eps": o.eps,
            "opt_weight_decay": o.weight_decay,
        }
        if o.name == "LAMB":
            keys |= {
                "opt_bias_correction": True,
                "opt_grad_averaging": True,
                "opt_max_grad_norm": o.max_grad_norm,
            }
        # The reference logs every key of its --lr_schedule argument, whose
        # decay_rate is there for cosine annealing too (rcps_deepcam.json, batch 128).
        keys |= {"scheduler_type": s.type, "scheduler_decay_rate": s.decay_rate}
        if s.type == "multistep":
            keys |= {"scheduler_milestones": list(s.milestones)}
        else:
            keys |= {"scheduler_t_max": s.t_max, "scheduler_eta_min": s.eta_min}
        keys |= {
            "scheduler_lr_warmup_steps": o.lr_warmup_steps,
            "scheduler_lr_warmup_factor": o.lr_warmup_factor,
        }
        return keys


def build_schedule(cfg: DeepCAMConfig) -> StepWarmupSchedule:
    o, s = cfg.optimizer, cfg.optimizer.lr_schedule
    return optimizers.build_schedule(
        "step_warmup",
        kind=s.type,
        start_lr=o.start_lr,
        warmup_steps=o.lr_warmup_steps,
        warmup_factor=o.lr_warmup_factor,
        milestones=s.milestones,
        decay_rate=s.decay_rate,
        t_max=s.t_max,
        eta_min=s.eta_min,
    )


def weighted_cross_entropy(labels, logits):
    """Mean over pixels of w[label] * CE (the reference's weighted loss, reduction 'none' then mean)."""
    logits = tf.cast(logits, tf.float32)
    ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    return tf.reduce_mean(ce * tf.gather(tf.constant(CLASS_WEIGHTS, tf.float32), labels))


def per_sample_iou(labels, logits, n_classes: int = N_CLASSES, mesh=None):
    """[B] mean over classes of TP / (TP + FP + FN); a class absent from both counts 1.

    With a height-split `mesh`, the counts of each rank's rows are summed over its group first:
    the IoU of the whole sample, the same on every rank of the group."""
    pred = tf.argmax(logits, axis=-1, output_type=tf.int32)
    counts = []
    for c in range(n_classes):
        p, t = tf.equal(pred, c), tf.equal(labels, c)
        tp = tf.reduce_sum(tf.cast(p & t, tf.float32), axis=[1, 2])
        union = tf.reduce_sum(tf.cast(p | t, tf.float32), axis=[1, 2])  # TP + FP + FN
        counts.append(tf.stack([tp, union], axis=1))
    counts = tf.stack(counts, axis=1)  # [B, classes, (TP, union)]; whole numbers, exact in float32
    if mesh is not None:
        counts = mesh.sum(counts, name="iou_counts.allreduce")
    tp, union = counts[..., 0], counts[..., 1]
    return tf.reduce_mean(tf.where(union > 0, tp / tf.maximum(union, 1.0), 1.0), axis=1)


def mean_iou(mesh=None) -> EvalMetric:
    """Validation IoU averaged over samples of all ranks (higher is better)."""

    def iou_sums(labels, logits):
        scores = per_sample_iou(labels, logits, mesh=mesh)
        return tf.stack([tf.reduce_sum(scores), tf.cast(tf.size(scores), tf.float32)])

    return EvalMetric(
        name=METRIC_NAME,
        update=iou_sums,
        finalize=lambda sums: float(sums[0] / sums[1]),
        lower_is_better=False,
    )
