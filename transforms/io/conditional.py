"""Conditional writes: what a lease (``transforms.io.lease``) is built on.

Beam's FileSystems has no create-if-absent, so each filesystem brings its own: local
paths (and anything backed by a local directory) use link(2), which fails when the name
exists, like O_EXCL, and shows the complete content at once; gs:// uses a generation
precondition (google-cloud-storage); another Beam FileSystem can offer the same two
methods, ``create_exclusive(path, data) -> bool`` and
``replace_if_unchanged(path, expected, data) -> bool`` (see tests/fakefs.py).

The local versions write beside the file under names that say which process wrote them
(``fs.temp_path``): one killed in the middle leaves a file that the next lease holder
removes (``fs.clear_dead_temps``).
"""

from __future__ import annotations

import os
import threading

from transforms.io.fs import (
    beam_filesystems,
    is_local,
    remove_quietly,
    temp_path,
    write_local_atomic,
)


def create_exclusive(path: str, data: bytes) -> bool:
    """Create ``path`` holding ``data`` only if no file of that name exists; True if this
    call created it. Of callers racing for one name exactly one wins, on every filesystem
    that supports it (OSError naming the scheme otherwise)."""
    return _conditional(path).create_exclusive(path, data)


def replace_if_unchanged(path: str, expected: bytes, data: bytes | None) -> bool:
    """Replace ``path``'s content with ``data`` (delete it when None) only if it still
    holds ``expected``; True if done. Exact on gs:// (generation precondition); locally
    the file is first renamed aside, so a concurrent writer is detected, not overwritten."""
    return _conditional(path).replace_if_unchanged(path, expected, data)


def local_create_exclusive(path: str, data: bytes) -> bool:
    """``create_exclusive`` for a local file (also what a locally backed FileSystem uses)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = temp_path(path, "new")
    write_local_atomic(tmp, data)
    try:
        os.link(tmp, path)  # atomic; fails with EEXIST if the name is taken
        return True
    except FileExistsError:
        return False
    finally:
        remove_quietly(tmp)


def local_replace_if_unchanged(path: str, expected: bytes, data: bytes | None) -> bool:
    """``replace_if_unchanged`` for a local file: rename it aside (atomic: one caller gets
    it), compare, and put the new content (or, if it was not ``expected``, the old one)
    back with a create-if-absent, so nothing created meanwhile is overwritten."""
    aside = temp_path(path, "cas")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return False
    try:
        with open(aside, "rb") as f:
            found = f.read()
        if found != expected:
            local_create_exclusive(path, found)
            return False
        return data is None or local_create_exclusive(path, data)
    finally:
        remove_quietly(aside)


class _LocalConditional:
    create_exclusive = staticmethod(local_create_exclusive)
    replace_if_unchanged = staticmethod(local_replace_if_unchanged)


class _GcsConditional:
    """gs:// with google-cloud-storage's generation preconditions (``if_generation_match``:
    0 = only if absent)."""

    _clients = threading.local()  # one client per thread of a process, not per call

    @classmethod
    def _blob(cls, path: str):
        from google.cloud import storage

        held = getattr(cls._clients, "held", None)
        if held is None or held[0] != os.getpid():  # a forked child makes its own
            held = cls._clients.held = (os.getpid(), storage.Client())
        bucket, _, name = path.removeprefix("gs://").partition("/")
        return held[1].bucket(bucket).blob(name)

    @classmethod
    def create_exclusive(cls, path: str, data: bytes) -> bool:
        from google.api_core.exceptions import PreconditionFailed

        blob = cls._blob(path)
        try:
            blob.upload_from_string(data, if_generation_match=0)
            return True
        except PreconditionFailed:  # taken; or a retried request whose first try won
            return cls._read(blob) == data

    @classmethod
    def replace_if_unchanged(cls, path: str, expected: bytes, data: bytes | None) -> bool:
        from google.api_core.exceptions import NotFound, PreconditionFailed

        blob = cls._blob(path)
        try:
            blob.reload()
            generation = blob.generation
            if blob.download_as_bytes(if_generation_match=generation) != expected:
                return False
            if data is None:
                blob.delete(if_generation_match=generation)
            else:
                blob.upload_from_string(data, if_generation_match=generation)
            return True
        except (NotFound, PreconditionFailed):
            return False

    @staticmethod
    def _read(blob) -> bytes | None:
        from google.api_core.exceptions import NotFound

        try:
            return blob.download_as_bytes()
        except NotFound:
            return None


def lease_refusal(path: str) -> str | None:
    """Why a run cannot hold a lease at ``path`` (None: it can), without touching the
    network: checked before any work, where an s3:// store was first listed and refused
    as a network or credentials failure ("Must provide one of client or options"), and
    an hdfs:// output stopped with a traceback."""
    try:
        _conditional(path)
    except OSError as e:
        return str(e)
    return None


def _conditional(path: str):
    if is_local(path):
        return _LocalConditional
    scheme = beam_filesystems().get_scheme(path)
    if scheme == "gs":
        return _GcsConditional
    try:
        own = beam_filesystems().get_filesystem(path)
    except Exception as e:  # noqa: BLE001 (Beam's own: an extra not installed, no options)
        own = e
    if hasattr(own, "create_exclusive") and hasattr(own, "replace_if_unchanged"):
        return own
    raise OSError(f"{scheme}:// offers no create-if-absent write, which the one-writer lease "
                  "needs: use a local path or gs:// for outputs, reports and stores")
