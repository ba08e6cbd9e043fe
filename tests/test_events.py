"""Trainer events: declared once on Listener and dispatched by Events, misspelled listeners
refused, and the MLPerf log's file:line at the trainer's call of `Events`."""

import inspect
import json
import re

import pytest

from common.errors import ExitCode
from common.reporting.events import EpochTrain, Events, Listener, RunInfo, StepInfo
from common.reporting.mlperf_logger import MLPerfLogger
from common.run.termination import NON_FINITE_LOSS, Failure

EVENTS = sorted(n for n in vars(Listener) if n.startswith("on_"))


def _recorder(calls):
    """A listener of every event, recording (event, arguments) in `calls`."""

    def method(name):
        return lambda self, *args: calls.append((name, args))

    return type("Recorder", (Listener,), {name: method(name) for name in EVENTS})()


def test_every_event_reaches_every_listener_in_order_with_the_declared_defaults():
    first, second = [], []
    events = Events([_recorder(first), _recorder(second)])
    assert {"on_step", "on_train_log", "on_run_stop"} <= set(EVENTS)
    for name in EVENTS:
        declared = inspect.signature(getattr(Listener, name)).parameters.values()
        required = [p for p in declared if p.name != "self" and p.default is p.empty]
        getattr(events, name)(*range(len(required)))
    assert first == second
    assert [name for name, _ in first] == EVENTS
    calls = dict(first)
    assert calls["on_epoch_start"] == (0, 1)
    assert calls["on_eval_stop"] == (0, 1, 2, None)  # loss defaults to None
    assert calls["on_run_stop"] == (0, 1, None, None)  # checkpoint and failure too
    events.on_run_stop("aborted", 2, failure="why")
    assert first[-1] == ("on_run_stop", ("aborted", 2, None, "why"))
    with pytest.raises(TypeError):
        events.on_epoch_start(1)  # global_step missing: refused by Events, not by a listener


def test_a_misspelled_listener_method_is_refused_at_construction():
    class Typo(Listener):
        def on_epoch_stopp(self, epoch, train):  # would never run
            pass

    with pytest.raises(TypeError, match="on_epoch_stopp"):
        Events([Typo()])


def _info():
    return RunInfo(
        benchmark="cosmoflow",
        seed=1,
        num_nodes=1,
        ranks=1,
        accelerators_per_node=0,
        global_batch_size=8,
        train_samples=64,
        eval_samples=8,
        hyperparameters={"opt_name": "sgd"},
        target_name="eval_error",
        target=0.124,
    )


def _emit(events):
    """The events of a one-epoch run, from a function one level deeper than the test."""
    events.on_init_start()
    events.on_init_stop(_info())
    events.on_run_start()
    events.on_epoch_start(1, 0)
    events.on_step(StepInfo(1, 8, 8, 8))
    events.on_epoch_stop(1, EpochTrain(global_step=8, loss=0.5, lr=0.01, samples_per_s=10.0))
    events.on_eval_start(1)
    events.on_eval_stop(1, 8, 0.3, 0.7)
    events.on_run_stop(
        "aborted",
        1,
        None,
        Failure(
            reason=NON_FINITE_LOSS,
            exit_code=ExitCode.NON_FINITE_LOSS,
            message="",
            step_num=8,
            loss="nan",
        ),
    )


def test_mlperf_lines_name_the_line_that_raised_the_event(tmp_path):
    logger = MLPerfLogger(
        tmp_path,
        {k: "x" for k in ("benchmark", "org", "division", "status", "platform")},
        metric_key="eval_error",
    )
    events = Events([logger])
    _emit(events)
    events.close()
    records = [
        json.loads(line[len(":::MLLOG ") :])
        for line in (tmp_path / "mlperf.log").read_text().splitlines()
    ]
    by_key = {r["key"]: r for r in records}
    # Each key at the line of the call that raised it (found in _emit's source, so that
    # reformatting _emit moves the expectation with it).
    source, first = inspect.getsourcelines(_emit)
    call_line = {
        name: first + i
        for i, text in enumerate(source)
        for name in re.findall(r"events\.(on_\w+)\(", text)
    }
    body = {
        "init_start": "on_init_start",
        "seed": "on_init_stop",
        "init_stop": "on_init_stop",
        "run_start": "on_run_start",
        "epoch_start": "on_epoch_start",
        "epoch_stop": "on_epoch_stop",
        "train_loss": "on_epoch_stop",
        "learning_rate": "on_epoch_stop",
        "eval_start": "on_eval_start",
        "eval_stop": "on_eval_stop",
        "eval_error": "on_eval_stop",
        "eval_loss": "on_eval_stop",
        "run_stop": "on_run_stop",
    }
    for key, method in body.items():
        assert by_key[key]["metadata"]["lineno"] == call_line[method], key
    # Every line, the submission, hyperparameter and step keys too, names this file.
    assert {r["metadata"]["file"] for r in records} == {"tests/test_events.py"}
    assert {"submission_org", "opt_name", "tracked_stats"} <= by_key.keys()
    assert by_key["epoch_start"]["metadata"]["epoch_num"] == 1
    # As the references log them: the step count with the epoch's end and the evaluation.
    assert by_key["epoch_start"]["metadata"]["step_num"] == 0
    assert all(
        by_key[k]["metadata"]["step_num"] == 8
        for k in ("epoch_stop", "train_loss", "eval_error", "eval_loss")
    )
    assert by_key["eval_loss"]["value"] == 0.7 and by_key["learning_rate"]["value"] == 0.01
    stop = by_key["run_stop"]["metadata"]
    assert (stop["status"], stop["reason"], stop["step_num"], stop["loss"]) == (
        "aborted",
        "non-finite loss",
        8,
        "nan",
    )
    assert not (tmp_path / "mlperf.log.partial").exists()


def test_the_log_writes_the_step_the_events_carry_and_counts_none_of_its_own(tmp_path):
    # A resumed epoch whose steps the logger never saw (no on_step): every step_num is the one its
    # event carries. A logger that counted on_step calls would write 0 here.
    logger = MLPerfLogger(
        tmp_path,
        {k: "x" for k in ("benchmark", "org", "division", "status", "platform")},
        metric_key="eval_error",
    )
    events = Events([logger])
    events.on_init_stop(_info())
    events.on_epoch_start(3, 13)
    events.on_epoch_stop(3, EpochTrain(global_step=24, loss=0.5, lr=0.01, samples_per_s=10.0))
    events.on_eval_stop(3, 24, 0.3, 0.7)
    events.close()
    records = [
        json.loads(line[len(":::MLLOG ") :])
        for line in (tmp_path / "mlperf.log").read_text().splitlines()
    ]
    steps = {r["key"]: r["metadata"]["step_num"] for r in records if "step_num" in r["metadata"]}
    assert steps == {
        "epoch_start": 13,
        "epoch_stop": 24,
        "train_loss": 24,
        "learning_rate": 24,
        "eval_error": 24,
        "eval_loss": 24,
    }
