"""Which process made a lease or a temporary file, and whether that process still runs.

A lease records its holder in its JSON (host, pid, start time: ``transforms.io.lease``); a
temporary file carries its maker in its name (``tag``, used by ``fs.temp_path``), so a
later run can tell what a killed process left from what a live one is still using, and
remove only the former (``fs.clear_dead_temps``). Linux's /proc gives start times (a
reused pid is another process); elsewhere a pid that exists counts as alive.
"""

from __future__ import annotations

import hashlib
import os
import socket

HOST = socket.gethostname()
HOST_KEY = hashlib.sha1(HOST.encode()).hexdigest()[:8]  # a host, in a file name


def tag() -> str:
    """This process in a file name: ``<pid>-<start time>-<host key>``."""
    pid = os.getpid()
    return f"{pid}-{start_time(pid) or 0}-{HOST_KEY}"


def tag_is_dead(pid: int, start: int, host_key: str) -> bool:
    """Whether the maker a ``tag`` names is gone: only judged on its own host."""
    return host_key == HOST_KEY and not alive(pid, start or None)


def alive(pid: object, start: object) -> bool:
    """Whether process ``pid`` of this host exists, is not a zombie, and (when known) is
    the same process (same start time), not a reuse of its pid."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    stat = _proc_stat(pid)
    if stat is None:
        return True
    return stat[0] != "Z" and (start is None or stat[1] == start)


def start_time(pid: int) -> int | None:
    stat = _proc_stat(pid)
    return None if stat is None else stat[1]


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks) from /proc (Linux); None elsewhere."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[19])
