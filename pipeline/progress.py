"""Progress lines on stderr while the job runs (records read, chunks and files done).

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
enabled = True


def reset(show: bool = True) -> None:
    global enabled
    with _lock:
        _stages.clear()
        enabled = show


def tick(stage: str, total: int, records: int, unit: str) -> None:
    """Count one finished ``unit`` (chunk, file) of ``total`` with ``records`` records."""
    with _lock:
        done, count, last = _stages.setdefault(stage, [0, 0, 0.0])
        done, count, now = done + 1, count + records, time.monotonic()
        show = enabled and (now - last >= INTERVAL_S or done == total)
        _stages[stage] = [done, count, now if show else last]
    if show:
        print(f"[{stage}] {int(done)}/{total} {unit} done, {int(count):,} records",
              file=sys.stderr, flush=True)
