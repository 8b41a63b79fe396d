"""Small file helpers over Beam's ``FileSystems``: one code path for local paths and any
scheme Beam knows (gs://, s3://, hdfs://, ...).

Beam is imported on first use by a helper that needs it (any non-local path, and
``match``/``rename_tree``/``upload``, which keep Beam's own semantics everywhere), not at
import: ``is_local``, ``join``, ``exists``, ``open_read`` and the other helpers on local
paths work without apache-beam installed, so the kernels and the TFRecord reader import
in a lean install (training filters without the ``job`` extra).

Why not ``FileSystems`` directly: its calls take lists, fail on a missing path, treat
directories differently per scheme (object stores have none), and its local rename is
not an atomic replace everywhere. These helpers give the few operations the job needs
the same meaning on every filesystem. Conditional writes (create-if-absent,
compare-and-swap: what leases need) are in ``transforms.io.conditional``.
"""

from __future__ import annotations

import glob as _glob
import io
import mmap
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, BinaryIO, NamedTuple

import numpy as np

from transforms.io import owner

if TYPE_CHECKING:
    from apache_beam.io.filesystems import FileSystems as _FileSystems

RAW = "uncompressed"  # Beam's CompressionTypes.UNCOMPRESSED
_COPY_BLOCK = 16 << 20  # bytes per read/write when uploading a local file
_SCHEME = re.compile(r"[a-zA-Z][-a-zA-Z0-9+.]*://")  # Beam's FileSystems.URI_SCHEMA_PATTERN
_TEMP = re.compile(r"\.(?:tmp|new|cas)-(\d+)-(\d+)-([0-9a-f]{8})-[0-9a-f]{8}$")  # temp_path


def beam_filesystems() -> type[_FileSystems]:
    """Beam's ``FileSystems``, imported when first needed (see the module docstring)."""
    try:
        from apache_beam.io.filesystems import FileSystems
    except ImportError as e:
        raise ImportError(f"{e}: paths with a scheme (gs://, ...) and the dedup job need "
                          "apache-beam: pip install -c constraints.txt "
                          "'tensordedup[job]'") from e
    return FileSystems


def is_local(path: str) -> bool:
    """True for a plain path (no ``scheme://``): handled with ``os`` directly."""
    return _SCHEME.match(path.strip()) is None


def join(*parts: str) -> str:
    """Join path components with the separator of the first component's filesystem."""
    if is_local(parts[0]):
        return os.path.join(*parts)
    return beam_filesystems().join(parts[0], *parts[1:])


def sibling(path: str, suffix: str) -> str:
    """``.<name>.<suffix>`` in ``path``'s directory: hidden, next to it. Leases, staging
    and swap directories and temporary files are named so (``clear_leftovers`` and
    ``clear_dead_temps`` find them by it)."""
    if is_local(path):
        head, name = os.path.split(path.rstrip(os.sep) or path)
        return os.path.join(head, f".{name}.{suffix}")
    head, _, name = path.rstrip("/").rpartition("/")
    return f"{head}/.{name}.{suffix}"


def temp_path(path: str, kind: str) -> str:
    """A unique hidden name beside ``path`` for a file on its way there (``kind``: tmp,
    new, cas), naming the process that makes it (``owner.tag``), so what a killed process
    left can be told from what a live one is using (``clear_dead_temps``)."""
    return sibling(path, f"{kind}-{owner.tag()}-{secrets.token_hex(4)}")


def clear_dead_temps(path: str) -> None:
    """Delete the temporary files (``temp_path``) in ``path``'s directory whose maker was
    a process of this host that is gone. Local paths only: an object store's
    conditional writes leave no files aside."""
    if not is_local(path):
        return
    folder = os.path.dirname(path) or "."
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return
    for name in names:
        m = _TEMP.search(name)
        if name.startswith(".") and m and owner.tag_is_dead(int(m[1]), int(m[2]), m[3]):
            remove_quietly(os.path.join(folder, name))


def is_temp(name: str) -> bool:
    """Whether a file's name is a temporary's (``temp_path``)."""
    return name.startswith(".") and _TEMP.search(name) is not None


def clear_temps_under(folder: str) -> None:
    """Delete every temporary file (``temp_path``) below a local ``folder``: once no
    writer is left (a staging directory at Publish), each is what a killed one left."""
    if not is_local(folder):
        return
    for at, _, names in os.walk(folder):
        for name in names:
            if is_temp(name):
                remove_quietly(os.path.join(at, name))


def exists(path: str) -> bool:
    return os.path.exists(path) if is_local(path) else beam_filesystems().exists(path)


def match(pattern: str) -> list[str]:
    """Sorted paths of the files matching a glob (``*`` stays within a path component,
    ``**`` crosses them); [] when nothing matches or the directory does not exist."""
    return sorted(m.path for m in beam_filesystems().match([pattern])[0].metadata_list)


def glob(pattern: str) -> list[str]:
    """Sorted files matching a glob with ``glob.glob(recursive=True)``'s meaning everywhere:
    ``**/`` matches zero or more directories (Beam's own match needs at least one), ``*``
    and ``?`` stay within a path component. Local paths use ``glob.glob`` itself; elsewhere
    the prefix before the first wildcard is listed once and filtered (names starting with
    "." match there too: object stores have no hidden files). A pattern that names an
    existing file as it is (``photo [1].parquet``) is that file alone: ``[1]`` as a glob
    would match ``photo 1.parquet`` instead, and never the file named."""
    return glob_matches(pattern).files


class GlobMatches(NamedTuple):
    """What a glob matched: its files, and what it matched that is not read: directories
    none of whose files it matched (a Spark ``out.parquet/`` folder of part files under
    ``*.parquet``), symbolic links to nothing, and what is no file at all (a FIFO)."""

    files: list[str]
    directories: list[str]
    broken_links: list[str]
    special: list[str] = []  # FIFOs, sockets, devices (local): no file to read


def glob_matches(pattern: str) -> GlobMatches:
    """``glob``'s files, and the directories and broken links it passes over (see
    ``GlobMatches``). Directories matched by a last ``**`` (``data/**``) are not counted:
    that pattern names every file below them."""
    last_any = pattern.rstrip("/").rsplit("/", 1)[-1] == "**"
    if is_local(pattern):
        if os.path.isfile(pattern):
            return GlobMatches([pattern], [], [])
        paths = _glob.glob(pattern, recursive=True)
        files = sorted(p for p in paths if os.path.isfile(p))
        broken = sorted(p for p in paths if os.path.islink(p) and not os.path.exists(p))
        dirs = {p for p in paths if os.path.isdir(p)}
        folders = [] if last_any else sorted(dirs)
        special = sorted(set(paths) - set(files) - dirs - set(broken))  # what else exists
        return GlobMatches(files, _unread(folders, files, os.sep), broken, special)
    prefix = re.match(r"[^[*?]*", pattern).group(0)
    if prefix == pattern:
        if beam_filesystems().exists(pattern):
            return GlobMatches([pattern], [], [])
        return GlobMatches([], [pattern] if exists_under(pattern) else [], [])
    listed = match(prefix + "**")
    if pattern in listed:
        return GlobMatches([pattern], [], [])
    wanted = _glob_regex(pattern)
    files = [p for p in listed if wanted.fullmatch(p)]
    folders = set()
    if not last_any:  # an object store has no directories: the names' prefixes are
        for p in listed:
            at = p.find("/", len(prefix))
            while at > 0:
                if wanted.fullmatch(p[:at]):
                    folders.add(p[:at])
                at = p.find("/", at + 1)
    return GlobMatches(files, _unread(sorted(folders), files, "/"), [])


def _unread(folders: list[str], files: list[str], sep: str) -> list[str]:
    """The folders none of ``files`` lies in."""
    holding = set()
    for f in files:
        head = f.rpartition(sep)[0]
        while head and head not in holding:
            holding.add(head)
            head = head.rpartition(sep)[0]
    return [d for d in folders if d.rstrip(sep) not in holding]


_GLOB_TOKEN = re.compile(r"\*\*/|\*\*|\*|\?|\[!?\]?[^\]]*\]")
_GLOB_REGEX = {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}


def _glob_regex(pattern: str) -> re.Pattern:
    out, pos = [], 0
    for m in _GLOB_TOKEN.finditer(pattern):
        token = m.group()
        out.append(re.escape(pattern[pos:m.start()]))
        if token in _GLOB_REGEX:
            out.append(_GLOB_REGEX[token])
        else:  # a character class: [abc], [!abc] (which never matches "/" either)
            body = token[1:-1].replace("\\", "\\\\")
            out.append("[" + ("^/" + body[1:] if body.startswith("!") else
                              "\\" + body if body.startswith("^") else body) + "]")
        pos = m.end()
    out.append(re.escape(pattern[pos:]))
    return re.compile("".join(out), re.S)


def glob_names(pattern: str, path: str) -> bool:
    """Whether ``glob`` of ``pattern`` would name ``path`` (were it there): ``*`` within
    one path component, as there (fnmatch's ``*`` crosses "/")."""
    return _glob_regex(pattern).fullmatch(path) is not None


def exists_under(path: str) -> bool:
    """Whether ``path`` is a file or a directory, or (object stores, which have no
    directories) some object's name starts with ``path/``."""
    if is_local(path):
        return os.path.exists(path)
    if beam_filesystems().exists(path):
        return True
    return bool(beam_filesystems().match([path.rstrip("/") + "/**"], limits=[1])[0].metadata_list)


def open_read(path: str) -> BinaryIO:
    """A seekable binary reader (what ``pyarrow.parquet.ParquetFile`` needs)."""
    if is_local(path):
        return open(path, "rb")
    return beam_filesystems().open(path, compression_type=RAW)


def open_ranged(path: str) -> BinaryIO:
    """A reader of a few byte ranges (``seek`` then ``read``): on an object store each read
    fetches the bytes asked for and no more. Beam's readers read ahead: its GCS reader
    (google-cloud-storage's ``BlobReader``) fetches at least 16 MB per read that misses
    its buffer, its S3 and Azure readers fill a 16 MB buffer, so a cell's slice of one
    chunk's spill file (kilobytes) or a store lookup's bucket cost up to 16 MB each.
    ``FileSystems.open`` takes no buffer size, so the reader's own is set to nothing."""
    f = open_read(path)
    if is_local(path):
        return f
    if isinstance(getattr(f, "raw", None), io.RawIOBase):  # a buffer over ranged reads
        return _Unbuffered(f)
    if hasattr(f, "_chunk_size"):  # BlobReader: a read fetches max(asked, _chunk_size)
        f._chunk_size = 1
    return f


class _Unbuffered(io.RawIOBase):
    """A ``BufferedReader``'s raw stream, read whole: ``read(n)`` returns n bytes (fewer
    only at the end of the file), one ranged request each on an object store."""

    def __init__(self, buffered: io.BufferedReader):
        super().__init__()
        self._f, self._raw = buffered, buffered.raw

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        return self._raw.seek(pos, whence)

    def tell(self) -> int:
        return self._raw.tell()

    def readinto(self, b) -> int:
        view, got = memoryview(b).cast("B"), 0
        while got < len(view):
            n = self._raw.readinto(view[got:])
            if not n:
                break
            got += n
        return got

    def close(self) -> None:
        self._f.close()
        super().close()


def read_bytes(path: str) -> bytes:
    with open_read(path) as f:
        return f.read()


RANGE_GAP = 1 << 20  # object stores: rows this many bytes apart or less come in one request
MAPPED_ROWS = 64  # local files: more rows than this are read through a memory map


def read_rows_into(path: str, rows: np.ndarray, out: np.ndarray, at: np.ndarray) -> None:
    """``out[at[i]] = rows[i]``-th fixed-width row of a file of rows like ``out``'s (C
    order), reading only those rows. A local file: up to MAPPED_ROWS rows, one positioned
    read per row straight into ``out`` (1-2 us a row); more, one gather from a memory map
    of the file, unmapped at once (0.2-0.5 us a row; while mapped, the pages around each
    row count in RSS: at most the file). An object store: one ranged request per run of
    rows up to RANGE_GAP bytes apart (a round trip costs more than a megabyte): a
    sample's few rows of a chunk, not its whole file."""
    width = out.shape[1] * out.itemsize
    if not len(rows) or not width:
        return
    if not out.flags.c_contiguous:  # its reshape below would be a copy, written and lost
        raise ValueError("read_rows_into: out must be C-contiguous")
    if not is_local(path):
        _read_runs_into(path, rows, out, at, width)
        return
    if len(rows) > MAPPED_ROWS:
        _read_mapped_into(path, rows, out, at, width)
        return
    buf = memoryview(out.reshape(len(out), -1).view(np.uint8)).cast("B")  # C order
    fd = os.open(path, os.O_RDONLY)
    try:
        for r, a in zip(rows.tolist(), at.tolist(), strict=True):
            if os.preadv(fd, [buf[a * width:(a + 1) * width]], r * width) != width:
                raise OSError(f"{path}: row {r} is past the end of the file")
    finally:
        os.close(fd)


def _read_mapped_into(path: str, rows: np.ndarray, out: np.ndarray, at: np.ndarray,
                      width: int) -> None:
    """``read_rows_into`` of many rows of a local file: one gather from a memory map."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        rows = np.asarray(rows, np.int64)
        past = (rows >= size // width) | (rows < 0)
        if past.any():
            raise OSError(f"{path}: row {rows[past][0]} is past the end of the file")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            table = np.frombuffer(m, np.uint8, count=size // width * width).reshape(-1, width)
            out.reshape(len(out), -1).view(np.uint8)[at] = table[rows]
            del table  # the map closes only once no array looks into it


def _read_runs_into(path: str, rows: np.ndarray, out: np.ndarray, at: np.ndarray,
                    width: int) -> None:
    """``read_rows_into`` on an object store: rows sorted, cut into runs where they lie
    more than RANGE_GAP bytes apart, each run's span one ranged request."""
    order = np.argsort(rows, kind="stable")
    r, a = np.asarray(rows, np.int64)[order], np.asarray(at, np.int64)[order]
    starts = np.r_[0, np.flatnonzero(np.diff(r) > max(1, RANGE_GAP // width)) + 1]
    ends = np.r_[starts[1:], len(r)]
    dest = out.reshape(len(out), -1).view(np.uint8)
    with open_ranged(path) as f:
        for lo, hi in zip(starts.tolist(), ends.tolist(), strict=True):
            first, last = int(r[lo]), int(r[hi - 1])
            f.seek(first * width)
            data = f.read((last - first + 1) * width)
            if len(data) != (last - first + 1) * width:
                raise OSError(f"{path}: row {last} is past the end of the file")
            block = np.frombuffer(data, np.uint8).reshape(-1, width)
            dest[a[lo:hi]] = block[r[lo:hi] - first]


def read_parquet(path: str, columns: list[str] | None = None):
    """A whole Parquet file as a ``pyarrow.Table``, read from a source Arrow owns: a local
    file through Arrow's own file, anything else read into an Arrow buffer first.

    Why never a Python file object: pyarrow's reader may drop its last reference to the
    source on one of its own threads after ``read_table`` has returned; for a Python
    object that thread takes the GIL, and when the interpreter is exiting by then the
    process aborts after the work is done (exit 134, "terminate called without an active
    exception"; apache/arrow#34314). A script that ends with ``s.removals()`` did so."""
    import pyarrow.parquet as pq

    with arrow_source(path) as source:
        return pq.read_table(source, columns=columns)


def read_parquet_parts(path: str, columns: list[str] | None = None):
    """A report table: one Parquet file, or a directory of ``part-*.parquet`` files (the
    parts in name order, which is input order), as one ``pyarrow.Table``."""
    import pyarrow as pa

    if is_local(path) and not os.path.isdir(path) or not is_local(path) and exists(path):
        return read_parquet(path, columns)
    parts = match(join(path, "part-*.parquet"))
    if not parts:
        raise FileNotFoundError(f"{path}: no such file, nor a directory of part-*.parquet files")
    return pa.concat_tables([read_parquet(p, columns) for p in parts])


def arrow_source(path: str):
    """A file for Arrow's readers that Arrow owns (see ``read_parquet``): a local file
    through Arrow's own file, anything else read into an Arrow buffer first."""
    import pyarrow as pa

    if is_local(path):
        return pa.OSFile(path)
    copy = pa.BufferOutputStream()  # Arrow-allocated: nothing Python to release later
    copy.write(read_bytes(path))
    return pa.BufferReader(copy.getvalue())


def makedirs(path: str) -> None:
    """Create a directory and its parents; no error if it exists (a no-op on object
    stores, which have no directories)."""
    if is_local(path):
        _refuse_closed(path)
        os.makedirs(path, exist_ok=True)
    elif not beam_filesystems().exists(path):
        beam_filesystems().mkdirs(path)


def write_bytes_atomic(path: str, data: bytes | memoryview) -> None:
    """Write ``path`` so that readers see the old content or the new, never part of it:
    the bytes go to a hidden temporary name in the same directory, which is then renamed
    over ``path`` (``os.replace`` locally)."""
    if is_local(path):
        write_local_atomic(path, data)
        return
    tmp = temp_path(path, "tmp")
    try:
        with beam_filesystems().create(tmp, compression_type=RAW) as f:
            f.write(data)
        beam_filesystems().rename([tmp], [path])
    except BaseException:
        if beam_filesystems().exists(tmp):
            beam_filesystems().delete([tmp])
        raise


_closed: set[str] = set()  # local trees a stopped job deleted for good (``close_tree``)


def close_tree(path: str) -> None:
    """Delete ``path``'s tree for good in this process: a writer still running (a worker
    thread of a stopped job, which no one can kill) gets an error instead of creating it
    again (a spill folder was left beside the output in 2 of 9 stops of the local
    runner's threads)."""
    if is_local(path):
        _closed.add(os.path.abspath(path))
    delete_tree(path)


def _refuse_closed(path: str) -> None:
    if _closed:
        full = os.path.abspath(path)
        if any(full == root or full.startswith(root + os.sep) for root in _closed):
            raise OSError(f"{path}: the job that writes here was stopped")


def write_scratch(path: str, data: bytes | memoryview | Iterator[memoryview]) -> None:
    """Write a scratch file that only this job reads, under a name no other writer uses
    (spilled values): no fsync and no rename. Its reference travels only once the write
    has returned, and the job deletes it, so what ``write_bytes_atomic`` adds buys
    nothing here; the fsync cost 3.9 s of a 1M x 384 near job's 60 (1.5 GB forced to
    disk). An object store shows an object only once it is complete. ``data`` may come
    as an iterator of parts (written one after another: no copy of them all is made)."""
    parts = data if isinstance(data, Iterator) else [data]
    if is_local(path):
        _refuse_closed(path)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "wb") as f:
            for part in parts:
                f.write(part)
        return
    with beam_filesystems().create(path, compression_type=RAW) as f:
        for part in parts:
            f.write(part)


def upload(local_path: str, path: str) -> None:
    """Copy a local file to ``path`` on any filesystem, streamed (an object store shows the
    object only once it is complete)."""
    with open(local_path, "rb") as src, \
            beam_filesystems().create(path, compression_type=RAW) as dst:
        shutil.copyfileobj(src, dst, _COPY_BLOCK)


@contextmanager
def local_dir_for(path: str) -> Iterator[str]:
    """A local directory to write ``path``'s files into, for writers that need a local
    path (pyarrow, h5py, TensorFlow, matplotlib): ``path`` itself when local (created),
    else a temporary directory whose files are uploaded below ``path`` when the block
    succeeds (and dropped either way)."""
    if is_local(path):
        _refuse_closed(path)
        os.makedirs(path or ".", exist_ok=True)
        yield path
        return
    tmp = tempfile.mkdtemp(prefix="tensordedup-")
    try:
        yield tmp
        for folder, _, names in os.walk(tmp):
            for name in sorted(names):
                local = os.path.join(folder, name)
                upload(local, join(path, *os.path.relpath(local, tmp).split(os.sep)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def local_file_for(path: str) -> Iterator[str]:
    """A local file name to write ``path`` through (see ``local_dir_for``), moved to
    ``path`` if the block created it: a hidden temporary name beside it when local
    (renamed over it: a retried or duplicated task never leaves a torn file under the
    final name), else a temporary file, uploaded."""
    if is_local(path):
        _refuse_closed(path)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = temp_path(path, "tmp")
        try:
            yield tmp
            if os.path.exists(tmp):
                os.replace(tmp, path)
        finally:
            remove_quietly(tmp)
        return
    head, _, name = path.rstrip("/").rpartition("/")
    with local_dir_for(head) as folder:
        yield os.path.join(folder, name)


def write_local_atomic(path: str, data: bytes | memoryview) -> None:
    """``data`` at local ``path`` in one step: written beside it, synced, renamed over it."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = temp_path(path, "tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        remove_quietly(tmp)
        raise


def delete(path: str) -> None:
    """Delete one file; no error if it is missing."""
    delete_files([path])


def delete_files(paths: list[str]) -> None:
    """Delete files; no error for missing ones. Elsewhere than local, one call for all
    (Beam's delete takes a list; gs:// sends them in batches of 100)."""
    remote = [p for p in paths if not is_local(p)]
    for p in paths:
        if is_local(p):
            remove_quietly(p)
    if not remote:
        return
    from apache_beam.io.filesystem import BeamIOError

    try:
        beam_filesystems().delete(remote)
    except BeamIOError:  # also for a missing path (gone is what was wanted): once more
        left = [p for p in remote if beam_filesystems().exists(p)]  # for those still there
        if left:
            beam_filesystems().delete(left)


def rename_tree(src: str, dst: str) -> None:
    """Move the files below ``src`` to the same names below ``dst``: one directory rename
    where the filesystem has directories (local, HDFS); on an object store a copy and a
    delete per object, so other readers can see the move half done."""
    if beam_filesystems().get_filesystem(src).has_dirs():
        if beam_filesystems().exists(src):
            beam_filesystems().rename([src], [dst])
        return
    src, dst = src.rstrip("/"), dst.rstrip("/")
    files = match(src + "/**")
    if files:
        beam_filesystems().rename(files, [dst + f[len(src):] for f in files])


def delete_tree(path: str) -> None:
    """Delete a file or a directory with everything below it; no error if missing."""
    if is_local(path):
        try:
            shutil.rmtree(path)
        except NotADirectoryError:
            remove_quietly(path)
        except FileNotFoundError:
            pass
        return
    if beam_filesystems().get_filesystem(path).has_dirs():  # e.g. HDFS: delete is recursive
        if beam_filesystems().exists(path):
            beam_filesystems().delete([path])
        return
    files = match(path.rstrip("/") + "/**")  # object store: a "directory" is a prefix
    if beam_filesystems().exists(path):
        files.append(path)
    if files:
        beam_filesystems().delete(files)


def remove_quietly(path: str) -> None:
    """Remove a local file that may already be gone."""
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
