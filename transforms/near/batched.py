"""Candidate pairs of many cells per launch on a torch device (a GPU): the near stage's
cells searched in a few large products instead of thousands of small ones.

Why: one cell's products are small (a block of 512 rows against a few thousand), so a
GPU searching cell by cell waits on launches and host copies, and on an H200 it was no
faster than 16 CPU cores (docs/gpu.md). Here the cells' rows go up once, are moved into
the search space and centred on their cell there, and cells of similar size are stacked
into one batched product of every row with every row of its cell, with the sign test of
``near.search.augmented`` (the same float32 augmented rows, TF32 off, so the proven
rounding bound holds). Each query row's threshold takes its cell's largest norm, at
least the largest of any block the cell-by-cell search would compare it with, so the
pairs are a superset of the pairs that search finds, and ``near.greedy.decide`` takes
them as its candidates (``known``): every candidate is verified in float64 as before,
so the decisions are the same.

A cell is left to the cell-by-cell search (None) when it has more than MAX_ROWS rows,
more than PAIRS_PER_ROW candidates per row (a crowd: its pairs grow as its size squared;
the greedy visit needs only a few per row), or values whose float32 rounding would swamp
the radius (the float64 search). The host copies only the pairs that pass.
"""

from __future__ import annotations

import sys

import numpy as np

from transforms.near.search import Vectors, augmented_limit, precision_for, to_device
from transforms.near.space import search_space
from transforms.near.spec import NearSpec
from transforms.near.verify import flat_rows

MAX_ROWS = 8192  # a cell's product: 64M scores (256 MB)
PAIRS_PER_ROW = 64  # more candidates per row: a crowd, searched block by block
LAUNCH_SCORES = 1 << 27  # scores per launch (512 MB of float32), halved on out-of-memory
LEAST_LAUNCH = 1 << 21  # below this, the GPU is too full: the CPU takes the cells
FAR = 1e30  # a padding data row's last column: no query passes against it

Known = tuple[np.ndarray, np.ndarray]  # (query row, data row) within one cell


def cell_candidates(x: np.ndarray, cells: list[np.ndarray], centers: np.ndarray,
                    spec: NearSpec, radius: float, dev) -> list[Known | None]:
    """For each cell (``cells[p]``: rows of ``x`` in keep order; ``centers[p]``: the
    search-space point its vectors are centred on), the candidate pairs among its rows
    as (query, data) positions in the cell, or None where the cell is searched block by
    block (see the module docstring). ``dev``: a torch device; ``x`` may be on it
    (``resident``)."""
    import torch

    out: list[Known | None] = [None] * len(cells)
    sizes = np.array([len(c) for c in cells], np.int64)
    todo = [p for p in np.argsort(sizes, kind="stable").tolist() if 1 < sizes[p] <= MAX_ROWS]
    for p in np.flatnonzero(sizes == 1).tolist():
        out[p] = (np.empty(0, np.int64), np.empty(0, np.int64))
    budget = LAUNCH_SCORES
    while todo:
        group = _group(todo, sizes, budget)
        try:
            for p, known in zip(group, _launch(x, [cells[p] for p in group], centers[group],
                                               spec, radius, dev), strict=True):
                out[p] = known
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            budget //= 4
            if budget < LEAST_LAUNCH:
                print("near: the GPU ran out of memory for the cells' products; these "
                      "cells go on block by block (the same answers)", file=sys.stderr,
                      flush=True)
                return out
            continue
        todo = todo[len(group):]
    return out


def _group(todo: list[int], sizes: np.ndarray, budget: int) -> list[int]:
    """The next cells (by size, smallest first) whose padded products fit ``budget``."""
    group: list[int] = []
    for p in todo:
        m = _padded(int(sizes[p]))
        if group and (len(group) + 1) * m * m > budget:
            break
        group.append(p)
    return group


def _padded(m: int) -> int:
    return -(-m // 32) * 32


def _launch(x: np.ndarray, cells: list[np.ndarray], centers: np.ndarray, spec: NearSpec,
            radius: float, dev) -> list[Known | None]:
    """One batched product over ``cells`` (ascending sizes)."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    b, m = len(cells), _padded(max(len(c) for c in cells))
    dim = int(np.prod(x.shape[1:], dtype=np.int64))
    sizes = torch.tensor([len(c) for c in cells], device=dev)
    valid = torch.arange(m, device=dev)[None, :] < sizes[:, None]
    rows = np.concatenate(cells)
    part = x[to_device(rows, dev)] if torch.is_tensor(x) else x[rows]
    values = _space(part.reshape(len(rows), dim), spec, dev)
    z = torch.zeros((b, m, dim), dtype=torch.float64, device=dev)
    z[valid] = values
    z -= to_device(np.asarray(centers, np.float64), dev)[:, None, :]
    z[~valid] = 0
    v, norm = _stored(z)
    top = norm.max(dim=1).values  # each cell's largest norm: every query's data maximum
    single = np.array([precision_for(t * (1 + 1e-6), dim, radius) == np.float32
                       for t in top.tolist()])
    limit = augmented_limit(norm, top[:, None], radius, dim, np.float32)
    qa = torch.zeros((b, m, dim + 2), dtype=torch.float32, device=dev)
    ya = torch.zeros((b, m, dim + 2), dtype=torch.float32, device=dev)
    qa[:, :, :dim], ya[:, :, :dim] = v, v
    qa[:, :, dim] = torch.where(valid, (limit - norm ** 2) / 2, -1.0).to(torch.float32)
    qa[:, :, dim + 1] = valid.to(torch.float32)
    ya[:, :, dim] = 1
    ya[:, :, dim + 1] = torch.where(valid, -(norm ** 2) / 2, -FAR).to(torch.float32)
    del v
    passed = torch.bmm(qa, ya.transpose(1, 2)) >= 0
    del qa, ya
    eye = torch.eye(m, dtype=torch.bool, device=dev)
    passed &= ~eye
    count = passed.sum(dim=(1, 2)).cpu().numpy()
    keep = single & (count <= PAIRS_PER_ROW * sizes.cpu().numpy())
    passed[to_device(~keep, dev)] = False
    found = torch.nonzero(passed).cpu().numpy()
    cuts = np.searchsorted(found[:, 0], np.arange(b + 1))
    return [(found[cuts[k]:cuts[k + 1], 1].astype(np.int64),
             found[cuts[k]:cuts[k + 1], 2].astype(np.int64)) if keep[k] else None
            for k in range(b)]


def device_vectors(x: np.ndarray, spec: NearSpec, center: np.ndarray | None, dev) -> Vectors:
    """``near.space.search_vectors(x, spec, _, center, np.float32)`` made on a torch
    device (the search space and the centring: several float64 passes over the rows,
    each one thread on the host), returned to the host: float32 vectors, float64 norms."""
    z = _space(flat_rows(x), spec, dev)
    if center is not None:
        z -= to_device(np.asarray(center, np.float64), dev)
    v, norm = _stored(z)
    return Vectors(v.cpu().numpy(), norm.cpu().numpy())


def _stored(z):
    """float64 search-space points ``z`` (a tensor, freed here) as the float32 vectors
    the products take, and the float64 norms of what is stored (``near.search.centred``
    on the host)."""
    import torch

    v = z.to(torch.float32)
    del z
    return v, torch.sqrt((v.to(torch.float64) ** 2).sum(dim=-1))


def resident(x: np.ndarray, spec: NearSpec, dev):
    """``x`` on the device once, for every launch to gather its cells' rows there (on the
    host that gather copies each row once per cell it joined), when torch holds its
    dtype, the metric's space is made on the device and it takes at most a quarter of
    the device's free memory; else ``x`` itself (each launch copies its rows up)."""
    import torch

    if spec.metric == "correlation" or x.dtype.kind not in "biuf":
        return x
    if dev.type == "cuda" and x.nbytes > torch.cuda.mem_get_info(dev)[0] // 4:
        return x
    return to_device(x, dev)


def _space(rows, spec: NearSpec, dev):
    """The rows' (an array, or a tensor on ``dev``) search-space points
    (``near.space.search_space``) in float64 on ``dev``: made there for the metrics whose
    space is the values or their unit vectors."""
    import torch

    if spec.metric == "correlation":
        return to_device(search_space(rows, spec), dev)
    if not torch.is_tensor(rows):
        if rows.dtype.kind not in "biuf":  # bfloat16 and other ml_dtypes: torch takes none
            rows = np.asarray(rows, np.float64)
        rows = to_device(rows, dev)
    t = rows.to(torch.float64, copy=True)  # a CPU tensor may share the caller's array
    if spec.metric == "cosine":
        norms = torch.sqrt((t * t).sum(dim=1))
        t /= torch.where(norms == 0, 1.0, norms)[:, None]
    return t
