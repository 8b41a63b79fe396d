"""A Beam filesystem for ``fakegs://`` paths, backed by a local directory, that behaves like
an object store: no directories (``exists`` is true for files only, ``mkdirs`` does
nothing, ``delete`` removes single files and the backing folders it leaves empty),
listing is by prefix.

Why: code that must work on gs:// is tested without a cloud account; a wrong assumption
about directories (an ``exists`` on a folder, a recursive delete) fails here as it would
on GCS. Conditional writes (``create_exclusive``, ``replace_if_unchanged``) behave like
GCS's generation preconditions, so leases can be raced here. Importing this module
registers the scheme (Beam finds ``FileSystem`` subclasses when it resolves a path);
``bucket(monkeypatch, tmp_path)`` points it at a directory (an environment variable, so a
child process that imports this module sees the same files).
"""

from __future__ import annotations

import os
import posixpath
from pathlib import Path

import pytest
from apache_beam.io.filesystem import BeamIOError, CompressionTypes, FileMetadata
from apache_beam.io.localfilesystem import LocalFileSystem

from transforms.io.conditional import local_create_exclusive, local_replace_if_unchanged

SCHEME = "fakegs"
ENV = "TENSORDEDUP_FAKEGS_ROOT"


def bucket(monkeypatch: pytest.MonkeyPatch, directory: Path) -> str:
    """Back ``fakegs://`` with ``directory`` for one test; returns a bucket URL in it."""
    monkeypatch.setenv(ENV, str(directory))
    return f"{SCHEME}://bucket"


def _local(url: str) -> str:
    prefix = f"{SCHEME}://"
    if not url.startswith(prefix):
        raise ValueError(f"not a {prefix} path: {url}")
    return os.path.join(os.environ[ENV], url[len(prefix):])


class FakeObjectStore(LocalFileSystem):
    """``fakegs://bucket/key`` -> ``$TENSORDEDUP_FAKEGS_ROOT/bucket/key``."""

    @classmethod
    def scheme(cls) -> str:
        return SCHEME

    def join(self, basepath, *paths):
        return posixpath.join(basepath.rstrip("/"), *(p.strip("/") for p in paths))

    def split(self, path):
        head, _, tail = path.rstrip("/").rpartition("/")
        return head, tail

    def has_dirs(self):
        return False

    def mkdirs(self, path):
        pass

    def _url_dirname(self, url_or_path):
        return url_or_path.rsplit("/", 1)[0]

    def _list(self, dir_or_prefix):
        base = os.environ[ENV]
        for dirpath, _, files in os.walk(base):
            for name in files:
                local = os.path.join(dirpath, name)
                url = f"{SCHEME}://" + os.path.relpath(local, base).replace(os.sep, "/")
                if url.startswith(dir_or_prefix):
                    yield FileMetadata(url, os.path.getsize(local), os.path.getmtime(local))

    def create(self, path, mime_type="application/octet-stream",
               compression_type=CompressionTypes.AUTO):
        return super().create(_local(path), mime_type, compression_type)

    def open(self, path, mime_type="application/octet-stream",
             compression_type=CompressionTypes.AUTO):
        return super().open(_local(path), mime_type, compression_type)

    def copy(self, source_file_names, destination_file_names):
        super().copy([_local(p) for p in source_file_names],
                     [_local(p) for p in destination_file_names])

    def rename(self, source_file_names, destination_file_names):
        for dst in destination_file_names:
            os.makedirs(os.path.dirname(_local(dst)), exist_ok=True)
        super().rename([_local(p) for p in source_file_names],
                       [_local(p) for p in destination_file_names])

    def exists(self, path):
        return os.path.isfile(_local(path))

    def size(self, path):
        return super().size(_local(path))

    def last_updated(self, path):
        return super().last_updated(_local(path))

    def checksum(self, path):
        return super().checksum(_local(path))

    def metadata(self, path):
        m = super().metadata(_local(path))
        return FileMetadata(path, m.size_in_bytes, m.last_updated_in_seconds)

    def create_exclusive(self, path: str, data: bytes) -> bool:
        """Create-if-absent, like a GCS upload with ``if_generation_match=0``: atomic on
        the backing directory (a link fails if the name exists)."""
        return local_create_exclusive(_local(path), data)

    def replace_if_unchanged(self, path: str, expected: bytes, data: bytes | None) -> bool:
        """Compare-and-swap, like a GCS write or delete with ``if_generation_match``."""
        return local_replace_if_unchanged(_local(path), expected, data)

    def delete(self, paths):
        missing = {p: FileNotFoundError(p) for p in paths if not self.exists(p)}
        if missing:
            raise BeamIOError("Delete operation failed", missing)
        for p in paths:
            os.remove(_local(p))
            _prune(os.path.dirname(_local(p)))


def _prune(folder: str) -> None:
    """Remove the backing directories a delete left empty, up to the bucket's: an object
    store has no directories, so once the objects under a prefix are gone, an object can
    take that name (a folder left on the backing disk would refuse it)."""
    root = os.environ[ENV]
    while os.path.dirname(folder) != root and folder.startswith(root + os.sep):
        try:
            os.rmdir(folder)
        except OSError:  # not empty (or being written into): the prefix still holds objects
            return
        folder = os.path.dirname(folder)
