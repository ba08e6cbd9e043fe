"""Rank 0's console: everything a person reads while a run goes, from `[init]` to `[done]`.

One listener (`Console`) owns the stream, so the order of its lines is decided in
one place: the `[init]` lines at init_stop, the staging bar and its `[staging]`
line, each epoch's step bar (`StepProgress`, which it drives) ended before that
epoch's `[epoch N]` line, the `[run]` line at run_stop, and the `[done]` report
that common.run.trainer.main hands it once the log is checked. Ranks other than 0 have no
listener: they print nothing but their `error:` lines.

The counts every tool draws (`Progress`: files staged, universes prepared, samples written) are drawn the same way, below.
"""

import sys
import time

from common.reporting.events import Listener

# A count going up towards a total, drawn on a stream: files staged, universes prepared, samples written.
#
# Two ways to show it, chosen by the stream:
#   - a terminal (`stream.isatty()`): one bar redrawn in place with '\r', at most
#     10 times a second, ended with a newline;
#   - anything else (a SLURM output file, a pipe, a test's list): one plain line
#     every `every_s` seconds, flushed, so that `tail -f` shows the work is alive
#     without filling the file.
# `Progress` draws any count; `StepProgress` (below) draws a run's optimizer steps the same way.

# A terminal redraw costs a write and a flush: 10 a second looks continuous.
REDRAW_S = 0.1
BAR_WIDTH = 24


def format_duration(seconds: float) -> str:
    """A short duration for an ETA: '41s', '4m41s', '2h05m'."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed file
        return False


def bar(done: int, total: int) -> str:
    filled = BAR_WIDTH if total <= 0 else min(BAR_WIDTH, BAR_WIDTH * done // total)
    return "[" + "#" * filled + "." * (BAR_WIDTH - filled) + "]"


def eta_or_took(
    final: bool, elapsed: float, remaining: float, rate: float, took: str | None = None
) -> str:
    """'took ...' once done, else 'ETA ...' of `remaining` units at `rate` per second ('ETA --' without one)."""
    if final:
        return f"took {took or format_duration(elapsed)}"
    if rate > 0:
        return f"ETA {format_duration(remaining / rate)}"
    return "ETA --"


def percent(done: int, total: int) -> int:
    return 100 if total <= 0 else int(100 * done / total)


class StatusLine:
    """One changing status line on a stream: redrawn in place on a terminal, else a line now and then."""

    def __init__(self, stream, every_s: float):
        self.stream = stream
        self.tty = _isatty(stream)
        self.interval = REDRAW_S if self.tty else every_s
        self.last = None  # clock time of the last draw (or of the start, off a terminal)
        self.width = 0  # characters on the terminal line now
        self.open = False  # a terminal line is drawn and not yet ended

    def start(self, now: float) -> None:
        # A terminal shows the bar at once; a file gets its first line after every_s,
        # not a useless "0 done" line at every start.
        self.last = None if self.tty else now

    def due(self, now: float) -> bool:
        return self.last is None or now - self.last >= self.interval

    def draw(self, text: str, now: float) -> None:
        self.last = now
        if self.tty:
            # Pad over the tail of a longer previous text (no terminal escape codes needed).
            self.stream.write("\r" + text + " " * max(0, self.width - len(text)))
            self.width = len(text)
            self.open = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def end(self, text: str | None = None) -> None:
        """Ends the line: a terminal bar gets its last state (text) and a newline; a file gets text."""
        if self.tty:
            if text is not None:
                self.draw(text, self.last or 0.0)
            if self.open:
                self.stream.write("\n")
                self.stream.flush()
            self.open = False
            self.width = 0
        elif text is not None:
            self.draw(text, self.last or 0.0)


class Progress:
    """A count going up towards a total (files staged, samples written), drawn as the module says.

    On a terminal: `[prepare] [#######.................] 3/10 universes   30%  1.2 universes/s  ETA 5s`;
    elsewhere, every `every_s` seconds: `[prepare] 3/10 universes (30%), 1.2 universes/s, ETA 5s`.
    `close()` draws the last state with the time taken instead of the ETA, on both.
    Rates are over the time since the `Progress` was made.

    Args:
      label: the tag between brackets that starts each line ("staging", "prepare").
      total: the count at which the work is done.
      unit: what is counted, plural ("files", "samples").
      stream: where to draw (default: sys.stdout at construction).
      every_s: seconds between lines when the stream is not a terminal.
      clock: a monotonic clock in seconds (tests pass a fake one).
    """

    def __init__(
        self,
        label: str,
        total: int,
        unit: str = "files",
        stream=None,
        every_s: float = 30.0,
        clock=time.monotonic,
    ):
        self.label, self.total, self.unit = label, int(total), unit
        self.clock = clock
        self.line = StatusLine(sys.stdout if stream is None else stream, every_s)
        self.start = clock()
        self.line.start(self.start)
        self.done, self.extra = 0, ""
        self.closed = False

    def update(self, done: int, extra: str = "") -> None:
        """Sets the count to `done` (not an increment); `extra` ("12.3 MiB") ends the line."""
        self.done, self.extra = int(done), extra
        now = self.clock()
        if self.line.due(now):
            self.line.draw(self.text(now), now)

    def close(self) -> None:
        """Draws the final state with the time taken (once; later calls do nothing)."""
        if not self.closed:
            self.closed = True
            self.line.end(self.text(self.clock(), final=True))

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:  # the error says what happened: only end a terminal line, no summary
            self.closed = True
            self.line.end()

    def text(self, now: float, final: bool = False) -> str:
        elapsed = now - self.start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        when = eta_or_took(
            final, elapsed, max(0, self.total - self.done), rate, took=f"{elapsed:.1f} s"
        )
        pct = percent(self.done, self.total)
        if self.line.tty:
            parts = [
                f"[{self.label}] {bar(self.done, self.total)} {self.done}/{self.total} {self.unit}",
                f"{pct:3d}%",
                f"{rate:.1f} {self.unit}/s",
                when,
                self.extra,
            ]
            return "  ".join(p for p in parts if p)
        parts = [
            f"[{self.label}] {self.done}/{self.total} {self.unit} ({pct}%)",
            f"{rate:.1f} {self.unit}/s",
            when,
            self.extra,
        ]
        return ", ".join(p for p in parts if p)


class LineSink:
    """A stream (not a terminal) that hands each complete line to a function.

    Lets a tool whose `progress` argument is a function of one line (a test's
    `list.append`, a logger) draw a `Progress`: it then gets plain lines.
    """

    def __init__(self, write_line):
        self.write_line = write_line
        self.pending = ""

    def write(self, text: str) -> int:
        *lines, self.pending = (self.pending + text).split("\n")
        for line in lines:
            self.write_line(line)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def progress_stream(progress=None):
    """The stream a tool draws its `Progress` on: stdout for None, else a `LineSink` around the function."""
    return sys.stdout if progress is None else LineSink(progress)


class Console(Listener):
    """Rank 0's lines on `stream` (default: sys.stdout at construction).

    Args:
      stream: where to print.
      every_s: seconds between progress lines when the stream is not a terminal.
    """

    def __init__(self, stream=None, every_s: float = 30.0):
        self.stream = sys.stdout if stream is None else stream
        self.steps = StepProgress(stream=self.stream, every_s=every_s)
        self.every_s = every_s
        self.run_start = None
        self.info = None
        self.train = (
            None  # the last epoch's EpochTrain; None before the first (an evaluate-only run)
        )
        self.staging_bar = None

    def print(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def note(self, text: str) -> None:
        """An `[init]` line of the launcher's (which config, what runtime.tiny did)."""
        self.print(f"[init] {text}")

    # ------------------------------------------------------------ events
    def on_runtime_configured(self, job, runtime):
        for line in runtime_lines(job, runtime):
            self.print(f"[init] {line}")

    def on_init_stop(self, info):
        self.info = info
        self.steps.on_init_stop(info)
        for line in init_lines(info):
            self.print(f"[init] {line}")

    def on_staging_progress(self, done, total, nbytes):
        if self.staging_bar is None:
            self.staging_bar = Progress(
                "staging", total, unit="files", stream=self.stream, every_s=self.every_s
            )
        self.staging_bar.update(done, f"rank 0: {nbytes / 1e6:.1f} MB")
        if done >= total:
            self.staging_bar.close()
            self.staging_bar = None

    def on_staging_stop(self, stats):
        self.print(
            f"[staging] {stats.files} files ({stats.skipped} already staged), "
            f"{stats.bytes / 1e9:.3f} GB in {stats.seconds:.2f} s = {stats.gb_per_s:.3f} GB/s "
            f"(all ranks)"
        )

    def on_instances_met(self, meeting):
        gone = f"; ended before they were ready: {list(meeting.gone)}" if meeting.gone else ""
        missing = (
            f"; not ready after the timeout, started without them: {list(meeting.missing)}"
            if meeting.missing
            else ""
        )
        self.print(
            f"[weak-scaling] this instance waited {meeting.waited_s:.2f} s for the others to be "
            f"ready{gone}{missing}"
        )

    def on_run_start(self):
        self.run_start = time.time()

    def on_epoch_start(self, epoch, global_step):
        self.steps.on_epoch_start(epoch, global_step)

    def on_step(self, step):
        self.steps.on_step(step)

    def on_epoch_stop(self, epoch, train):
        self.steps.on_epoch_stop(epoch, train)
        self.train = train
        if train.first_step_s is not None:
            self.print(
                f"[timing] first step {train.first_step_s:.3f} s, median {train.median_step_s:.3f} s "
                f"({train.first_step_s / train.median_step_s:.2f}x), 90th percentile {train.p90_step_s:.3f} s "
                f"({train.p90_step_s / train.median_step_s:.2f}x) over the epoch's steps, each waited for, "
                f"without their wait for input; the first batch waited {train.first_input_wait_s:.3f} s "
                f"(cold reads, buffers filling); rank 0"
            )

    def on_eval_start(self, epoch):
        self.steps.on_eval_start(epoch)

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
        self.steps.on_run_stop(status, epoch, checkpoint, failure)  # a bar ended before the line
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

    # ------------------------------------------------------------ the report
    def report(self, report) -> None:
        """The `[benchmark]`/`[done]` lines of a finished run (common.run.report.Report)."""
        for line in report_lines(report):
            self.print(line)


_NOTES = (
    "cpu",
    "stack",
    "image",
    "precision_note",
    "threads_note",
)  # runtime entries said on lines of their own


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


def report_lines(report) -> list[str]:
    """The `[benchmark]` and `[done]` lines of a common.run.report.Report."""
    r, name = report.result, report.benchmark
    where = f"[done] run directory: {report.run_dir}"
    if r.status == "benchmarked":
        b = r.throughput
        return [
            f"[benchmark] {name}: {b['steps']} steps after {b['warmup_steps']} warm-up, {b['ranks']} rank(s), "
            f"global batch {b['global_batch_size']}, {b['precision']}: {b['samples_per_s_per_rank']:.2f} "
            f"samples/s per rank, {b['samples_per_s']:.2f} samples/s in total; input pipeline alone "
            f"{b['input_samples_per_s_per_rank']:.2f} samples/s per rank",
            where,
        ]
    if r.status == "evaluated":
        return [
            f"[done] {name}: evaluated the model of epoch {r.epochs}: {report.metric_name} "
            f"{r.metric:.4f} (target {report.target})",
            where,
        ]
    if r.failure:
        f = r.failure
        return [
            f"[done] {name}: aborted ({f.reason} at step {f.step_num}), exit code {f.exit_code}"
            + (f"; checkpoint of the last finite state {f.checkpoint}" if f.checkpoint else ""),
            where,
        ]
    lines = [
        f"[done] {name}: {r.status}, {r.epochs} epoch(s), {report.metric_name} {r.metric:.4f}, "
        f"time to train {r.time_to_train_s / 60:.3f} min",
        where,
    ]
    if r.status == "preempted":
        lines.append(
            f"[done] stopped on request (SIGUSR1 or SIGTERM on a rank): checkpoint {r.checkpoint}; "
            f"go on with --resume (exit code {report.exit_preempted}); the log says aborted"
        )
    elif report.log_check == "passed":
        lines.append(
            f"[done] MLPerf log {report.log} PASSED the compliance checker (hpc {report.ruleset})"
        )
    elif report.log_check == "failed":
        lines.append(
            f"[done] MLPerf log {report.log} FAILED the compliance checker (hpc {report.ruleset}):"
        )
        lines += ["    " + line for line in report.checker_output.splitlines()[-15:]]
    return lines


class StepProgress(Listener):
    """The optimizer steps inside each epoch, on rank 0 (the caller decides), drawn as the module says.

    On a terminal, one bar per epoch:
      `[epoch   3] [#####...................] 1200/5000  24%  812.3 samples/s  ETA 4m41s`
    ended at the epoch's end with its time taken and a newline. Elsewhere, every `every_s` seconds:
      `[epoch   3] step 1200/5000 (24%), 812.3 samples/s, ETA 4m41s`
    and nothing at the epoch's end (common.reporting.console.Console prints the epoch's line).

    Samples/s is steps x RunInfo.global_batch_size over the wall time since the
    first step seen in the epoch: that step's own time (tracing the step
    function, filling the input pipeline) would make the first epoch's ETA too
    long, and a resumed epoch starts at a later step. Steps/s is shown instead
    when no RunInfo was seen.

    Args:
      stream: where to draw (default: sys.stdout at construction).
      every_s: seconds between lines when the stream is not a terminal.
      clock: a monotonic clock in seconds (tests pass a fake one).
    """

    def __init__(self, stream=None, every_s: float = 30.0, clock=time.monotonic):
        self.stream = sys.stdout if stream is None else stream
        self.every_s = every_s
        self.clock = clock
        self.batch = None  # global batch size, from RunInfo
        self.line = None  # the epoch's status line
        self.epoch = 0
        self.epoch_start = None
        self.first = None  # (step, clock) of the first step seen in the epoch
        self.step = None  # the last StepInfo

    def on_init_stop(self, info):
        self.batch = info.global_batch_size

    def on_epoch_start(self, epoch, global_step):
        self._end()
        self.epoch, self.first, self.step = epoch, None, None
        self.epoch_start = self.clock()
        self.line = StatusLine(self.stream, self.every_s)

    def on_step(self, step):
        now = self.clock()
        if self.line is None:  # steps without an epoch start (not from the trainer): still draw
            self.on_epoch_start(step.epoch, step.global_step - step.step)
        self.step = step
        if self.first is None:
            self.first = (step.step, now)
            self.line.start(now)
        if self.line.due(now):
            self.line.draw(self.text(now), now)

    def on_epoch_stop(self, epoch, train):
        self._end(final=True)

    def on_eval_start(self, epoch):
        self._end()

    def on_run_stop(self, status, epoch, checkpoint, failure):
        self._end()  # stopped mid-epoch: end the bar before the run's last line

    def _end(self, final: bool = False) -> None:
        if self.line is not None:
            text = (
                self.text(self.clock(), final=True)
                if final and self.step is not None and self.line.tty
                else None
            )
            self.line.end(text)
            self.line = None

    def rate(self, now: float) -> tuple[float, float]:
        """(steps/s, samples/s; samples/s is 0 without a global batch size) since the first step seen."""
        first_step, t0 = self.first
        steps, seconds = self.step.step - first_step, now - t0
        per_s = steps / seconds if steps > 0 and seconds > 0 else 0.0
        return per_s, per_s * (self.batch or 0)

    def text(self, now: float, final: bool = False) -> str:
        s = self.step
        steps_per_s, samples_per_s = self.rate(now)
        if steps_per_s <= 0:
            speed = "-- samples/s" if self.batch else "-- steps/s"
        else:
            speed = f"{samples_per_s:.1f} samples/s" if self.batch else f"{steps_per_s:.2f} steps/s"
        when = eta_or_took(final, now - self.epoch_start, s.steps_per_epoch - s.step, steps_per_s)
        pct = percent(s.step, s.steps_per_epoch)
        if self.line.tty:
            return (
                f"[epoch {self.epoch:3d}] {bar(s.step, s.steps_per_epoch)} {s.step}/{s.steps_per_epoch} "
                f"{pct:3d}%  {speed}  {when}"
            )
        return (
            f"[epoch {self.epoch:3d}] step {s.step}/{s.steps_per_epoch} ({pct}%), {speed}, {when}"
        )
