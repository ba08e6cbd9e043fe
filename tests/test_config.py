import dataclasses
from pathlib import Path

import pytest
import yaml

from common import benchmarks
from common.config import dump_config, load_config, replace, to_dict
from common.errors import ConfigError
from cosmoflow.config import CosmoFlowConfig
from tests.helpers import REPO


def write(tmp_path, text) -> Path:
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def test_yaml_and_overrides_are_typed(tmp_path):
    p = write(
        tmp_path,
        "data:\n  data_dir: /d\n  batch_size: 4\noptimizer:\n  decay_boundary_epochs: [3]\n"
        "  decay_factors: [0.5]\n",
    )
    cfg = load_config(
        CosmoFlowConfig,
        p,
        {
            "data.n_train": "64",
            "optimizer.base_learning_rate": "1e-3",
            "runtime.amp": "true",
            "data.sample_shape": "16,16,16,4",
            "model.n_conv_layers": "4",
        },
    )
    assert cfg.data.batch_size == 4 and cfg.data.n_train == 64
    assert cfg.optimizer.base_learning_rate == pytest.approx(1e-3)
    assert cfg.runtime.amp is True
    assert cfg.data.sample_shape == (16, 16, 16, 4)
    assert cfg.optimizer.decay_boundary_epochs == (3,) and cfg.optimizer.decay_factors == (0.5,)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.data.batch_size = 3


@pytest.mark.parametrize(
    "text, override, culprit",
    [
        ("data:\n  data_dir: /d\n  batch_sise: 4\n", {}, "data.batch_sise"),
        ("data:\n  data_dir: /d\n", {"model.nope": 1}, "model.nope"),
        ("data:\n  data_dir: /d\nbogus: 1\n", {}, "bogus"),
        ("data:\n  data_dir: /d\n  batch_size: four\n", {}, "data.batch_size"),
        ("data:\n  data_dir: /d\nruntime:\n  amp_dtype: fp8\n", {}, "runtime.amp_dtype"),
        ("data: {}\n", {}, "data.data_dir"),
        (
            "data:\n  data_dir: /d\noptimizer:\n  decay_boundary_epochs: [3, 5]\n  decay_factors: [0.5]\n",
            {},
            "optimizer.decay_boundary_epochs",
        ),
        (
            "data:\n  data_dir: /d\noptimizer:\n  decay_boundary_epochs: [5, 3]\n  decay_factors: [0.5, 0.1]\n",
            {},
            "optimizer.decay_boundary_epochs",
        ),
        ("data:\n  data_dir: /d\n", {"train.stop_check_steps": "0"}, "train.stop_check_steps"),
        ("data:\n  data_dir: /d\n", {"train.checkpoint_steps": "-5"}, "train.checkpoint_steps"),
        ("data:\n  data_dir: /d\n", {"runtime.sigterm_grace_s": "-1"}, "runtime.sigterm_grace_s"),
        (
            "data:\n  data_dir: /d\n",
            {"parallel.shard_optimizer": "true"},
            "parallel.shard_optimizer",
        ),
        (
            "data:\n  data_dir: /d\n",
            {"mlperf.start_barrier_dir": "/s", "mlperf.number_of_instances": "2"},
            "mlperf.start_barrier_dir",
        ),
        (
            "data:\n  data_dir: /d\n",
            {
                "mlperf.start_barrier_dir": "/s",
                "mlperf.number_of_instances": "2",
                "mlperf.instance_id": "2",
            },
            "mlperf.start_barrier_dir",
        ),
    ],
)
def test_bad_keys_and_values_name_the_key(tmp_path, text, override, culprit):
    with pytest.raises(ConfigError, match=culprit.replace(".", r"\.")):
        load_config(CosmoFlowConfig, write(tmp_path, text), override)


def test_unreadable_config_files_name_the_file(tmp_path):
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"data:\n  data_dir: /d\xff\xfe\n")
    with pytest.raises(ConfigError, match=r"binary\.yaml is not UTF-8 text"):
        load_config(CosmoFlowConfig, binary)
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(CosmoFlowConfig, tmp_path)  # a directory


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(CosmoFlowConfig, tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(CosmoFlowConfig, write(tmp_path, "data: [unclosed\n"))


def test_validation_rejects_impossible_model(tmp_path):
    p = write(tmp_path, "data:\n  data_dir: /d\n  sample_shape: [24, 24, 24, 4]\n")
    with pytest.raises(ConfigError, match="n_conv_layers"):
        load_config(CosmoFlowConfig, p)


def test_dump_round_trip(tmp_path):
    cfg = load_config(CosmoFlowConfig, None, {"data.data_dir": "/d", "train.seed": 5})
    dump_config(cfg, tmp_path / "resolved.yaml")
    again = load_config(CosmoFlowConfig, tmp_path / "resolved.yaml")
    assert to_dict(again) == to_dict(cfg)
    assert replace(cfg, {"train.seed": 6}).train.seed == 6


SHIPPED = sorted(REPO.glob("*/configs/*.yaml")) + sorted(
    (REPO / "tests" / "configs").glob("*.yaml")
)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(REPO)))
def test_every_shipped_config_loads(path):
    bench = benchmarks.get(
        path.name.split("_")[0]
    )  # every config belongs to a benchmark of the table
    cfg = load_config(benchmarks.config_class(bench.name), path, {"data.data_dir": "/data"})
    text = path.read_text()
    # Each config opens with the command that runs it.
    assert bench.train_script in text.split("\n\n")[0] or bench.train_script in text[:600]
    assert yaml.safe_load(text)
    assert cfg.output_dir


@pytest.mark.parametrize("name", benchmarks.names())
def test_shipped_configs_exist(name):
    bench = benchmarks.get(name)
    assert REPO / bench.synthetic_config in SHIPPED
    closed = benchmarks.closed_configs(name)
    assert closed and set(closed) <= set(SHIPPED)


def test_a_section_given_in_part_keeps_the_benchmark_s_defaults_for_the_rest(tmp_path):
    # CosmoFlow's own train defaults (128 epochs, global batch 64) differ from TrainLoopConfig's.
    path = tmp_path / "seed.yaml"
    path.write_text("data:\n  data_dir: d\ntrain:\n  seed: 7\n")
    whole = load_config(CosmoFlowConfig, None, {"data.data_dir": "d"})
    for cfg in (load_config(CosmoFlowConfig, path), replace(whole, {"train.seed": "7"})):
        assert cfg.train.seed == 7
        assert (
            (cfg.train.n_epochs, cfg.train.global_batch_size)
            == (
                whole.train.n_epochs,
                whole.train.global_batch_size,
            )
            != (100, None)
        )
