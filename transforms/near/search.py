"""Candidate pairs within an L2 radius: matrix-product speed, no pair lost to rounding.

Why not a plain float32 range search: FAISS's flat search (on its BLAS path, above a few
thousand rows) computes |x|^2 + |y|^2 - 2 x.y in float32 and compares it with the radius
as given. The rounding error of that sum grows with |x|^2 (about d x 6e-8 x |x|^2), so
pairs closer than it are lost, and a tolerance of 1e-4 on vectors of norm 5 loses a
third of them. Here each query row is compared with a threshold that adds a proven
bound on that error, in squared units, from the norms involved; vectors are centred
(on a partition centroid) first, so the norms and the bound stay small. When the float32
bound would still swamp the radius (tight tolerances, large values) the product runs in
float64 instead. Callers verify every candidate in float64 with the exact metric.

The bound (Higham, Accuracy and Stability of Numerical Algorithms, 3.1): a float
dot product of length d errs by at most g_d sum |x_i y_i| <= g_d |x| |y|, g_d = d u /
(1 - d u); norms likewise; the two additions add u each on values below (|x| + |y|)^2.
So |computed - exact| <= g_{d+3} (|x| + |y|)^2. Storing a float64 vector as float32
moves it by at most u |x|, which widens the radius by u (|x| + |y|).
"""

from __future__ import annotations

import functools
import math
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

UNIT_ROUNDOFF = {np.dtype(np.float32): 2.0 ** -24, np.dtype(np.float64): 2.0 ** -53}
BLOCK_ELEMENTS = 1 << 24  # query x data distances computed at once (64 MB in float32)
BLOCK_BYTES = 64 << 20  # query or data rows copied at once (16k-value rows: 1,024 of them)
WINDOW_COLS = 2048  # data rows per block when blocks are paired by a projected coordinate
SUBSET = 8  # a crowd block's top partners: every SUBSET-th column bounds the rest
T = TypeVar("T")


def rows_for(row_bytes: int, budget: int, most: int, least: int = 16) -> int:
    """Rows per block so that a block holds about ``budget`` bytes (at most ``most``
    rows, at least ``least``): blocks of 16,384-value records must be fewer rows."""
    return int(max(least, min(most, budget // max(1, row_bytes))))


def gamma(dim: int, dtype: np.dtype) -> float:
    """Relative error bound of a length-``dim`` dot product plus two additions, x 1.01."""
    k = (dim + 3) * UNIT_ROUNDOFF[np.dtype(dtype)]
    return math.inf if k >= 0.5 else 1.01 * k / (1 - k)


@dataclass
class Vectors:
    """Search vectors (float32 or float64) and their norms (float64, of the stored values):
    storing moved each vector by at most ``u`` x its norm."""

    v: np.ndarray
    norm: np.ndarray

    @property
    def u(self) -> float:
        return UNIT_ROUNDOFF[self.v.dtype]

    def take(self, rows: np.ndarray) -> Vectors:
        return Vectors(self.v[rows], self.norm[rows])

    def rows(self, part: slice) -> Vectors:
        """A slice of the rows, as views (no copy)."""
        return Vectors(self.v[part], self.norm[part])


def centred_blocks(z: np.ndarray, center: np.ndarray | None,
                   space: Callable[[np.ndarray], np.ndarray] | None = None
                   ) -> Iterator[tuple[slice, np.ndarray]]:
    """``space(rows) - center`` in float64 blocks of about 32 MB (``space``: rows -> a
    new float64 array; default a float64 copy): no float64 copy of all of ``z``."""
    step = rows_for(8 * max(1, z.shape[1]), 32 << 20, 4096)
    for a in range(0, len(z), step):
        b = np.array(z[a:a + step], dtype=np.float64) if space is None else space(
            z[a:a + step])
        if center is not None:
            b -= center
        yield slice(a, a + len(b)), b


def centred(z: np.ndarray, center: np.ndarray | None, dtype: np.dtype,
            space: Callable[[np.ndarray], np.ndarray] | None = None) -> Vectors:
    """``space(z) - center`` (``centred_blocks``) stored in ``dtype``, with norms of what
    is stored (inf where a float64 value is beyond float32: ``precision_for`` then asks
    for float64)."""
    v = np.empty(z.shape, dtype)
    for sl, b in centred_blocks(z, center, space):
        with np.errstate(over="ignore"):
            v[sl] = b
    return Vectors(v, np.sqrt(np.einsum("ij,ij->i", v, v, dtype=np.float64)))


def precision_for(norm_max: float, dim: int, radius: float) -> np.dtype:
    """float32 unless its rounding bound at these norms would exceed 3 radius^2 (the
    search area would grow many-fold): then float64, about 2x slower on a CPU."""
    bound = gamma(dim, np.float32) * (2 * norm_max) ** 2
    return np.dtype(np.float32 if bound <= 3 * radius * radius else np.float64)


def thresholds(q: Vectors, data_norm_max: float, radius: float, dim: int) -> np.ndarray:
    """Per query row: the squared distance under which a computed distance may belong to
    a pair truly within ``radius`` (storage and product rounding both bounded)."""
    return _threshold(q.norm, data_norm_max, radius, dim, q.v.dtype)


def _threshold(norm, data_norm_max, radius: float, dim: int, dtype):
    """``thresholds`` from the query rows' norms (numpy arrays or torch tensors alike)."""
    s = (norm + data_norm_max) * (1 + 1e-9)  # norms are computed: round them up
    return (radius + 1.01 * UNIT_ROUNDOFF[np.dtype(dtype)] * s) ** 2 + gamma(dim, dtype) * s * s


def augmented_limit(norm, data_norm_max, radius: float, dim: int, dtype):
    """The limit ``augmented``'s sign test holds each query row to: its threshold
    widened by 1 + 2 g for the two extra terms of the product (see there). Numpy arrays
    or torch tensors alike: a GPU's batched cells (``near.batched``) take this bound."""
    g = gamma(dim + 2, dtype) + UNIT_ROUNDOFF[np.dtype(dtype)]
    return _threshold(norm, data_norm_max, radius, dim, dtype) * (1 + 2 * g)


def to_device(a: np.ndarray, dev):
    """A numpy array as a torch tensor on ``dev`` (on a CPU device it shares ``a``'s
    memory). A read-only array (a memory-mapped input) makes torch warn that writing
    would be undefined: the near stage never writes them, so the warning is silenced."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(np.ascontiguousarray(a)).to(dev)


@functools.cache
def _driver_present() -> bool:
    """Whether an NVIDIA driver is loaded: asked once (a cell asks per product; at 8M
    records the file checks were 3 CPU seconds)."""
    return os.path.exists("/dev/nvidiactl")


def use_cuda(device: str) -> bool:
    """``cuda``: required; ``auto``: when a GPU and a CUDA build of torch are present."""
    if device == "cpu":
        return False
    if device == "auto" and not _driver_present():
        return False
    import torch

    if torch.cuda.is_available():
        return True
    if device == "cuda":
        raise RuntimeError("near.device is cuda, but torch sees no CUDA device")
    return False


_OUT_OF_MEMORY: set[str] = set()  # the work that fell back to the CPU in this process


def on_device(gpu: Callable[[], T], cpu: Callable[[], T], what: str) -> T:
    """``gpu()``, or ``cpu()`` once the GPU ran out of memory for ``what`` in this
    process (said once, in one line): the two paths give the same answers (the tests
    hold both to one float64 oracle), so a worker whose GPU is full goes on, slower,
    instead of failing the run with a traceback."""
    import torch

    if what not in _OUT_OF_MEMORY:
        try:
            return gpu()
        except torch.cuda.OutOfMemoryError:
            _OUT_OF_MEMORY.add(what)
            torch.cuda.empty_cache()
            print(f"near: the GPU ran out of memory for {what}; this worker goes on with "
                  "them on the CPU (the same answers)", file=sys.stderr, flush=True)
    return cpu()


def augmented(q: Vectors, y: Vectors, radius: float | np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q', y', T) with q'_i . y'_j = (T_i - D_ij) / 2 + rounding, where D_ij = |q_i|^2 +
    |y_j|^2 - 2 q_i.y_j is the squared distance and T_i the query's threshold (``radius``:
    one for all, or one per query row): one matrix product and one sign test per pair,
    no other pass over the distances.

    The two extra terms per product raise the rounding bound by g (|a_i| + |b_j|) <=
    g (T_i + |q_i|^2 + |y_j|^2) / 2, covered by widening T_i by the factor (1 + 2 g)."""
    dim, dtype = q.v.shape[1], q.v.dtype
    limit = augmented_limit(q.norm, float(y.norm.max(initial=0)), radius, dim, dtype)
    qa = np.empty((len(q.v), dim + 2), dtype)
    qa[:, :dim], qa[:, dim], qa[:, dim + 1] = q.v, (limit - q.norm ** 2) / 2, 1
    ya = np.empty((len(y.v), dim + 2), dtype)
    ya[:, :dim], ya[:, dim], ya[:, dim + 1] = y.v, 1, -(y.norm ** 2) / 2
    return qa, ya, limit


NO_NEAREST = -2  # ``own`` value: this query needs no nearest neighbour


def pairs_within(q: Vectors, y: Vectors, radius: float, device: str = "cpu",
                 own: np.ndarray | None = None, pairs: bool = True,
                 projected: tuple[Vectors, Vectors, float] | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(query row, data row) for every pair whose distance may be within ``radius`` (a
    superset of the true pairs; same-row pairs included when q and y share rows), and
    the nearest data row of each query (by float32 distance, from the same products) for
    queries whose ``own`` entry is not NO_NEAREST: ``own[i]`` is the data row that is
    query i itself (skipped), or -1. -1 where no nearest is wanted or there is none.
    ``pairs`` False: the nearest rows only (no pair is listed: a crowd has millions).
    ``projected``: as for ``earlier_candidates`` (pairs only, on the CPU)."""
    nq = len(q.v)
    best = np.full(nq, -1, np.int64)
    if not nq or not len(y.v):
        return np.empty(0, np.int64), np.empty(0, np.int64), best
    if q.v.dtype != y.v.dtype:
        raise ValueError("queries and data must have one precision")
    if projected is not None and own is None and pairs and not use_cuda(device):
        return (*_narrowed_pairs(q, y, radius, projected), best)
    row_bytes = q.v.itemsize * (q.v.shape[1] + 2)
    step = rows_for(row_bytes, BLOCK_BYTES, nq)
    if step < nq:  # wide rows: the queries' augmented copy a block at a time
        parts = [pairs_within(q.take(np.arange(a, min(a + step, nq))), y, radius, device,
                              None if own is None else own[a:a + step], pairs)
                 for a in range(0, nq, step)]
        return (np.concatenate([p[0] + a for p, a in zip(parts, range(0, nq, step),
                                                          strict=True)]),
                np.concatenate([p[1] for p in parts]), np.concatenate([p[2] for p in parts]))
    own = np.full(nq, NO_NEAREST, np.int64) if own is None else np.asarray(own, np.int64)
    want = np.flatnonzero(own != NO_NEAREST)
    best_d = np.full(nq, np.inf)
    cols = rows_for(row_bytes, BLOCK_BYTES, min(len(y.v), BLOCK_ELEMENTS // 256), 1)
    rows = max(1, BLOCK_ELEMENTS // cols)
    gpu = use_cuda(device)
    qs, ys = [], []
    for c in range(0, len(y.v), cols):
        qa, ya, limit = augmented(q, y.take(np.arange(c, min(c + cols, len(y.v)))), radius)
        args = (qa, ya, rows, want, own[want] - c, pairs)
        i, j, w, top, score = (on_device(lambda a=args: _signs_torch(*a),
                                         lambda a=args: _signs(*a), "the cells' products")
                               if gpu else _signs(*args))
        qs.append(i)
        ys.append(j + c)
        d = limit[w] - 2 * score  # the computed squared distance of each one's best
        better = d < best_d[w]
        best[w[better]], best_d[w[better]] = top[better] + c, d[better]
    return np.concatenate(qs).astype(np.int64), np.concatenate(ys).astype(np.int64), best


def _narrowed_pairs(q: Vectors, y: Vectors, radius: float,
                    projected: tuple[Vectors, Vectors, float]) -> tuple[np.ndarray, np.ndarray]:
    """``pairs_within``'s pairs through the projected product first (``_narrowed``);
    a block where more than one pair in 128 passes it takes the full product."""
    qp, yp, radius_p = projected
    row_bytes = q.v.itemsize * (q.v.shape[1] + 2)
    cols = rows_for(row_bytes, BLOCK_BYTES, min(len(y.v), BLOCK_ELEMENTS // 256), 1)
    rows = max(1, min(BLOCK_ELEMENTS // cols, rows_for(row_bytes, BLOCK_BYTES, len(q.v))))
    qs, ys = [], []
    for c in range(0, len(y.v), cols):
        block = slice(c, min(c + cols, len(y.v)))  # slices: views, no copies
        width = block.stop - block.start
        for r in range(0, len(q.v), rows):
            part = slice(r, min(r + rows, len(q.v)))
            qa, ya, _ = augmented(q.rows(part), y.rows(block), radius)
            pq, py, _ = augmented(qp.rows(part), yp.rows(block), radius_p)
            near = _narrowed(pq @ py.T, qa, ya, (part.stop - part.start) * width // 128)
            if near is None:
                i, j = np.divmod(np.flatnonzero((qa @ ya.T).reshape(-1) >= 0), width)
            else:
                i, j = near[0], near[1]
            qs.append(i + r)
            ys.append(j + c)
    return np.concatenate(qs).astype(np.int64), np.concatenate(ys).astype(np.int64)


def _signs(qa: np.ndarray, ya: np.ndarray, rows: int, want: np.ndarray, own: np.ndarray,
           pairs: bool = True) -> tuple[np.ndarray, ...]:
    """(i, j) where qa_i . ya_j >= 0, in blocks of ``rows`` queries; and for the query
    rows ``want`` (sorted) the column with the largest product other than ``own``:
    (those rows, their columns, the products)."""
    out, tops, scores = [], [], []
    for r in range(0, len(qa), rows):
        m = qa[r:r + rows] @ ya.T
        if pairs:
            out.append(np.flatnonzero(m >= 0) + r * len(ya))  # 1-d: ~10x faster than 2-d
        lo, hi = np.searchsorted(want, [r, r + rows])
        if hi > lo:
            sub = m[want[lo:hi] - r]
            mine = (own[lo:hi] >= 0) & (own[lo:hi] < len(ya))
            sub[np.flatnonzero(mine), own[lo:hi][mine]] = -np.inf
            top = sub.argmax(axis=1)
            tops.append(top)
            scores.append(sub[np.arange(len(sub)), top])
    return _found(out, len(ya), want, tops, scores)


def _found(out: list, cols: int, want: np.ndarray, tops: list, scores: list
           ) -> tuple[np.ndarray, ...]:
    i, j = np.divmod(np.concatenate(out) if out else np.empty(0, np.int64), cols)
    top = np.concatenate(tops) if tops else np.empty(0, np.int64)
    score = np.concatenate(scores).astype(np.float64) if scores else np.empty(0)
    return i, j, want, np.where(np.isfinite(score), top, -1), score


def _signs_torch(qa: np.ndarray, ya: np.ndarray, rows: int, want: np.ndarray,
                 own: np.ndarray, pairs: bool = True, dev=None) -> tuple[np.ndarray, ...]:
    """``_signs`` with torch on ``dev`` (default: the GPU; full float32 products, no TF32)."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda") if dev is None else dev
    qt, yt = to_device(qa, dev), to_device(ya, dev)
    out, tops, scores = [], [], []
    for r in range(0, len(qa), rows):
        m = qt[r:r + rows] @ yt.T
        if pairs:
            out.append(torch.nonzero((m >= 0).reshape(-1)).reshape(-1).cpu().numpy()
                       + r * len(ya))
        lo, hi = np.searchsorted(want, [r, r + rows])
        if hi > lo:
            sub = m[to_device(want[lo:hi] - r, dev)]
            mine = np.flatnonzero((own[lo:hi] >= 0) & (own[lo:hi] < len(ya)))
            sub[to_device(mine, dev), to_device(own[lo:hi][mine], dev)] = (
                -torch.inf)
            score, top = sub.max(dim=1)
            tops.append(top.cpu().numpy())
            scores.append(score.cpu().numpy())
    return _found(out, len(ya), want, tops, scores)


def earlier_candidates(q: Vectors, y: Vectors, radius: float, q_rank: tuple, y_rank: tuple,
                       k: int, projected: tuple[Vectors, Vectors, float] | None = None,
                       dev=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each query row: the data rows earlier in keep order (``*_rank``: (prio,
    order) arrays, compared in that order) that may be within ``radius``, the ``k``
    nearest of them by the products (a crowd record has thousands; the caller verifies
    these), and how many there were. Returns (query row, data row, candidates per
    query). ``projected``: the same rows projected (``near.project``) and a radius that
    bounds every pair within ``radius``: a block's pairs go through that narrow product
    first, and only those it keeps get the full one (a crowd's rows, where most pass,
    take the full product). ``dev``: a torch device where the products, the rank test
    and the selection run instead (no projection there: the products are cheap)."""
    if dev is not None:
        return _earlier_torch(q, y, radius, q_rank, y_rank, k, dev)
    nq = len(q.v)
    count = np.zeros(nq, np.int64)
    if not nq or not len(y.v):
        return np.empty(0, np.int64), np.empty(0, np.int64), count
    row_bytes = q.v.itemsize * (q.v.shape[1] + 2)
    step = rows_for(row_bytes, BLOCK_BYTES, nq)
    if step < nq:  # wide rows: the queries' augmented copy a block at a time
        parts = [earlier_candidates(q.take(np.arange(a, min(a + step, nq))), y, radius,
                                    (q_rank[0][a:a + step], q_rank[1][a:a + step]), y_rank, k,
                                    None if projected is None else (projected[0].take(
                                        np.arange(a, min(a + step, nq))), *projected[1:]))
                 for a in range(0, nq, step)]
        return (np.concatenate([p[0] + a for p, a in zip(parts, range(0, nq, step),
                                                          strict=True)]),
                np.concatenate([p[1] for p in parts]), np.concatenate([p[2] for p in parts]))
    qi, yj = [], []
    cols = rows_for(row_bytes, BLOCK_BYTES, min(len(y.v), BLOCK_ELEMENTS // 256), 1)
    window = None
    if projected is not None and len(y.v) > WINDOW_COLS:
        q, y, projected, q_rank, y_rank, window = _by_first_coordinate(q, y, projected,
                                                                       q_rank, y_rank)
        cols = min(cols, WINDOW_COLS)
    rows = max(1, BLOCK_ELEMENTS // cols)
    for c in range(0, len(y.v), cols):
        sl = slice(c, min(c + cols, len(y.v)))
        lo, hi = (0, nq) if window is None else window(sl)
        if lo >= hi:
            continue
        block = np.arange(sl.start, sl.stop)
        qa, ya, _ = augmented(q, y.take(block), radius)
        pa = None if projected is None else augmented(projected[0], projected[1].take(block),
                                                      projected[2])
        for r in range(lo, hi, rows):
            e = min(r + rows, hi)
            qr = (q_rank[0][r:e], q_rank[1][r:e])
            yr = (y_rank[0][sl], y_rank[1][sl])
            if pa is None:
                i, j, n = _earlier_top(qa[r:e] @ ya.T, qr, yr, k)
            else:
                i, j, n = _earlier_split(pa[0][r:e] @ pa[1].T, qa[r:e], ya, qr, yr, k)
            count[r:e] += n
            qi.append(i + r)
            yj.append(j + c)
    qi, yj = np.concatenate(qi or [np.empty(0, np.int64)]), np.concatenate(
        yj or [np.empty(0, np.int64)])
    if window is not None:  # back to the callers' rows, by query row as before
        qi, yj, count = window.q[qi], window.y[yj], count[np.argsort(window.q)]
        by = np.argsort(qi, kind="stable")
        qi, yj = qi[by], yj[by]
    return qi, yj, count


def _earlier_torch(q: Vectors, y: Vectors, radius: float, q_rank: tuple, y_rank: tuple,
                   k: int, dev) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``earlier_candidates`` on a torch device, in products 8 times the CPU's blocks:
    per block of data rows, each query's ``k`` largest passing products among the
    earlier rows (``torch.topk``, largest first) and how many passed."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    nq = len(q.v)
    count = np.zeros(nq, np.int64)
    qi, yj = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
    row_bytes = q.v.itemsize * (q.v.shape[1] + 2)
    cols = rows_for(row_bytes, 8 * BLOCK_BYTES, len(y.v), 1)
    rows = max(1, 8 * BLOCK_ELEMENTS // max(cols, 1))
    for c in range(0, len(y.v), cols):
        sl = slice(c, min(c + cols, len(y.v)))
        qa, ya, _ = augmented(q, y.rows(sl), radius)
        yt = to_device(ya, dev)
        yr = tuple(to_device(o[sl], dev)[None, :] for o in y_rank)
        for r in range(0, nq, rows):
            e = min(r + rows, nq)
            m = to_device(qa[r:e], dev) @ yt.T
            m[~_before(yr, tuple(to_device(o[r:e], dev)[:, None] for o in q_rank))] = (
                -torch.inf)
            count[r:e] += (m >= 0).sum(dim=1).cpu().numpy()
            top, at = torch.topk(m, min(k, m.shape[1]), dim=1)
            i, t = torch.nonzero(top >= 0, as_tuple=True)
            qi.append(i.cpu().numpy() + r)
            yj.append(at[i, t].cpu().numpy() + c)
    return np.concatenate(qi), np.concatenate(yj), count


@dataclass
class _Window:
    """Rows sorted by their first projected coordinate (``s`` queries', ``t`` data's):
    a data block meets only the queries whose coordinate is within ``reach`` of its
    range, since |s - t| <= the projected distance (``near.project``); ``q``, ``y``:
    the sorted rows' places in the callers' order."""

    s: np.ndarray
    t: np.ndarray
    reach: float
    q: np.ndarray
    y: np.ndarray

    def __call__(self, sl: slice) -> tuple[int, int]:
        lo = np.searchsorted(self.s, self.t[sl.start] - self.reach, "left")
        hi = np.searchsorted(self.s, self.t[sl.stop - 1] + self.reach, "right")
        return int(lo), int(hi)


def _by_first_coordinate(q: Vectors, y: Vectors, projected: tuple, q_rank: tuple,
                         y_rank: tuple) -> tuple:
    """``earlier_candidates``' rows sorted by the top principal coordinate, and the
    window that pairs their blocks. ``reach`` bounds the stored projected distance of
    every pair the projected sign test can pass (its threshold ``augmented`` widens, plus
    the product's rounding), so the blocks it skips hold no pair the test would pass:
    the same pairs and counts as the whole product. The coordinates' differences are
    taken in float64: exact for float32 values, within 2 ulps of |s| + |t| otherwise."""
    qp, yp, radius = projected
    s = qp.v[:, 0].astype(np.float64)
    t = yp.v[:, 0].astype(np.float64)
    oq, oy = np.argsort(s, kind="stable"), np.argsort(t, kind="stable")
    g = gamma(qp.v.shape[1] + 2, qp.v.dtype) + UNIT_ROUNDOFF[qp.v.dtype]
    qmax, ymax = float(qp.norm.max(initial=0)), float(yp.norm.max(initial=0))
    limit = float(augmented_limit(qp.norm, ymax, radius, qp.v.shape[1], qp.v.dtype).max(
        initial=0))
    big = float(max(np.abs(s).max(initial=0), np.abs(t).max(initial=0)))
    reach = (math.sqrt(limit * (1 + 2 * g) + 4 * g * (qmax ** 2 + ymax ** 2)) * (1 + 1e-6)
             + 4 * UNIT_ROUNDOFF[np.dtype(np.float64)] * big)
    return (q.take(oq), y.take(oy), (qp.take(oq), yp.take(oy), radius),
            (q_rank[0][oq], q_rank[1][oq]), (y_rank[0][oy], y_rank[1][oy]),
            _Window(s[oq], t[oy], reach, oq, oy))


def _earlier_split(mp: np.ndarray, qa: np.ndarray, ya: np.ndarray, q_rank: tuple,
                   y_rank: tuple, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``_earlier_top`` for one block through its projected products ``mp``: the rows of
    which more than 4 k pairs pass them (a crowd's members) take the full product, the
    others only their passing pairs' (a block that mixes both, as a file holding a crowd
    among distinct records gives, took the full product for every row)."""
    passed = mp >= 0
    crowded = np.count_nonzero(passed, axis=1) > 4 * k
    count = np.zeros(len(mp), np.int64)
    qi, yj = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
    dense, sparse = np.flatnonzero(crowded), np.flatnonzero(~crowded)
    if len(dense):
        i, j, count[dense] = _earlier_top(qa[dense] @ ya.T, (q_rank[0][dense],
                                                             q_rank[1][dense]), y_rank, k)
        qi.append(dense[i])
        yj.append(j)
    if len(sparse):
        i, j = np.divmod(np.flatnonzero(passed[sparse]), mp.shape[1])
        i = sparse[i]
        score = _gathered(qa, ya, i, j)
        ok = score >= 0
        i, j, n = _earlier_pairs(i[ok], j[ok], score[ok], q_rank, y_rank, k, len(mp))
        qi.append(i)
        yj.append(j)
        count += n
    i, j = np.concatenate(qi), np.concatenate(yj)
    by = np.argsort(i, kind="stable")  # by query row, as one product gives them
    return i[by], j[by], count


def _gathered(qa: np.ndarray, ya: np.ndarray, i: np.ndarray, j: np.ndarray) -> np.ndarray:
    """The products qa[i[n]] . ya[j[n]] (8,192 pairs' rows gathered at a time)."""
    score = np.empty(len(i), qa.dtype)
    for a in range(0, len(i), 8192):
        b = slice(a, a + 8192)
        score[b] = np.einsum("ij,ij->i", qa[i[b]], ya[j[b]])
    return score


def _narrowed(mp: np.ndarray, qa: np.ndarray, ya: np.ndarray, most: int
              ) -> tuple[np.ndarray, ...] | None:
    """The pairs the projected products ``mp`` keep, with their full products (those
    passing the full sign test): (query, data, product); None when more than ``most``
    pass (a crowd block: one full product costs less than gathering them)."""
    flat = np.flatnonzero(mp.reshape(-1) >= 0)
    if len(flat) > most:
        return None
    i, j = np.divmod(flat, mp.shape[1])
    score = _gathered(qa, ya, i, j)
    ok = score >= 0
    return i[ok], j[ok], score[ok]


def _earlier_top(m: np.ndarray, q_rank: tuple, y_rank: tuple, k: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One block of ``earlier_candidates``: the products ``m`` (queries x data), the
    pairs with a non-negative product whose data row is earlier, the ``k`` largest
    products per query among them, and how many there were per query. Few products pass
    the sign test (one pass, 1-d), so the rank test and the selection look at those
    only; a block of a crowd, where many do, is ranked and partitioned whole."""
    passed = m.reshape(-1) >= 0
    if np.count_nonzero(passed) > 4 * k * len(m):  # a crowd: most of the block passes
        m[~_before((y_rank[0], y_rank[1]), (q_rank[0][:, None], q_rank[1][:, None]))] = -np.inf
        count = np.count_nonzero(m >= 0, axis=1)
        i, j = _top_columns(m, min(k, m.shape[1]))
        hit = m[i, j] >= 0
        return i[hit], j[hit], count
    flat = np.flatnonzero(passed)
    i, j = np.divmod(flat, m.shape[1])
    return _earlier_pairs(i, j, m.reshape(-1)[flat], q_rank, y_rank, k, len(m))


def _top_columns(m: np.ndarray, kk: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, column) of the ``kk`` largest entries of each row of ``m`` (ties: any), or
    of its largest non-negative ones, at most kk (the caller drops the others). A
    wide block first takes each row's kk-th largest over every SUBSET-th column: that is
    at most the row's own kk-th largest, so the entries at or above it hold the whole
    top, and about SUBSET x kk of them are ranked instead of the row (a crowd's recall
    block: 16M entries, argpartition over all of them took most of the brute force)."""
    rows, cols = m.shape
    if cols >= 4 * SUBSET * kk:
        sub = m[:, ::SUBSET]
        floor = np.partition(sub, sub.shape[1] - kk, axis=1)[:, sub.shape[1] - kk]
        i, j = np.nonzero(m >= np.maximum(floor, 0)[:, None])  # the caller keeps >= 0 only
        if len(i) <= 4 * SUBSET * kk * rows:  # else many ties at the floor: rank it all
            score = m[i, j]
            by = np.lexsort((-score, i))  # per row, the largest first
            i, j = i[by], j[by]
            keep = np.arange(len(i)) - np.searchsorted(i, i) < kk
            return i[keep], j[keep]
    top = np.argpartition(m, cols - kk, axis=1)[:, cols - kk:]
    return np.repeat(np.arange(rows), kk), top.reshape(-1)


def _earlier_pairs(i: np.ndarray, j: np.ndarray, score: np.ndarray, q_rank: tuple,
                   y_rank: tuple, k: int, nq: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Of the pairs (i, j) that passed the sign test (``score``: their products): those
    whose data row is earlier, the ``k`` largest per query, and the count per query."""
    earlier = _before((y_rank[0][j], y_rank[1][j]), (q_rank[0][i], q_rank[1][i]))
    i, j, score = i[earlier], j[earlier], score[earlier]
    by = np.lexsort((-score, i))  # per query, the largest products first
    i, j = i[by], j[by]
    first = np.searchsorted(i, i)  # where each query's run starts
    keep = np.arange(len(i)) - first < k
    return i[keep], j[keep], np.bincount(i, minlength=nq)


def _before(a: tuple, b: tuple) -> np.ndarray:
    """(prio, order) ``a`` comes before ``b`` in keep order (arrays that broadcast, numpy
    or torch)."""
    return (a[0] < b[0]) | ((a[0] == b[0]) & (a[1] < b[1]))
