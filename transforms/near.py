"""Near-duplicate search and grouping over plain arrays: FAISS finds candidates, float64 decides.

Why two steps: an index (flat, IVF, HNSW, float32) is fast but approximate; a removal
must never depend on it. Candidates come from an L2 range search whose radius is a
proven superset of the user's tolerance (with slack for float32 rounding and FAISS's
strict comparison); every candidate pair is then verified with the exact metric in
float64, so precision is 1.0 whatever the index. Grouping visits records in keep order.

Scale without one big index: ``partitioned_pairs`` clusters the vectors (k-means on a
sample), stores each vector in its nearest centroid's partition only, and queries it
against every partition whose centroid is within (distance to its own centroid +
2 x radius). By the triangle inequality a pair within the radius always meets in one
partition, so partitioning never costs recall; partitions are searched independently.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

METRICS = ("allclose", "l2", "cosine")
GROUPINGS = ("representative", "components")
INDEXES = ("auto", "flat", "ivf", "hnsw")
FLAT_MAX_ROWS = 50_000  # auto: one exact flat index up to here (n^2 d flops stay seconds)
PARTITION_ROWS = 3_000  # auto above that: k-means partitions of about this many rows
QUERY_BATCH = 8192  # range-search queries per call: bounds the result buffers


@dataclass(frozen=True)
class NearSpec:
    metric: str  # allclose | l2 | cosine
    threshold: float = 0.0  # l2: Euclidean distance; cosine: 1 - cos
    atol: float = 1e-5  # allclose: |a - b| <= atol + rtol * |b| elementwise (b = kept record)
    rtol: float = 0.0
    grouping: str = "representative"
    index: str = "auto"
    nlist: int | None = None  # ivf: lists (default 4 sqrt(n))
    nprobe: int = 16  # ivf: lists visited per query
    hnsw_m: int = 32  # hnsw: links per node

    def __post_init__(self) -> None:
        for name, value, allowed in (("metric", self.metric, METRICS),
                                     ("grouping", self.grouping, GROUPINGS),
                                     ("index", self.index, INDEXES)):
            if value not in allowed:
                raise ValueError(f"near.{name} must be one of {', '.join(allowed)}, got {value!r}")


def finite_rows(x: np.ndarray) -> np.ndarray:
    """Rows that can be compared by distance (no NaN/inf)."""
    return np.isfinite(x).all(axis=1)


def search_vectors(x: np.ndarray, spec: NearSpec) -> tuple[np.ndarray, float]:
    """(float32 vectors for the index, squared L2 search radius) such that every pair within
    the user's tolerance is within the radius (a superset: verification decides)."""
    x64 = x.astype(np.float64)
    if spec.metric == "cosine":
        norms = np.linalg.norm(x64, axis=1, keepdims=True)
        v = x64 / np.where(norms == 0, 1, norms)
        radius = math.sqrt(2 * spec.threshold)  # |a^ - b^|^2 = 2 (1 - cos)
        scale = 1.0
    elif spec.metric == "l2":
        v, radius = x64, spec.threshold
        scale = float(np.abs(x64).max(initial=0))
    else:  # allclose: |a_i - b_i| <= atol + rtol |b_i| for all i  =>  L2 <= sqrt(d) * that
        scale = float(np.abs(x64).max(initial=0))
        v, radius = x64, math.sqrt(x.shape[1]) * (spec.atol + spec.rtol * scale)
    # float32 storage and FAISS's |x|^2 + |y|^2 - 2xy in float32: allow a few ulps of the norms
    slack = 1e-5 * (radius + scale * math.sqrt(max(x.shape[1], 1))) + 1e-12
    return np.ascontiguousarray(v, dtype=np.float32), (radius + slack) ** 2


def exact_distance(a: np.ndarray, b: np.ndarray, spec: NearSpec
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(distance, within) for row pairs, in float64; ``b`` is the kept (reference) record.

    l2: Euclidean; cosine: 1 - cos (NaN for a zero vector: never within); allclose:
    the largest |a_i - b_i|, within when numpy.isclose(a, b, rtol, atol) holds everywhere.
    """
    a, b = a.astype(np.float64), b.astype(np.float64)
    if spec.metric == "l2":
        d = np.linalg.norm(a - b, axis=1)
        return d, d <= spec.threshold
    if spec.metric == "cosine":
        with np.errstate(invalid="ignore", divide="ignore"):
            cos = (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        d = 1.0 - np.clip(cos, -1.0, 1.0)
        return d, d <= spec.threshold
    diff = np.abs(a - b)
    return diff.max(axis=1, initial=0.0), (diff <= spec.atol + spec.rtol * np.abs(b)).all(axis=1)


def _index(v: np.ndarray, spec: NearSpec):
    import faiss

    n, d = v.shape
    kind = "flat" if spec.index == "auto" else spec.index  # auto: exact (flat) per partition
    if kind == "flat":
        index = faiss.IndexFlatL2(d)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(d, spec.hnsw_m)
    else:
        nlist = spec.nlist or max(1, min(n // 39, int(4 * math.sqrt(n))))
        index = faiss.IndexIVFFlat(faiss.IndexFlatL2(d), d, nlist)
        sample = v[np.random.default_rng(0).choice(n, min(n, 256 * nlist), replace=False)]
        index.train(sample)
        index.nprobe = min(spec.nprobe, nlist)
    index.add(v)
    return index


def range_pairs(data: np.ndarray, queries: np.ndarray, radius_sq: float, spec: NearSpec
                ) -> tuple[np.ndarray, np.ndarray]:
    """(query row, data row) for every query-data pair within the squared radius."""
    if len(data) == 0 or len(queries) == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    index = _index(data, spec)
    qs, ds = [], []
    for a in range(0, len(queries), QUERY_BATCH):
        lims, _, ids = index.range_search(queries[a:a + QUERY_BATCH], radius_sq)
        qs.append(a + np.repeat(np.arange(len(lims) - 1), np.diff(lims.astype(np.int64))))
        ds.append(ids.astype(np.int64))
    return np.concatenate(qs), np.concatenate(ds)


def _unique_pairs(i: np.ndarray, j: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lo, hi = np.minimum(i, j), np.maximum(i, j)
    keep = lo != hi
    pairs = np.unique(np.stack([lo[keep], hi[keep]], axis=1), axis=0)
    return pairs[:, 0], pairs[:, 1]


def candidate_pairs(v: np.ndarray, radius_sq: float, spec: NearSpec
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Unordered candidate pairs (i < j) from one index over all vectors."""
    return _unique_pairs(*range_pairs(v, v, radius_sq, spec))


def partition_plan(v: np.ndarray, radius_sq: float, partitions: int, seed: int = 0
                   ) -> tuple[np.ndarray, list[np.ndarray]]:
    """(home partition of each row, rows that must query each partition).

    A row queries partition p when |row - c_p| <= |row - c_home| + 2 r: then any pair
    within r shares a partition (triangle inequality), so recall does not depend on k-means.
    """
    import faiss

    n, d = v.shape
    k = max(1, min(partitions, n))
    km = faiss.Kmeans(d, k, niter=20, seed=seed, max_points_per_centroid=256)
    km.train(v[np.random.default_rng(seed).choice(n, min(n, 256 * k), replace=False)])
    r = math.sqrt(radius_sq)
    home = np.empty(n, dtype=np.int64)
    members: list[list[np.ndarray]] = [[] for _ in range(k)]
    for a in range(0, n, QUERY_BATCH):
        dist = np.sqrt(np.maximum(faiss.pairwise_distances(v[a:a + QUERY_BATCH], km.centroids),
                                  0)).astype(np.float64)
        nearest = dist.argmin(axis=1)
        home[a:a + QUERY_BATCH] = nearest
        reach = dist <= dist[np.arange(len(dist)), nearest][:, None] + 2 * r + 1e-6 * (1 + dist)
        rows, parts = np.nonzero(reach)
        for p in np.unique(parts):
            members[p].append(a + rows[parts == p])
    queries = [np.concatenate(m) if m else np.empty(0, np.int64) for m in members]
    return home, queries


def partitioned_pairs(v: np.ndarray, radius_sq: float, spec: NearSpec, partitions: int
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Candidate pairs found partition by partition (each could run on its own worker)."""
    home, queries = partition_plan(v, radius_sq, partitions)
    found_i, found_j = [], []
    for p, q in enumerate(queries):
        data = np.flatnonzero(home == p)
        qi, di = range_pairs(v[data], v[q], radius_sq, spec)
        found_i.append(q[qi])
        found_j.append(data[di])
    if not found_i:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    return _unique_pairs(np.concatenate(found_i), np.concatenate(found_j))


def verify(x: np.ndarray, i: np.ndarray, j: np.ndarray, rank: np.ndarray, spec: NearSpec
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Orient candidate pairs as (later, earlier) in keep order and keep the ones within
    tolerance of the earlier record (the reference, as numpy isclose's b): (later, earlier,
    distance), sorted by (later, distance, earlier rank)."""
    later = np.where(rank[i] > rank[j], i, j)
    earlier = np.where(rank[i] > rank[j], j, i)
    dist, within = exact_distance(x[later], x[earlier], spec)
    later, earlier, dist = later[within], earlier[within], dist[within]
    order = np.lexsort((rank[earlier], dist, rank[later]))
    return later[order], earlier[order], dist[order]


def group_representative(n: int, later: np.ndarray, earlier: np.ndarray, dist: np.ndarray,
                         rank: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Visit records in keep order; remove one when it is within tolerance of an already
    kept record (the nearest such, ties by keep order). No chaining: each removed record
    is within tolerance of the record it names. Returns (removed, kept, distance)."""
    kept = np.ones(n, dtype=bool)
    removed, ref, dists = [], [], []
    starts = np.flatnonzero(np.r_[True, later[1:] != later[:-1]]) if len(later) else []
    bounds = list(starts) + [len(later)]
    for s, e in zip(bounds[:-1], bounds[1:], strict=True):  # groups by `later`, in keep order
        r = later[s]
        for k in range(s, e):  # sorted by distance, then the reference's rank
            if kept[earlier[k]]:
                kept[r] = False
                removed.append(r)
                ref.append(earlier[k])
                dists.append(dist[k])
                break
    return (np.array(removed, dtype=np.int64), np.array(ref, dtype=np.int64),
            np.array(dists, dtype=np.float64))


def group_components(x: np.ndarray, later: np.ndarray, earlier: np.ndarray, rank: np.ndarray,
                     spec: NearSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Connected components of the within-tolerance graph; the first record of each in keep
    order survives. The reported distance to it may exceed the threshold (chains)."""
    n = len(x)
    label = _components(n, later, earlier)
    by_rank = np.argsort(rank, kind="stable")
    first = np.full(label.max(initial=0) + 1, -1, dtype=np.int64)
    for r in by_rank[::-1]:  # the last write per label is the best-ranked row
        first[label[r]] = r
    keeper = first[label]
    removed = np.flatnonzero(keeper != np.arange(n))
    removed = removed[np.argsort(rank[removed], kind="stable")]
    dist, _ = exact_distance(x[removed], x[keeper[removed]], spec)
    return removed, keeper[removed], dist


def _components(n: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Component label of each node of the graph with edges (a[k], b[k]) (union-find)."""
    parent = list(range(n))

    def find(u: int) -> int:
        while parent[u] != u:
            parent[u] = parent[parent[u]]
            u = parent[u]
        return u

    for u, w in zip(a.tolist(), b.tolist(), strict=True):
        ru, rw = find(u), find(w)
        if ru != rw:
            parent[max(ru, rw)] = min(ru, rw)
    return np.array([find(u) for u in range(n)], dtype=np.int64)


def near_duplicates(x: np.ndarray, rank: np.ndarray, spec: NearSpec,
                    partitions: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Near-duplicate removals among the rows of ``x`` (n, d).

    ``rank``: each row's place in keep order (smaller = preferred, all distinct). Rows
    with NaN/inf never take part (the caller reports or keeps them). Returns
    ``(removed, kept, distance)`` row indices and float64 distances, in keep order of
    the removed rows. ``partitions > 1`` searches k-means partitions independently
    (same result with a flat index: see ``partition_plan``); None = one index up to
    FLAT_MAX_ROWS rows, else partitions of about PARTITION_ROWS rows.
    """
    x = x.reshape(len(x), -1)
    ok = np.flatnonzero(finite_rows(x))
    xs, rs = x[ok], rank[ok]
    v, radius_sq = search_vectors(xs, spec)
    if partitions is None:
        partitions = 1 if len(xs) <= FLAT_MAX_ROWS else math.ceil(len(xs) / PARTITION_ROWS)
    if partitions > 1:
        i, j = partitioned_pairs(v, radius_sq, spec, partitions)
    else:
        i, j = candidate_pairs(v, radius_sq, spec)
    later, earlier, dist = verify(xs, i, j, rs, spec)
    if spec.grouping == "representative":
        removed, kept, dist = group_representative(len(xs), later, earlier, dist, rs)
    else:
        removed, kept, dist = group_components(xs, later, earlier, rs, spec)
    order = np.argsort(rs[removed], kind="stable")
    return ok[removed[order]], ok[kept[order]], dist[order]
