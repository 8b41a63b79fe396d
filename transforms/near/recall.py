"""How much a near search missed, measured: brute force on a seeded sample of records.

Why: bounded mode and IVF/HNSW cells may lose pairs, and a user deciding whether to
trust a cleaned dataset needs a number, not an argument. A sample of distinct records
(chosen by a seeded hash of their key, so it does not depend on chunking or worker
order) is compared with every record, verified in float64 with the metric itself.

Each sampled record that has an earlier partner within tolerance (one its decision
depends on) is judged by its decision: right when it was kept and no earlier partner
was kept, or removed in favour of a kept earlier partner with no kept one nearer in
its tier or in a more protected one (a reference record is named before a stored one,
and a stored one before this run's, as the job names them). Recall is the share
judged right, with a Wilson 95% interval (an honest lower bound even when every one
was right). So it judges against the records kept: a record
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

Drawn in strata (``draw``, ``Strata``): in bounded mode over one level of cells with a
flat index, a record that met every cell exact mode would have given it (not *capped*)
meets every partner within tolerance (the join rule: the other record's home cell is
among them), so its decision is the one exact mode makes against the records kept;
only capped records can be missed. The sample then puts CAPPED_SHARE of its records
among the capped ones and the rest among the others, each uniform in its stratum,
and weights each by its stratum's size: the misses are counted where they can be
(at 1M records, 22% capped, the interval's lower end went from 0.95 to 0.99 for the
same brute-force work). The others are judged all the same: a wrong decision among
them (which the argument says cannot happen) puts their stratum's own interval into
the bound. Uniform otherwise (exact mode, two levels, IVF/HNSW cells, jaccard).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from transforms.exact import is_protected, tier_of
from transforms.store.segment import keys_of

Z95 = 1.959963984540054
PARTNERS = 32  # nearest earlier partners kept per sampled record (and as many latest)
POOL = 8  # a stratum is drawn at most this many times as densely as a uniform sample
CAPPED_SHARE = 0.7  # of a stratified sample, the records drawn among capped ones


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


def draw(keys: np.ndarray, rows: int, size: int, capped: np.ndarray | None = None,
         share: float = 0.0) -> np.ndarray:
    """The recall sample among ``keys`` (``rows`` records in all): ``in_sample``'s, or,
    given each key's ``capped`` flag and the capped share of all records, CAPPED_SHARE
    of ``size`` among capped records and the rest among the others, each by
    ``in_sample`` at its own rate. No rate exceeds POOL x ``size`` / ``rows``, so the
    rows ``in_sample`` picks at that rate (a pool) hold every row drawn."""
    if capped is None or share <= 0 or size >= rows:  # (every record: every stratum)
        return in_sample(keys, rows, size)
    c = min(POOL * size, CAPPED_SHARE * size / share)
    u = min(POOL * size, (1 - CAPPED_SHARE) * size / (1 - share)) if share < 1 else 0
    return np.where(capped, in_sample(keys, rows, c), in_sample(keys, rows, u))


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
    drawn: str = "uniform"  # or "stratified": recall, removed share and interval weighted
    strata: dict | None = None  # stratified: per stratum, records and what was sampled

    def as_dict(self) -> dict:
        return {**self.__dict__, "interval": 0.95, "judged": "decisions"}


@dataclass
class Strata:
    """How a stratified sample (``draw`` with capped flags) was drawn and what the search
    counted: the sampled keys that are capped, the records the sample was drawn from
    (unprotected records searched) and how many were capped. ``floor``: positives known
    without a sample (representative grouping: every removal has a kept earlier partner
    within tolerance)."""

    capped: set
    records: int
    capped_records: int
    floor: int = 0


@dataclass
class _Tally:
    sampled: int = 0
    with_partners: int = 0
    right: int = 0
    unsure: int = 0
    gone: int = 0

    @property
    def wrong(self) -> int:
        return self.with_partners - self.right


def _stratified(c: _Tally, u: _Tally, st: Strata) -> dict:
    """Recall, its interval and the removed share when capped records (``c``) and the
    others (``u``) were sampled at their own rates: each count weighted by its stratum's
    records over its sampled ones. Lower end: the misses' upper Wilson bound (unsure as
    misses) over the positives' lower bound (never below ``floor``); the others' misses
    count only once one was seen. Each bound is a two-sided 95% one, so each side errs
    at most 2.5%: together at most 5%."""
    nc, nu = st.capped_records, max(st.records - st.capped_records, 0)
    wc, wu = nc / max(c.sampled, 1), nu / max(u.sampled, 1)
    pos = wc * c.with_partners + wu * u.with_partners
    miss = wc * c.wrong + wu * u.wrong
    lo_c, hi_c = wilson(c.with_partners, c.sampled)
    lo_u, hi_u = wilson(u.with_partners, u.sampled)
    pos_lo = max(st.floor, nc * lo_c + nu * lo_u)
    miss_hi = nc * wilson(c.wrong + c.unsure, c.sampled)[1]
    if u.wrong:
        miss_hi += nu * wilson(u.wrong + u.unsure, u.sampled)[1]
    miss_lo = nc * wilson(c.wrong, c.sampled)[0] + nu * wilson(u.wrong, u.sampled)[0]
    pos_hi = max(st.floor, nc * hi_c + nu * hi_u)
    # (records sampled with partners may stand for no record searched: a run whose every
    # record was an exact copy of a reference or stored one searched those only)
    recall = (1 - miss / max(pos, st.floor) if c.with_partners + u.with_partners
              and max(pos, st.floor) > 0 else None)
    low = max(0.0, 1 - miss_hi / pos_lo) if pos_lo > 0 else 0.0
    high = min(1.0, 1 - miss_lo / pos_hi) if pos_hi > 0 else 1.0
    weights = [wc] * c.with_partners + [wu] * u.with_partners
    gone = (wc * c.gone + wu * u.gone) / pos if pos else None
    n_eff = sum(weights) ** 2 / sum(w * w for w in weights) if pos else 0.0
    removed_low, removed_high = wilson(gone * n_eff, n_eff) if pos else (0.0, 1.0)
    if gone == 1.0:
        removed_high = 1.0
    strata = {name: {"records": n, "sampled": t.sampled, "with_partners": t.with_partners,
                     "recalled": t.right, "unsure": t.unsure, "removed": t.gone}
              for name, n, t in (("capped", nc, c), ("others", nu, u))}
    return {"recall": recall, "low": min(low, recall if recall is not None else low),
            "high": max(high, recall if recall is not None else high),
            "recall_removed": gone, "removed_low": removed_low, "removed_high": removed_high,
            "drawn": "stratified", "strata": strata}


@dataclass
class Truth:
    """Brute-force partners of sampled records: for each, its nearest earlier partners
    within tolerance (the sampled record within tolerance of the partner as the
    reference), cut to the PARTNERS nearest and the PARTNERS latest in keep order, and
    how many there are in all. Records are (n, 2)
    uint64 keys; (``prio``, ``order``) orders partners as keep order does. ``held``:
    sampled keys that a protected record (a reference or stored one) holds too: the
    exact stage removed those records as its copies, so they stand for no record
    searched and are not judged (their kept near partners among the protected ones
    made them misses: recall 0.0000 on a run whose copies of references were all
    removed)."""

    sample: np.ndarray  # (m, 2) uint64
    partner: np.ndarray  # (m, 2) uint64
    dist: np.ndarray  # (m,) float64
    prio: np.ndarray  # (m,) float64: the partner's place in keep order (first key) ...
    order: np.ndarray  # (m,) int64: ... and (second key)
    counts: dict  # sampled key -> partners in all
    held: frozenset = field(default_factory=frozenset)  # sampled keys protected rows hold

    @classmethod
    def empty(cls, held: frozenset = frozenset()) -> Truth:
        e = np.empty((0, 2), np.uint64)
        return cls(e, e, np.empty(0), np.empty(0), np.empty(0, np.int64), {}, held)

    @classmethod
    def held_by(cls, sample: np.ndarray, words: np.ndarray, prio: np.ndarray) -> Truth:
        """No partners; the keys of ``sample`` ((m, 2) uint64) that protected rows
        among ``words`` (by ``prio``) hold."""
        mine = is_protected(prio)
        if not mine.any() or not len(sample):
            return cls.empty()
        at = np.isin(keys_of(sample), keys_of(words[mine]))
        return cls.empty(frozenset(map(tuple, sample[at].tolist())))

    def add(self, other: Truth) -> Truth:
        counts = dict(self.counts)
        for k, c in other.counts.items():
            counts[k] = counts.get(k, 0) + c
        return Truth.concat([self, other], counts).cut()

    @classmethod
    def concat(cls, parts: list[Truth], counts: dict) -> Truth:
        """The parts' partners end to end, uncut, with ``counts``."""
        return cls(*(np.concatenate([getattr(t, f) for t in parts])
                     for f in ("sample", "partner", "dist", "prio", "order")), counts,
                   frozenset().union(*(t.held for t in parts)))

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
                     self.order[keep], self.counts, self.held)


def judge(truth: Truth, sampled: set, removed: dict, components: bool = False,
          strata: Strata | None = None) -> Recall:
    """``sampled``: keys of sampled records; ``removed``: key -> (key it duplicates,
    distance) for every removal (others were kept). ``components``: a record
    with an earlier partner is right when removed (its component keeps an earlier
    record; which one, the brute force cannot tell from a sample). ``strata``: the
    sample was drawn by ``draw`` with capped flags (weighted: ``_stratified``). Keys
    ``truth.held`` are not judged."""
    sampled = sampled - truth.held
    by: dict = {}
    tiers = (-tier_of(truth.prio, truth.order)).tolist()  # the most protected first
    for s, p, d, r, o, g in zip(map(tuple, truth.sample.tolist()),
                                map(tuple, truth.partner.tolist()), truth.dist.tolist(),
                                truth.prio.tolist(), truth.order.tolist(), tiers, strict=True):
        if s in sampled:
            by.setdefault(s, []).append((d, r, o, p, g))
    tallies = {True: _Tally(), False: _Tally()}  # capped, others (all: others)
    for s in sampled:
        tallies[strata is not None and s in strata.capped].sampled += 1
    for s, partners in by.items():
        partners.sort()
        kept = sorted((g, d, p) for d, _, _, p, g in partners if p not in removed)
        cut = truth.counts.get(s, 0) > len(partners)  # farther partners exist, not listed
        t = tallies[strata is not None and s in strata.capped]
        t.with_partners += 1
        t.gone += s in removed
        if components:
            t.right += s in removed
        elif s in removed:  # wrong only if a listed kept partner of a more protected tier
            dup, d = removed[s]  # than its dup's, or of the same and nearer, exists
            g = next((g for _, _, _, p, g in partners if p == dup), kept[0][0] if kept else 0)
            t.right += (not kept and cut) or (bool(kept) and (kept[0][2] == dup or (
                kept[0][0] == g and kept[0][1] >= d)))
        else:
            t.right += not kept
            t.unsure += not kept and cut
    c, u = tallies[True], tallies[False]
    m, right, unsure, gone = (getattr(c, f) + getattr(u, f)
                              for f in ("with_partners", "right", "unsure", "gone"))
    truncated = sum(truth.counts.get(s, 0) > len(p) for s, p in by.items())
    pairs = int(sum(truth.counts.get(s, 0) for s in by))
    if strata is not None:
        return Recall(len(sampled), m, right, pairs, truncated, unsure=unsure, removed=gone,
                      **_stratified(c, u, strata))
    low, high = wilson(right - unsure, m)[0], wilson(right, m)[1]
    return Recall(len(sampled), m, right, pairs, truncated, right / m if m else None, low, high,
                  gone, gone / m if m else None, *wilson(gone, m), unsure)


def _strata_words(strata: dict | None) -> str:
    if not strata:
        return ""
    c = strata["capped"]
    return (f"; {c['sampled']:,} of the sample drawn among the {c['records']:,} capped "
            "records, the only ones bounded mode can miss, and weighted by their share")


def recall_line(r: dict | None, mode: str | None = None) -> str:
    """One line for a ``Recall.as_dict()``; ``mode`` exact: a check that agrees is said
    as such (recall is 1.0 by construction there; an interval read as possible misses)."""
    if r is None:
        return "recall not measured (near.recall_sample: 0, or no record to sample)"
    if r["recall"] is None:
        return (f"recall not measured: none of {r['sampled']:,} sampled records has a near "
                "duplicate")
    if mode == "exact" and r["recall"] == 1.0 and not r.get("unsure"):
        line = (f"recall 1.0000 (exact mode: every pair within the threshold is compared; "
                f"a brute-force check of the decisions against the records kept agrees on "
                f"all {r['with_partners']:,} of {r['sampled']:,} sampled records that have "
                "an earlier near duplicate)")
    else:
        line = _sampled_line(r)
    if r.get("recall_removed") is None:  # a summary written before recall_removed
        return line
    return (f"{line}; recall_removed {r['recall_removed']:.4f} ("
            f"{r['removed_low']:.4f}-{r['removed_high']:.4f}: {r['removed']:,} of them "
            "removed, kept or not their earlier near duplicate)")


def _sampled_line(r: dict) -> str:
    return (f"recall {r['recall']:.4f} (95% interval {r['low']:.4f}-{r['high']:.4f}; "
            f"{r['with_partners']:,} of {r['sampled']:,} sampled records have an earlier near "
            "duplicate, their decisions checked by brute force against the records kept"
            + _strata_words(r.get("strata"))
            + (f"; {r['unsure']:,} kept ones judged on their {PARTNERS} nearest and {PARTNERS} "
               "latest partners only, all removed: misses at the interval's lower end"
               if r.get("unsure") else "")
            + ")")
