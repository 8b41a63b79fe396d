"""Exact-duplicate grouping over arrays of digests: which record of each group survives.

Why a sort and not a dict: one ``lexsort`` over (digest, priority, order) groups and
ranks a whole shard in C, and ties are broken by input order, so the result is the
same on every run and runner whatever order the shuffle delivered the rows in.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KEEP_POLICIES = ("first", "last", "max", "min")
# Where a record comes from. Protected tiers (a reference set, the store of earlier runs)
# always survive and are preferred over this run's records: reference first, then store.
NEW, STORE, REFERENCE = 0, 1, 2
_TIER_SPAN = 1 << 61  # protected orders: [-2**63, -2**63 + 2 * _TIER_SPAN), below any NEW


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
               rank: np.ndarray | None = None, tier: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
    """(priority, input order): sorting by priority, then input order, puts the record
    each keep policy prefers first. Shared by the exact and the near stage, so both
    pick the same survivor.

    ``tier`` (NEW | STORE | REFERENCE per row) folds protection into the same two keys:
    protected rows get priority -inf and an order below every NEW row (reference before
    store), so every sort that ranks records ranks them first, with no extra key."""
    if keep not in KEEP_POLICIES:
        raise ValueError(f"keep must be one of {KEEP_POLICIES}, got {keep!r}")
    sign = -1 if keep == "last" else 1
    where = (file_index.astype(np.int64) << 40) | position  # positions < 2**40
    in_order = sign * where
    prio = (np.zeros(len(in_order)) if keep in ("first", "last") else _priority(keep, rank))
    if tier is not None and (tier != NEW).any():
        prot = tier != NEW
        below = np.iinfo(np.int64).min + (REFERENCE - tier.astype(np.int64)) * _TIER_SPAN
        in_order = np.where(prot, below + (where & (_TIER_SPAN - 1)), in_order)
        prio = np.where(prot, -np.inf, np.maximum(prio, np.finfo(np.float64).min))
    return prio, in_order


def is_protected(prio: np.ndarray) -> np.ndarray:
    """Rows ``keep_order`` marked protected (never removed)."""
    return prio == -np.inf


def tier_of(prio: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Recover each row's tier from its keep order (for naming the kind of a removal)."""
    ref_end = np.iinfo(np.int64).min + _TIER_SPAN
    return np.where(~is_protected(prio), NEW, np.where(order < ref_end, REFERENCE, STORE))


def _sharing_first_word(hi: np.ndarray) -> np.ndarray:
    """Rows whose first digest word another row has too: only they can be duplicates.
    One sort of a single word (~0.05 s per 1e6 rows) sets the rest aside, so the
    three-key ``lexsort`` (~4x slower per row) runs over the duplicates, not the shard."""
    by_hi = np.argsort(hi)
    same = np.zeros(len(hi), dtype=bool)
    eq = hi[by_hi[1:]] == hi[by_hi[:-1]]
    same[1:] |= eq
    same[:-1] |= eq
    return np.sort(by_hi[same])


def find_exact_duplicates(words: np.ndarray, file_index: np.ndarray, position: np.ndarray,
                          keep: str = "first", rank: np.ndarray | None = None,
                          tier: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Rows whose digest equals another row's, and the row each duplicates.

    ``words``: (n, 2) uint64 digests; ``file_index``/``position``: the input order
    ("first" = smallest (file_index, position)); ``keep``: first | last | max | min
    (max/min by ``rank``, ties by input order); ``tier``: protected rows (see
    ``keep_order``) win every group and are never removed. Returns ``(removed, kept)``
    index arrays: row ``removed[i]`` is a duplicate of the surviving row ``kept[i]``;
    ``removed`` is sorted by input order.
    """
    prio, in_order = keep_order(file_index, position, keep, rank, tier)
    shared = _sharing_first_word(words[:, 0])
    keys = (in_order, words[:, 1], words[:, 0]) if keep in ("first", "last") else (
        in_order, prio, words[:, 1], words[:, 0])  # protected orders sort first either way
    order = shared[np.lexsort([k[shared] for k in keys])]
    w = words[order]
    starts = np.ones(len(order), dtype=bool)
    starts[1:] = (w[1:] != w[:-1]).any(axis=1)
    keeper = order[np.flatnonzero(starts)][np.cumsum(starts) - 1]
    removed, kept = order[~starts], keeper[~starts]
    if tier is not None:
        mine = tier[removed] == NEW
        removed, kept = removed[mine], kept[mine]
    by_input = np.lexsort((position[removed], file_index[removed]))
    return removed[by_input], kept[by_input]


@dataclass(frozen=True)
class Keep:
    """Which record of a duplicate group survives: the ``first`` or ``last`` in input
    order, or the one with the largest (``max``) or smallest (``min``) value of
    ``column`` (ties: input order). ``Keep.first()``, ``Keep.max("quality")``..."""

    rule: str = "first"
    column: str | None = None

    def __post_init__(self) -> None:
        if self.rule not in KEEP_POLICIES:
            raise ValueError(f"keep must be one of {', '.join(KEEP_POLICIES)}, got {self.rule!r}")
        if (self.column is None) != (self.rule in ("first", "last")):
            raise ValueError(f"keep {self.rule!r} {'needs' if self.column is None else 'takes no'}"
                             " column")

    @classmethod
    def first(cls) -> Keep:
        return cls("first")

    @classmethod
    def last(cls) -> Keep:
        return cls("last")

    @classmethod
    def max(cls, column: str) -> Keep:
        return cls("max", column)

    @classmethod
    def min(cls, column: str) -> Keep:
        return cls("min", column)

    @classmethod
    def of(cls, keep: Keep | str) -> Keep:
        """A ``Keep`` from itself or a rule name ("first" | "last")."""
        return keep if isinstance(keep, Keep) else cls(keep)
