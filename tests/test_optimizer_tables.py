"""The name tables of optimizers (common/optimizers.py) and LR schedules (common/optimizers.py):
each name builds its class with the hyperparameters it takes, an unknown name is refused naming
the known ones, and the configs and tasks choose from them."""

import pytest
import tf_keras

from common.config import load_config
from common.errors import ConfigError
from common.optimizers import (
    LAMB,
    OPTIMIZERS,
    SCHEDULES,
    AdamL2,
    EpochWarmupStepDecay,
    StepWarmupSchedule,
    build_optimizer,
    build_schedule,
    check_name,
)
from cosmoflow.config import CosmoFlowConfig
from cosmoflow.task import CosmoFlowTask
from deepcam.config import DeepCAMConfig
from deepcam.task import DeepCAMTask

EVERY_HYPERPARAMETER = dict(
    learning_rate=0.1,
    momentum=0.7,
    beta_1=0.8,
    beta_2=0.9,
    epsilon=1e-5,
    weight_decay=0.01,
    max_grad_norm=2.0,
)
# Where the shipped optimizers keep the configs' weight decay: spelled out here, not read from the table.
WEIGHT_DECAY = {
    "Adam": (AdamL2, "l2"),
    "AdamW": (tf_keras.optimizers.AdamW, "weight_decay"),
    "LAMB": (LAMB, "weight_decay_rate"),
}


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_each_name_builds_its_class_with_the_hyperparameters_it_takes(name):
    cls, keywords = OPTIMIZERS[name]
    optimizer = build_optimizer(name, **EVERY_HYPERPARAMETER)
    assert type(optimizer) is cls
    for hyperparameter, keyword in keywords.items():  # each arrived, under the class's own name
        value = getattr(optimizer, keyword)
        assert float(value) == pytest.approx(EVERY_HYPERPARAMETER[hyperparameter]), hyperparameter


def test_the_shipped_optimizers_are_the_reference_classes_with_their_decay():
    assert OPTIMIZERS["SGD"][0] is tf_keras.optimizers.SGD and "momentum" in OPTIMIZERS["SGD"][1]
    for name, (cls, keyword) in WEIGHT_DECAY.items():
        assert OPTIMIZERS[name][0] is cls
        assert getattr(build_optimizer(name, **EVERY_HYPERPARAMETER), keyword) == pytest.approx(
            0.01
        ), name


def test_an_unknown_optimizer_is_refused_naming_the_known_ones():
    with pytest.raises(
        ConfigError, match="unknown optimizer 'Adafactor'; known: SGD, Adam, AdamW, LAMB"
    ):
        build_optimizer("Adafactor", learning_rate=0.1)


def test_check_name_accepts_the_optimizers_that_take_every_hyperparameter_named():
    check_name("SGD", ("learning_rate", "momentum"))
    check_name("LAMB", ("beta_1", "weight_decay", "max_grad_norm"))
    with pytest.raises(ConfigError, match="choose one of LAMB "):
        check_name("AdamW", ("max_grad_norm",))


def _config(cls, **overrides):
    return load_config(cls, None, {"data.data_dir": "unused", **overrides})


@pytest.mark.parametrize("name", ["Adam", "AdamW", "LAMB"])
def test_deepcam_builds_the_optimizer_its_config_names(name):
    cfg = _config(DeepCAMConfig, **{"optimizer.name": name})
    optimizer, schedule = DeepCAMTask(cfg).build_optimizer(1, 1)
    cls, decay = WEIGHT_DECAY[name]
    assert type(optimizer) is cls and isinstance(schedule, StepWarmupSchedule)
    assert getattr(optimizer, decay) == pytest.approx(cfg.optimizer.weight_decay)
    assert optimizer.epsilon == pytest.approx(cfg.optimizer.eps)


def test_cosmoflow_builds_sgd_with_its_momentum_and_epoch_schedule():
    cfg = _config(CosmoFlowConfig)
    optimizer, schedule = CosmoFlowTask(cfg).build_optimizer(cfg.train.global_batch_size, 10)
    assert type(optimizer) is tf_keras.optimizers.SGD and isinstance(schedule, EpochWarmupStepDecay)
    assert optimizer.momentum == pytest.approx(cfg.optimizer.momentum)


@pytest.mark.parametrize(
    "cls, name, usable",
    [
        (DeepCAMConfig, "SGD", "Adam, AdamW, LAMB"),
        (DeepCAMConfig, "Adafactor", "Adam, AdamW, LAMB"),
        (CosmoFlowConfig, "Adam", "SGD"),
    ],
)
def test_a_config_refuses_an_optimizer_not_taking_its_hyperparameters(cls, name, usable):
    with pytest.raises(ConfigError, match=f"'optimizer.name'='{name}': choose one of {usable} "):
        _config(cls, **{"optimizer.name": name})


SCHEDULE_ARGUMENTS = {
    "epoch_warmup_step_decay": (
        EpochWarmupStepDecay,
        dict(
            peak_lr=0.1,
            init_lr=0.01,
            warmup_epochs=1,
            boundaries=[2],
            factors=[0.5],
            steps_per_epoch=4,
        ),
    ),
    "step_warmup": (
        StepWarmupSchedule,
        dict(kind="multistep", start_lr=0.1, warmup_steps=2, milestones=[3]),
    ),
}


def test_every_schedule_of_the_table_is_checked_here():
    assert set(SCHEDULES) == set(SCHEDULE_ARGUMENTS)


@pytest.mark.parametrize("name", SCHEDULE_ARGUMENTS)
def test_each_schedule_name_builds_its_class(name):
    cls, arguments = SCHEDULE_ARGUMENTS[name]
    schedule = build_schedule(name, **arguments)
    assert type(schedule) is cls
    assert schedule.at_step(100) == pytest.approx(
        0.05 if name == "epoch_warmup_step_decay" else 0.01
    )


def test_an_unknown_schedule_is_refused_naming_the_known_ones():
    with pytest.raises(
        ConfigError, match="unknown LR schedule 'poly'; known: epoch_warmup_step_decay, step_warmup"
    ):
        build_schedule("poly", start_lr=0.1)
