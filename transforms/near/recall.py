"""How much a near search missed, measured: brute force on a seeded sample of records.

Why: bounded mode and IVF/HNSW cells may lose pairs, and a user deciding whether to
trust a cleaned dataset needs a number, not an argument. A sample of distinct records
(chosen by a seeded hash of their key, so it does not depend on chunking or worker
order) is compared with every record, verified in float64 with the metric itself.

Each sampled record that has an earlier partner within tolerance (one its decision
depends on) is judged by its decision: right when it was kept and no earlier partner
was kept, or removed in favour of a kept earlier partner with no kept one nearer.
Recall is the share judged right, with a Wilson 95% interval (an honest lower
bound even when every one was right). So it judges against the records kept: a record
within tolerance only of records that were themselves removed is rightly kept (its
partner's survivor may be farther than the tolerance). ``recall_removed`` answers the
other question a user asks: of the sampled records within tolerance of some earlier
record, kept or not, the share that was removed (with its own interval); keep order
decides how far the two differ. The search never lists its pairs (a crowd of
copies has millions), so records are judged, not pairs; inside a crowd a sampled
record keeps only its ``PARTNERS`` nearest earlier partners and its ``PARTNERS``
latest ones in keep order, and the judgement looks at those (``truncated`` counts the
records where more existed). The latest: bounded mode offers a record at most 64 kept
ones per band, so a kept partner it can miss was kept late (on a 100,000-copy licence
crowd at J 0.8 they showed 2 wrong decisions of 1,905 that the nearest alone judged
right). A kept record whose listed partners were all removed while more exist cannot
be judged from them: a kept partner may be among the others. Such records
(``unsure``) count as right in the point estimate and as misses at the interval's
lower end, so the interval stays honest (that crowd printed 0.9995, 0.9989-0.9999,
where its decisions against a greedy brute force over every record agree on 0.9106 of
the removals; now 0.9984, 0.7983-0.9995).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

Z95 = 1.959963984540054
PARTNERS = 32  # nearest earlier partners kept per sampled record (and as many latest)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: uint64 -> well-spread uint64."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def in_sample(keys: np.ndarray, rows: int, size: int, seed: int = 0) -> np.ndarray:
    """Rows whose key ((n, 2) uint64) hashes below size / rows of the range: about
    ``size`` distinct keys out of ``rows``, the same keys whatever the order."""
    if size <= 0 or rows <= 0:
        return np.zeros(len(keys), bool)
    with np.errstate(over="ignore"):
        h = splitmix64(splitmix64(keys[:, 0] ^ np.uint64(seed)) ^ keys[:, 1])
    cut = min(size / rows, 1.0) * 2.0 ** 64
    return h.astype(np.float64) < cut


def wilson(k: int, m: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion k / m."""
    if m == 0:
        return 0.0, 1.0
    p = k / m
    den = 1 + z * z / m
    mid = (p + z * z / (2 * m)) / den
    half = z * math.sqrt(p * (1 - p) / m + z * z / (4 * m * m)) / den
    return max(0.0, mid - half), 1.0 if k == m else min(1.0, mid + half)


@dataclass
class Recall:
    sampled: int  # distinct records in the sample
    with_partners: int  # of them, records with an earlier partner within tolerance
    recalled: int  # of those, records whose decision was right
    pairs: int  # (sampled record, earlier partner) pairs within tolerance
    truncated: int  # records judged on the earlier partners listed (PARTNERS nearest and
    # PARTNERS latest) only
    recall: float | None  # recalled / with_partners (None: no sampled record had one)
    low: float  # Wilson 95% lower end, counting the unsure records as misses
    high: float
    removed: int = 0  # of the records with an earlier partner, those removed
    recall_removed: float | None = None  # removed / with_partners
    removed_low: float = 0.0
    removed_high: float = 1.0
    unsure: int = 0  # of the recalled: kept, truncated, every listed partner removed

    def as_dict(self) -> dict:
        return {**self.__dict__, "interval": 0.95, "judged": "decisions"}


@dataclass
class Truth:
    """Brute-force partners of sampled records: for each, its nearest earlier partners
    within tolerance (the sampled record within tolerance of the partner as the
    reference), cut to the PARTNERS nearest and the PARTNERS latest in keep order, and
    how many there are in all. Records are (n, 2)
    uint64 keys; (``prio``, ``order``) orders partners as keep order does."""

    sample: np.ndarray  # (m, 2) uint64
    partner: np.ndarray  # (m, 2) uint64
    dist: np.ndarray  # (m,) float64
    prio: np.ndarray  # (m,) float64: the partner's place in keep order (first key) ...
    order: np.ndarray  # (m,) int64: ... and (second key)
    counts: dict  # sampled key -> partners in all

    @classmethod
    def empty(cls) -> Truth:
        e = np.empty((0, 2), np.uint64)
        return cls(e, e, np.empty(0), np.empty(0), np.empty(0, np.int64), {})

    def add(self, other: Truth) -> Truth:
        counts = dict(self.counts)
        for k, c in other.counts.items():
            counts[k] = counts.get(k, 0) + c
        return Truth.concat([self, other], counts).cut()

    @classmethod
    def concat(cls, parts: list[Truth], counts: dict) -> Truth:
        """The parts' partners end to end, uncut, with ``counts``."""
        return cls(*(np.concatenate([getattr(t, f) for t in parts])
                     for f in ("sample", "partner", "dist", "prio", "order")), counts)

    def cut(self) -> Truth:
        """Each sampled record's PARTNERS nearest partners (distance, then keep order) and
        its PARTNERS latest (keep order from the end, then distance)."""
        if not len(self.dist):
            return self
        o = np.lexsort((self.order, self.prio, self.dist, self.sample[:, 1], self.sample[:, 0]))
        s = self.sample[o]
        start = np.r_[True, (s[1:] != s[:-1]).any(axis=1)]
        first = np.maximum.accumulate(np.where(start, np.arange(len(o)), 0))
        keep = o[np.arange(len(o)) - first < PARTNERS]
        e = np.lexsort((self.dist, -self.order, -self.prio, self.sample[:, 1], self.sample[:, 0]))
        keep = np.union1d(keep, e[np.arange(len(e)) - first < PARTNERS])
        return Truth(self.sample[keep], self.partner[keep], self.dist[keep], self.prio[keep],
                     self.order[keep], self.counts)


def judge(truth: Truth, sampled: set, removed: dict, components: bool = False) -> Recall:
    """``sampled``: keys of sampled records; ``removed``: key -> (key it duplicates,
    distance) for every removed record (others were kept). ``components``: a record
    with an earlier partner is right when removed (its component keeps an earlier
    record; which one, the brute force cannot tell from a sample)."""
    by: dict = {}
    for s, p, d, r, o in zip(map(tuple, truth.sample.tolist()),
                             map(tuple, truth.partner.tolist()), truth.dist.tolist(),
                             truth.prio.tolist(), truth.order.tolist(), strict=True):
        if s in sampled:
            by.setdefault(s, []).append((d, r, o, p))
    right = unsure = 0
    for s, partners in by.items():
        partners.sort()
        kept = [(d, p) for d, *_, p in partners if p not in removed]
        cut = truth.counts.get(s, 0) > len(partners)  # farther partners exist, not listed
        if components:
            right += s in removed
        elif s in removed:  # wrong only if a listed kept partner is nearer than its dup
            dup, d = removed[s]
            right += (not kept and cut) or (bool(kept) and (kept[0][1] == dup or kept[0][0] >= d))
        else:
            right += not kept
            unsure += not kept and cut
    m = len(by)
    low, high = wilson(right - unsure, m)[0], wilson(right, m)[1]
    truncated = sum(truth.counts.get(s, 0) > len(p) for s, p in by.items())
    gone = sum(s in removed for s in by)
    return Recall(len(sampled), m, right, int(sum(truth.counts.get(s, 0) for s in by)),
                  truncated, right / m if m else None, low, high,
                  gone, gone / m if m else None, *wilson(gone, m), unsure)


def recall_line(r: dict | None) -> str:
    """One line for a ``Recall.as_dict()``."""
    if r is None:
        return "recall not measured (recall_sample: 0)"
    if r["recall"] is None:
        return (f"recall not measured: none of {r['sampled']:,} sampled records has a near "
                "duplicate")
    line = (f"recall {r['recall']:.4f} (95% interval {r['low']:.4f}-{r['high']:.4f}; "
            f"{r['with_partners']:,} of {r['sampled']:,} sampled records have an earlier near "
            "duplicate, their decisions checked by brute force against the records kept"
            + (f"; {r['unsure']:,} kept ones judged on their {PARTNERS} nearest and {PARTNERS} "
               "latest partners only, all removed: misses at the interval's lower end"
               if r.get("unsure") else "")
            + ")")
    if r.get("recall_removed") is None:  # a summary written before recall_removed
        return line
    return (f"{line}; recall_removed {r['recall_removed']:.4f} ("
            f"{r['removed_low']:.4f}-{r['removed_high']:.4f}: {r['removed']:,} of them "
            "removed, kept or not their earlier near duplicate)")
