"""One writer at a time: an exclusive lease on an output directory, a report directory or
a fingerprint store, taken before a run deletes or writes anything there.

Why: two runs on one output (a cron job overlapping a manual rerun) cleared each other's
staging, deleted each other's summary.json and committed to one store without seeing each
other's records. A lease is one small JSON object created with create-if-absent
(``conditional.create_exclusive``: link(2) locally, a generation precondition on gs://), so of two
runs exactly one gets it; the other is refused with one line naming the holder.

Stale rule (a holder that crashed must not block the next run forever):

- every lease has an expiry; a lease past it is stale. The holder renews it every
  ``TTL_S / 4`` while it runs (``keep_alive``), so only a holder that stopped for a whole
  ``TTL_S`` loses it;
- a lease taken on this host by a process that no longer exists (same host name, pid
  gone, or reused by another process: its start time differs) is stale at once;
- a *detached* lease (a Dataflow job, where the launcher exits after submitting and the
  job's Publish step releases the lease) is stale only by expiry (``DETACHED_TTL_S``), as
  no process on this host stands for it. A launcher takes its leases bound to its pid
  like any run and detaches them (``Lease.detach``) only once the job is submitted, so a
  launcher killed before that (SIGKILL, a scheduler's timeout) blocks nothing.

A stale lease is broken with a compare-and-swap (``conditional.replace_if_unchanged``): only the
exact stale content is deleted, so two runs breaking one stale lease cannot both win. A
user can break a lease by hand by deleting its file (the refusal names it).

This module is plain functions over ``transforms.io.fs``: no Beam pipeline involved, so the
driver, a worker's Publish step and tests use the same code.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone

from transforms.io import conditional, fs, periodic
from transforms.io.owner import HOST, alive, start_time

TTL_S = 600.0  # a lease nobody renews for this long is stale
DETACHED_TTL_S = 24 * 3600.0  # a lease handed to a job that runs without its launcher


class LeaseHeld(RuntimeError):
    """Another live run holds the lease: the message is one line naming it and the way out."""


class LeaseLost(RuntimeError):
    """This run's lease was broken or taken over (it stopped renewing for a whole TTL):
    it must not publish."""


@dataclass(frozen=True)
class Lease:
    """A lease this process took. Only strings and numbers, so Beam ships it to the worker
    that runs Publish, which checks it and (detached runs) releases it."""

    path: str  # the lease object
    target: str  # what it guards (a directory or a store), for messages
    token: str  # unique per acquisition: tells this lease from any later one
    ttl: float
    made: str = ""  # the outermost local folder taking the lease created, else ""

    def holds(self) -> bool:
        """Whether the lease object is still this one (not broken, not released)."""
        found = _read(self.path)
        return found is not None and found[1].get("token") == self.token

    def check(self) -> None:
        """Raise ``LeaseLost`` unless this lease is still held."""
        if not self.holds():
            raise LeaseLost(f"{self.target}: this run's lease {self.path} was broken or "
                            "taken by another run; nothing more is published: run again")

    def renew(self) -> bool:
        """Push the expiry ``ttl`` seconds ahead (never back: a lease detached meanwhile
        keeps its day); False if the lease is no longer ours."""
        found = _read(self.path)
        if found is None or found[1].get("token") != self.token:
            return False
        was = found[1].get("expires")
        until = time.time() + self.ttl
        info = {**found[1], "expires": max(until, was) if isinstance(was, int | float) else until}
        return conditional.replace_if_unchanged(self.path, found[0], _dumps(info))

    def detach(self) -> bool:
        """Hand the lease to a job that runs on without this process (a Dataflow job, once
        submitted): no longer bound to this pid, it expires ``DETACHED_TTL_S`` from now
        unless the job's Publish step releases it first. False if it is no longer ours
        (that Publish may have released it already)."""
        for _ in range(8):  # a renewal in between changed it: read again
            found = _read(self.path)
            if found is None or found[1].get("token") != self.token:
                return False
            info = {**found[1], "detached": True, "expires": time.time() + DETACHED_TTL_S}
            if conditional.replace_if_unchanged(self.path, found[0], _dumps(info)):
                return True
        return False

    def release(self) -> None:
        """Delete the lease object if it is still ours (never someone else's)."""
        found = _read(self.path)
        if found is not None and found[1].get("token") == self.token:
            conditional.replace_if_unchanged(self.path, found[0], None)
        if self.made:  # a run stopped before writing leaves no empty folders behind
            folder = os.path.dirname(os.path.abspath(self.path))
            while True:
                try:
                    os.rmdir(folder)
                except OSError:
                    break  # not empty (the run wrote there, or another run did), or gone
                if folder == self.made:
                    break
                folder = os.path.dirname(folder)


def _missing_top(folder: str) -> str:
    """The outermost missing folder of local path ``folder`` ("" if it exists)."""
    top = ""
    while folder and not os.path.exists(folder):
        top, folder = folder, os.path.dirname(folder)
    return top


def acquire(path: str, target: str, run_id: str, detached: bool = False) -> Lease:
    """Take the lease at ``path`` guarding ``target``, breaking it if stale; raise
    ``LeaseHeld`` if a live run holds it."""
    ttl = DETACHED_TTL_S if detached else TTL_S
    token = secrets.token_hex(16)
    made = _missing_top(os.path.dirname(os.path.abspath(path))) if fs.is_local(path) else ""
    for _ in range(8):  # each round: another run released, or a stale lease was broken
        now = time.time()
        info = {"token": token, "run_id": run_id, "target": target, "host": HOST,
                "pid": os.getpid(), "pid_start": start_time(os.getpid()),
                "started": now, "expires": now + ttl, "detached": detached}
        if conditional.create_exclusive(path, _dumps(info)):
            fs.clear_dead_temps(path)  # what a killed process left while writing beside it
            return Lease(path, target, token, ttl, made)
        found = _read(path)
        if found is None:
            continue  # released since
        if not stale(found[1], now):
            raise LeaseHeld(refusal(path, target, found[1]))
        conditional.replace_if_unchanged(path, found[0], None)  # only the stale content we judged
    raise LeaseHeld(f"{target} is being taken by several runs at once (lease {path}): "
                    "run again once they finish")


def acquire_all(wanted: Sequence[tuple[str, str]], run_id: str, detached: bool = False
                ) -> list[Lease]:
    """Take every (lease path, target) lease, in order, or none (releasing those taken)."""
    leases: list[Lease] = []
    try:
        for path, target in wanted:
            leases.append(acquire(path, target, run_id, detached))
    except BaseException:
        release_all(leases)
        raise
    return leases


def holder(path: str, target: str) -> str | None:
    """``acquire``'s refusal if a live run holds the lease at ``path`` now, else None
    (nothing taken: for a dry run)."""
    found = _read(path)
    return None if found is None or stale(found[1]) else refusal(path, target, found[1])


def detach_all(leases: Sequence[Lease]) -> None:
    for lease in leases:
        lease.detach()


def release_all(leases: Sequence[Lease]) -> None:
    for lease in reversed(leases):
        lease.release()


def stale(info: dict, now: float | None = None) -> bool:
    """The stale rule (module docstring): past its expiry, or taken on this host by a
    process that is gone (not for detached leases)."""
    now = time.time() if now is None else now
    if not isinstance(info.get("expires"), int | float):
        return False  # not a lease this code wrote: only its owner or a user removes it
    if info["expires"] < now:
        return True
    if info.get("detached") or info.get("host") != HOST:
        return False
    return not alive(info.get("pid"), info.get("pid_start"))


def refusal(path: str, target: str, info: dict) -> str:
    """One line: who holds ``target`` and what the user can do. A lease file this code
    did not write (empty, cut short, another tool's) holds no run to name: it is never
    stale either, so the user must judge whether a run is using ``target``."""
    if not isinstance(info.get("expires"), int | float):
        return (f"{target} has a lease file that cannot be read ({path} is empty or not a "
                "lease tensordedup wrote): if no run is using it, delete that file and run "
                "again")
    until = _iso(info["expires"])
    holder = (f"run {info.get('run_id', '?')} (host {info.get('host', '?')}, pid "
              f"{info.get('pid', '?')}, since {_iso(info.get('started'))}"
              + (", a detached Dataflow job" if info.get("detached") else "")
              + f"; lease expires {until} unless renewed)")
    return (f"{target} is in use by {holder}: wait for that run to finish, or if it is no "
            f"longer running, delete {path} and run again")


@contextmanager
def keep_alive(leases: Sequence[Lease], every: float | None = None) -> Iterator[None]:
    """Renew ``leases`` in a background thread while the block runs. A lease that cannot
    be renewed is left alone: Publish's ``check`` refuses to publish without it."""
    if not leases:
        yield
        return
    every = min(lease.ttl for lease in leases) / 4 if every is None else every

    def renew() -> None:
        for lease in leases:
            try:
                lease.renew()
            except OSError:  # a network blip: the next round tries again
                pass

    with periodic.every(every, renew, "lease-renewal"):
        yield


def _read(path: str) -> tuple[bytes, dict] | None:
    """(raw bytes, parsed) of the lease object, or None if there is none."""
    try:
        raw = fs.read_bytes(path)
    except (FileNotFoundError, OSError):
        if fs.exists(path):
            raise
        return None
    try:
        info = json.loads(raw)
    except ValueError:
        info = {}
    return raw, info if isinstance(info, dict) else {}


def _iso(t: object) -> str:
    if not isinstance(t, int | float):
        return "?"
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")


def _dumps(info: dict) -> bytes:
    return json.dumps(info, sort_keys=True).encode()
