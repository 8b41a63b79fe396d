"""Borderline pairs: the verified pairs nearest the threshold on each side.

Where a wrong threshold shows first. Each cell keeps its own sample and the merge
keeps the same number of pairs again, so only a few rows travel to the report.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

BORDERLINE_SCHEMA = pa.schema([("record_id", pa.string()), ("neighbour_id", pa.string()),
                               ("distance", pa.float64()), ("within", pa.bool_())])
# Ties on distance are broken by ids so that every run and every split picks the same rows.
ORDER = [("distance", "ascending"), ("record_id", "ascending"), ("neighbour_id", "ascending")]



def _top(table: pa.Table, k: int, keys: list[tuple[str, str]]) -> pa.Table:
    """First ``k`` rows by ``keys`` in O(n log k); the keys are a total order, so no ties."""
    if table.num_rows == 0:  # select_k_unstable fails on an empty table
        return table
    return table.take(pc.select_k_unstable(table, min(k, table.num_rows), keys))


def _select(table: pa.Table, per_side: int) -> pa.Table:
    """Largest-distance ``within`` pairs and smallest-distance others, ``per_side`` each."""
    k = max(per_side, 0)
    if table.num_rows:  # a pair met twice (two partitions, or search and kNN) counts once
        table = table.group_by(["record_id", "neighbour_id"], use_threads=False).aggregate(
            [("distance", "min"), ("within", "max")]).rename_columns(BORDERLINE_SCHEMA.names)
    inside = _top(table.filter(pc.field("within")), k, [("distance", "descending")] + ORDER[1:])
    outside = _top(table.filter(~pc.field("within")), k, ORDER)
    return pa.concat_tables([inside, outside]).sort_by(ORDER)


def borderline_sample(later_ids: pa.Array, earlier_ids: pa.Array, distance: np.ndarray,
                      within: np.ndarray, per_side: int) -> pa.Table:
    """Pairs nearest the threshold on each side, where a wrong threshold shows first."""
    distance = np.asarray(distance, dtype=np.float64)
    if np.isnan(distance).any():
        raise ValueError("distance holds NaN")
    table = pa.table([pa.array(later_ids).cast(pa.string()),
                      pa.array(earlier_ids).cast(pa.string()),
                      pa.array(distance), pa.array(np.asarray(within, dtype=bool))],
                     schema=BORDERLINE_SCHEMA)
    return _select(table, per_side)


def merge_borderline(tables: list[pa.Table], per_side: int) -> pa.Table:
    """Combine per-shard samples; equals ``borderline_sample`` of all pairs at once."""
    if not tables:
        return BORDERLINE_SCHEMA.empty_table()
    return _select(pa.concat_tables([t.select(BORDERLINE_SCHEMA.names).cast(BORDERLINE_SCHEMA)
                                     for t in tables]), per_side)
