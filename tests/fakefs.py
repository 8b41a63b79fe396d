"""A Beam filesystem for ``fakegs://`` paths, backed by a local directory, that behaves like
an object store: no directories (``exists`` is true for files only, ``mkdirs`` does
nothing, ``delete`` removes single files and the backing folders it leaves empty),
listing is by prefix.

Why: code that must work on gs:// is tested without a cloud account; a wrong assumption
about directories (an ``exists`` on a folder, a recursive delete) fails here as it would
on GCS. Conditional writes (``create_exclusive``, ``replace_if_unchanged``) behave like
GCS's generation preconditions, so leases can be raced here. Reads go through Beam's own
GCS reader (``BeamBlobReader``, 16 MB read-ahead) over the file, and ``FETCHED`` counts
the bytes they download, so a read pattern that costs gigabytes on GCS shows here.
Importing this module registers the scheme (Beam finds ``FileSystem`` subclasses when it
resolves a path); ``bucket(monkeypatch, tmp_path)`` points it at a directory (an
environment variable, so a child process that imports this module sees the same files).
"""

from __future__ import annotations

import collections
import io
import os
import posixpath
import time
from pathlib import Path

import pytest
from apache_beam.io.filesystem import (
    BeamIOError,
    CompressedFile,
    CompressionTypes,
    FileMetadata,
    FileSystem,
)
from apache_beam.io.filesystemio import Downloader, DownloaderStream
from apache_beam.io.gcp.gcsio import BeamBlobReader
from apache_beam.io.localfilesystem import LocalFileSystem
from google.api_core.exceptions import RequestRangeNotSatisfiable

from transforms.io.conditional import local_create_exclusive, local_replace_if_unchanged

SCHEME = "fakegs"
ENV = "TENSORDEDUP_FAKEGS_ROOT"
LATENCY_ENV = "TENSORDEDUP_FAKEGS_LATENCY_MS"  # scripts/bench_object_store.py: per request


def bucket(monkeypatch: pytest.MonkeyPatch, directory: Path) -> str:
    """Back ``fakegs://`` with ``directory`` for one test; returns a bucket URL in it."""
    monkeypatch.setenv(ENV, str(directory))
    return f"{SCHEME}://bucket"


def _local(url: str) -> str:
    """``fakegs://b/k`` (or ``fakes3://b/k``) -> the backing file of object k in bucket b."""
    scheme, sep, key = url.partition("://")
    if not sep or scheme not in (SCHEME, "fakes3"):
        raise ValueError(f"not a {SCHEME}:// or fakes3:// path: {url}")
    return os.path.join(os.environ[ENV], key)


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
                url = f"{self.scheme()}://" + os.path.relpath(local, base).replace(os.sep, "/")
                if url.startswith(dir_or_prefix):
                    yield FileMetadata(url, os.path.getsize(local), os.path.getmtime(local))

    def create(self, path, mime_type="application/octet-stream",
               compression_type=CompressionTypes.AUTO):
        return super().create(_local(path), mime_type, compression_type)

    def open(self, path, mime_type="application/octet-stream",
             compression_type=CompressionTypes.AUTO):
        compression_type = FileSystem._get_compression_type(path, compression_type)
        raw = self._reader(_local(path))
        if compression_type == CompressionTypes.UNCOMPRESSED:
            return raw
        return CompressedFile(raw, compression_type=compression_type)

    @staticmethod
    def _reader(local: str):
        """Beam's GCS reader over the object: google-cloud-storage's ``BlobReader``, which
        fetches max(asked, 16 MB) per read that misses its buffer (what gs:// costs)."""
        return BeamBlobReader(_Blob(local))

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
        st = os.stat(_local(path))  # (LocalFileSystem.metadata calls size() with the local
        return FileMetadata(path, st.st_size, st.st_mtime)  # path, which is no fakegs://)

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


class _Blob:
    """The part of ``google.cloud.storage.Blob`` a ``BlobReader`` uses, over a local file;
    ``FETCHED`` counts the bytes its downloads returned per backing file (in this
    process; objects deleted later stay counted)."""

    chunk_size = None
    content_encoding = content_type = None

    def __init__(self, local: str):
        if not os.path.isfile(local):
            raise FileNotFoundError(local)
        self.local, self.size = local, None

    def reload(self, **_) -> None:
        _round_trip()  # a metadata request
        self.size = os.path.getsize(self.local)

    def download_as_bytes(self, start=None, end=None, **_) -> bytes:
        """Bytes ``start`` to ``end`` inclusive (GCS's range header); 416 past the end."""
        _round_trip()
        size = os.path.getsize(self.local)
        start = start or 0
        if start >= size:
            raise RequestRangeNotSatisfiable(f"{self.local}: range from {start} of {size}")
        with open(self.local, "rb") as f:
            f.seek(start)
            data = f.read(-1 if end is None else end + 1 - start)
        FETCHED[self.local] += len(data)
        SIZES[self.local] = size
        return data


def _round_trip() -> None:
    """Benchmarks (``LATENCY_ENV``): the wait of one request to an object store."""
    if LATENCY_ENV in os.environ:
        time.sleep(float(os.environ[LATENCY_ENV]) / 1000)


FETCHED: collections.Counter[str] = collections.Counter()  # downloaded bytes per object
SIZES: dict[str, int] = {}  # each downloaded object's size (in this process)


class FakeS3(FakeObjectStore):
    """``fakes3://``: the same objects read the way Beam's S3 and Azure filesystems read
    them, a 16 MB ``io.BufferedReader`` over a ``DownloaderStream`` of ranged gets."""

    @classmethod
    def scheme(cls) -> str:
        return "fakes3"

    @staticmethod
    def _reader(local: str):
        return io.BufferedReader(DownloaderStream(_Download(local)), buffer_size=16 << 20)


class _Download(Downloader):
    """Beam's ``Downloader`` over a local file, counted in ``FETCHED`` like ``_Blob``."""

    def __init__(self, local: str):
        self.blob = _Blob(local)
        self.blob.reload()

    @property
    def size(self) -> int:
        return self.blob.size

    def get_range(self, start: int, end: int) -> bytes:
        return self.blob.download_as_bytes(start, end - 1)


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
