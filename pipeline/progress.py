"""Progress on stderr while the job runs: a bar per long phase (rate, ETA) on a terminal,
plain throttled lines otherwise.

Off until ``enable()`` (the CLI and ``pipeline.run_job`` call it): inside a user's own
pipeline the steps print nothing.

Why module state: the local runner executes every DoFn in this process, so one
tally per stage gives whole-job progress; on a distributed runner each worker
logs its own share (and Beam counters carry the totals). The portable runner's worker
processes forward their calls to the launcher (``FORWARD_ENV``), which replays them
into its one tally (``pipeline.runners.portable``).

A stage is counted in units (read units, chunks, files, cells: ``tick``) and records,
or stepped to a position (k-means iterations: ``step``); it ends when its units, or
without a unit total its records, reach their total. On a terminal (stderr is a TTY,
``TERM`` is not ``dumb``) each running stage is a bar redrawn in place, at most every
``REDRAW_S`` and every ``TICK_S`` while nothing arrives (so elapsed time moves during
one long unit), and a finished stage's last bar stays in the scrollback; a last line,
``[job] 01:23 elapsed``, keeps moving while Beam moves data between steps and no stage
has anything to count. Otherwise
(a log file, a pipe, a notebook's captured stderr) each stage prints a line at most
every ``INTERVAL_S`` and its last one, as ``[read] 3/16 units done, 786,432 records``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TextIO

INTERVAL_S = 2.0  # plain lines: at most one per stage per interval (and its last one)
REDRAW_S = 0.1  # bars: at most this often, except a stage's start and end
TICK_S = 0.5  # bars: redrawn this often while nothing arrives (elapsed time, ETA)
BAR_WIDTH = 24

_lock = threading.RLock()
_stages: dict[str, _Stage] = {}
_noted: set[str] = set()  # the notes shown in this tally
enabled = False
_stream: TextIO | None = None
_bars = False
_drawn = 0  # live bar lines on the screen below the cursor's line, counting it
_last_draw = 0.0
_ticker: threading.Thread | None = None
_stop = threading.Event()
_started = 0.0  # when enable() was called: the job clock under the bars
_wrapped: TextIO | None = None  # sys.stderr as it was before bars routed it above them
# A worker process whose launcher shows its progress: the file it appends its calls to.
FORWARD_ENV = "TENSORDEDUP_PROGRESS_TO"
_forward_to = os.environ.get(FORWARD_ENV)
_forward_fd: int | None = None


@dataclass
class _Stage:
    name: str
    unit: str
    total: int = 0  # units (tick) or steps (step); 0: unknown
    total_records: int = 0  # 0: unknown
    done: int = 0
    records: int = 0
    stepped: bool = False  # a position (step), not a count of units
    start: float = field(default_factory=time.monotonic)
    last: float = 0.0  # when it last changed
    shown: float = 0.0  # when its last plain line was printed
    finished: bool = False
    closed: bool = False  # its last line or bar is printed: later updates are not shown

    def check_finished(self) -> bool:
        if not self.finished:
            self.finished = bool((self.total and self.done >= self.total) or (
                not self.total and self.total_records and self.records >= self.total_records))
        return self.finished

    def fraction(self) -> float | None:
        if self.total_records:  # records move more smoothly than units
            return min(self.records / self.total_records, 1.0)
        if self.total:
            return min(self.done / self.total, 1.0)
        return None

    def line(self) -> str:
        """The plain line (no terminal)."""
        if self.stepped:
            return f"[{self.name}] {self.done:,}/{self.total:,}"
        records = f"{self.records:,}" + (f"/{self.total_records:,}" if self.total_records else "")
        if self.total_records and not self.total:
            return f"[{self.name}] {records} records"
        of = f"/{self.total}" if self.total else ""
        return f"[{self.name}] {self.done}{of} {self.unit} done, {records} records"

    def bar(self, width: int, now: float, fill: str, empty: str) -> str:
        """``[read]  62%|█████     | 620,000/1,000,000 records [00:06<00:04, 95,000 records/s]``;
        without a total, no bar or ETA, and the clock stops at its last change."""
        f = self.fraction()
        elapsed = max((now if f is not None else self.last or now) - self.start, 1e-9)
        if self.stepped:
            count = f"{self.done:,}/{self.total:,}"
        elif self.total_records:
            count = f"{self.records:,}/{self.total_records:,} records" + (
                f" ({self.done:,}/{self.total:,} {self.unit})" if self.total else "")
        else:
            of = f"/{self.total:,}" if self.total else ""
            count = f"{self.done:,}{of} {self.unit}" + (f", {self.records:,} records"
                                                        if self.records else "")
        if self.records:
            rate = f"{self.records / elapsed:,.0f} records/s"
        else:
            per_s = self.done / elapsed
            rate = (f"{per_s:,.{2 if per_s < 10 else 0}f}" if self.done else "?") + (
                f" {'it' if self.stepped else self.unit}/s")
        timing = _clock(elapsed)
        if f is not None:
            left = None if f <= 0 else elapsed * (1 - f) / f
            timing += f"<{'?' if left is None else _clock(left)}"
        head = f"[{self.name}] "
        tail = f" {count} [{timing}, {rate}]"
        if f is None:
            return _fit(head + tail.lstrip(), width)
        cells = max(0, min(BAR_WIDTH, width - len(head) - len(tail) - 7))
        full = f * cells
        bar = fill * int(full) + (fill if full - int(full) >= 0.5 else "")
        bar = bar[:cells].ljust(cells, empty)
        return _fit(f"{head}{f * 100:3.0f}%|{bar}|{tail}", width)


def _clock(seconds: float) -> str:
    s = int(seconds + 0.5)
    h, rest = divmod(s, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60:02d}:{rest % 60:02d}"


def _fit(text: str, width: int) -> str:
    """One screen line: a line that wraps would break redrawing in place."""
    return text if len(text) < width else text[:max(width - 2, 1)] + "…"


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty() and os.environ.get("TERM", "") != "dumb"
    except (AttributeError, ValueError):  # closed, or not a real stream
        return False


def _width() -> int:
    """The terminal's columns (``COLUMNS`` first, as ``shutil.get_terminal_size``); 100
    when it does not say (a pseudo-terminal nobody sized)."""
    try:
        columns = int(os.environ.get("COLUMNS", 0)) or os.get_terminal_size(
            _stream.fileno()).columns
    except (AttributeError, ValueError, OSError):
        columns = 0
    return columns if columns > 0 else 100


def enable(show: bool = True, *, stream: TextIO | None = None, bars: bool | None = None
           ) -> None:
    """Start a new tally; from now on show progress when ``show`` (else nothing), on
    ``stream`` (default: stderr now), as bars when it is a terminal (``bars``: force
    either way; the CLI turns bars off with ``--verbose``, whose log lines would break
    them). Stages still on screen from an earlier tally are finished first."""
    global enabled, _stream, _bars, _ticker, _started, _wrapped
    close()
    with _lock:
        _stages.clear()
        _noted.clear()
        enabled, _started = show, time.monotonic()
        _stream = stream if stream is not None else sys.stderr
        _bars = show and (_is_terminal(_stream) if bars is None else bars)
        if _bars:
            if _stream is sys.stderr:  # other writes to stderr go above the bars
                _wrapped, sys.stderr = sys.stderr, _AboveBars(sys.stderr)
            _stop.clear()
            _ticker = threading.Thread(target=_tick_screen, name="tensordedup-progress",
                                       daemon=True)
            _ticker.start()


def close() -> None:
    """Leave the screen tidy: running stages print their last bar or line, the redraw
    thread stops. Progress stays on or off as it was."""
    global _ticker, _wrapped
    ticker, _ticker = _ticker, None
    if ticker is not None:
        _stop.set()
        ticker.join()
    with _lock:
        if _wrapped is not None:
            if isinstance(sys.stderr, _AboveBars):
                sys.stderr.flush_line()
                sys.stderr = _wrapped
            _wrapped = None
        if not enabled or _stream is None:
            return
        live = [s for s in _stages.values() if not s.closed]
        for s in live:
            s.finished = s.closed = True
        if _bars:
            now = time.monotonic()
            _draw([s.bar(_width(), now, *_glyphs()) for s in live], [])
        else:
            for s in live:
                if s.done or s.records:
                    _print(s.line())


class _AboveBars:
    """sys.stderr while bars are drawn: whole lines written by anyone else (a warning,
    a library's print) go above the bars, which are redrawn below them."""

    def __init__(self, stream: TextIO) -> None:
        self._stream, self._partial = stream, ""

    def write(self, text: str) -> int:
        with _lock:
            *lines, self._partial = (self._partial + text).split("\n")
            if lines:
                _redraw(lines, force=True)
        return len(text)

    def flush_line(self) -> None:
        if self._partial:
            _redraw([self._partial], force=True)
            self._partial = ""

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _tick_screen() -> None:
    while not _stop.wait(TICK_S):
        with _lock:
            _redraw([])


def _glyphs() -> tuple[str, str]:
    encoding = (getattr(_stream, "encoding", None) or "").lower().replace("-", "")
    return ("█", " ") if encoding.startswith("utf") else ("#", "-")


def _print(line: str) -> None:
    try:
        print(line, file=_stream, flush=True)
    except (OSError, ValueError):  # stderr closed under us: progress is not worth an error
        pass


def _draw(permanent: list[str], live: list[str]) -> None:
    """Replace the live bars with ``permanent`` lines (kept) and then ``live`` bars.
    Called under ``_lock``."""
    global _drawn, _last_draw
    out = []
    if _drawn:  # back to the first live line, and clear from there down
        out.append("\r" + (f"\x1b[{_drawn - 1}A" if _drawn > 1 else "") + "\x1b[J")
    out += [line + "\n" for line in permanent]
    out.append("\n".join(live))
    _drawn, _last_draw = len(live), time.monotonic()
    try:
        _stream.write("".join(out))
        _stream.flush()
    except (OSError, ValueError):
        pass


def _redraw(permanent: list[str], force: bool = False) -> None:
    """Bars: finished stages move to the scrollback, running ones are redrawn (at most
    every REDRAW_S unless ``force`` or there is a line to keep). Under ``_lock``."""
    now = time.monotonic()
    done = [s for s in _stages.values() if s.finished and not s.closed]
    if not (force or permanent or done) and now - _last_draw < REDRAW_S:
        return
    width, glyphs = _width(), _glyphs()
    for s in done:
        s.closed = True
    kept = [s.bar(width, now, *glyphs) for s in done] + permanent
    live = [s.bar(width, now, *glyphs) for s in _stages.values() if not s.closed]
    # the job's clock: it moves while Beam moves data between steps (no stage counts then)
    _draw(kept, [*live, _fit(f"[job] {_clock(now - _started)} elapsed", width)])


def _update(stage: _Stage, new: bool) -> None:
    """Show the stage's change: a bar redraw, or its plain line when due. Under _lock."""
    if stage.closed:  # its last line is out (records reached their total before the
        return        # last unit's tick, say)
    now = stage.last = time.monotonic()
    finished = stage.check_finished()
    if _bars:
        _redraw([], force=new)
    elif (now - stage.shown >= INTERVAL_S or finished) and (stage.done or stage.records):
        stage.shown, stage.closed = now, finished
        _print(stage.line())


def _stage(name: str, unit: str, total: int, total_records: int) -> tuple[_Stage, bool]:
    stage = _stages.get(name)
    if stage is None:
        stage = _stages[name] = _Stage(name, unit, total, total_records)
        return stage, True
    stage.total = stage.total or total
    stage.total_records = stage.total_records or total_records
    return stage, False


def _forwarded(call: str, *args) -> None:
    """In a worker process whose launcher shows its progress: the call appended to the
    launcher's file as one JSON line, in one write to a file opened O_APPEND (lines from
    several workers never interleave)."""
    global _forward_fd
    if _forward_to is None:
        return
    with _lock:
        try:
            if _forward_fd is None:
                _forward_fd = os.open(_forward_to, os.O_WRONLY | os.O_APPEND)
            os.write(_forward_fd, (json.dumps([call, *args]) + "\n").encode())
        except OSError:  # the launcher is gone: progress is not worth an error
            pass


def replay(line: str) -> None:
    """Show a call a worker process forwarded (``_forwarded``) in this process's tally."""
    call, *args = json.loads(line)
    if call == "tick":
        stage, total, records, unit, units, total_records = args
        tick(stage, total, records, unit, units=units, total_records=total_records)
    elif call == "step":
        step(*args)
    else:
        note(*args)


def tick(stage: str, total: int, records: int, unit: str, *, units: int = 1,
         total_records: int = 0) -> None:
    """Count ``units`` finished ``unit``s (chunks, files, cells) of ``total`` (0: unknown)
    holding ``records`` records, of ``total_records`` (0: unknown). ``units=0`` counts
    records within a unit (a chunk of a read unit); ``units=0, records=0`` starts the
    stage's clock before its first unit is done."""
    if not enabled:
        _forwarded("tick", stage, total, records, unit, units, total_records)
        return
    with _lock:
        s, new = _stage(stage, unit, total, total_records)
        s.done += units
        s.records += records
        _update(s, new)


def step(stage: str, done: int, total: int) -> None:
    """A long single-worker step at ``done`` of ``total`` (k-means iterations)."""
    if not enabled:
        _forwarded("step", stage, done, total)
        return
    with _lock:
        s, new = _stage(stage, "it", total, 0)
        s.stepped, s.done = True, max(s.done, done)
        _update(s, new)


def note(line: str) -> None:
    """One line about the job (a choice it made, what it will cost), shown once per
    tally: a step that runs again (Dask recomputes a lost worker's steps) says it again."""
    if not enabled:
        _forwarded("note", line)
        return
    with _lock:
        if line in _noted:
            return
        _noted.add(line)
        if _bars:
            _redraw([line], force=True)
        else:
            _print(line)
