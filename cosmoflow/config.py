"""CosmoFlow configuration: typed sections loaded from configs/*.yaml."""

import dataclasses
from typing import Literal, Mapping, Optional

from common.errors import ConfigError
from common.run_config import MLPerfConfig, RuntimeConfig, StagingConfig, TrainLoopConfig


@dataclasses.dataclass(frozen=True)
class DataConfig:
    data_dir: Optional[str] = None        # holds train/ and validation/
    n_train: int = 524288
    n_valid: int = 65536
    batch_size: int = 8                   # per rank
    sample_shape: tuple[int, ...] = (128, 128, 128, 4)
    compression: Literal["auto", "GZIP", "none"] = "auto"
    # 'log': x -> log(1 + x) (v1.0+); 'mean': x -> x / mean(x) (v0.7 data).
    transform: Literal["log", "mean"] = "log"
    shuffle_buffer: int = 0               # 0: shuffle the whole shard (file order)
    read_parallelism: int = 4             # files read concurrently per rank
    prefetch: int = 4


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    conv_size: int = 32                   # filters of the first conv; doubles per layer
    kernel_size: int = 3
    n_conv_layers: int = 5
    fc1_size: int = 128
    fc2_size: int = 64
    dropout: float = 0.5
    l2: float = 0.0


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    name: Literal["sgd"] = "sgd"
    momentum: float = 0.9
    base_lr: float = 0.001
    base_batch_size: int = 64             # the LR is scaled from this global batch
    scaling: Literal["linear", "sqrt", "none"] = "linear"
    warmup_epochs: int = 4
    warmup_factor: float = 1.0            # initial LR = base_lr * warmup_factor
    decay_schedule: Mapping[int, float] = dataclasses.field(
        default_factory=lambda: {32: 0.25, 64: 0.125})


@dataclasses.dataclass(frozen=True)
class CosmoFlowConfig:
    output_dir: str = "runs/cosmoflow"
    target_mae: float = 0.124
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    train: TrainLoopConfig = TrainLoopConfig(n_epochs=128)
    staging: StagingConfig = StagingConfig()
    runtime: RuntimeConfig = RuntimeConfig()
    mlperf: MLPerfConfig = MLPerfConfig()

    def validate(self) -> None:
        d, m = self.data, self.model
        if not d.data_dir:
            raise ConfigError("config key 'data.data_dir' is not set (use --data-dir)")
        if len(d.sample_shape) != 4:
            raise ConfigError(f"config key 'data.sample_shape' must have 4 entries (N, N, N, channels), "
                              f"got {list(d.sample_shape)}")
        edge = d.sample_shape[0]
        if edge % (2 ** m.n_conv_layers):
            raise ConfigError(f"config key 'model.n_conv_layers'={m.n_conv_layers}: the sample edge {edge} "
                              f"is not divisible by 2^{m.n_conv_layers} (one 2x pooling per layer)")
        if not 0.0 <= m.dropout < 1.0:
            raise ConfigError(f"config key 'model.dropout' must be in [0, 1), got {m.dropout}")
        for key, value in (("data.batch_size", d.batch_size), ("data.n_train", d.n_train),
                           ("data.n_valid", d.n_valid), ("train.n_epochs", self.train.n_epochs)):
            if value <= 0:
                raise ConfigError(f"config key '{key}' must be positive, got {value}")
