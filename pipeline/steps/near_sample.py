"""Near, while planning: the two samples one pass over the records collects.

``Sample`` is the planning sample (bottom-k by digest: it trains the cells);
``RecallRows`` is the recall sample's candidates (a seeded hash of the digest below a
rate, so the same records whatever the chunking; POOL times the sample where it may be
drawn in strata, which the plan's cells decide), whose drawn rows the recall brute
force compares with every chunk. Both are gathered by ``SampleAndPlan``'s one combine,
so no pass over the chunks exists only to pick the recall sample (it read every chunk's
values back: 1.5 s of the 1M x 384 job). Rows whose values wait in a local spill file
travel as (file, rows) and are read back on the worker that makes the plan.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from pipeline.steps.elements import VecBatch
from pipeline.steps.near_cells import collapse
from transforms.exact import is_protected
from transforms.io import fs
from transforms.near.find import sample_cap
from transforms.near.recall import in_sample
from transforms.near.space import search_space
from transforms.near.spec import NearSpec

Ref = tuple[str, np.ndarray, np.dtype]  # (value file, rows in it, their dtype)
Pick = Callable[[VecBatch], tuple[np.ndarray, np.ndarray | None]]  # (drawn, capped flags)


def _ref_of(batch: VecBatch, pick: np.ndarray) -> Ref | None:
    """Where ``pick``'s values can be read back later: the chunk's local spill file, or
    None (values in memory, or in a remote file: the caller carries them, reading only
    those rows, ``VecBatch.picked``, on the worker that has the chunk)."""
    if batch.spilled is not None and fs.is_local(batch.spilled[0]):
        return batch.spilled[0], pick.astype(np.int64), batch.x.dtype
    return None


def _read(ref: Ref, dim: int) -> np.ndarray:
    raw = np.empty((len(ref[1]), dim), ref[2])
    fs.read_rows_into(ref[0], ref[1], raw, np.arange(len(ref[1])))
    return raw


@dataclass
class Sample:
    """Accumulator: the rows with the smallest digests (a uniform sample that does not
    depend on chunking or worker order), the row count and the largest |value|. Rows
    arrive in parts and are cut back to the cap when they hold a quarter more; once the
    cap is full, only rows below the largest digest kept (``below``) enter. A part whose
    rows wait in a local spill file names them (file, rows) instead of carrying their
    values: two workers' samples of 134 MB each took 4.6 s to move to the merge at
    1M x 384 (and were the crowds job's peak); their references take a few MB.
    ``recall``: the recall sample's candidates, drawn among the ``fresh`` rows (this
    run's, not a store's or reference's: those are never removed, so never judged)."""

    lo: list[np.ndarray]  # (k,) uint64 digest word, per part
    v: list[np.ndarray | None]  # (k, d) float32 rows of the search space, or None ...
    ref: list[Ref | None]  # ... (value file, rows, dtype)
    recall: RecallRows
    n: int = 0
    scale: float = 0.0
    below: int = 1 << 64
    widths: set[int] = field(default_factory=set)  # values per record (one, or an error)
    fresh: int = 0  # rows not protected

    def cap(self) -> int:
        return sample_cap(next(iter(self.widths), 1))

    def add(self, batch: VecBatch, spec: NearSpec) -> None:
        """A chunk's rows that may be in either sample (``n`` already counts them,
        ``fresh`` counts them here)."""
        lo = batch.words[:, 1]
        full = self.below < 1 << 64
        pick = np.flatnonzero(lo < np.uint64(self.below)) if full else np.arange(len(lo))
        if len(pick):
            ref = _ref_of(batch, pick)
            self.lo.append(lo[pick])
            self.ref.append(ref)
            with np.errstate(over="ignore"):  # beyond float32: inf, left out by the plan
                self.v.append(None if ref is not None else search_space(
                    batch.picked(pick).x, spec).astype(np.float32))
        mine = ~is_protected(batch.prio)  # the recall judges this run's records only
        self.fresh += int(np.count_nonzero(mine))
        self.recall.add(batch, self.fresh, mine)
        if sum(len(p) for p in self.lo) > self.cap() * 5 // 4:
            self.compact()

    def compact(self) -> Sample:
        """Keep the ``cap`` smallest digests (the first row of each), part by part, and
        the recall candidates still below the rate of ``n`` rows."""
        self.recall.cut(self.fresh)
        if not self.lo:
            return self
        lo = np.concatenate(self.lo)
        _, first = np.unique(lo, return_index=True)  # sorted: the smallest digests first
        cap = self.cap()
        keep = np.zeros(len(lo), bool)
        keep[first[:cap]] = True
        parts, at = [], 0
        for p, v, ref in zip(self.lo, self.v, self.ref, strict=True):
            m = keep[at:at + len(p)]
            at += len(p)
            if m.any():
                parts.append((p[m], None if v is None else v[m],
                              None if ref is None else (ref[0], ref[1][m], ref[2])))
        self.lo, self.v, self.ref = (list(c) for c in zip(*parts, strict=True))
        if len(first) >= cap:
            self.below = int(lo[first[cap - 1]])
        return self

    @staticmethod
    def merged(accs: list[Sample]) -> Sample:
        return Sample([p for a in accs for p in a.lo], [p for a in accs for p in a.v],
                      [p for a in accs for p in a.ref],
                      RecallRows.merged([a.recall for a in accs]), sum(a.n for a in accs),
                      max(a.scale for a in accs), min(a.below for a in accs),
                      set().union(*(a.widths for a in accs)),
                      sum(a.fresh for a in accs)).compact()

    def rows(self, spec: NearSpec) -> np.ndarray:
        """The sample's search-space rows, float32, in digest order (values read back
        from the spill files they name)."""
        self.compact()
        lo = np.concatenate(self.lo)
        x = np.empty((len(lo), next(iter(self.widths))), np.float32)
        at = 0
        for p, v, ref in zip(self.lo, self.v, self.ref, strict=True):
            if ref is not None:
                v = search_space(_read(ref, x.shape[1]), spec)
            with np.errstate(over="ignore"):
                x[at:at + len(p)] = v
            at += len(p)
        return x[np.argsort(lo)]


@dataclass
class RecallRows:
    """The recall sample's candidates: rows whose digest hashes below ``size`` / n
    (``in_sample``). The rate falls as n grows, so the rows below the rate of the rows
    counted so far hold the final sample (about size x ln(chunks) rows at most); ``cut``
    drops those no longer below it, and the plan keeps exactly ``in_sample``'s rows of
    all n."""

    size: int
    parts: list[VecBatch] = field(default_factory=list)  # values, or none and a ref
    refs: list[Ref | None] = field(default_factory=list)

    def add(self, batch: VecBatch, n: int, mine: np.ndarray) -> None:
        """A chunk's candidates among its rows not protected (``mine``; ``n`` of them
        so far)."""
        pick = np.flatnonzero(in_sample(batch.words, n, self.size) & mine)
        if len(pick):
            ref = _ref_of(batch, pick)
            self.refs.append(ref)
            self.parts.append(batch.take(pick, values=False) if ref is not None
                              else batch.picked(pick))
            if sum(len(b) for b in self.parts) > 2 * self.size:
                self.cut(n)

    def cut(self, n: int) -> None:
        parts, refs = [], []
        for b, ref in zip(self.parts, self.refs, strict=True):
            m = np.flatnonzero(in_sample(b.words, n, self.size))
            if len(m):
                parts.append(b.take(m, values=ref is None))
                refs.append(None if ref is None else (ref[0], ref[1][m], ref[2]))
        self.parts, self.refs = parts, refs

    @staticmethod
    def merged(all_rows: list[RecallRows]) -> RecallRows:
        return RecallRows(all_rows[0].size, [b for r in all_rows for b in r.parts],
                          [f for r in all_rows for f in r.refs])

    def sample(self, dim: int, folder: str, pick: Pick) -> tuple[VecBatch | None,
                                                                np.ndarray | None]:
        """The sample, once: in keep order, a digest's best row standing for it (every
        chunk's brute force reads this one batch), its values in a file in ``folder``
        (as a side input, 2,000 wide records (128 MB) were held by the runner and each
        worker's cache several times over). ``pick``: which of the candidates are drawn
        (``near.recall.draw``), with their capped flags if drawn in strata (returned
        for the rows drawn)."""
        if not self.parts:
            return None, None
        parts = [b if ref is None else dataclasses.replace(b, x=_read(ref, dim))
                 for b, ref in zip(self.parts, self.refs, strict=True)]
        rows = VecBatch.concat(parts)
        rows = rows.take(np.lexsort((rows.order, rows.prio)))
        rows = rows.take(collapse(rows))
        drawn, capped = pick(rows)
        drawn = np.flatnonzero(drawn)
        return rows.take(drawn).spill(folder), None if capped is None else capped[drawn]
