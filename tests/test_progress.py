"""Progress, alone and as the Console's step count: one line redrawn in place on a terminal,
periodic lines elsewhere.

Time is a fake clock (times in 1/16 s or 0.5 s: exact in binary floating point), not sleeps.
"""

import io

import pytest

from common.reporting.console import Console, Progress, format_duration
from common.reporting.events import EpochTrain, Events, RunInfo, StepInfo


def run_info(global_batch_size, steps_per_epoch):
    return RunInfo(
        benchmark="cosmoflow",
        seed=0,
        num_nodes=1,
        ranks=1,
        accelerators_per_node=0,
        global_batch_size=global_batch_size,
        train_samples=global_batch_size * steps_per_epoch,
        eval_samples=8,
        hyperparameters={},
        target_name="eval_error",
        target=0.124,
        steps_per_epoch=steps_per_epoch,
        n_epochs=2,
    )


class Clock:
    def __init__(self, t=1000.0):
        self.t = t

    def __call__(self):
        return self.t


class Stream(io.StringIO):
    """A stream that says whether it is a terminal and counts its flushes."""

    def __init__(self, tty):
        super().__init__()
        self.tty, self.flushes = tty, 0

    def isatty(self):
        return self.tty

    def flush(self):
        self.flushes += 1


def frames(text):
    """The successive states of a terminal line: what follows each '\\r', trailing padding dropped."""
    assert text.startswith("\r")
    return [f.rstrip(" \n") for f in text.split("\r")[1:]]


def test_format_duration():
    assert [format_duration(s) for s in (0, 41.4, 59.6, 281, 3600 * 2 + 5 * 60 + 20)] == [
        "0s",
        "41s",
        "1m00s",
        "4m41s",
        "2h05m",
    ]


def test_epoch_steps_on_a_terminal_redraw_in_place_ten_times_a_second_and_end_the_line():
    clock, stream = Clock(), Stream(tty=True)
    events = Events([Console(stream=stream, clock=clock)])
    events.on_init_stop(run_info(global_batch_size=8, steps_per_epoch=64))
    events.on_epoch_start(2, 64)
    for step in range(1, 65):  # 16 steps/s: a redraw every second step (0.125 s >= 0.1 s)
        clock.t = 1000.0 + step / 16
        events.on_step(StepInfo(2, step, 64, 64 + step))
    events.on_epoch_stop(2, EpochTrain(global_step=128, loss=0.1, lr=0.001, samples_per_s=128.0))
    out = stream.getvalue()
    assert out.endswith("\n") and out.count("\n") == 1
    shown = frames(out)
    assert len(shown) == 32 + 1  # steps 1, 3, ..., 63, then the final state
    assert shown[0] == "[epoch   2] 1/64 steps (1%), -- samples/s, ETA --"
    # Step 33: 32 steps in 2 s since step 1 = 16 steps/s x 8 = 128 samples/s; 31 left ~ 2 s.
    assert shown[16] == "[epoch   2] 33/64 steps (51%), 128.0 samples/s, ETA 2s"
    assert shown[-1] == "[epoch   2] 64/64 steps (100%), 128.0 samples/s, took 4s"
    assert stream.flushes >= len(shown)
    # The next epoch gets its own line; a line printed mid-epoch ends it first.
    events.on_epoch_start(3, 128)
    clock.t += 1 / 16
    events.on_step(StepInfo(3, 1, 64, 129))
    events.on_run_stop("aborted", 2)
    assert stream.getvalue()[len(out) :].startswith(
        "\r[epoch   3] 1/64 steps (1%), -- samples/s, ETA --\n[run] aborted after 2 epoch(s)"
    )


def test_epoch_steps_off_a_terminal_print_a_line_every_30_s():
    clock, stream = Clock(), Stream(tty=False)
    events = Events([Console(stream=stream, clock=clock)])
    events.on_init_stop(run_info(global_batch_size=32, steps_per_epoch=200))
    for epoch in (1, 2):
        events.on_epoch_start(epoch, (epoch - 1) * 200)
        start = clock.t
        for step in range(1, 201):  # 2 steps/s: 64 samples/s
            clock.t = start + step / 2
            events.on_step(StepInfo(epoch, step, 200, (epoch - 1) * 200 + step))
        events.on_epoch_stop(
            epoch,
            EpochTrain(global_step=epoch * 200, loss=0.1, lr=0.001, samples_per_s=64.0),
        )
        events.on_eval_start(epoch)
    lines = stream.getvalue().splitlines(keepends=True)
    assert "\r" not in stream.getvalue()
    # 30 s after each epoch's first step: steps 61, 121, 181; nothing at the epoch's end.
    expected = [
        "61/200 steps (30%), 64.0 samples/s, ETA 1m10s\n",  # 139 steps / 2 per s = 69.5 s
        "121/200 steps (60%), 64.0 samples/s, ETA 40s\n",
        "181/200 steps (90%), 64.0 samples/s, ETA 10s\n",
    ]
    assert lines == [f"[epoch   1] {e}" for e in expected] + [f"[epoch   2] {e}" for e in expected]
    assert stream.flushes == len(lines)


def test_the_rate_of_a_resumed_epoch_counts_from_the_first_step_seen():
    clock, stream = Clock(), Stream(tty=False)
    events = Events([Console(stream=stream, clock=clock)])
    events.on_init_stop(run_info(global_batch_size=4, steps_per_epoch=200))
    events.on_epoch_start(4, 600)
    for step in range(101, 201):
        clock.t = 1000.0 + (step - 100) / 2
        events.on_step(StepInfo(4, step, 200, 600 + step))
    # 60 steps in 30 s since step 101: 2 steps/s (not 161 / 30 s), 8 samples/s.
    assert stream.getvalue() == "[epoch   4] 161/200 steps (80%), 8.0 samples/s, ETA 20s\n"


def test_progress_on_a_terminal_is_one_line_ended_by_close():
    clock, stream = Clock(), Stream(tty=True)
    bar = Progress("staging", 8, unit="files", out=stream, clock=clock)
    for done in range(1, 9):  # one file every 1/16 s: at most one redraw per 0.1 s
        clock.t = 1000.0 + done / 16
        bar.update(done, extra="" if done > 4 else f"{done} MB")
    bar.close()
    out = stream.getvalue()
    assert out.endswith("\n") and out.count("\n") == 1
    shown = frames(out)
    assert shown == [
        "[staging] 1/8 files (12%), 16.0 files/s, ETA 0s, 1 MB",
        "[staging] 3/8 files (37%), 16.0 files/s, ETA 0s, 3 MB",
        "[staging] 5/8 files (62%), 16.0 files/s, ETA 0s",
        "[staging] 7/8 files (87%), 16.0 files/s, ETA 0s",
        "[staging] 8/8 files (100%), 16.0 files/s, took 0s",
    ]
    # A shorter text is padded over the longer one before it.
    assert len(out.split("\r")[3]) == len("[staging] 3/8 files (37%), 16.0 files/s, ETA 0s, 3 MB")


def test_progress_off_a_terminal_prints_every_30_s_then_a_summary():
    clock, stream = Clock(), Stream(tty=False)
    with Progress("prepare", 10, unit="universes", out=stream, clock=clock) as bar:
        for done in range(1, 11):
            clock.t = 1000.0 + 10 * done
            bar.update(done, extra=f"{8 * done} samples")
    assert stream.getvalue().splitlines() == [
        "[prepare] 3/10 universes (30%), 0.1 universes/s, ETA 1m10s, 24 samples",
        "[prepare] 6/10 universes (60%), 0.1 universes/s, ETA 40s, 48 samples",
        "[prepare] 9/10 universes (90%), 0.1 universes/s, ETA 10s, 72 samples",
        "[prepare] 10/10 universes (100%), 0.1 universes/s, took 1m40s, 80 samples",
    ]


def test_progress_ended_by_an_error_prints_no_summary():
    clock, stream = Clock(), Stream(tty=False)
    with pytest.raises(RuntimeError):
        with Progress("stats", 4, out=stream, clock=clock) as bar:
            clock.t += 1
            bar.update(1)
            raise RuntimeError("unreadable file")
    assert stream.getvalue() == ""
    tty = Stream(tty=True)
    with pytest.raises(RuntimeError):
        with Progress("stats", 4, out=tty, clock=clock) as bar:
            bar.update(1)
            raise RuntimeError("unreadable file")
    assert tty.getvalue() == "\r[stats] 1/4 files (25%), -- files/s, ETA --\n"


def test_a_function_gets_whole_lines():
    lines = []
    clock = Clock()
    bar = Progress("synthetic", 2, unit="samples", out=lines.append, clock=clock)
    clock.t += 4
    bar.update(2, extra="1.5 MiB")
    bar.close()
    assert lines == ["[synthetic] 2/2 samples (100%), 0.5 samples/s, took 4s, 1.5 MiB"]
