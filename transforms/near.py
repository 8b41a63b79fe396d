"""Near-duplicate search and grouping over plain arrays: FAISS finds candidates, float64 decides.

Why two steps: an index (flat, IVF, HNSW, float32) is fast but approximate; a removal
must never depend on it. Candidates come from an L2 range search whose radius is a
proven superset of the user's tolerance (with slack for float32 rounding and FAISS's
strict comparison); every candidate pair is then verified with the exact metric in
float64, so precision is 1.0 whatever the index. Grouping visits records in keep order.

Scale without one big index: vectors are clustered (k-means on a sample, ``train_centroids``);
each vector has one home partition (its nearest centroid) and also joins every partition
whose centroid is within (distance to its own centroid + 2 x radius) (``assign``). By the
triangle inequality every neighbour within the radius of a partition's home rows is then
in that partition, so partitions are searched independently (``search_partition``, one
worker each in the job) with no loss of recall, and their pairs are merged by record key
(``merge_pairs``). ``near_duplicates`` runs the same steps in one process.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

METRICS = ("allclose", "l2", "cosine")
GROUPINGS = ("representative", "components")
INDEXES = ("auto", "flat", "ivf", "hnsw")
QUERY_BATCH = 8192  # range-search queries per call: bounds the result buffers
NN_K = 4  # neighbours per sampled row for the distance histogram and the borderline sample


@dataclass(frozen=True)
class NearSpec:
    metric: str  # allclose | l2 | cosine
    threshold: float = 0.0  # l2: Euclidean distance; cosine: 1 - cos
    atol: float = 1e-5  # allclose: |a - b| <= atol + rtol * |b| elementwise (b = kept record)
    rtol: float = 0.0
    grouping: str = "representative"
    index: str = "auto"  # auto = flat inside each partition (exact)
    nlist: int | None = None  # ivf: lists (default 4 sqrt(n))
    nprobe: int = 16  # ivf: lists visited per query
    hnsw_m: int = 32  # hnsw: links per node
    single_index_rows: int = 50_000  # up to here: one partition (n^2 d flops stay seconds)
    partition_rows: int = 3_000  # above: k-means partitions of about this many rows

    def __post_init__(self) -> None:
        for name, value, allowed in (("metric", self.metric, METRICS),
                                     ("grouping", self.grouping, GROUPINGS),
                                     ("index", self.index, INDEXES)):
            if value not in allowed:
                raise ValueError(f"near.{name} must be one of {', '.join(allowed)}, got {value!r}")

    @property
    def marker(self) -> float:
        """The distance to mark on a histogram: the threshold (allclose: atol)."""
        return self.atol if self.metric == "allclose" else self.threshold


def finite_rows(x: np.ndarray) -> np.ndarray:
    """Rows that can be compared by distance (no NaN/inf)."""
    return np.isfinite(x).all(axis=1)


def search_space(x: np.ndarray, spec: NearSpec) -> np.ndarray:
    """float32 vectors for the index: unit vectors for cosine, the values otherwise."""
    if spec.metric != "cosine":
        return np.ascontiguousarray(x, dtype=np.float32)
    x64 = x.astype(np.float64)
    norms = np.linalg.norm(x64, axis=1, keepdims=True)
    return np.ascontiguousarray(x64 / np.where(norms == 0, 1, norms), dtype=np.float32)


def value_scale(x: np.ndarray, spec: NearSpec) -> float:
    """The largest |value| the search sees (1 for unit vectors): sizes the float32 slack."""
    return 1.0 if spec.metric == "cosine" else float(np.abs(x).max(initial=0))


def search_radius_sq(spec: NearSpec, dim: int, scale: float) -> float:
    """Squared L2 radius such that every pair within the user's tolerance is inside it."""
    if spec.metric == "cosine":
        radius = math.sqrt(2 * spec.threshold)  # |a^ - b^|^2 = 2 (1 - cos)
    elif spec.metric == "l2":
        radius = spec.threshold
    else:  # allclose: |a_i - b_i| <= atol + rtol |b_i| for all i  =>  L2 <= sqrt(d) * that
        radius = math.sqrt(dim) * (spec.atol + spec.rtol * scale)
    # float32 storage and FAISS's |x|^2 + |y|^2 - 2xy in float32: allow a few ulps of the norms
    slack = 1e-5 * (radius + scale * math.sqrt(max(dim, 1))) + 1e-12
    return (radius + slack) ** 2


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


def partition_count(n: int, spec: NearSpec) -> int:
    """One partition up to ``single_index_rows``; above, partitions of ``partition_rows``
    rows, but at least sqrt(n) rows each so that assigning (n x partitions x d) does not
    outgrow searching (n x partition rows x d)."""
    if n <= spec.single_index_rows:
        return 1
    return math.ceil(n / max(spec.partition_rows, math.isqrt(n)))


def train_centroids(sample: np.ndarray, partitions: int, seed: int = 0) -> np.ndarray:
    """k-means centroids (k, d) from a sample of search vectors; one zero centroid when
    there is a single partition. Recall never depends on them (see ``assign``)."""
    import faiss

    d = sample.shape[1]
    k = max(1, min(partitions, len(sample)))
    if k == 1:
        return np.zeros((1, d), np.float32)
    km = faiss.Kmeans(d, k, niter=20, seed=seed, max_points_per_centroid=256)
    km.train(np.ascontiguousarray(sample, dtype=np.float32))
    return km.centroids


def assign(v: np.ndarray, centroids: np.ndarray, radius_sq: float
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(home partition of each row, rows, partitions): row ``rows[k]`` joins partition
    ``partitions[k]`` (its home included) when |row - c_p| <= |row - c_home| + 2 r.

    Then every y within r of a home row x of p joins p: |y - c_p| <= r + |x - c_p|
    <= r + |x - c_q| <= 2 r + |y - c_q| for y's home q (triangle inequality, twice)."""
    import faiss

    n = len(v)
    if len(centroids) == 1:
        return np.zeros(n, np.int64), np.arange(n, dtype=np.int64), np.zeros(n, np.int64)
    r = math.sqrt(radius_sq)
    home = np.empty(n, dtype=np.int64)
    rows, parts = [], []
    for a in range(0, n, QUERY_BATCH):
        dist = np.sqrt(np.maximum(faiss.pairwise_distances(v[a:a + QUERY_BATCH], centroids),
                                  0)).astype(np.float64)
        nearest = dist.argmin(axis=1)
        home[a:a + QUERY_BATCH] = nearest
        reach = dist <= dist[np.arange(len(dist)), nearest][:, None] + 2 * r + 1e-6 * (1 + dist)
        reach[np.arange(len(dist)), nearest] = True
        rr, pp = np.nonzero(reach)
        rows.append(a + rr)
        parts.append(pp)
    if not rows:
        return home, np.empty(0, np.int64), np.empty(0, np.int64)
    return home, np.concatenate(rows), np.concatenate(parts).astype(np.int64)


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


def _gpu_flat(index, kind: str):
    """A GPU copy of a flat index when FAISS sees a GPU (the faiss-gpu extra), else None."""
    import faiss

    if kind != "flat" or not hasattr(faiss, "StandardGpuResources") or faiss.get_num_gpus() < 1:
        return None
    return faiss.index_cpu_to_all_gpus(index)


def range_pairs(index, queries: np.ndarray, radius_sq: float, spec: NearSpec
                ) -> tuple[np.ndarray, np.ndarray]:
    """(query row, data row) for every query-data pair within the squared radius.

    On a GPU, FAISS has no range search: kNN on the GPU plus a CPU fallback for queries
    with more neighbours than k (``faiss.contrib.exhaustive_search.range_search_gpu``)."""
    gpu = _gpu_flat(index, "flat" if spec.index == "auto" else spec.index)
    qs, ds = [], []
    for a in range(0, len(queries), QUERY_BATCH):
        q = queries[a:a + QUERY_BATCH]
        if gpu is not None:
            from faiss.contrib.exhaustive_search import range_search_gpu

            lims, _, ids = range_search_gpu(q, radius_sq, gpu, index)
        else:
            lims, _, ids = index.range_search(q, radius_sq)
        qs.append(a + np.repeat(np.arange(len(lims) - 1), np.diff(lims.astype(np.int64))))
        ds.append(ids.astype(np.int64))
    if not qs:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    return np.concatenate(qs), np.concatenate(ds)


@dataclass
class Found:
    """What one partition found, in its local row numbers.

    Pairs (a, b) are unordered (a is a home row, a != b), each once; ``a_near_b``: a is
    within tolerance with b as the reference (allclose is not symmetric). ``nn_row`` /
    ``nn``: sampled home rows and their nearest-neighbour distance (inf when alone).
    ``near_*``: those rows' nearest neighbours (for the borderline sample)."""

    a: np.ndarray
    b: np.ndarray
    dist: np.ndarray
    a_near_b: np.ndarray
    b_near_a: np.ndarray
    nn_row: np.ndarray
    nn: np.ndarray
    near_a: np.ndarray
    near_b: np.ndarray
    near_dist: np.ndarray
    near_within: np.ndarray


def _verified(x: np.ndarray, a: np.ndarray, b: np.ndarray, spec: NearSpec
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    d, ab = exact_distance(x[a], x[b], spec)
    ba = exact_distance(x[b], x[a], spec)[1] if spec.metric == "allclose" else ab
    return d, ab, ba


def search_partition(x: np.ndarray, v: np.ndarray, home: np.ndarray, spec: NearSpec,
                     radius_sq: float, nn_rows: np.ndarray | None = None) -> Found:
    """Every verified pair between a home row of the partition and any of its rows.

    ``x``: the rows' values (for float64 verification); ``v``: their search vectors;
    ``home``: bool mask of home rows; ``nn_rows``: home rows whose nearest-neighbour
    distance is wanted (a kNN search, so a sample keeps it cheap)."""
    index = _index(v, spec)
    home_rows = np.flatnonzero(home)
    qi, b = range_pairs(index, v[home_rows], radius_sq, spec)
    a = home_rows[qi]
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    pairs = np.unique(np.stack([lo, hi], axis=1)[lo != hi], axis=0)
    a, b = pairs[:, 0], pairs[:, 1]
    dist, ab, ba = _verified(x, a, b, spec)
    keep = ab | ba
    a, b, dist, ab, ba = a[keep], b[keep], dist[keep], ab[keep], ba[keep]

    nn_rows = np.empty(0, np.int64) if nn_rows is None else np.sort(nn_rows).astype(np.int64)
    k = min(NN_K + 1, len(v))
    _, ids = index.search(v[nn_rows], k) if len(nn_rows) else (None, np.empty((0, k), np.int64))
    rows = np.repeat(nn_rows, k)
    nbrs = ids.reshape(-1).astype(np.int64)
    ok = (nbrs >= 0) & (nbrs != rows)
    rows, nbrs = rows[ok], nbrs[ok]
    near_dist, n_ab, n_ba = _verified(x, rows, nbrs, spec)
    near_dist = np.where(np.isnan(near_dist), np.inf, near_dist)
    nn = np.full(len(nn_rows), np.inf)
    slot = np.searchsorted(nn_rows, rows) if len(rows) else rows
    np.minimum.at(nn, slot, near_dist)
    for ends in ((a, dist), (b, dist)):  # a verified pair the kNN missed is nearer
        hit = np.isin(ends[0], nn_rows)
        np.minimum.at(nn, np.searchsorted(nn_rows, ends[0][hit]), ends[1][hit])
    return Found(a, b, dist, ab, ba, nn_rows, nn, rows, nbrs, near_dist, n_ab | n_ba)


@dataclass
class Edges:
    """Within-tolerance edges between records, merged from all partitions.

    ``node``: for each record, the index of its first mention (the arrays passed to
    ``merge_pairs``); ``rank``: its place in keep order; ``later``/``earlier``: record
    numbers, sorted by (rank of later, distance, rank of earlier)."""

    node: np.ndarray
    rank: np.ndarray
    later: np.ndarray
    earlier: np.ndarray
    dist: np.ndarray


def merge_pairs(key: np.ndarray, prio: np.ndarray, order: np.ndarray, dist: np.ndarray,
                a_near_b: np.ndarray, b_near_a: np.ndarray) -> Edges:
    """Pairs from all partitions -> one set of oriented edges between records.

    Each pair k has two mentions: ``[k]`` (a) and ``[m + k]`` (b) of ``key`` (2m, 2) uint64
    (the record's identity: its exact digest in the job, so copies are one record),
    ``prio`` (float64, smaller preferred) and ``order`` (int64 input order), which define
    keep order. A pair found by two partitions counts once. Deterministic whatever the
    order the pairs arrive in."""
    m = len(dist)
    by_key = np.lexsort((order, prio, key[:, 1], key[:, 0]))
    k_sorted = key[by_key]
    starts = np.ones(2 * m, dtype=bool)
    starts[1:] = (k_sorted[1:] != k_sorted[:-1]).any(axis=1)
    node = by_key[starts]  # best mention of each key, i.e. the record that stands for it
    record = np.empty(2 * m, dtype=np.int64)
    record[by_key] = np.cumsum(starts) - 1
    rank = np.empty(len(node), dtype=np.int64)
    rank[np.lexsort((order[node], prio[node]))] = np.arange(len(node))
    ra, rb = record[:m], record[m:]
    a_later = rank[ra] > rank[rb]
    later, earlier = np.where(a_later, ra, rb), np.where(a_later, rb, ra)
    within = np.where(a_later, a_near_b, b_near_a) & (ra != rb)
    later, earlier, dist = later[within], earlier[within], dist[within]
    o = np.lexsort((dist, earlier, later))  # a pair found twice counts once (smallest distance)
    later, earlier, dist = later[o], earlier[o], dist[o]
    first = np.ones(len(later), dtype=bool)  # empty when no pair is within tolerance
    first[1:] = (later[1:] != later[:-1]) | (earlier[1:] != earlier[:-1])
    later, earlier, dist = later[first], earlier[first], dist[first]
    o = np.lexsort((rank[earlier], dist, rank[later]))
    return Edges(node, rank, later[o], earlier[o], dist[o])


def row_edges(a: np.ndarray, b: np.ndarray, rank: np.ndarray, dist: np.ndarray,
              a_near_b: np.ndarray, b_near_a: np.ndarray) -> tuple[Edges, np.ndarray]:
    """``merge_pairs`` for pairs of rows of one array, keyed by row number (no digests):
    the edges and each record's row. ``rank``: the keep order of every row."""
    both = np.concatenate([a, b])
    key = np.stack([np.zeros_like(both), both], axis=1).astype(np.uint64)
    edges = merge_pairs(key, np.zeros(len(both)), rank[both], dist, a_near_b, b_near_a)
    return edges, both[edges.node]


def group_representative(e: Edges, protected: np.ndarray | None = None
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Visit records in keep order; remove one when it is within tolerance of an already
    kept record (the nearest such, ties by keep order). No chaining: each removed record
    is within tolerance of the record it names. ``protected`` (per record): never removed
    (reference / stored records). Returns (removed, kept, distance)."""
    kept = np.ones(len(e.node), dtype=bool)
    safe = np.zeros(len(e.node), dtype=bool) if protected is None else protected
    removed, ref, dists = [], [], []
    later, earlier = e.later.tolist(), e.earlier.tolist()
    starts = np.flatnonzero(np.r_[True, e.later[1:] != e.later[:-1]]) if len(later) else []
    bounds = list(starts) + [len(later)]
    for s, t in zip(bounds[:-1], bounds[1:], strict=True):  # groups by `later`, in keep order
        if safe[later[s]]:
            continue
        for k in range(s, t):  # sorted by distance, then the reference's rank
            if kept[earlier[k]]:
                kept[later[s]] = False
                removed.append(later[s])
                ref.append(earlier[k])
                dists.append(e.dist[k])
                break
    return (np.array(removed, dtype=np.int64), np.array(ref, dtype=np.int64),
            np.array(dists, dtype=np.float64))


def group_components(e: Edges, protected: np.ndarray | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Connected components of the within-tolerance graph; the first record of each in keep
    order survives, and so do ``protected`` records (which rank first). Returns (removed,
    kept) in keep order of the removed records; the caller measures their distances,
    which may exceed the threshold (chains)."""
    n = len(e.node)
    label = _components(n, e.later, e.earlier)
    first = np.full(n, -1, dtype=np.int64)
    by_rank = np.argsort(e.rank, kind="stable")
    for r in by_rank[::-1].tolist():  # the last write per label is the best-ranked record
        first[label[r]] = r
    keeper = first[label]
    removed = np.flatnonzero(keeper != np.arange(n))
    if protected is not None:
        removed = removed[~protected[removed]]
    removed = removed[np.argsort(e.rank[removed], kind="stable")]
    return removed, keeper[removed]


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
    """Near-duplicate removals among the rows of ``x`` (n, d), in one process.

    ``rank``: each row's place in keep order (smaller = preferred, all distinct). Rows
    with NaN/inf never take part (the caller reports or keeps them). Returns
    ``(removed, kept, distance)`` row indices and float64 distances, in keep order of
    the removed rows. ``partitions``: None = ``partition_count``; with a flat index the
    result does not depend on it (see ``assign``).
    """
    x = x.reshape(len(x), -1)
    ok = np.flatnonzero(finite_rows(x))
    xs, rs = x[ok], np.asarray(rank)[ok].astype(np.int64)
    v = search_space(xs, spec)
    radius_sq = search_radius_sq(spec, xs.shape[1], value_scale(xs, spec))
    k = partition_count(len(xs), spec) if partitions is None else partitions
    sample = v[np.random.default_rng(0).choice(len(v), min(len(v), 256 * k), replace=False)]
    home, rows, parts = assign(v, train_centroids(sample, k), radius_sq)
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("a", "b", "dist", "ab", "ba")}
    order = np.argsort(parts, kind="stable")
    bounds = np.searchsorted(parts[order], np.arange(parts.max(initial=-1) + 2))
    for p in range(len(bounds) - 1):
        members = rows[order[bounds[p]:bounds[p + 1]]]
        if len(members) < 2:
            continue
        f = search_partition(xs[members], v[members], home[members] == p, spec, radius_sq)
        for k, val in (("a", members[f.a]), ("b", members[f.b]), ("dist", f.dist),
                       ("ab", f.a_near_b), ("ba", f.b_near_a)):
            cols[k].append(val)
    a, b, dist, ab, ba = (np.concatenate(cols[k]) if cols[k] else np.empty(0, t) for k, t in
                          (("a", np.int64), ("b", np.int64), ("dist", float), ("ab", bool),
                           ("ba", bool)))
    edges, row = row_edges(a, b, rs, dist, ab, ba)
    if spec.grouping == "representative":
        removed, kept, dist = group_representative(edges)
    else:
        removed, kept = group_components(edges)
        dist, _ = exact_distance(xs[row[removed]], xs[row[kept]], spec)
    return ok[row[removed]], ok[row[kept]], dist
