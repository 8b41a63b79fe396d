"""Remote filesystems in the checks: every call bounded in time, every failure one line.

Why: a remote filesystem without network or credentials does not fail: its client
retries for minutes. Every remote call here runs in a daemon thread (the process can
still exit while one hangs) and is given tuning.remote_timeout_s to answer; files are
inspected by REMOTE_WORKERS threads at once, each call bounded on its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

from apache_beam.io.filesystem import BeamIOError

from transforms.io import fs
from transforms.io.formats.base import InputError, error_line

T = TypeVar("T")
R = TypeVar("R")

REMOTE_WORKERS = 8


# how each object store's credentials are given (gcloud's advice was printed for s3://)
_CREDENTIALS = {"gs": "gcloud auth application-default login",
                "s3": "AWS credentials, or Beam's --s3_* options after --"}


def _remote_fix(key: str, path: str = "", error: BaseException | None = None) -> str:
    if isinstance(error, ImportError):
        return (f"install what the message names to read {path.partition('://')[0]}:// "
                f"paths, or --set {key}=<a local path>")
    how = _CREDENTIALS.get(path.partition("://")[0], "that filesystem's credentials")
    return (f"check the network and the credentials ({how}; tuning.remote_timeout_s sets "
            f"the wait), or, for an offline --dry-run, --set {key}=<a local path>")


def _inner(e: BaseException) -> BaseException:
    """The real error: Beam's BeamIOError wraps one per path."""
    inner = list(getattr(e, "exception_details", None) or {})
    return e.exception_details[inner[0]] if isinstance(e, BeamIOError) and inner else e


def _reason(e: BaseException) -> str:
    """A filesystem error as one line."""
    return error_line(_inner(e))


def each_bounded(items: Sequence[str], fn: Callable[[str], R], key: str, what: str,
                 timeout: float, fix: str | None = None) -> list[R]:
    """``[fn(p) for p in items]``; remote paths in parallel, each answer awaited at most
    ``timeout`` seconds. A timeout or an error (other than an InputError, which is
    already one line) becomes one InputError naming the path, what failed and the fix
    (``fix``, or the network, credentials and a local path for a dry run)."""
    given = fix
    if all(fs.is_local(p) for p in items):
        return [fn(p) for p in items]
    results: list = [None] * len(items)
    done = [threading.Event() for _ in items]
    lock, todo = threading.Lock(), iter(range(len(items)))

    def work() -> None:
        while True:
            with lock:
                i = next(todo, None)
            if i is None:
                return
            try:
                results[i] = (True, fn(items[i]))
            except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
                results[i] = (False, e)
            done[i].set()

    for _ in range(min(REMOTE_WORKERS, len(items))):
        threading.Thread(target=work, daemon=True, name="preflight-remote").start()
    out = []
    for i, path in enumerate(items):
        if not done[i].wait(timeout):
            fix = given or _remote_fix(key, path)
            raise InputError(f"{key}: {path}: no answer within {timeout:g} s ({what}): {fix}")
        ok, value = results[i]
        if not ok:
            if isinstance(value, InputError):
                raise value
            fix = given or _remote_fix(key, path, _inner(value))
            raise InputError(f"{key}: {path}: {what} failed ({_reason(value)}): {fix}"
                             ) from None
        out.append(value)
    return out


def bounded(path: str, fn: Callable[[str], T], key: str, what: str, timeout: float,
            fix: str | None = None) -> T:
    """``fn(path)``, bounded like ``each_bounded`` when ``path`` is remote."""
    return each_bounded([path], fn, key, what, timeout, fix)[0]

