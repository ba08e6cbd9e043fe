"""CosmoFlow configuration: typed sections loaded from configs/*.yaml."""

import dataclasses
from typing import Literal

from common.config import BaseConfig, TrainLoopConfig, check_at_least
from common.errors import ConfigError

# What cosmoflow/task.py passes every optimizer: optimizer.name may be any that takes them.
OPTIMIZER_HYPERPARAMETERS = ("learning_rate", "momentum")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    data_dir: str | None = None  # holds train/ and validation/
    n_train: int = 524288
    n_valid: int = 65536
    batch_size: int = 8  # per rank
    sample_shape: tuple[int, ...] = (128, 128, 128, 4)
    compression: Literal["auto", "GZIP", "none"] = "auto"
    # 'log': x -> log(1 + x) (v1.0+); 'mean': x -> x / mean(x) (v0.7 data).
    transform: Literal["log", "mean"] = "log"
    read_parallelism: int = 4  # files read concurrently per rank
    prefetch: int = 4


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    conv_size: int = 32  # filters of the first conv; doubles per layer
    kernel_size: int = 3
    n_conv_layers: int = 5
    fc1_size: int = 128
    fc2_size: int = 64
    dropout: float = 0.5  # logged as `dropout` (an RCP hyperparameter)
    # Filters of the deeper layers capped at this (None: conv_size * 2^i, the reference).
    max_channels: int | None = None


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """SGD with the reference's epoch schedule, named as in the MLPerf log. At a global batch other
    than train.global_batch_size, the LR after warmup scales by `scaling` (the reference's rule)."""

    name: str = "SGD"  # any optimizer taking OPTIMIZER_HYPERPARAMETERS
    momentum: float = 0.9
    base_learning_rate: float = 0.001  # opt_base_learning_rate: the LR after warmup
    scaling: Literal["linear", "sqrt", "none"] = "linear"
    warmup_epochs: int = 4  # opt_learning_rate_warmup_epochs
    warmup_factor: float = 1.0  # opt_learning_rate_warmup_factor: warmup starts at base / factor
    # The LR is base x factor from the 0-based epoch after each boundary on (`boundary < epoch`).
    decay_boundary_epochs: tuple[int, ...] = (32, 64)
    decay_factors: tuple[float, ...] = (0.25, 0.125)
    weight_decay: float = 0.0  # opt_weight_decay: L2 on the two hidden Dense layers


@dataclasses.dataclass(frozen=True, kw_only=True)
class CosmoFlowConfig(BaseConfig):
    output_dir: str = "runs/cosmoflow"
    target_mae: float = 0.124
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    train: TrainLoopConfig = TrainLoopConfig(n_epochs=128, global_batch_size=64)

    def validate(self) -> None:
        super().validate()
        d, m = self.data, self.model
        if not d.data_dir:
            raise ConfigError("config key 'data.data_dir' is not set (use --data-dir)")
        if len(d.sample_shape) != 4:
            raise ConfigError(
                f"config key 'data.sample_shape' must have 4 entries (N, N, N, channels), "
                f"got {list(d.sample_shape)}"
            )
        edge = d.sample_shape[0]
        if edge % (2**m.n_conv_layers):
            raise ConfigError(
                f"config key 'model.n_conv_layers'={m.n_conv_layers}: the sample edge {edge} "
                f"is not divisible by 2^{m.n_conv_layers} (one 2x pooling per layer)"
            )
        check_spatial_split(self)
        if not 0.0 <= m.dropout < 1.0:
            raise ConfigError(f"config key 'model.dropout' must be in [0, 1), got {m.dropout}")
        o = self.optimizer
        from common import optimizers  # here, not at the top: it imports TensorFlow

        optimizers.check_name(o.name, OPTIMIZER_HYPERPARAMETERS)
        if len(o.decay_boundary_epochs) != len(o.decay_factors):
            raise ConfigError(
                f"config keys 'optimizer.decay_boundary_epochs' ({len(o.decay_boundary_epochs)} "
                f"values) and 'optimizer.decay_factors' ({len(o.decay_factors)}) differ in length"
            )
        if list(o.decay_boundary_epochs) != sorted(set(o.decay_boundary_epochs)):
            raise ConfigError(
                f"config key 'optimizer.decay_boundary_epochs' must increase, "
                f"got {list(o.decay_boundary_epochs)}"
            )
        if o.warmup_factor <= 0 or o.base_learning_rate <= 0:
            raise ConfigError(
                "config keys 'optimizer.base_learning_rate' and 'optimizer.warmup_factor' "
                "must be positive"
            )
        check_at_least(
            ("data.batch_size", d.batch_size, 1),
            ("data.n_train", d.n_train, 1),
            ("data.n_valid", d.n_valid, 1),
        )


def check_spatial_split(cfg: CosmoFlowConfig) -> None:
    """parallel.spatial_ranks K must cut the depth into slabs the first layer can work on."""
    k, depth, m = cfg.parallel.spatial_ranks, cfg.data.sample_shape[0], cfg.model
    if k == 1:
        return
    key = f"config key 'parallel.spatial_ranks'={k}"
    if depth % k:
        raise ConfigError(f"{key} does not divide the sample depth {depth}")
    halo = m.kernel_size // 2
    least = max(2, halo)  # a whole 2x pooling window, and the neighbours' halo planes
    if depth // k < least:
        raise ConfigError(
            f"{key} leaves {depth // k} plane(s) per rank of the depth {depth}; the first layer "
            f"needs at least {least} (a 2x pool window, a halo of {halo}): at most "
            f"{depth // least} spatial ranks for this sample"
        )
    if m.kernel_size % 2 == 0:
        raise ConfigError(
            f"{key} needs an odd 'model.kernel_size' (a halo of kernel // 2 each side), "
            f"got {m.kernel_size}"
        )
    if cfg.data.transform != "log":
        raise ConfigError(
            f"{key}: data.transform='{cfg.data.transform}' divides by the whole sample's mean, "
            f"which a slab does not see; use 'log' (v1.0+ data)"
        )
    if cfg.staging.stage_dir and not cfg.staging.convert:
        raise ConfigError(
            f"{key}: staging writes each rank's slab of a sample (staging.convert: true); a plain "
            f"copy would have the ranks of a group write the same staged file"
        )
