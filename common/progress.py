"""What rank 0 prints while a run goes: staging, steps inside an epoch, one line per epoch, the end.

Two ways to show a count going up, chosen by the stream:
  - a terminal (`stream.isatty()`): one bar redrawn in place with '\\r', at most
    10 times a second, ended with a newline;
  - anything else (a SLURM output file, a pipe, a test's list): one plain line
    every `every_s` seconds, flushed, so that `tail -f` shows the run is alive
    without filling the file.
`StepProgress` draws the optimizer steps of each epoch; `Progress` draws any
other count (files staged, universes prepared, samples written).
"""

import sys
import time

from common.events import Listener

# A terminal redraw costs a write and a flush: 10 a second looks continuous.
REDRAW_S = 0.1
BAR_WIDTH = 24


class ProgressPrinter(Listener):
    """One line per epoch on rank 0: loss, validation metric, throughput, LR."""

    def __init__(self, stream=sys.stdout):
        self.stream = stream
        self.run_start = None
        self.info = None
        self.train = {}

    def _print(self, msg):
        print(msg, file=self.stream, flush=True)

    def on_init_stop(self, info, site):
        self.info = info

    def on_staging_stop(self, stats, site):
        self._print(f"[staging] {stats['files']} files ({stats['skipped']} already staged), "
                    f"{stats['bytes'] / 1e9:.3f} GB in {stats['seconds']:.2f} s = {stats['gb_per_s']:.3f} GB/s "
                    f"(all ranks)")

    def on_run_start(self, site):
        self.run_start = time.time()

    def on_epoch_stop(self, epoch, train, site):
        self.train = train

    def on_eval_stop(self, epoch, value, loss, site):
        t = self.train
        self._print(f"[epoch {epoch:3d}] train_loss {t.get('loss', float('nan')):.4f}  "
                    f"{self.info.target_name} {value:.4f} (target {self.info.target})  "
                    f"{t.get('samples_per_s', 0):.1f} samples/s  lr {t.get('lr', 0):.3g}  "
                    f"t={time.time() - self.run_start:.1f}s")

    def on_run_stop(self, status, epoch, checkpoint, failure, site):
        minutes = (time.time() - self.run_start) / 60 if self.run_start else float("nan")
        saved = f"; checkpoint {checkpoint}" if checkpoint else ""
        why = f" ({failure['reason']} at step {failure['step_num']})" if failure else ""
        self._print(f"[run] {status}{why} after {epoch} epoch(s), time to train {minutes:.3f} min{saved}")


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
    except (AttributeError, ValueError):   # no isatty, or a closed file
        return False


def _bar(done: int, total: int) -> str:
    filled = BAR_WIDTH if total <= 0 else min(BAR_WIDTH, BAR_WIDTH * done // total)
    return "[" + "#" * filled + "." * (BAR_WIDTH - filled) + "]"


def _when(final: bool, elapsed: float, remaining: float, rate: float, took: str | None = None) -> str:
    """'took ...' once done, else 'ETA ...' of `remaining` units at `rate` per second ('ETA --' without one)."""
    if final:
        return f"took {took or format_duration(elapsed)}"
    if rate > 0:
        return f"ETA {format_duration(remaining / rate)}"
    return "ETA --"


def _percent(done: int, total: int) -> int:
    return 100 if total <= 0 else int(100 * done / total)


class _StatusLine:
    """One changing status line on a stream: redrawn in place on a terminal, else a line now and then."""

    def __init__(self, stream, every_s: float):
        self.stream = stream
        self.tty = _isatty(stream)
        self.interval = REDRAW_S if self.tty else every_s
        self.last = None       # clock time of the last draw (or of the start, off a terminal)
        self.width = 0         # characters on the terminal line now
        self.open = False      # a terminal line is drawn and not yet ended

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

    def __init__(self, label: str, total: int, unit: str = "files", stream=None, every_s: float = 30.0,
                 clock=time.monotonic):
        self.label, self.total, self.unit = label, int(total), unit
        self.clock = clock
        self.line = _StatusLine(sys.stdout if stream is None else stream, every_s)
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
        else:   # the error says what happened: only end a terminal line, no summary
            self.closed = True
            self.line.end()

    def text(self, now: float, final: bool = False) -> str:
        elapsed = now - self.start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        when = _when(final, elapsed, max(0, self.total - self.done), rate, took=f"{elapsed:.1f} s")
        pct = _percent(self.done, self.total)
        if self.line.tty:
            parts = [f"[{self.label}] {_bar(self.done, self.total)} {self.done}/{self.total} {self.unit}",
                     f"{pct:3d}%", f"{rate:.1f} {self.unit}/s", when, self.extra]
            return "  ".join(p for p in parts if p)
        parts = [f"[{self.label}] {self.done}/{self.total} {self.unit} ({pct}%)", f"{rate:.1f} {self.unit}/s",
                 when, self.extra]
        return ", ".join(p for p in parts if p)


class StepProgress(Listener):
    """The optimizer steps inside each epoch, on rank 0 (the caller decides), drawn as the module says.

    On a terminal, one bar per epoch:
      `[epoch   3] [#####...................] 1200/5000  24%  812.3 samples/s  ETA 4m41s`
    ended at the epoch's end with its time taken and a newline. Elsewhere, every `every_s` seconds:
      `[epoch   3] step 1200/5000 (24%), 812.3 samples/s, ETA 4m41s`
    and nothing at the epoch's end (`ProgressPrinter` prints the epoch's line).

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
        self.batch = None      # global batch size, from RunInfo
        self.line = None       # the epoch's status line
        self.epoch = 0
        self.epoch_start = None
        self.first = None      # (step, clock) of the first step seen in the epoch
        self.step = None       # the last StepInfo

    def on_init_stop(self, info, site):
        self.batch = info.global_batch_size

    def on_epoch_start(self, epoch, site):
        self._end()
        self.epoch, self.first, self.step = epoch, None, None
        self.epoch_start = self.clock()
        self.line = _StatusLine(self.stream, self.every_s)

    def on_step(self, step, site):
        now = self.clock()
        if self.line is None:     # steps without an epoch start (not from the trainer): still draw
            self.on_epoch_start(step.epoch, site)
        self.step = step
        if self.first is None:
            self.first = (step.step, now)
            self.line.start(now)
        if self.line.due(now):
            self.line.draw(self.text(now), now)

    def on_epoch_stop(self, epoch, train, site):
        self._end(final=True)

    def on_eval_start(self, epoch, site):
        self._end()

    def on_run_stop(self, status, epoch, checkpoint, failure, site):
        self._end()   # stopped mid-epoch: end the bar before the run's last line

    def _end(self, final: bool = False) -> None:
        if self.line is not None:
            text = self.text(self.clock(), final=True) if final and self.step is not None and self.line.tty else None
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
        when = _when(final, now - self.epoch_start, s.steps_per_epoch - s.step, steps_per_s)
        pct = _percent(s.step, s.steps_per_epoch)
        if self.line.tty:
            return (f"[epoch {self.epoch:3d}] {_bar(s.step, s.steps_per_epoch)} {s.step}/{s.steps_per_epoch} "
                    f"{pct:3d}%  {speed}  {when}")
        return f"[epoch {self.epoch:3d}] step {s.step}/{s.steps_per_epoch} ({pct}%), {speed}, {when}"


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
