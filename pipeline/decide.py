"""Decide: join, per input file, its read facts and every removal -> FileDecision.

Removal streams (exact now, near later) are flattened here, so a new stage only
adds one more (file_index, Removed) PCollection.
"""

from __future__ import annotations

from collections.abc import Iterable

import apache_beam as beam
import numpy as np

from pipeline.elements import FileDecision, ReadFacts, Removed


def _merge(parts: list[Removed]) -> list[Removed]:
    """One Removed per kind, sorted by position (deterministic whatever the shuffle order)."""
    merged = []
    for kind in sorted({p.kind for p in parts}):
        same = [p for p in parts if p.kind == kind]
        pos = np.concatenate([p.position for p in same])
        order = np.argsort(pos, kind="stable")
        merged.append(Removed(pos[order], np.concatenate([p.record_id for p in same])[order],
                              np.concatenate([p.duplicate_of for p in same])[order], kind,
                              np.concatenate([p.distance for p in same])[order]))
    return merged


def decide(file_index: int, joined: dict[str, Iterable]) -> FileDecision:
    (path,) = list(joined["path"])
    facts: list[ReadFacts] = list(joined["facts"])
    invalid = sorted((r for f in facts for r in f.invalid), key=lambda r: r.position)
    return FileDecision(file_index, path, sum(f.n_read for f in facts),
                        _merge(list(joined["removed"])), invalid)


class Decide(beam.PTransform):
    """{"facts": (i, ReadFacts), removal streams: (i, Removed)...} -> FileDecision."""

    def __init__(self, files: list[str]):
        super().__init__()
        self.files = files

    def expand(self, streams: dict):
        pipeline = streams["facts"].pipeline
        paths = pipeline | "ListFiles" >> beam.Create(list(enumerate(self.files)))
        removals = [v for k, v in sorted(streams.items()) if k != "facts"]
        removed = (removals | "FlattenRemovals" >> beam.Flatten() if removals
                   else pipeline | "NoRemovals" >> beam.Create([]))
        return ({"path": paths, "facts": streams["facts"], "removed": removed}
                | "JoinByFile" >> beam.CoGroupByKey()
                | "DecidePerFile" >> beam.MapTuple(decide))
