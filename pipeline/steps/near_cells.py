"""Near, per cell: a chunk's rows -> the cells they join (spilled) -> each cell decided.

``assign_batch`` writes one spill file per chunk, a record batch per cell naming its
rows in the chunk's value file (or, on an object store, holding their values), so the
shuffle moves references and no runner holds every cell's vectors at once. ``decide_one``
reads one cell, collapses exact copies, and decides its home records in keep order
(``transforms.near.greedy``): what travels on to the merge is one line per removed
record, the few records whose fate depends on another cell (with their values), the
count of pairs within tolerance on a fixed grid, and samples for the report; never
the pairs themselves, which a crowd of copies has by the million.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import apache_beam as beam
import numpy as np
import pyarrow as pa

from pipeline import progress
from pipeline.steps.borderline import borderline_sample
from pipeline.steps.elements import VecBatch, arrow_values
from pipeline.steps.near_grid import pair_histogram
from transforms.canonical import dtype_named
from transforms.exact import is_protected, tier_of
from transforms.io import fs, spill
from transforms.io.streams import read_stream_bytes, read_streams, stream_bytes, write_streams
from transforms.near.find import assign_rows, decide_cell
from transforms.near.greedy import STATE_KEPT, STATE_OPEN, STATE_REMOVED
from transforms.near.nearest import nearest_distances
from transforms.near.space import search_vectors
from transforms.near.spec import NearSpec
from transforms.store.segment import keys_of

NN_PER_CELL = 256  # rows of a cell that get a nearest-neighbour distance, at most
SURE = "sure"  # DecideCells' output of the removals its cells settled
CELLS_PER_SHARD = 16  # cells whose removals become lines per file together
READ_AT_ONCE = 256 << 20  # a bucket's values up to this: read once, chunk by chunk


@dataclass
class CellSlice:
    """AssignCells -> DecideCells: one chunk's rows of one cell, spilled to a file: an
    Arrow IPC stream of one record batch at bytes [offset, offset + size) of ``path``
    (``transforms.io.streams``), or carried: ``data``, the stream itself, through the
    runner's shuffle (``carry``)."""

    path: str
    offset: int
    size: int
    rows: int
    data: bytes | None = None


def assign_batch(batch: VecBatch, plan, spec: NearSpec, spill: str,
                 loaded: VecBatch | None = None, carry: bool = False
                 ) -> Iterator[tuple[int, CellSlice]]:
    """A chunk's rows -> the cells they join, written as one spill file (a one-batch IPC
    stream per cell, ``CellSlice``; flags: ``home`` there, and ``capped``: had more
    cells to meet than the bounded mode lets it). Where the chunk's values already lie
    in a local file, the cells name their rows in it (``row``) instead of copying them:
    a row joins two or three cells, and copying them wrote and read 3.5 GB more for 1M
    x 384. ``carry``: each cell's rows travel in the element itself, through the
    runner's shuffle, and nothing is written (Dataflow: a cell would otherwise read a
    slice of every chunk's file, 40,000 ranged requests per cell at a billion records).
    ``loaded``: the batch's values, where the caller has read them already."""
    progress.tick("near assign", 0, 0, "chunks", units=0, total_records=plan.n)
    local = batch.spilled and fs.is_local(batch.spilled[0]) and not carry
    values = batch.spilled if local else None
    batch = batch.loaded() if loaded is None else loaded
    said = [0]

    def rows_done(_: str, done: int, total: int) -> None:
        progress.tick("near assign", 0, done - said[0], "chunks", units=0,
                      total_records=plan.n)
        said[0] = done

    a = assign_rows(batch.x, spec, plan.radius, plan.parts, progress=rows_done)
    rows_done("assign", len(batch), len(batch))  # one cell: assign() had nothing to do
    order = np.argsort(a.cells, kind="stable")
    rows, cells = a.rows[order], a.cells[order]
    home = a.home[rows] == cells
    flags = {"home": home, "capped": home & a.capped[rows], "cell": cells.astype(np.int32)}
    if values is None:
        rb = batch.take(rows).to_arrow(**flags)
    else:
        rb = batch.take(rows, values=False).to_arrow(**flags, row=rows)
        rb = rb.replace_schema_metadata({**rb.schema.metadata, b"values": values[0],
                                         b"values_dim": str(values[1])})
    bucket = cells // plan.per_bucket
    runs = _runs(bucket)
    if carry:
        for (lo, hi), data in zip(runs, stream_bytes(rb, runs), strict=True):
            yield int(bucket[lo]), CellSlice("", 0, len(data), hi - lo, data)
    else:
        path = fs.join(spill, f"{uuid.uuid4().hex}.arrows")
        for (lo, hi), (at, size) in zip(runs, write_streams(path, rb, runs), strict=True):
            yield int(bucket[lo]), CellSlice(path, at, size, hi - lo)
    progress.tick("near assign", 0, 0, "chunks")


def _runs(keys: np.ndarray) -> list[tuple[int, int]]:
    """[lo, hi) of each run of equal values in ``keys`` (sorted)."""
    if not len(keys):
        return []
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    return list(zip(starts.tolist(), np.r_[starts[1:], len(keys)].tolist(), strict=True))


def cell_batches(slices: Iterable[CellSlice]) -> Iterator[tuple[int, list[pa.RecordBatch]]]:
    """A bucket's slices (one per chunk) -> each of its cells and the record batches
    holding its rows, cells in order (a slice's rows are sorted by cell). Slices that
    name rows in their chunk's value file read them there first, all the bucket's at
    once, where they come to READ_AT_ONCE bytes or less (else each cell reads its own:
    a crowd's cell)."""
    slices = list(slices)
    batches = [rb for _, rb in read_streams([s for s in slices if s.data is None])]
    batches += [read_stream_bytes(s.data) for s in slices if s.data is not None]
    if sum(_named_bytes(rb) for rb in batches) <= READ_AT_ONCE:
        batches = [_with_values(rb) for rb in batches]
    per_cell: dict[int, list[pa.RecordBatch]] = {}
    for rb in batches:
        cell = rb.column("cell").to_numpy()
        for lo, hi in _runs(cell):
            per_cell.setdefault(int(cell[lo]), []).append(rb.slice(lo, hi - lo))
    yield from sorted(per_cell.items())


def _named_bytes(rb: pa.RecordBatch) -> int:
    """The bytes of the values a batch names in its chunk's value file (0: it holds them)."""
    meta = rb.schema.metadata
    if b"values" not in meta:
        return 0
    return len(rb) * int(meta[b"values_dim"]) * dtype_named(meta[b"dtype"].decode()).itemsize


def _with_values(rb: pa.RecordBatch) -> pa.RecordBatch:
    """A batch naming its rows in its chunk's value file as one holding their values:
    those rows read in one pass (``fs.read_rows_into``: a memory map where many), where
    each cell of a bucket read its few rows of each chunk one positioned read at a time
    (18M reads of 2-5 us at 8M records, two fifths of the search)."""
    meta = rb.schema.metadata
    if b"values" not in meta:
        return rb
    dtype, dim = dtype_named(meta[b"dtype"].decode()), int(meta[b"values_dim"])
    x = np.empty((len(rb), dim), dtype)
    fs.read_rows_into(meta[b"values"].decode(), rb.column("row").to_numpy(), x,
                      np.arange(len(rb)))
    col = pa.FixedSizeBinaryArray.from_buffers(pa.binary(dim * dtype.itemsize), len(rb),
                                               [None, pa.py_buffer(x.reshape(-1).view(np.uint8))])
    rb = rb.set_column(rb.schema.get_field_index("x"), "x", col).drop_columns(["row"])
    kept = {k: v for k, v in meta.items() if k not in (b"values", b"values_dim")}
    return rb.replace_schema_metadata({**kept, b"dim": str(dim).encode()})


def read_cell(batches: list[pa.RecordBatch]) -> tuple[VecBatch, np.ndarray, int, int]:
    """A cell's spilled rows, exact copies collapsed (``collapse``), in keep order (ties by
    digest and place: one order whatever the files' names and the shuffle's order, so
    reports are reproducible): (rows, home flags, home rows that arrived, capped flags).
    Batches of one schema become one Arrow batch before any NumPy (converting each slice
    took longer than reading its rows), without their values: those are copied once,
    into the result (16k-value records make a cell big), from each batch or from the
    chunk's value file it names (joining them first copied a bucket's values once more:
    9 GB at 8M records)."""
    kinds: list[list[pa.RecordBatch]] = []  # file-backed or carrying values; stored runs
    for rb in batches:
        same = next((k for k in kinds if k[0].schema.equals(rb.schema)), None)
        if same is None:
            kinds.append([rb])
        else:
            same.append(rb)
    parts, pieces, at = [], [], 0  # pieces: (first row, values file or None, batch)
    for k in kinds:
        keys = [rb.drop_columns(["x"]) for rb in k]
        whole = pa.Table.from_batches(keys).combine_chunks().to_batches()
        parts.append(VecBatch.from_arrow(whole[0] if whole else keys[0].slice(0, 0)))
        for rb in k:
            pieces.append((at, rb.schema.metadata.get(b"values"), rb))
            at += len(rb)
    meta = parts[0][0] if len(parts) == 1 else VecBatch.concat(
        [b.take(np.arange(len(b)), values=False) for b, _ in parts])
    home = np.concatenate([f["home"] for _, f in parts])
    capped = np.concatenate([f["capped"] for _, f in parts])
    rows = np.lexsort((meta.position, meta.file_index, meta.words[:, 1], meta.words[:, 0],
                       meta.order, meta.prio))
    rows = rows[collapse(meta.take(rows, values=False))]
    out = meta.take(rows, values=False)
    first = batches[0].schema.metadata
    out.x = np.empty((len(rows), int(first.get(b"values_dim", first[b"dim"]))),
                     parts[0][0].x.dtype)
    by_piece = np.argsort(rows, kind="stable")  # a piece's rows are contiguous in ``meta``
    cuts = np.searchsorted(rows[by_piece], [p[0] for p in pieces] + [len(meta)])
    for k, (start, values, rb) in enumerate(pieces):
        mine = by_piece[cuts[k]:cuts[k + 1]]
        local = rows[mine] - start
        if values is None:
            out.x[mine] = arrow_values(rb)[local]
        else:  # the rows it names in its chunk's value file
            fs.read_rows_into(values.decode(), rb.column("row").to_numpy()[local], out.x,
                              mine)
    return out, home[rows], int(home.sum()), capped[rows]


def collapse(batch: VecBatch) -> np.ndarray:
    """Rows that stand for their digest: the best in keep order (= exact dedup's
    survivor; the rows are in keep order, so the first of each digest), in order."""
    _, first = np.unique(keys_of(batch.words), return_index=True)
    return np.sort(first)


@dataclass
class CellOut:
    """DecideCells -> Merge: what one cell settled.

    ``gone``/``dup``/``dist``: removed home records (no values), the kept record each
    duplicates, the distance. ``unsure``: records the merge settles, with values: home
    records left open (``role`` STATE_OPEN) or removed with a nearer open neighbour possible
    (``role`` STATE_REMOVED; ``best``/``best_dist``: the cell's kept candidate), and records
    of other cells they depend on (``role`` STATE_KEPT: their fate comes from their own
    cell). Components: ``links`` (member, its component's first row in this cell) and
    the linked home records' ``values``, spilled to files: a crowd's values would
    otherwise cross the runner's data plane to the merge (138 MB of 90k linked records
    took 5-7 s and 1.4 GB more at peak on the local runner)."""

    gone: VecBatch
    dup: VecBatch
    dist: np.ndarray
    unsure: VecBatch
    role: np.ndarray
    best: VecBatch
    best_dist: np.ndarray
    links: tuple[VecBatch, VecBatch] | None
    values: list[VecBatch]  # spilled: words in memory, values in a file each
    pairs: dict  # the census on the fixed grid (pair_histogram), exact part
    pairs_sampled: dict | None  # the sampled part (each pair counts ``weight``)
    weight: float
    nn: np.ndarray
    borderline: pa.Table
    searched: int
    arrived: int
    capped: int  # home records (not protected) that met fewer cells than exact mode would
    members: int
    sampled_cells: int  # cells whose pairs were partly sampled (0 or 1; more once joined)
    nn_sampled_cells: int  # cells whose nearest-neighbour rows were sampled (likewise)
    compared: int  # (home record, record of the cell) pairs the search compared
    protected: int = 0  # home records of a reference set or store (never sampled)
    sent: int = 0  # removals sent on by the cell itself (``decide_split``; ``gone`` empty)


spill.register(CellOut)  # a cell's output waits in a scratch file (near_gather)


def decide_one(cell: int, batches: list[pa.RecordBatch], plan, spec: NearSpec,
               per_side: int, links_folder: str) -> CellOut:
    """One cell on one worker: read its rows, collapse exact copies, decide in keep
    order, sample nearest-neighbour distances and borderline pairs. Components: the
    linked records' values go to a file in ``links_folder`` for the merge (in bounded
    mode those of rows of other cells too: a capped row may be linked only here)."""
    progress.tick("near search", len(plan.parts), 0, "cells", units=0)  # starts its clock
    batch, home, arrived, capped = read_cell(batches)
    kept = is_protected(batch.prio)
    z = search_vectors(batch.x, spec, plan.radius,
                            plan.parts.mean + plan.parts.centroids[cell])
    d = decide_cell(batch.x, home, spec, plan.radius, None, z=z,
                         exact=plan.parts.mode == "exact", kept=kept,
                         keys=batch.words, projection=plan.parts.projection,
                         tier=tier_of(batch.prio, batch.order))
    nn_rows, nn_all = _nn_rows(batch, home, plan.nn_mod)
    nb, nn, nn_within = nearest_distances(batch.x, z, nn_rows, spec, plan.radius)
    del z  # a crowd's cell: as big as its values, or twice
    later, earlier, bdist, within = d.border
    has = nb >= 0
    border = _borderline(batch, np.concatenate([later, nn_rows[has]]),
                         np.concatenate([earlier, nb[has]]),
                         np.concatenate([np.asarray(bdist, np.float64), nn[has]]),
                         np.concatenate([np.asarray(within, bool), nn_within[has]]), per_side)
    mine = home & (d.state == STATE_REMOVED)
    # components: the merge removes by the links alone (a line per removal is not sent)
    sure = np.flatnonzero(mine & ~d.doubt & (d.label is None))
    unsure = np.flatnonzero((home & ((d.state == STATE_OPEN) | d.doubt)) | d.open_refs)
    role = np.where(home[unsure], np.where(d.state[unsure] == STATE_OPEN, STATE_OPEN,
                                           STATE_REMOVED), STATE_KEPT)
    best = np.where(role == STATE_REMOVED, d.dup[unsure], unsure)
    links, values = None, []
    if d.label is not None:
        linked = np.flatnonzero(d.label != np.arange(len(batch)))
        links = (batch.take(linked, values=False), batch.take(d.label[linked], values=False))
        paired = np.unique(np.concatenate([linked, d.label[linked]]))
        if plan.parts.mode == "exact":  # each pair meets in both rows' home cells: a
            paired = paired[home[paired]]  # linked row's values come from its own cell
        if len(paired):
            values = [batch.spill_rows(paired, links_folder)]
    exact_d, sampled_d = d.census.distances()
    progress.tick("near search", len(plan.parts), arrived, "cells")
    return CellOut(batch.take(sure, values=False), batch.take(d.dup[sure], values=False),
                   d.dist[sure], batch.take(unsure), role, batch.take(best, values=False),
                   np.where(role == STATE_REMOVED, d.dist[unsure], np.inf), links, values,
                   pair_histogram(exact_d, spec.marker),
                   pair_histogram(sampled_d, spec.marker) if d.census.estimated else None,
                   d.census.weight, np.resize(nn, nn_all), border, int(home.sum()), arrived,
                   int((capped & ~kept).sum()), len(batch), int(d.census.estimated),
                   int(nn_all > len(nn)), int(home.sum()) * len(batch),
                   int((home & kept).sum()))


def decide_split(kv: tuple[int, Iterable[CellSlice]], plan, spec: NearSpec, per_side: int,
                 links_folder: str) -> Iterator:
    """``decide_one``, its sure removals sent on by themselves (``SURE``: (shard of
    cells, (removed, the kept record each duplicates, distance))), which become lines
    per file a shard of CELLS_PER_SHARD cells at a time (per cell, a job of 1,174 cells
    and 8 files made 9k small elements: 1.5 s more at 1M), and the rest to the
    one-worker merge, which then holds the few removals it asks about
    (``near_merge.known_removals``), not one line per removal (at 1B records, a fifth
    removed: 200M lines on one worker). ``kv``: a bucket of cells (``Plan.per_bucket``),
    decided one by one."""
    none = np.empty(0, np.int64)
    for cell, batches in cell_batches(kv[1]):
        out = decide_one(cell, batches, plan, spec, per_side, links_folder)
        if len(out.gone):
            yield beam.pvalue.TaggedOutput(SURE, (cell // CELLS_PER_SHARD,
                                                  (out.gone, out.dup, out.dist)))
        yield dataclasses.replace(out, gone=out.gone.take(none, values=False),
                                  dup=out.dup.take(none, values=False), dist=out.dist[:0],
                                  sent=len(out.gone))


def _nn_rows(batch: VecBatch, home: np.ndarray, every: int) -> tuple[np.ndarray, int]:
    """The home rows that get a nearest-neighbour distance (1 in ``every``, by digest),
    at most NN_PER_CELL of them (the first by digest), and how many there were. Each
    costs a product with every row of the cell: a crowd's cell of m rows has m / every
    of them, m^2 / every products; there the distances of the NN_PER_CELL stand for
    all (repeated), all of them tiny alike."""
    rows = np.flatnonzero(home & (batch.words[:, 1] % np.uint64(every) == 0))
    if len(rows) <= NN_PER_CELL:
        return rows, len(rows)
    return np.sort(rows[np.argsort(batch.words[rows, 0], kind="stable")[:NN_PER_CELL]]), len(rows)


def _borderline(batch: VecBatch, later: np.ndarray, earlier: np.ndarray, dist: np.ndarray,
                within: np.ndarray, per_side: int) -> pa.Table:
    """Pairs named (later, earlier) in keep order (rows are in keep order), so each pair
    has one spelling, met once (the search's and the nearest-neighbour sample's pairs
    merged here); each end with its file and position (-1 for a stored record).
    Only the pairs that can make either side's ``per_side`` (ties included) become a
    table: a cell counts up to 65,536 pairs, and grouping them all by record id took
    longer than deciding the cell."""
    a, b = np.maximum(later, earlier), np.minimum(later, earlier)
    o = np.argsort(a.astype(np.int64) * max(1, len(batch)) + b, kind="stable")
    a, b, dist, within = a[o], b[o], np.asarray(dist, np.float64)[o], np.asarray(within)[o]
    first = np.flatnonzero(np.r_[True, (a[1:] != a[:-1]) | (b[1:] != b[:-1])])
    if len(first) < len(a):  # a pair met twice counts once: its least distance, within if any
        dist = np.minimum.reduceat(dist, first)
        within = np.maximum.reduceat(within.astype(np.int8), first).astype(bool)
        a, b = a[first], b[first]
    keep = np.sort(np.concatenate([  # within: the farthest; outside: the nearest
        _nearest_edge(np.flatnonzero(within), -dist, per_side),
        _nearest_edge(np.flatnonzero(~within), dist, per_side)]))
    a, b = a[keep], b[keep]

    def at(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        f = batch.file_index[rows]
        return f, np.where(f < 0, -1, batch.position[rows])

    return borderline_sample(batch.ids.take(pa.array(a)), batch.ids.take(pa.array(b)),
                             dist[keep], within[keep], per_side, at(a), at(b), distinct=True)


def _nearest_edge(rows: np.ndarray, score: np.ndarray, k: int) -> np.ndarray:
    """``rows`` whose ``score`` is among the ``k`` smallest, ties with the k-th kept."""
    if len(rows) <= k:
        return rows
    if k <= 0:
        return rows[:0]
    s = score[rows]
    return rows[s <= np.partition(s, k - 1)[k - 1]]
