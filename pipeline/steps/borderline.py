"""Borderline pairs: the verified pairs nearest the threshold on each side.

Where a wrong threshold shows first. Each cell keeps its own sample and the merge
keeps the same number of pairs again, so only a few rows travel to the report.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

BORDERLINE_SCHEMA = pa.schema([("record_id", pa.string()), ("neighbour_id", pa.string()),
                               ("distance", pa.float64()), ("within", pa.bool_()),
                               ("record_file", pa.int32()), ("record_row", pa.int64()),
                               ("neighbour_file", pa.int32()), ("neighbour_row", pa.int64())])
# Where each end lives (file index, position; -1 (null in the report) for a stored record
# of an earlier run): part of a pair's identity, so two records that share an id stay two.
_WHERE = ["record_file", "record_row", "neighbour_file", "neighbour_row"]
# Ties on distance are broken by ids so that every run and every split picks the same rows.
ORDER = [("distance", "ascending"), ("record_id", "ascending"), ("neighbour_id", "ascending")]



def _top(table: pa.Table, k: int, keys: list[tuple[str, str]]) -> pa.Table:
    """First ``k`` rows by ``keys`` in O(n log k); the keys are a total order, so no ties."""
    if table.num_rows == 0:  # select_k_unstable fails on an empty table
        return table
    return table.take(pc.select_k_unstable(table, min(k, table.num_rows), keys))


def _select(table: pa.Table, per_side: int, distinct: bool = False) -> pa.Table:
    """Largest-distance ``within`` pairs and smallest-distance others, ``per_side`` each.
    ``distinct``: no pair is in the table twice (else each counts once, at its least
    distance: Arrow's group-by, about a millisecond a call)."""
    k = max(per_side, 0)
    if table.num_rows and not distinct:  # a pair met twice (two cells, search and kNN)
        keys = ["record_id", "neighbour_id", *_WHERE]
        table = table.group_by(keys, use_threads=False).aggregate(
            [("distance", "min"), ("within", "max")])
        table = table.rename_columns([{"distance_min": "distance", "within_max": "within"}
                                      .get(n, n) for n in table.column_names])
        table = table.select(BORDERLINE_SCHEMA.names)
    within = table.column("within")  # a mask, not an expression: no Acero plan per call
    inside = _top(table.filter(within), k, [("distance", "descending")] + ORDER[1:])
    outside = _top(table.filter(pc.invert(within)), k, ORDER)
    return pa.concat_tables([inside, outside]).sort_by(ORDER)


def borderline_sample(later_ids: pa.Array, earlier_ids: pa.Array, distance: np.ndarray,
                      within: np.ndarray, per_side: int,
                      later_at: tuple[np.ndarray, np.ndarray] | None = None,
                      earlier_at: tuple[np.ndarray, np.ndarray] | None = None,
                      distinct: bool = False) -> pa.Table:
    """Pairs nearest the threshold on each side, where a wrong threshold shows first.
    ``*_at``: (file index, position) of each end (default -1: unknown); ``distinct``:
    the caller has merged pairs met twice already."""
    distance = np.asarray(distance, dtype=np.float64)
    if np.isnan(distance).any():
        raise ValueError("distance holds NaN")
    n = len(distance)
    where = []
    for at in (later_at, earlier_at):
        f, p = (np.full(n, -1), np.full(n, -1)) if at is None else at
        where += [pa.array(np.asarray(f, np.int32)), pa.array(np.asarray(p, np.int64))]
    table = pa.table([pa.array(later_ids).cast(pa.string()),
                      pa.array(earlier_ids).cast(pa.string()),
                      pa.array(distance), pa.array(np.asarray(within, dtype=bool)), *where],
                     schema=BORDERLINE_SCHEMA)
    return _select(table, per_side, distinct)


def merge_borderline(tables: list[pa.Table], per_side: int) -> pa.Table:
    """Combine per-shard samples; equals ``borderline_sample`` of all pairs at once."""
    if not tables:
        return BORDERLINE_SCHEMA.empty_table()
    return _select(pa.concat_tables([t.select(BORDERLINE_SCHEMA.names).cast(BORDERLINE_SCHEMA)
                                     for t in tables]), per_side)
