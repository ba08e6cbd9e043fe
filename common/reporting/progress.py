"""A count going up towards a total, drawn on a stream: files staged, universes prepared, samples written.

Two ways to show it, chosen by the stream:
  - a terminal (`stream.isatty()`): one bar redrawn in place with '\\r', at most
    10 times a second, ended with a newline;
  - anything else (a SLURM output file, a pipe, a test's list): one plain line
    every `every_s` seconds, flushed, so that `tail -f` shows the work is alive
    without filling the file.
`Progress` draws any count; common.reporting.console draws a run's optimizer steps the same way.
"""

import sys
import time

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
