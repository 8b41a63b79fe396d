"""Components grouping inside one cell: the components of the pairs a cell visited.

Why apart from the keep-order visit (``near_greedy``): components need no keep order,
only connectivity. Inside a crowd the visit counts the pairs among removed rows on a
sample, so some pairs were never looked at; the kept rows form a net (every row is
within tolerance of one), and two nets' members can be within tolerance only when
their net points are within three radii, so those are compared member by member.
"""

from __future__ import annotations

import numpy as np

BLOCK = 512  # member rows compared at once


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


def join_nets(pairs, kept: np.ndarray, label: np.ndarray, radius: float) -> np.ndarray:
    """Components where pairs with removed rows were only sampled: every row is within
    tolerance of a kept row (its net point); two net points' members can be within
    tolerance only when the net points are within three radii, so those nets not yet
    joined are compared member by member, stopping at the first pair."""
    net = np.flatnonzero(kept)
    member_of = label.copy()
    z = pairs.z
    c = z.v[net].astype(np.float64)
    far = 3 * radius * (1 + 1e-6) + 4 * pairs.z.u * (2 * float(z.norm.max(initial=0)))
    sq = np.einsum("ij,ij->i", c, c)
    close = sq[:, None] + sq[None, :] - 2 * c @ c.T <= far * far
    for i, j in zip(*np.nonzero(np.triu(close, 1)), strict=True):
        ra, rb = member_of[net[i]], member_of[net[j]]
        if ra == rb:
            continue
        ma, mb = np.flatnonzero(member_of == ra), np.flatnonzero(member_of == rb)
        found = False
        for s in range(0, len(ma), BLOCK):
            a, b, _, ab, ba = pairs.between(ma[s:s + BLOCK], mb)
            if np.where(a > b, ab, ba).any():  # the later row within the earlier
                found = True
                break
        if found:
            lo, hi = min(ra, rb), max(ra, rb)
            member_of[member_of == hi] = lo
    return member_of
