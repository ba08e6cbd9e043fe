"""DeepCAM configuration: typed sections loaded from configs/*.yaml."""

import dataclasses
from typing import Literal

from common.config import BaseConfig, TrainLoopConfig, check_at_least
from common.errors import ConfigError

N_CHANNELS = 16  # fields per sample in the public data set
N_CLASSES = 3  # background, tropical cyclone, atmospheric river
# What deepcam/task.py passes every optimizer: optimizer.name may be any that takes them.
OPTIMIZER_HYPERPARAMETERS = ("learning_rate", "beta_1", "beta_2", "epsilon", "weight_decay")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    data_dir: str | None = None  # holds train/, validation/ and stats.h5
    # Samples used; 0 = every file (training drops the remainder over the ranks, as the reference).
    n_train: int = 0
    n_valid: int = 0
    local_batch_size: int = 2
    height: int = 768
    width: int = 1152
    channels: tuple[int, ...] = tuple(range(N_CHANNELS))  # which of the 16 fields feed the model
    readers: int = 4  # files read concurrently per rank (rounded up to whole batches)
    prefetch: int = 2


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    output_stride: Literal[16] = 16
    # Ranks whose batch-norm statistics are averaged together (reference flag).
    batchnorm_group_size: int = 1
    # Scales every channel count (1.0: the reference, 56,454,720 parameters); smaller for CPUs.
    width: float = 1.0
    middle_blocks: int = 16  # Xception middle-flow blocks (16 in the reference)


@dataclasses.dataclass(frozen=True)
class LRScheduleConfig:
    type: Literal["multistep", "cosine_annealing"] = "multistep"
    milestones: tuple[int, ...] = ()  # in optimizer steps after warmup
    decay_rate: float = 0.1
    t_max: int = 1000  # cosine period in steps
    eta_min: float = 0.0


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    name: str = "LAMB"  # any optimizer taking OPTIMIZER_HYPERPARAMETERS
    start_lr: float = 0.0055
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-6
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0  # LAMB's global gradient-norm clip
    lr_warmup_steps: int = 400
    lr_warmup_factor: float = 1.0
    lr_schedule: LRScheduleConfig = LRScheduleConfig(milestones=(800,))


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeepCAMConfig(BaseConfig):
    output_dir: str = "runs/deepcam"
    target_iou: float = 0.82
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    train: TrainLoopConfig = TrainLoopConfig(n_epochs=64, seed=333)

    def validate(self) -> None:
        super().validate()
        d, m, o = self.data, self.model, self.optimizer
        from common import optimizers  # here, not at the top: it imports TensorFlow

        optimizers.check_name(o.name, OPTIMIZER_HYPERPARAMETERS)
        if not d.data_dir:
            raise ConfigError("config key 'data.data_dir' is not set (use --data_dir_prefix)")
        bad = [c for c in d.channels if not 0 <= c < N_CHANNELS]
        if bad or not d.channels or len(set(d.channels)) != len(d.channels):
            raise ConfigError(
                f"config key 'data.channels' must list distinct fields in 0..{N_CHANNELS - 1}, "
                f"got {list(d.channels)}"
            )
        if d.height % m.output_stride or d.width % m.output_stride:
            raise ConfigError(
                f"config keys 'data.height'/'data.width' ({d.height}x{d.width}) must be "
                f"multiples of the output stride {m.output_stride}"
            )
        check_height_split(self)
        if not 0 < m.width <= 4:
            raise ConfigError(f"config key 'model.width' must be in (0, 4], got {m.width}")
        check_at_least(
            ("data.n_train", d.n_train, 0),
            ("data.n_valid", d.n_valid, 0),
            ("data.local_batch_size", d.local_batch_size, 1),
            ("data.readers", d.readers, 1),
            ("model.batchnorm_group_size", m.batchnorm_group_size, 1),
            ("optimizer.lr_schedule.t_max", o.lr_schedule.t_max, 1),
            ("optimizer.lr_warmup_factor", o.lr_warmup_factor, 1.0),
            ("train.seed", self.train.seed, 1),  # an MLPerf rule
        )
        if len(o.betas) != 2 or not all(0.0 <= b < 1.0 for b in o.betas):
            raise ConfigError(
                f"config key 'optimizer.betas' must be two values in [0, 1), got {list(o.betas)}"
            )
        if self.runtime.xla and m.batchnorm_group_size > 1:  # refused before the first step fails
            raise ConfigError(
                "config keys 'runtime.xla' and 'model.batchnorm_group_size' > 1 cannot go together "
                "(Horovod compiles no group batch norm allreduce); drop --xla or use groups of 1"
            )


def check_height_split(cfg: DeepCAMConfig) -> None:
    """ConfigError unless parallel.spatial_ranks K cuts the height into slabs each stride of the
    network halves evenly (H / K a multiple of the output stride)."""
    k, d, stride = cfg.parallel.spatial_ranks, cfg.data, cfg.model.output_stride
    if k == 1:
        return
    key = f"config key 'parallel.spatial_ranks'={k}"
    if d.height % (k * stride):
        raise ConfigError(
            f"{key}: the height {d.height} must be a multiple of {k} x the output stride {stride} "
            f"(each rank's rows halve evenly down to stride {stride})"
        )
    if cfg.staging.stage_dir:
        raise ConfigError(
            f"{key}: staging is not implemented for a height split (the ranks of a group would "
            f"write the same staged file); leave staging.stage_dir unset"
        )
