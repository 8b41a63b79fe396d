"""Brute-force oracle for the dedup job: a plain dict over canonical bytes.

Independent of the fingerprint kernel: the key is (dtype name, shape, bytes with
-0.0 -> +0.0 and every NaN -> one NaN), exactly the identity docs/fingerprint.md
specifies, computed with plain numpy per record.
"""

from __future__ import annotations

import numpy as np

from transforms.near import NearSpec, exact_distance


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


def near_oracle(x: np.ndarray, spec: NearSpec) -> dict[int, int]:
    """{removed row: kept row} by brute force over all pairs in float64 (rank = row order;
    rows with NaN/inf never take part). Uses only ``exact_distance``, the metric itself."""
    good = [i for i in range(len(x)) if np.isfinite(x[i]).all()]

    def against(r: int, refs: list[int]) -> tuple[np.ndarray, np.ndarray]:
        refs = np.array(refs, dtype=np.int64)
        return exact_distance(np.repeat(x[r][None], len(refs), 0), x[refs], spec)

    out = {}
    if spec.grouping == "representative":
        kept: list[int] = []
        for r in good:
            d, ok = against(r, kept) if kept else (np.empty(0), np.empty(0, bool))
            if ok.any():
                out[r] = kept[int(np.flatnonzero(ok)[np.argmin(d[ok])])]
            else:
                kept.append(r)
        return out
    label = {i: i for i in good}

    def find(u):
        while label[u] != u:
            u = label[u]
        return u

    for k, a in enumerate(good[1:], 1):
        _, ok = against(a, good[:k])  # a (later) within tolerance of b (earlier, reference)
        for b in np.array(good[:k])[ok].tolist():
            ra, rb = find(a), find(b)
            label[max(ra, rb)] = min(ra, rb)
    return {i: find(i) for i in good if find(i) != i}


def stream_oracle(x: np.ndarray, spec: NearSpec | None = None) -> np.ndarray:
    """Keep mask of an online filter, one record at a time: drop a record whose value was
    seen before, or (``spec``) that is within tolerance of an earlier kept record."""
    seen: set[tuple] = set()
    kept: list[int] = []
    keep = np.zeros(len(x), dtype=bool)
    for i in range(len(x)):
        key = canonical_key(x[i])
        if key in seen:
            continue
        seen.add(key)
        row = x[i].reshape(1, -1)
        if spec is not None and kept and np.isfinite(row).all():
            refs = x[kept].reshape(len(kept), -1)
            if exact_distance(np.repeat(row, len(kept), 0), refs, spec)[1].any():
                continue
        if spec is None or np.isfinite(row).all():
            kept.append(i)
        keep[i] = True
    return keep
