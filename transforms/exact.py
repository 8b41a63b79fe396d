"""Exact-duplicate grouping over arrays of digests: which record of each group survives.

Why a sort and not a dict: one ``lexsort`` over (digest, priority, order) groups and
ranks a whole shard in C, and ties are broken by input order, so the result is the
same on every run and runner whatever order the shuffle delivered the rows in.
"""

from __future__ import annotations

import numpy as np

KEEP_POLICIES = ("first", "last", "max", "min")


def digest_words(digests: np.ndarray) -> np.ndarray:
    """V16 digests -> (n, 2) native uint64 (hi, lo): sortable, cheap to shuffle."""
    return digests.view(">u8").reshape(-1, 2).astype(np.uint64)


def _priority(keep: str, rank: np.ndarray | None) -> np.ndarray:
    """Smaller = preferred (max/min). NaN ranks are never preferred over a number."""
    if rank is None:
        raise ValueError(f"keep {keep!r} needs the rank values")
    prio = -rank.astype(np.float64) if keep == "max" else rank.astype(np.float64)
    return np.where(np.isnan(prio), np.inf, prio)


def keep_order(file_index: np.ndarray, position: np.ndarray, keep: str,
               rank: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(priority, input order): sorting by priority, then input order, puts the record
    each keep policy prefers first. Shared by the exact and the near stage, so both
    pick the same survivor."""
    if keep not in KEEP_POLICIES:
        raise ValueError(f"keep must be one of {KEEP_POLICIES}, got {keep!r}")
    sign = -1 if keep == "last" else 1
    in_order = sign * ((file_index.astype(np.int64) << 40) | position)  # positions < 2**40
    prio = (np.zeros(len(in_order)) if keep in ("first", "last") else _priority(keep, rank))
    return prio, in_order


def find_exact_duplicates(words: np.ndarray, file_index: np.ndarray, position: np.ndarray,
                          keep: str = "first",
                          rank: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Rows whose digest equals another row's, and the row each duplicates.

    ``words``: (n, 2) uint64 digests; ``file_index``/``position``: the input order
    ("first" = smallest (file_index, position)); ``keep``: first | last | max | min
    (max/min by ``rank``, ties by input order). Returns ``(removed, kept)`` index
    arrays: row ``removed[i]`` is a duplicate of the surviving row ``kept[i]``;
    ``removed`` is sorted by input order.
    """
    n = len(words)
    prio, in_order = keep_order(file_index, position, keep, rank)
    keys = (in_order, words[:, 1], words[:, 0]) if keep in ("first", "last") else (
        in_order, prio, words[:, 1], words[:, 0])
    order = np.lexsort(keys)
    w = words[order]
    starts = np.ones(n, dtype=bool)
    starts[1:] = (w[1:] != w[:-1]).any(axis=1)
    keeper = order[np.flatnonzero(starts)][np.cumsum(starts) - 1]
    removed, kept = order[~starts], keeper[~starts]
    by_input = np.lexsort((position[removed], file_index[removed]))
    return removed[by_input], kept[by_input]

