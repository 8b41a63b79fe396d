"""How much a near search missed, measured: brute force on a seeded sample of records.

Why: bounded mode and IVF/HNSW cells may lose pairs, and a user deciding whether to
trust a cleaned dataset needs a number, not an argument. A sample of distinct records
(chosen by a seeded hash of their key, so it does not depend on chunking or worker
order) is compared with every record, verified in float64 with the metric itself. A
sampled record with at least one partner within tolerance counts as *recalled* when
the search found every such partner; recall is the recalled share, with a Wilson 95%
interval (an honest lower bound even when every one was found). Pair recall (partners
found / partners) is given too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

Z95 = 1.959963984540054


def _mix(x: np.ndarray) -> np.ndarray:
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
        h = _mix(_mix(keys[:, 0] ^ np.uint64(seed)) ^ keys[:, 1])
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
    with_partners: int  # of them, records with a partner within tolerance
    recalled: int  # of those, records whose every partner was found
    pairs: int  # (sampled record, partner) pairs within tolerance
    pairs_found: int
    recall: float | None  # recalled / with_partners (None: no sampled record had a partner)
    low: float
    high: float

    @property
    def pair_recall(self) -> float | None:
        return self.pairs_found / self.pairs if self.pairs else None

    def as_dict(self) -> dict:
        return {**self.__dict__, "pair_recall": self.pair_recall, "interval": 0.95}



def recall_line(r: dict | None) -> str:
    """One line for a ``Recall.as_dict()``."""
    if r is None:
        return "recall not measured (recall_sample: 0)"
    if r["recall"] is None:
        return (f"recall not measured: none of {r['sampled']:,} sampled records has a near "
                "duplicate")
    return (f"recall {r['recall']:.4f} (95% interval {r['low']:.4f}-{r['high']:.4f}; "
            f"{r['with_partners']:,} of {r['sampled']:,} sampled records have near duplicates,"
            " checked by brute force)")


def estimate(sampled: set, true_pairs: set, found_pairs: set) -> Recall:
    """``sampled``: keys of sampled records; ``true_pairs``: (sampled key, partner key)
    within tolerance by brute force; ``found_pairs``: unordered pairs the search found
    within tolerance, as (key, key) in either order."""
    found = {(a, b) for a, b in found_pairs if a in sampled} | {
        (b, a) for a, b in found_pairs if b in sampled}
    partners: dict = {}
    for s, p in true_pairs:
        partners.setdefault(s, set()).add(p)
    hits = {s: sum((s, p) in found for p in ps) for s, ps in partners.items()}
    recalled = sum(hits[s] == len(ps) for s, ps in partners.items())
    pairs = sum(len(ps) for ps in partners.values())
    m = len(partners)
    low, high = wilson(recalled, m)
    return Recall(len(sampled), m, recalled, pairs, sum(hits.values()),
                  recalled / m if m else None, low, high)
