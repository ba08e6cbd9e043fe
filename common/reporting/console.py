"""Rank 0's console: every line a person reads while a run goes, from `[init]` to `[done]`.

`Console` is the one listener that prints, so the order of the lines is decided here; ranks
other than 0 print only their `error:` lines. `Progress` draws a count (the epoch's steps, files
staged, and the counts of the data tools).
"""

import sys
import time

from common.reporting.events import Listener

REDRAW_S = 0.1  # seconds between redraws of a terminal line: 10 a second looks continuous
LINE_S = 30.0  # seconds between lines elsewhere: `tail -f` shows the work is alive


def format_duration(seconds: float) -> str:
    """A short duration for an ETA: '41s', '4m41s', '2h05m'."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Progress:
    """A count going up to `total`: `[label] 3/10 files (30%), 1.2 files/s, ETA 5s, extra`.

    On a terminal, one line redrawn in place every `REDRAW_S` at most; elsewhere a flushed line
    every `LINE_S`. `close()` draws the last state with the time taken and ends the line. `out`: a
    stream (None: stdout) or a function of one line; `first`: the count at construction, from
    which the rate counts; `rate_in`: the rate's unit and how many make one counted unit.
    """

    def __init__(
        self,
        label: str,
        total: int,
        unit: str = "files",
        out=None,
        clock=time.monotonic,
        first: int = 0,
        rate_in: tuple[str, float] | None = None,
    ):
        self.label, self.total, self.unit = label, int(total), unit
        self.rate_unit, self.scale = rate_in or (unit, 1)
        self.clock, self.first, self.done, self.extra = clock, first, first, ""
        self.stream = sys.stdout if out is None else out
        self.tty = not callable(self.stream) and self.stream.isatty()
        self.interval = REDRAW_S if self.tty else LINE_S
        self.start = clock()
        self.last = None if self.tty else self.start  # a terminal shows the first update at once
        self.width = 0  # characters of the terminal line drawn

    def update(self, done: int, extra: str = "") -> None:
        """Sets the count to `done` (not an increment); `extra` ("12.3 MiB") ends the line."""
        self.done, self.extra = int(done), extra
        now = self.clock()
        if self.last is None or now - self.last >= self.interval:
            self._draw(now)

    def close(self, summary: bool = True) -> None:
        """Ends the line; with `summary`, after drawing the last state with the time taken."""
        if summary:
            self._draw(self.clock(), final=True)
        if self.width:
            print(file=self.stream, flush=True)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close(summary=exc_type is None)  # the error says what happened

    def _draw(self, now: float, final: bool = False) -> None:
        self.last = now
        text = self.text(now, final)
        if callable(self.stream):
            self.stream(text)
        elif self.tty:  # padded over the tail of a longer previous text
            print("\r" + text.ljust(self.width), end="", file=self.stream, flush=True)
            self.width = len(text)
        else:
            print(text, file=self.stream, flush=True)

    def text(self, now: float, final: bool = False) -> str:
        elapsed = now - self.start
        per_s = (self.done - self.first) / elapsed if elapsed > 0 else 0.0
        rate = f"{per_s * self.scale:.1f}" if per_s > 0 else "--"
        eta = format_duration((self.total - self.done) / per_s) if per_s > 0 else "--"
        when = f"took {format_duration(elapsed)}" if final else f"ETA {eta}"
        pct = 100 if self.total <= 0 else int(100 * self.done / self.total)
        head = f"[{self.label}] {self.done}/{self.total} {self.unit} ({pct}%)"
        return ", ".join(p for p in (head, f"{rate} {self.rate_unit}/s", when, self.extra) if p)


class Console(Listener):
    """Rank 0's lines on `stream` (default: sys.stdout); `clock` times the progress lines."""

    def __init__(self, stream=None, clock=time.monotonic):
        self.stream, self.clock = sys.stdout if stream is None else stream, clock
        self.tty = self.stream.isatty()
        self.bar = None  # the Progress drawn now: staging, or the epoch's steps
        self.run_start = None
        self.info = None
        self.train = None  # the last epoch's EpochTrain; None before the first

    def print(self, text: str) -> None:
        self._end_bar()
        print(text, file=self.stream, flush=True)

    def _end_bar(self, summary: bool = False) -> None:
        if self.bar is not None:
            self.bar.close(summary)
            self.bar = None

    def on_runtime_configured(self, job, runtime):
        for line in runtime_lines(job, runtime):
            self.print(f"[init] {line}")

    def on_init_stop(self, info):
        self.info = info
        for line in init_lines(info):
            self.print(f"[init] {line}")

    def on_staging_progress(self, done, total, nbytes):
        if self.bar is None:
            self.bar = Progress("staging", total, "files", self.stream, self.clock)
        self.bar.update(done, f"rank 0: {nbytes / 1e6:.1f} MB")
        if done >= total:
            self._end_bar(summary=True)

    def on_staging_stop(self, stats):
        self.print(stats.line())

    def on_instances_met(self, meeting):
        self.print(meeting.line())

    def on_run_start(self):
        self.run_start = time.time()

    def on_step(self, step):
        # The epoch's bar starts at the first step seen: the rate leaves out that step's own time
        # (tracing, filling the input pipeline), and a resumed epoch starts at a later step.
        if self.bar is None:
            self.bar = Progress(
                f"epoch {step.epoch:3d}",
                step.steps_per_epoch,
                "steps",
                self.stream,
                self.clock,
                first=step.step,
                rate_in=("samples", self.info.global_batch_size),
            )
        self.bar.update(step.step)

    def on_epoch_stop(self, epoch, train):
        self._end_bar(summary=self.tty)  # a file gets the epoch line only
        self.train = train
        if train.first_step_s is not None:
            from common.run.benchmark_mode import timing_line  # runtime.step_timing only

            self.print(timing_line(train))

    def on_eval_stop(self, epoch, global_step, value, loss):
        t = self.train
        loss, samples_per_s, lr = (
            (t.loss, t.samples_per_s, t.lr) if t is not None else (float("nan"), 0, 0)
        )
        self.print(
            f"[epoch {epoch:3d}] train_loss {loss:.4f}  "
            f"{self.info.target_name} {value:.4f} (target {self.info.target})  "
            f"{samples_per_s:.1f} samples/s  lr {lr:.3g}  "
            f"t={time.time() - self.run_start:.1f}s"
        )

    def on_run_stop(self, status, epoch, checkpoint, failure):
        minutes = (time.time() - self.run_start) / 60 if self.run_start else float("nan")
        saved = f"; checkpoint {checkpoint}" if checkpoint else ""
        why = f" ({failure.reason} at step {failure.step_num})" if failure else ""
        self.print(
            f"[run] {status}{why} after {epoch} epoch(s), time to train {minutes:.3f} min{saved}"
        )

    def on_characterization_start(self):
        self.print(
            "[characterize] measuring FLOPs, input pipeline, memory and allreduce (after run_stop)"
        )

    def close(self):
        self._end_bar()

    def report(self, report) -> None:
        """The `[benchmark]`/`[done]` lines of a finished run (common.run.report.Report)."""
        for line in report.lines:
            self.print(line)


_NOTES = ("cpu", "stack", "image", "precision_note", "threads_note")  # lines of their own


def runtime_lines(job: str, rt: dict) -> list[str]:
    """The job and the runtime it got, a line each (without the `[init] ` tag)."""
    lines = [f"{job}; runtime { {k: v for k, v in rt.items() if k not in _NOTES} }"]
    cpu = rt.get("cpu")
    if cpu:
        lines.append(f"CPU {cpu['cpu']}: {cpu['isa']}, bf16 {cpu['bf16']}, oneDNN {cpu['onednn']}")
    if rt.get("stack"):
        lines.append(rt["stack"])
    if rt.get("image"):
        lines.append("image: " + ", ".join(f"{k} {v}" for k, v in rt["image"].items() if v))
    return lines + [rt[note] for note in ("precision_note", "threads_note") if rt.get(note)]


def init_lines(info) -> list[str]:
    """What init built, a line each (without the `[init] ` tag), from the RunInfo."""
    lines = []
    if info.samples_per_epoch < info.shard_samples:
        lines.append(
            f"epoch: {info.steps_per_epoch} steps x global batch {info.global_batch_size} = "
            f"{info.samples_per_epoch} of {info.shard_samples} samples; the rest of each rank's "
            f"shuffled shard is dropped each epoch (partial batches, as the reference's drop_last)"
        )
    if info.model_name:
        lines.append(f"model {info.model_name}: {info.num_params:,} trainable parameters")
    if info.spatial_ranks > 1:
        lines.append(f"spatial: {info.spatial_plan}")
    if info.warmup_steps:
        lines.append(
            f"warm-up: {info.warmup_steps} synthetic step(s) in {info.warmup_s:.2f} s (compile, autotune), "
            f"the state put back; before run_start, outside the timed region"
        )
    if info.batchnorm_layers and info.ranks > 1:
        lines.append(
            f"batch norm: running statistics of {info.batchnorm_layers} layers averaged over the "
            f"{info.ranks} ranks after every epoch"
        )
    resumed = info.resumed_from
    if resumed and resumed.get("weights_only"):
        lines.append(
            f"model weights from {info.resumed_source} (model-only folder: fresh optimizer, starting at "
            f"epoch 0; not a valid benchmark result)"
        )
    elif resumed:
        lines.append(
            f"resumed from {info.resumed_source} (epoch {resumed['epoch']}, {resumed['step']} of "
            f"{info.steps_per_epoch} steps done); a resumed run is not a valid benchmark result "
            f"(its log says so)"
        )
    return lines
