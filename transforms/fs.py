"""Small file helpers over Beam's ``FileSystems``: one code path for local paths and any
scheme Beam knows (gs://, s3://, hdfs://, ...).

Why not ``FileSystems`` directly: its calls take lists, fail on a missing path, treat
directories differently per scheme (object stores have none), and its local rename is
not an atomic replace everywhere. These helpers give the few operations the job needs
the same meaning on every filesystem.
"""

from __future__ import annotations

import os
import secrets
import shutil
from typing import BinaryIO

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

RAW = CompressionTypes.UNCOMPRESSED


def is_local(path: str) -> bool:
    """True for a plain path (no ``scheme://``): handled with ``os`` directly."""
    return FileSystems.get_scheme(path) is None


def join(*parts: str) -> str:
    """Join path components with the separator of the first component's filesystem."""
    return FileSystems.join(parts[0], *parts[1:])


def exists(path: str) -> bool:
    return FileSystems.exists(path)


def match(pattern: str) -> list[str]:
    """Sorted paths of the files matching a glob (``*`` stays within a path component,
    ``**`` crosses them); [] when nothing matches or the directory does not exist."""
    return sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list)


def open_read(path: str) -> BinaryIO:
    """A seekable binary reader (what ``pyarrow.parquet.ParquetFile`` needs)."""
    return open(path, "rb") if is_local(path) else FileSystems.open(path, compression_type=RAW)


def read_bytes(path: str) -> bytes:
    with open_read(path) as f:
        return f.read()


def makedirs(path: str) -> None:
    """Create a directory and its parents; no error if it exists (a no-op on object
    stores, which have no directories)."""
    if is_local(path):
        os.makedirs(path, exist_ok=True)
    elif not FileSystems.exists(path):
        FileSystems.mkdirs(path)


def write_bytes_atomic(path: str, data: bytes | memoryview) -> None:
    """Write ``path`` so that readers see the old content or the new, never part of it:
    the bytes go to a hidden temporary name in the same directory, which is then renamed
    over ``path`` (``os.replace`` locally)."""
    if is_local(path):
        _write_local_atomic(path, data)
        return
    head, _, tail = path.rpartition("/")
    tmp = f"{head}/.{tail}.tmp-{secrets.token_hex(8)}"
    try:
        with FileSystems.create(tmp, compression_type=RAW) as f:
            f.write(data)
        FileSystems.rename([tmp], [path])
    except BaseException:
        if FileSystems.exists(tmp):
            FileSystems.delete([tmp])
        raise


def _write_local_atomic(path: str, data: bytes | memoryview) -> None:
    head, tail = os.path.split(path)
    os.makedirs(head or ".", exist_ok=True)
    tmp = os.path.join(head, f".{tail}.tmp-{secrets.token_hex(8)}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        _remove_quietly(tmp)
        raise


def delete_tree(path: str) -> None:
    """Delete a file or a directory with everything below it; no error if missing."""
    if is_local(path):
        try:
            shutil.rmtree(path)
        except NotADirectoryError:
            _remove_quietly(path)
        except FileNotFoundError:
            pass
        return
    if FileSystems.get_filesystem(path).has_dirs():  # e.g. HDFS: delete is recursive
        if FileSystems.exists(path):
            FileSystems.delete([path])
        return
    files = match(path.rstrip("/") + "/**")  # object store: a "directory" is a prefix
    if FileSystems.exists(path):
        files.append(path)
    if files:
        FileSystems.delete(files)


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
