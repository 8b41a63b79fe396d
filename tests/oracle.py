"""Brute-force oracle for the dedup job: a plain dict over canonical bytes.

Independent of the fingerprint kernel: the key is (dtype name, shape, bytes with
-0.0 -> +0.0 and every NaN -> one NaN), exactly the identity docs/fingerprint.md
specifies, computed with plain numpy per record.
"""

from __future__ import annotations

import numpy as np

from transforms.near.spec import NearSpec
from transforms.near.verify import centred_channels, exact_distance


def canonical_key(t: np.ndarray) -> tuple:
    t = np.ascontiguousarray(t)
    v = t.view(f"f{t.dtype.itemsize // 2}") if t.dtype.kind == "c" else t
    if v.dtype.kind == "f":
        v = np.where(v == 0, np.zeros((), v.dtype), v)
        v = np.where(np.isnan(v), np.array(np.nan, v.dtype), v)
    return t.dtype.name, t.shape, v.tobytes()


def expected_removals(records: list[tuple[str, np.ndarray, float]], keep: str = "first"
                      ) -> dict[str, str]:
    """{removed id: kept id} for records in input order (id, tensor, rank).

    keep: first | last | max | min (by rank, ties by input order; NaN never preferred).
    """
    groups: dict[tuple, list[int]] = {}
    for i, (_, t, _) in enumerate(records):
        groups.setdefault(canonical_key(t), []).append(i)
    out = {}
    for members in groups.values():
        if keep == "first":
            winner = members[0]
        elif keep == "last":
            winner = members[-1]
        else:
            def score(i, sign=1 if keep == "min" else -1):
                r = records[i][2]
                return (np.inf if np.isnan(r) else sign * r, i)
            winner = min(members, key=score)
        for i in members:
            if i != winner:
                out[records[i][0]] = records[winner][0]
    return out


def keep_rank(keep: str, score: np.ndarray) -> np.ndarray:
    """Input positions in keep order (ties by input order, NaN scores last)."""
    idx = np.arange(len(score))
    if keep in ("first", "last"):
        return idx if keep == "first" else idx[::-1]
    p = -score if keep == "max" else score
    return np.lexsort((idx, np.where(np.isnan(p), np.inf, p)))


def near_pairs(x: np.ndarray, spec: NearSpec) -> dict[int, list[tuple[float, int]]]:
    """{row: [(distance, earlier row), ...]} for every earlier row that ``row`` is within
    tolerance of (the earlier one as reference), by brute force in float64 (direct
    differences: ``exact_distance``, the metric itself); rows with NaN/inf never take part.

    Candidates, each then verified: l2 and cosine, the pairs a float64 Gram matrix does
    not put far beyond the tolerance (``_may_be_within``); allclose, the pairs whose row
    means m differ by no more than |m(a) - m(b)| <= max |a_i - b_i| <= atol + rtol max|b|
    allows (a sweep over the means); correlation, every pair whose Pearson r from a
    float64 product of the unit centred rows is within the threshold plus a slack far
    above that product's rounding."""
    flat = x.reshape(len(x), -1)
    good = np.flatnonzero(np.isfinite(flat).all(axis=1))
    xs = flat[good].astype(np.float64)
    if spec.metric == "correlation":
        return _verified(xs, good, *_correlated(xs, spec), spec)
    if spec.metric in ("l2", "cosine"):
        return _verified(xs, good, *_earlier_pairs(
            len(xs), lambda rows: _may_be_within(xs, spec, rows)), spec)
    key = xs.mean(axis=1)  # allclose
    width = (spec.atol + spec.rtol * np.abs(xs).max(initial=0)) * 1.001 + 1e-12
    order = np.argsort(key, kind="stable")
    ks = key[order]
    count = np.searchsorted(ks, ks + width, side="right") - np.arange(len(ks)) - 1
    i = np.repeat(np.arange(len(ks)), count)  # sorted position i meets i+1 .. i+count[i]
    j = i + 1 + np.arange(len(i)) - np.repeat(np.cumsum(count) - count, count)
    return _verified(xs, good, order[i], order[j], spec)


def _correlated(xs: np.ndarray, spec: NearSpec) -> tuple[np.ndarray, np.ndarray]:
    """Candidate pairs (later, earlier) for correlation: the rows ``exact_distance`` takes
    the cosine of (each channel centred on its own mean) scaled to unit length, all pairs
    compared by a float64 product (rounding below 1e-12 at these sizes; the slack is
    1e-6), with no cells, no float32 and no bound."""
    c = centred_channels(xs, spec.channels)
    norm = np.linalg.norm(c, axis=1)
    u = c / np.where(norm > 0, norm, 1)[:, None]
    return _earlier_pairs(len(u), lambda rows: 1 - u[rows] @ u[:rows.stop].T
                          <= spec.threshold + 1e-6)


def _earlier_pairs(n: int, maybe) -> tuple[np.ndarray, np.ndarray]:
    """(later, earlier) rows of the pairs ``maybe`` keeps: ``maybe(rows)`` is a bool block
    of ``rows`` against every row before ``rows.stop``, taken in blocks of ~16M pairs."""
    out, step = [], max(64, (1 << 24) // max(n, 1))
    for s in range(0, n, step):
        near = np.argwhere(np.tril(maybe(slice(s, min(n, s + step))), s - 1))
        near[:, 0] += s
        out.append(near)
    both = np.concatenate(out) if out else np.empty((0, 2), np.int64)
    return both[:, 0], both[:, 1]


def _verified(xs: np.ndarray, good: np.ndarray, a: np.ndarray, b: np.ndarray,
              spec: NearSpec) -> dict[int, list[tuple[float, int]]]:
    """``near_pairs``'s answer from candidate pairs (a, b) of rows of ``xs``, verified by
    ``exact_distance`` with the earlier row as the reference."""
    later, earlier = np.maximum(a, b), np.minimum(a, b)
    out: dict[int, list[tuple[float, int]]] = {}
    step = max(1, (8 << 20) // max(xs.shape[1], 1))  # pairs per call: 64 MB a side
    for s in range(0, len(later), step):
        la, ea = later[s:s + step], earlier[s:s + step]
        d, ok = exact_distance(xs[la], xs[ea], spec)
        for r, e, dist in zip(la[ok].tolist(), ea[ok].tolist(), d[ok].tolist(), strict=True):
            out.setdefault(int(good[r]), []).append((dist, int(good[e])))
    return out


def near_oracle(x: np.ndarray, spec: NearSpec) -> dict[int, int]:
    """{removed row: kept row} by brute force over all pairs in float64 (rank = row order;
    rows with NaN/inf never take part), grouped as ``spec.grouping`` says."""
    return near_decisions(near_pairs(x, spec), spec.grouping)


def near_decisions(pairs: dict[int, list[tuple[float, int]]], grouping: str,
                   protected: int = 0, tiers: list[int] | None = None) -> dict[int, int]:
    """{removed row: kept row} from ``near_pairs`` in row order; the first ``protected``
    rows (reference or stored records) are never removed. Representative: each row names
    its nearest kept earlier row of the most protected tier (``tiers``: each protected
    row's, lower first, a reference record's before a stored one's; all protected rows
    one tier by default; this run's rows last), ties by the earlier row; components: each
    row names its component's first row."""
    if grouping == "representative":
        def tier(e: int) -> int:
            return (tiers[e] if tiers is not None else 0) if e < protected else 1 << 30

        out: dict[int, int] = {}
        for r in sorted(pairs):
            refs = [(tier(e), d, e) for d, e in pairs[r] if e not in out]  # kept: not removed
            if refs and r >= protected:  # the most protected tier first, then the nearest
                out[r] = min(refs)[2]
        return out
    return {i: r for i, r in component_roots(pairs).items() if r != i and i >= protected}


def component_roots(pairs: dict[int, list[tuple[float, int]]]) -> dict[int, int]:
    """{row: the first row of its component} for the rows of ``pairs`` (union-find; a
    row in no pair is its own component)."""
    label: dict[int, int] = {}

    def find(u: int) -> int:
        while label.get(u, u) != u:
            u = label[u]
        return u

    for a in sorted(pairs):
        for _, b in pairs[a]:
            ra, rb = find(a), find(b)
            label[max(ra, rb)] = min(ra, rb)
    return {i: find(i) for i in label}


class StreamOracle:
    """Online filter by brute force, one record at a time: a known value (canonical bytes)
    is dropped unless, with ids, this record's id first kept it; a new value is dropped
    when within tolerance of a kept record (``exact_distance``, float64; NaN/inf never
    compare), else kept. ``new_epoch`` forgets everything when there are no ids."""

    def __init__(self, spec: NearSpec | None = None, with_ids: bool = False) -> None:
        self.spec, self.with_ids = spec, with_ids
        self.owner: dict[tuple, object] = {}
        self.kept: list[np.ndarray] = []
        self.near_drops = 0

    def new_epoch(self) -> None:
        if not self.with_ids:
            self.owner.clear()
            self.kept.clear()

    def keep(self, rid: object, x: np.ndarray) -> bool:
        x = np.asarray(x)
        key = canonical_key(x)
        if key in self.owner:
            return self.with_ids and self.owner[key] == rid
        row = x.reshape(1, -1)
        if self.spec is not None and self.kept and exact_distance(
                np.repeat(row, len(self.kept), 0), np.array(self.kept), self.spec)[1].any():
            self.owner[key] = None
            self.near_drops += 1
            return False
        self.owner[key] = rid
        self.kept.append(row[0])
        return True

    def run(self, stream: list[tuple[object, np.ndarray]]) -> list:
        """The ids of the records kept, in stream order."""
        return [rid for rid, x in stream if self.keep(rid, x)]


def stream_oracle(x: np.ndarray, spec: NearSpec | None = None) -> np.ndarray:
    """Keep mask of an online filter without ids over the rows of ``x``, in order."""
    oracle = StreamOracle(spec)
    return np.array([oracle.keep(None, row) for row in x], dtype=bool)


def planted_stream(seed: int, n: int, d: int, copies: int, nans: int, zeros: int = 0
                   ) -> np.ndarray:
    """n random float32 records plus ``copies`` exact copies, ``copies`` near copies (noise
    0.02) and ``copies`` decoys (noise 0.2), ``nans`` rows with a NaN and ``zeros`` rows
    set to -0.0 and as many to +0.0 (one value), shuffled."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=(n, d)).astype(np.float32)
    pick = rng.integers(0, n, size=(3, copies))
    near = base[pick[1]] + rng.normal(scale=0.02 / np.sqrt(d), size=(copies, d))
    decoy = base[pick[2]] + rng.normal(scale=0.2 / np.sqrt(d), size=(copies, d))
    x = np.concatenate([base, base[pick[0]], near.astype(np.float32), decoy.astype(np.float32)])
    x[rng.choice(len(x), nans, replace=False), 3] = np.nan
    if zeros:
        x[rng.choice(len(x), zeros, replace=False)] = -0.0
        x[rng.choice(len(x), zeros, replace=False)] = 0.0
    return x[rng.permutation(len(x))]


def _may_be_within(flat: np.ndarray, spec: NearSpec, rows: slice) -> np.ndarray:
    """(rows, rows.stop) bool: which pairs of ``rows`` with the rows up to ``rows.stop``
    may be within tolerance, from a float64 Gram matrix with a margin far above its
    rounding (a few ``d * eps`` of the norms); ``exact_distance`` decides each. NaN (zero
    norms, overflow) counts as maybe. Metrics without a Gram form: every pair."""
    a, b = flat[rows], flat[:rows.stop]
    if spec.metric not in ("l2", "cosine"):
        return np.ones((len(a), len(b)), bool)
    margin = 64 * (flat.shape[1] + 2) * np.finfo(np.float64).eps
    with np.errstate(all="ignore"):
        na, nb = (a * a).sum(axis=1)[:, None], (b * b).sum(axis=1)[None, :]
        dot = a @ b.T
        if spec.metric == "l2":
            far = na + nb - 2 * dot > spec.threshold ** 2 + margin * (na + nb)
        else:
            far = 1 - dot / (np.sqrt(na) * np.sqrt(nb)) > spec.threshold + margin
    return ~far


def kept_set_oracle(x: np.ndarray, spec: NearSpec) -> dict[int, int]:
    """{removed row: kept row} for representative grouping without listing pairs: rows in
    order, each compared (float64, ``exact_distance``) with every row kept so far; within
    tolerance of one -> removed in favour of the nearest (ties: the earlier). Cheap where
    many rows are copies of few (crowds: the kept rows are few), so it checks crowds of
    thousands that ``near_oracle`` would list millions of pairs for. Pairs a Gram matrix
    puts far beyond the tolerance are skipped (``_may_be_within``)."""
    flat = x.reshape(len(x), -1).astype(np.float64)
    finite = np.isfinite(flat).all(axis=1)
    kept = np.zeros(len(x), bool)
    out: dict[int, int] = {}
    for start in range(0, len(x), 256):
        maybe = _may_be_within(flat, spec, slice(start, min(len(x), start + 256)))
        for r in np.flatnonzero(finite[start:start + 256]).tolist():
            r += start
            k = np.flatnonzero(maybe[r - start, :r] & kept[:r])
            if len(k):
                d, ok = exact_distance(np.broadcast_to(flat[r], (len(k), flat.shape[1])),
                                       flat[k], spec)
                if ok.any():
                    hit = np.flatnonzero(ok)
                    out[r] = int(k[hit[np.lexsort((k[hit], d[hit]))[0]]])
                    continue
            kept[r] = True
    return out
