"""The Trainer inside pytest's process, on a Distribution of one rank (tests/fake_distribution.py):
the run modes, the events in order, a resume, and no line printed by anything but a listener."""

import pytest

from common.config import load_config
from common.reporting.console import Console
from common.reporting.events import Events, Listener
from common.run.trainer import Trainer
from common.runtime import configure
from cosmoflow.task import CosmoFlowTask
from tests.fake_distribution import OneRankDistribution

# 64 training samples of 8 a step: 8 steps an epoch, evaluated every epoch on 16.
SMALL = {
    "data.n_train": 64,
    "data.n_valid": 16,
    "train.n_epochs": 2,
    "train.checkpoint_every": 1,
    "train.stop_at_target": False,
}


class Recorder(Listener):
    """Every event's name and arguments, in order."""

    def __init__(self):
        self.events = []

    def names(self, prefix="on_"):
        return [e[0] for e in self.events if e[0].startswith(prefix)]


def _recording(name):
    def record(self, *args):
        self.events.append((name, *args))

    return record


for _event in [name for name in vars(Listener) if name.startswith("on_")]:
    setattr(Recorder, _event, _recording(_event))


def _trainer(cosmo_data, tiny_config, run_dir, listeners, **overrides):
    cfg = load_config(
        CosmoFlowTask.config_class,
        tiny_config,
        {"data.data_dir": str(cosmo_data), **SMALL, **overrides},
    )
    dist = OneRankDistribution()
    return Trainer(
        CosmoFlowTask(cfg), dist, Events(listeners), run_dir, configure(cfg.runtime, dist)
    ), dist


def test_a_run_emits_its_events_in_order_prints_nothing_and_resumes(
    cosmo_data, tiny_config, tmp_path, capsys
):
    recorder = Recorder()
    trainer, dist = _trainer(cosmo_data, tiny_config, tmp_path / "run", [recorder])
    result = trainer.run()
    assert capsys.readouterr().out == ""  # the trainer says everything through events
    assert (
        result.status in ("success", "aborted") and result.epochs == 2 and len(result.history) == 2
    )
    assert dist.collectives > 0 and trainer.global_step == 16 and trainer.started
    names = [n for n in recorder.names() if n != "on_step"]
    assert names == [
        "on_init_start",
        "on_runtime_configured",
        "on_init_stop",
        "on_caches_cleared",
        "on_run_start",
        "on_epoch_start",
        "on_epoch_stop",
        "on_eval_start",
        "on_eval_stop",
        "on_epoch_start",
        "on_epoch_stop",
        "on_eval_start",
        "on_eval_stop",
        "on_run_stop",
    ]
    steps = [e[1] for e in recorder.events if e[0] == "on_step"]
    assert [(s.epoch, s.step, s.global_step) for s in steps] == [
        (1 + i // 8, 1 + i % 8, 1 + i) for i in range(16)
    ]
    info = recorder.events[2][1]
    assert (info.steps_per_epoch, info.global_batch_size, info.model_name) == (8, 8, "cosmoflow")
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == [
        "step-0000000008",
        "step-0000000016",
    ]

    # A third epoch from the checkpoint of the second: only epoch 3 runs, from step 17.
    again = Recorder()
    resumed, _ = _trainer(
        cosmo_data,
        tiny_config,
        tmp_path / "run",
        [again],
        **{"train.n_epochs": 3, "train.resume": True},
    )
    result = resumed.run()
    assert result.resumed_from["epoch"] == 2 and result.resumed_from["global_step"] == 16
    assert [e[1] for e in again.events if e[0] == "on_epoch_start"] == [3]
    assert [e[1].global_step for e in again.events if e[0] == "on_step"] == list(range(17, 25))
    assert result.epochs == 3 and capsys.readouterr().out == ""


def test_the_console_listener_prints_what_the_trainer_does_not(
    cosmo_data, tiny_config, tmp_path, capsys
):
    # The negative control of the test above: the same run with rank 0's console does print.
    trainer, _ = _trainer(
        cosmo_data, tiny_config, tmp_path / "run", [Console()], **{"train.n_epochs": 1}
    )
    trainer.run()
    out = capsys.readouterr().out
    assert "[init] 1 rank in-process (tests.fake_distribution); runtime" in out
    assert "[init] model cosmoflow:" in out and "[epoch   1] train_loss" in out
    assert "[run] " in out and "after 1 epoch(s)" in out


def test_evaluate_and_benchmark_are_modes_of_their_own(cosmo_data, tiny_config, tmp_path):
    recorder = Recorder()
    trainer, _ = _trainer(
        cosmo_data,
        tiny_config,
        tmp_path / "bench",
        [recorder],
        **{"train.benchmark_steps": 3, "train.benchmark_warmup_steps": 1},
    )
    result = trainer.run()
    assert result.status == "benchmarked" and result.throughput["steps"] == 3
    assert result.throughput["samples_per_s"] > 0
    assert "on_run_start" not in recorder.names() and len(recorder.names("on_step")) == 3

    recorder = Recorder()
    trainer, _ = _trainer(
        cosmo_data, tiny_config, tmp_path / "eval", [recorder], **{"train.evaluate_only": True}
    )
    result = trainer.run()
    assert result.status == "evaluated" and 0 < result.metric < 10
    assert recorder.names() == [
        "on_init_start",
        "on_runtime_configured",
        "on_init_stop",
    ]  # no run: no run events


def test_a_resume_from_another_runs_checkpoint_is_refused(cosmo_data, tiny_config, tmp_path):
    from common.errors import InputError

    trainer, _ = _trainer(cosmo_data, tiny_config, tmp_path / "run", [], **{"train.n_epochs": 1})
    trainer.run()
    # 32 samples make 4 steps an epoch, the checkpoint has 8.
    other, _ = _trainer(
        cosmo_data,
        tiny_config,
        tmp_path / "run",
        [],
        **{"data.n_train": 32, "train.resume": True, "train.n_epochs": 2},
    )
    with pytest.raises(InputError, match="written with 8 steps per epoch, this run has 4"):
        other.run()
