"""Reading ahead: the next pieces of a file are read in other threads while the caller
works on the one it holds.

Why: Arrow releases the GIL while it reads and decodes, so reads overlap the caller's
Python (hashing, filtering, encoding) and each other. On the exact job's two passes
over Parquet, decoding is the slowest part: one reader thread kept the first pass
waiting (10 M x 128 float32: 4.2 s of decoding in 5.3 s), two keep up with it.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
DEPTH = 2  # pieces being read while the caller works on one (memory: DEPTH + 1 pieces)
_END = object()
_depth = DEPTH  # what ``depth()`` says now: ``at_once`` lowers it for a while


def depth() -> int:
    """Pieces to read at once ahead of a caller, process-wide (``at_once``)."""
    return _depth


@contextlib.contextmanager
def at_once(n: int) -> Iterator[None]:
    """Read at most ``n`` pieces at once ahead of each caller while the block runs (the
    local runner's parallel workers: they use the cores and memory already)."""
    global _depth
    was, _depth = _depth, n
    try:
        yield
    finally:
        _depth = was


def ahead(items: Iterator[T]) -> Iterator[T]:
    """The items of a source that must be read in order (one reader: Arrow's batch
    iterator), the next one produced in a second thread while the caller works."""
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(next, items, _END)
        while (item := pending.result()) is not _END:
            pending = pool.submit(next, items, _END)
            yield item


def in_order(tasks: Iterable[Callable[[], T]], depth: int = DEPTH) -> Iterator[T]:
    """Each task's result, in the tasks' order, with up to ``depth`` tasks running ahead
    of the caller (tasks must not share a reader: each thread opens its own)."""
    with ThreadPoolExecutor(depth) as pool:
        pending: deque = deque()
        for task in tasks:
            pending.append(pool.submit(task))
            if len(pending) > depth:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
