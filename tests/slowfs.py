"""Beam filesystems for remote paths that misbehave the way GCS does without network or
credentials: ``hangfs://`` never answers (every call waits on an Event the test does not
set: gcsio's retries take minutes), ``deniedfs://`` refuses every call (PermissionError).

Why: preflight must turn both into one line and exit 2 within tuning.remote_timeout_s,
and that needs a real Beam filesystem in the path, not a patched function. Importing this
module registers both schemes (Beam finds ``FileSystem`` subclasses when it resolves a
path). ``RELEASE.set()`` lets the hung calls return once a test is over.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.localfilesystem import LocalFileSystem

RELEASE = threading.Event()
HANGING_ENV = "TENSORDEDUP_TEST_HANGING"  # a file touched when a call starts hanging


class _Misbehaving(LocalFileSystem):
    """Every operation preflight uses goes through ``_fail``."""

    @classmethod
    def scheme(cls) -> str:
        return "misbehavingfs"  # not None: Beam would take it for a second local filesystem

    def _fail(self, path: str) -> None:
        raise NotImplementedError

    def _list(self, dir_or_prefix):
        self._fail(dir_or_prefix)
        return iter(())

    def exists(self, path):
        self._fail(path)
        return False

    def open(self, path, mime_type="application/octet-stream",
             compression_type=CompressionTypes.AUTO):
        self._fail(path)
        raise FileNotFoundError(path)

    def create(self, path, mime_type="application/octet-stream",
               compression_type=CompressionTypes.AUTO):
        self._fail(path)
        raise FileNotFoundError(path)

    def delete(self, paths):
        self._fail(paths[0])

    # Conditional writes, as gs:// offers them: without these the lease check refuses the
    # scheme before any call is made, and the misbehaviour under test is never reached.
    def create_exclusive(self, path: str, data: bytes) -> bool:
        self._fail(path)
        return False

    def replace_if_unchanged(self, path: str, expected: bytes, data: bytes | None) -> bool:
        self._fail(path)
        return False


class HangingFileSystem(_Misbehaving):
    """``hangfs://``: no call ever answers (until ``RELEASE`` is set)."""

    @classmethod
    def scheme(cls) -> str:
        return "hangfs"

    def _fail(self, path: str) -> None:
        if os.environ.get(HANGING_ENV):  # says so, for a test in another process
            Path(os.environ[HANGING_ENV]).touch()
        RELEASE.wait()
        raise ConnectionError(f"{path}: released")


class DeniedFileSystem(_Misbehaving):
    """``deniedfs://``: every call is refused, as with credentials lacking a role."""

    @classmethod
    def scheme(cls) -> str:
        return "deniedfs"

    def _fail(self, path: str) -> None:
        raise PermissionError(13, "403 Forbidden: caller does not have storage.objects.list "
                              "access", path)
