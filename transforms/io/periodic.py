"""Call a function every few seconds from a background thread while a block runs.

Why a context manager: the thread is stopped and joined when the block ends, so none is
left running at interpreter exit (a daemon thread woken during shutdown can abort the
process, which a scheduler reads as a failed run)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def every(seconds: float, fn: Callable[[], None], name: str) -> Iterator[None]:
    """Run ``fn()`` every ``seconds`` (first after one period) until the block ends."""
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(seconds):
            fn()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
