"""Decide: join, per input file, its read facts and every removal -> FileDecision.

Removal streams (exact now, near later) are flattened here, so a new stage only
adds one more (file_index, Removed) PCollection.
"""

from __future__ import annotations

from collections.abc import Iterable

import apache_beam as beam

from pipeline.steps.elements import EMBEDDED, FACTS, FILES, REMOVED, SEEN, FileDecision, ReadFacts
from pipeline.steps.removed import Removed
from transforms.io.formats.base import records_of


def _merge(parts: list[Removed], spill: str | None) -> list[Removed]:
    """One Removed per kind, sorted by position (deterministic whatever the shuffle order);
    with ``spill``, a large one as a stand-in for its file (a lone part is one already)."""
    out = []
    for kind in sorted({p.kind for p in parts}):
        mine = [p for p in parts if p.kind == kind]
        out.append(mine[0] if len(mine) == 1 else Removed.concat_sorted(mine).spill(spill))
    return out


def decide(file_index: int, joined: dict[str, Iterable], checked: bool,
           spill: str | None = None) -> FileDecision:
    (path,) = list(joined[FILES])
    facts: list[ReadFacts] = list(joined[FACTS])
    invalid = sorted((r for f in facts for r in f.invalid), key=lambda r: r.position)
    n_read = sum(f.n_read for f in facts)
    valid = n_read - len(records_of(invalid))  # an unreadable file is no record
    if checked and sum(joined[SEEN]) != valid:
        raise RuntimeError(f"{path}: {valid} valid records were read but "
                           f"{sum(joined[SEEN])} reached the duplicate check: refusing to "
                           "write a clean copy that was not fully checked")
    removed = _merge(list(joined[REMOVED]), spill)
    if EMBEDDED in joined:  # every record exact dedup kept went through the model
        kept = valid - sum(len(r) for r in removed if r.kind.endswith("exact"))
        if sum(joined[EMBEDDED]) != kept:
            raise RuntimeError(f"{path}: exact dedup kept {kept} records but "
                               f"{sum(joined[EMBEDDED])} were embedded: refusing to write a "
                               "clean copy whose near duplicates were not all searched")
    return FileDecision(file_index, path, n_read, removed, invalid)


class Decide(beam.PTransform):
    """{FILES: (i, path), FACTS: (i, ReadFacts), SEEN: (i, rows) and EMBEDDED: (i, rows)
    (optional, checked), removal streams (any other key): (i, Removed)} -> FileDecision.
    ``spill``: a folder for large merged removal lists (``Removed.spill``)."""

    def __init__(self, spill: str | None = None):
        super().__init__()
        self.spill = spill

    def expand(self, streams: dict):
        pipeline = streams[FACTS].pipeline
        counts = (FILES, FACTS, SEEN, EMBEDDED)
        removals = [v for k, v in sorted(streams.items()) if k not in counts]
        removed = (removals | "FlattenRemovals" >> beam.Flatten() if removals
                   else pipeline | "NoRemovals" >> beam.Create([]))
        joined = {FILES: streams[FILES], FACTS: streams[FACTS], REMOVED: removed}
        joined.update({k: streams[k] for k in (SEEN, EMBEDDED) if k in streams})
        return (joined
                | "JoinByFile" >> beam.CoGroupByKey()
                | "DecidePerFile" >> beam.Map(
                    lambda kv, checked, spill: decide(*kv, checked, spill),
                    SEEN in streams, self.spill))
