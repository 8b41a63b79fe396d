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
