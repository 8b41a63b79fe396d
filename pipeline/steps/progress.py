"""Progress lines on stderr while the job runs (records read, chunks and files done).

Off until ``enable()`` (the CLI calls it): inside a user's own pipeline the steps
print nothing.

Why module state: the local runner executes every DoFn in this process, so one
tally per stage gives whole-job progress; on a distributed runner each worker
logs its own share (and Beam counters carry the totals).
"""

from __future__ import annotations

import sys
import threading
import time

INTERVAL_S = 2.0

_lock = threading.Lock()
_stages: dict[str, list[float]] = {}
enabled = False


def enable(show: bool = True) -> None:
    """Start a new tally; print progress lines from now on when ``show``."""
    reset(show)


def reset(show: bool = True) -> None:
    global enabled
    with _lock:
        _stages.clear()
        enabled = show


def _due(state: list, final: bool) -> bool:
    """Whether a stage's line is due (at most one per INTERVAL_S, and its last one); marks
    the time it was shown. Called under ``_lock``."""
    now = time.monotonic()
    show = enabled and (now - state[2] >= INTERVAL_S or final)
    if show:
        state[2] = now
    return show


def tick(stage: str, total: int, records: int, unit: str) -> None:
    """Count one finished ``unit`` (chunk, file) of ``total`` (0: unknown) with ``records``
    records."""
    with _lock:
        state = _stages.setdefault(stage, [0, 0, 0.0])
        state[0] += 1
        state[1] += records
        done, count = state[0], state[1]
        show = _due(state, done == total)
    if show:
        of = f"/{total}" if total else ""
        print(f"[{stage}] {int(done)}{of} {unit} done, {int(count):,} records",
              file=sys.stderr, flush=True)


def step(stage: str, done: int, total: int) -> None:
    """A long single-worker step at ``done`` of ``total`` (k-means iterations, rows)."""
    with _lock:
        show = _due(_stages.setdefault(stage, [0, 0, 0.0]), done == total)
    if show:
        print(f"[{stage}] {done:,}/{total:,}", file=sys.stderr, flush=True)


def note(line: str) -> None:
    """One line about the job (a choice it made, what it will cost)."""
    if enabled:
        print(line, file=sys.stderr, flush=True)
