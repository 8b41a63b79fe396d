"""Ctrl-C and SIGTERM: a job stops within seconds, whatever it is doing, and leaves no
process, staging directory, lease or temporary file behind.

Why a module of its own: Python runs a signal handler only when its main thread runs
Python code, and a job's main thread mostly waits inside C code or on threads that wait
on worker processes. Beam's local runner joins the thread that waits on each worker
process with no timeout, and a worker waits on its control stream: with the interrupt
raised in the launcher's main thread alone, the command did not exit for 857 s
(issue 41). So, while ``handled`` is active:

- the signal's C handler writes its number to a pipe (``signal.set_wakeup_fd``), which a
  watcher thread reads at once, even while the main thread waits in C code;
- on the first signal the watcher kills every process the job started (its children at
  any depth, found with psutil: local worker processes, the portable runner's services
  and their workers, a Dask cluster's workers), so that the waits on them end, and the
  main thread gets ``KeyboardInterrupt`` (SIGTERM: ``Terminated``, a subclass) and
  unwinds through the job's own cleanups;
- the cleanups are ``pending`` blocks: each runs once, at its block's end or, when the
  command has not ended ``GRACE_S`` after the signal (or at a second signal, at once),
  from the watcher, which then prints the one line and ends the process.

A library caller (``run_job``) keeps its process: no deadline ends it, and handlers it
had installed (a scheduler's SIGTERM handler) still run after the children are killed.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator

GRACE_S = 3.0  # from the first signal to the end of a command that has not unwound
CLEANUP_S = 0.8  # what the watcher gives the pending cleanups before it ends the process
SWEEP_S = 0.1  # how often the watcher kills processes started after the first sweep
EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}
_NAMES = {signal.SIGINT: "interrupted", signal.SIGTERM: "stopped by SIGTERM"}


LAUNCHER_ENV = "TENSORDEDUP_LAUNCHER"  # the launcher's process id, for its local workers
PARENT_POLL_S = 0.2  # how often a started process looks whether its launcher is still there


def on_parent_gone(parent: int, then: Callable[[], object]) -> None:
    """Call ``then`` from a daemon thread once ``parent`` is no longer this process's
    parent. A launcher killed with SIGKILL (the OOM killer, ``kill -9``, a scheduler's
    last resort) runs no code, so what it started must notice by itself: local worker
    processes waited up to 2 minutes on their gRPC stream, holding their memory."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        then()

    threading.Thread(target=watch, name="tensordedup-parent", daemon=True).start()


def ends_with_launcher() -> None:
    """A local worker process (``LAUNCHER_ENV`` set) ends once its launcher is gone.
    Called before the worker imports Beam and the project: those imports take seconds on
    a busy machine, and a worker started just before its launcher was killed outright
    outlived it by that long (CI, 2 cores under load)."""
    if LAUNCHER_ENV in os.environ:
        on_parent_gone(int(os.environ[LAUNCHER_ENV]), lambda: os._exit(1))


class Terminated(KeyboardInterrupt):
    """SIGTERM in the main thread: unwinds like Ctrl-C (nothing published)."""


_published: str | None = None  # what a job stopped while publishing had published


def published(what: str) -> None:
    """The job was stopped after its Publish began replacing the output: the stop's line
    says ``what`` it published, not that nothing was."""
    global _published
    _published = what


def line(signum: int) -> str:
    """The one line a stopped job prints."""
    if _published is not None:
        return f"{_NAMES.get(signum, 'stopped')}: {_published}"
    return (f"{_NAMES.get(signum, 'stopped')}: nothing was published (earlier outputs are "
            "unchanged); run the same command again to redo the job")


def exit_code(signum: int | None) -> int:
    """130 for SIGINT (and a KeyboardInterrupt raised without a signal), 143 for SIGTERM."""
    return EXIT_CODES.get(signum, 130)


_said = threading.Lock()


def stopped(say: Callable[[str], None] | None = None) -> int:
    """Prints the stopped job's line (once per process, whichever thread gets here
    first: the main thread's unwinding or the watcher) and returns the exit code."""
    signum = _Watcher.signalled
    if _said.acquire(blocking=False):
        (say or _stderr)(line(signum if signum is not None else signal.SIGINT))
    return exit_code(signum)


def _stderr(text: str) -> None:
    """To the process's stderr as it was before a stop silenced it (``quiet``)."""
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    fd = _Watcher.stderr_fd if _Watcher.stderr_fd is not None else sys.stderr.fileno()
    os.write(fd, (text + "\n").encode())


_verbose = False


def verbose(on: bool) -> None:
    """``--verbose``: a stop keeps what the job's threads and libraries print as they
    go down (the default silences it: the stop is one line)."""
    global _verbose
    _verbose = on


_WORKER_EXIT = re.compile(r"Worker subprocess exited with return code (-?\d+)")
_lost: list[int] = []  # return codes of local worker processes that ended under the job


WORKER_GONE = "a worker process ended while the job ran (its control stream closed)"
# what the job's error says when a worker's connection ended: the runners' requests to a
# worker whose control stream closed (WORKER_GONE), Beam's data plane ("Channel closed
# prematurely.", the portable runner's pool)
_CONNECTION_LOST = re.compile(re.escape(WORKER_GONE) + r"|Channel closed prematurely")


def lost_worker(error: str = "") -> str | None:
    """What ended a worker process under the job, for the failure's line (the job's own
    error is then only the end of a stream: "Empty", "Channel closed prematurely"), or
    None: the local runner's worker's exit code or signal where Beam said it, else
    whether ``error`` says a worker's connection ended."""
    if _lost:
        code = _lost[0]
        how = f"exit code {code}"
        if code < 0:
            try:
                how = f"signal {-code}, {signal.Signals(-code).name}"
            except ValueError:
                how = f"signal {-code}"
        if code == -signal.SIGKILL:
            how += ": out of memory, or killed from outside"
    elif _CONNECTION_LOST.search(error):
        how = "its connection closed: out of memory, or killed from outside"
    else:
        return None
    return (f"a worker process of the job ended under it ({how}): run again (with fewer "
            "runner.workers, or more memory, if it was memory)")


class _Cleanups:
    """The pending cleanups, each run once: by its block or by the watcher."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[int, Callable[[], None]] = {}
        self._next = 0

    def add(self, fn: Callable[[], None]) -> int:
        with self._lock:
            self._next += 1
            self._items[self._next] = fn
            return self._next

    def take(self, key: int) -> Callable[[], None] | None:
        with self._lock:
            return self._items.pop(key, None)

    def take_all(self) -> list[Callable[[], None]]:
        with self._lock:
            items = [self._items.pop(k) for k in sorted(self._items, reverse=True)]
        return items


_cleanups = _Cleanups()
_state = threading.local()


@contextlib.contextmanager
def pending(cleanup: Callable[[], None]) -> Iterator[None]:
    """Run ``cleanup`` when the block ends, however it ends, or from the watcher when a
    stopped command must end before the block does: exactly once either way."""
    key = _cleanups.add(cleanup)
    try:
        yield
    finally:
        fn = _cleanups.take(key)
        if fn is not None:
            fn()


def _run_pending(limit_s: float) -> None:
    """The cleanups no block has run, newest first, in a thread given ``limit_s``."""
    def run() -> None:
        for fn in _cleanups.take_all():
            with contextlib.suppress(Exception):
                fn()

    t = threading.Thread(target=run, name="tensordedup-cleanup", daemon=True)
    t.start()
    t.join(limit_s)


def _descendants(exclude: set[int]) -> list:
    """This process's children at any depth, but those in ``exclude`` and theirs."""
    import psutil

    try:
        kids = psutil.Process().children()
    except psutil.Error:
        return []
    out = []
    for k in kids:
        if k.pid in exclude:
            continue
        out.append(k)
        with contextlib.suppress(psutil.Error):
            out.extend(k.children(recursive=True))
    return out


def kill_started(exclude: set[int]) -> int:
    """SIGKILL to every process this one started since ``exclude`` was taken (their own
    children first found, so none is left re-parented); returns how many."""
    import psutil

    procs = _descendants(exclude)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
    return len(procs)


def children() -> set[int]:
    """The pids of this process's children now (left alone by a stop)."""
    import psutil

    try:
        return {c.pid for c in psutil.Process().children()}
    except psutil.Error:
        return set()


def stopping() -> int | None:
    """The signal that is stopping the job in this process, or None."""
    return _Watcher.signalled


class _Watcher:
    """The thread that acts on the signals as soon as they arrive."""

    signalled: int | None = None
    stderr_fd: int | None = None  # the real stderr, once a stop has silenced fd 2

    def __init__(self, exits: bool, keep: set[int], say: Callable[[str], None] | None):
        self.exits, self.keep, self.say = exits, keep, say
        self.read, self.write = os.pipe()
        os.set_blocking(self.write, False)
        self.count, self.once = 0, threading.Lock()
        self.thread = threading.Thread(target=self._run, name="tensordedup-signals",
                                       daemon=True)
        self.thread.start()

    def _run(self) -> None:
        deadline = None
        while True:
            wait = SWEEP_S if deadline is not None else None
            ready = _readable(self.read, wait)
            if ready:
                data = os.read(self.read, 64)
                if not data or 0 in data:  # the block ended
                    return
                for signum in data:
                    if signum in EXIT_CODES:
                        self._signal(signum)
                if self.count and deadline is None:
                    deadline = time.monotonic() + GRACE_S
                if self.count > 1 and self.exits:
                    self._end()
            if deadline is not None:
                kill_started(self.keep)  # again: a Dask nanny restarts its workers
                if self.exits and time.monotonic() >= deadline:
                    self._end()

    def _signal(self, signum: int) -> None:
        self.count += 1
        self.first(signum)

    def first(self, signum: int) -> None:
        """The stop's first acts, by whichever thread sees the signal first (the main
        thread's handler runs before it unwinds anything: Dask's result cancels its
        tasks as it goes, and their workers would say so on the terminal)."""
        if self.once.acquire(blocking=False):  # never released; never waited for (a
            _Watcher.signalled = signum  # handler that waited on it in the main thread,
            if self.exits and not _verbose:  # re-entered by a second signal, deadlocked)
                _silence_stderr()
        kill_started(self.keep)

    def _end(self) -> None:
        """The command ends now: what is left to clean, the line, the exit code."""
        _run_pending(CLEANUP_S)
        code = stopped(self.say)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self.write, b"\0")
        self.thread.join()
        os.close(self.read)
        os.close(self.write)


def _silence_stderr() -> None:
    """What this process (its threads, the libraries going down with the job: Dask's
    nanny, asyncio, Beam's threads) and the processes it starts from now on write to
    stderr goes nowhere; the stop's line goes to the real stderr (``_stderr``)."""
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    try:
        _Watcher.stderr_fd = os.dup(2)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)
    except OSError:  # no fd 2 (a daemon): nothing to silence
        _Watcher.stderr_fd = None


def _readable(fd: int, timeout: float | None) -> bool:
    import select

    return bool(select.select([fd], [], [], timeout)[0])


@contextlib.contextmanager
def while_importing(active: bool) -> Iterator[None]:
    """The command's imports, before ``handled`` (Beam's take seconds, when a user's first
    Ctrl-C comes: "oops, wrong config"): SIGINT or SIGTERM ends the process at once with
    the stop's one line and exit code (nothing was started or written yet), not with a
    KeyboardInterrupt traceback through the module being imported. ``active`` False (a
    library's import of the module): nothing changes. Signals ignored (nohup) stay so."""
    if not active or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in EXIT_CODES}

    def on_signal(signum: int, frame) -> None:
        _stderr(line(signum))
        os._exit(exit_code(signum))

    for s, before in previous.items():
        if before is not signal.SIG_IGN:
            signal.signal(s, on_signal)
    try:
        yield
    finally:
        for s, before in previous.items():
            signal.signal(s, before)


@contextlib.contextmanager
def handled(*, exits: bool, say: Callable[[str], None] | None = None) -> Iterator[None]:
    """SIGINT and SIGTERM stop the job inside the block (main thread only; elsewhere the
    block changes nothing). ``exits``: this is the command's process, which a stop ends
    (GRACE_S after the first signal at the latest, at once after a second one), printing
    ``say(line)`` (``stopped``); a library caller's process is never ended by it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    watcher = _Watcher(exits, children(), say)
    previous = {s: signal.getsignal(s) for s in EXIT_CODES}

    def on_signal(signum: int, frame) -> None:
        watcher.first(signum)
        before = previous.get(signum)
        if callable(before) and before is not signal.default_int_handler:
            before(signum, frame)  # e.g. a scheduler's own SIGTERM handler
        if signum == signal.SIGTERM:
            raise Terminated()
        raise KeyboardInterrupt()

    global _said, _published
    _Watcher.signalled, _Watcher.stderr_fd, _said = None, None, threading.Lock()
    _published = None
    excepthook = threading.excepthook
    _lost.clear()

    def quiet_when_stopping(args) -> None:
        # the threads that waited on the killed processes raise as they go (Beam's
        # "Worker subprocess exited with return code -9", gRPC's streams): the stop is
        # the one line; a worker that died under a running job is kept for the failure's
        # line (``lost_worker``), its threads' tracebacks only with --verbose
        died = _WORKER_EXIT.search(str(args.exc_value))
        if died:
            _lost.append(int(died.group(1)))
        ours = died or type(args.exc_value).__module__.split(".")[0] == "grpc"
        if _Watcher.signalled is None and (_verbose or not ours):
            excepthook(args)

    old_fd = signal.set_wakeup_fd(watcher.write, warn_on_full_buffer=False)
    threading.excepthook = quiet_when_stopping
    try:
        for s in EXIT_CODES:
            if previous[s] is not signal.SIG_IGN:  # nohup and friends keep their choice
                signal.signal(s, on_signal)
        yield
    finally:
        for s, before in previous.items():
            signal.signal(s, before)
        signal.set_wakeup_fd(old_fd)
        watcher.close()
        threading.excepthook = excepthook
