"""Components grouping inside one cell: the components of the pairs a cell visited.

Why apart from the keep-order visit (``near.greedy``): components need no keep order,
only connectivity. Inside a crowd the visit counts the pairs among removed rows on a
sample, so some pairs were never looked at. The kept rows form a net (every removed
row is within tolerance of one), so a skipped pair lies within two radii of a net
point: ``join_skipped`` looks there, never at all pairs of two components.
"""

from __future__ import annotations

import numpy as np

BLOCK = 512  # net points whose candidates are looked for at once
COLUMNS = 8192  # removed members compared at once


def labels_of(n: int, edges: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    a = np.concatenate([e[0] for e in edges]) if edges else np.empty(0, np.int64)
    b = np.concatenate([e[1] for e in edges]) if edges else np.empty(0, np.int64)
    return component_labels(n, a, b)


def component_labels(n: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Connected components of n nodes with edges (a[k], b[k]) (label: the smallest node
    of each), by hooking roots onto smaller roots until nothing changes (a vectorised
    union-find)."""
    parent = np.arange(n)
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    while len(a):
        ra, rb = parent[a], parent[b]
        diff = ra != rb
        if not diff.any():
            break
        a, b, ra, rb = a[diff], b[diff], ra[diff], rb[diff]
        np.minimum.at(parent, np.maximum(ra, rb), np.minimum(ra, rb))
        while True:  # compress to roots
            up = parent[parent]
            if (up == parent).all():
                break
            parent = up
    return parent


def join_skipped(pairs, state: np.ndarray, dup: np.ndarray, missed: np.ndarray,
                 label: np.ndarray, removed: int) -> np.ndarray:
    """Components where a crowd's pairs were sampled: the pairs the visit skipped are
    those of a later row left out of the sample (``missed``) with an earlier removed
    row. A removed row g lies within tolerance of its net point ``dup[g]`` (a kept row),
    so a missed row within tolerance of g lies within two search radii of that net
    point: each net point's missed neighbours at 2 radii in another component are
    compared with its removed members, and joined at their first pair within
    tolerance. Work: the rows near each net point, not the pairs inside a crowd (all of
    one component after the first join); memory: one block of candidates at a time."""
    parent = label.copy()

    def root(r: np.ndarray) -> np.ndarray:
        while True:
            up = parent[r]
            if (up == r).all():
                return r
            r = up

    members = np.flatnonzero(state == removed)
    rows = np.flatnonzero(missed)
    if not len(members) or not len(rows):
        return parent
    net = np.where(dup[members] >= 0, dup[members], members)
    by_net = members[np.argsort(net, kind="stable")]
    nets, first = np.unique(np.sort(net), return_index=True)
    bounds = np.append(first, len(by_net))
    for s in range(0, len(nets), BLOCK):
        for e, u in pairs.candidates(nets[s:s + BLOCK], rows, 2.0):
            far = root(e) != root(u)
            e, u = e[far], u[far]
            for k in np.unique(e):
                at = np.searchsorted(nets, k)
                _join_first(pairs, root, parent, k, u[e == k],
                            by_net[bounds[at]:bounds[at + 1]])
    return root(np.arange(len(parent)))


def _join_first(pairs, root, parent: np.ndarray, net: int, cand: np.ndarray,
                mine: np.ndarray) -> None:
    """Join net point ``net``'s component with each of ``cand`` (missed rows) that lies
    within tolerance of one of ``mine`` (its removed members), the later row within the
    earlier; a candidate stops at its first hit, and the ones a join reaches drop out
    (BLOCK x COLUMNS pairs verified at most at once)."""
    for q in range(0, len(cand), BLOCK):
        left = cand[q:q + BLOCK]
        for c in range(0, len(mine), COLUMNS):
            left = left[root(left) != root(np.array([net]))[0]]
            if not len(left):
                break
            a, b, _, ab, ba = pairs.between(left, mine[c:c + COLUMNS])
            hit = np.unique(a[np.where(a > b, ab, ba)])
            if len(hit):
                top = np.unique(root(np.append(hit, net)))
                parent[top] = top.min()
