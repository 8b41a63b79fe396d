"""The cells' outputs joined on their way to the merge (``near_gather``) decide and
report exactly what the merge decides from the cells one by one: removals, the record
each duplicates, distances, pair counts (exact and sampled), the histogram sample, the
borderline pairs and recall. The cells send their removals on themselves; the merge
gets the few it asks about. Real cells: the step functions the job runs (plan, assign,
decide, recall brute force), on data with a crowd large enough that a cell counts its
pairs on a sample, in both groupings."""

from __future__ import annotations

import dataclasses
import json
import pickle
import struct
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pipeline.steps import near_cells
from pipeline.steps.elements import NEAR_REPORT, VecBatch
from pipeline.steps.near import MIN_BUCKETS, GatherTruth, SampleForPlan, chunk_partners
from pipeline.steps.near_cells import SURE, assign_batch, decide_split
from pipeline.steps.near_gather import GatherCells, Spilled, loaded
from pipeline.steps.near_merge import (
    GatherKnown,
    asked_keys,
    known_removals,
    lines_by_file,
    merge_cells,
)
from tests import shapes
from transforms.near.spec import NearSpec

PER_SIDE = 20


def _batches(tmp_path, x: np.ndarray, rows: int) -> list[VecBatch]:
    """``x`` as the job's spilled chunks (digests: the row's bytes hashed)."""
    from transforms.exact import digest_words
    from transforms.fingerprint import fingerprint_batch

    words = digest_words(fingerprint_batch(x))
    out = []
    for a in range(0, len(x), rows):
        n = min(rows, len(x) - a)
        b = VecBatch(words[a:a + n], np.zeros(n), np.arange(a, a + n), np.zeros(n, np.int32),
                     np.arange(a, a + n), pa.array([f"r{i}" for i in range(a, a + n)]),
                     x[a:a + n])
        out.append(b.spill(str(tmp_path / "values")))
    return out


def _outputs(gen) -> tuple[list, object]:
    removed, report = [], None
    for out in gen:
        if getattr(out, "tag", None) == NEAR_REPORT:
            report = out.value
        else:
            removed.append(out)
    return removed, report


def _planned(tmp_path, grouping: str, mode: str) -> tuple[list[VecBatch], NearSpec, object]:
    """Chunks of clustered rows with near copies and two crowds, spilled, and their plan."""
    bg = shapes.background(6000, dim=32, seed=4)
    t = 0.05
    rng = np.random.default_rng(7)
    # in every cell, about t / 2 from their sources: some pairs straddle two cells (open)
    near = bg[:800] + rng.standard_normal((800, 32)) * (t / 2 / np.sqrt(32))
    x = np.concatenate([bg, near, shapes.crowd(bg[3], 2500, t, "l2", seed=5),
                        shapes.crowd(bg[9], 200, t, "l2", seed=6)])
    x = x[rng.permutation(len(x))].astype(np.float32)
    spec = NearSpec("l2", threshold=t, grouping=grouping, partition_rows=500, mode=mode,
                    single_index_rows=1000, recall_sample=300)
    batches = _batches(tmp_path, x, 2048)
    planner = SampleForPlan(spec, str(tmp_path / "plan.pickle"), str(tmp_path / "recall"))
    acc = planner.create_accumulator()
    for b in batches:
        acc = planner.add_input(acc, b)
    return batches, spec, planner.extract_output(planner.compact(acc))


def _decided(tmp_path, batches: list[VecBatch], spec: NearSpec, plan, name: str = "cells"
             ) -> tuple[list, int]:
    """AssignCells -> GroupByCell -> DecideCells as the job runs them: (outputs, slices)."""
    slices = defaultdict(list)
    for b in batches:
        for bucket, s in assign_batch(b, plan, spec, str(tmp_path / name)):
            slices[bucket].append(s)
    return [o for k in sorted(slices) for o in decide_split(
        (k, slices[k]), plan, spec, PER_SIDE, str(tmp_path / f"{name}-links"))], sum(
        len(v) for v in slices.values())


@pytest.mark.parametrize("mode", ["exact", "bounded"])
@pytest.mark.parametrize("grouping", ["representative", "components"])
def test_joined_cells_merge_as_the_cells_one_by_one(tmp_path, grouping, mode):
    batches, spec, plan = _planned(tmp_path, grouping, mode)
    gather = GatherTruth()
    truth = gather.create_accumulator()
    for b in batches:
        for t_part in chunk_partners(b, plan, spec):
            truth = gather.add_input(truth, t_part)
    outs, _ = _decided(tmp_path, batches, spec, plan)
    cells = [o for o in outs if getattr(o, "tag", None) != SURE]
    sure = [o.value[1] for o in outs if getattr(o, "tag", None) == SURE]
    assert len(cells) > 3 and sum(c.sampled_cells for c in cells) >= 1  # a sampled census
    assert all(len(c.gone) == len(c.dup) == len(c.dist) == 0 for c in cells)  # sent on
    if grouping == "representative":
        assert len(sure) > len(cells) // 2 and sum(c.sent for c in cells) == sum(
            len(s[0]) for s in sure)
    else:  # the merge removes by the links alone: no line per removal besides them
        assert not sure
    if mode == "exact" and grouping == "representative":
        assert sum(len(c.unsure) for c in cells) > 0  # records the merge settles

    fn = GatherCells(PER_SIDE, str(tmp_path / "cells"))  # three workers' bundles, each
    accs = []                                             # encoded as a runner does
    for part in np.array_split(np.arange(len(cells)), 3):
        a = fn.create_accumulator()
        for i in part:
            a = fn.add_input(a, cells[i])
        sent = pickle.dumps(fn.compact(a))
        assert len(sent) < 1000  # the joined bundle waits in a file: only its name travels
        accs.append(pickle.loads(sent))
    out = fn.extract_output(fn.merge_accumulators(accs))
    assert len(out) == 1 and isinstance(out[0], Spilled)
    joined = [loaded(out[0])]
    if grouping == "components":  # the linked records' values wait in files, not in the
        linked = sum(len(c.links[0]) for c in cells if c.links is not None)  # element
        assert linked > 2500 and sum(len(v) for v in joined[0].values) >= linked
        assert all(v.spilled and v.x.size == 0 for v in joined[0].values)

    # the merge learns of the cells' removals it asks about only: the records it settles
    # and those they depend on, and the recall's
    asked = asked_keys(out, truth)
    assert np.array_equal(asked, asked_keys(cells, truth))
    gk = GatherKnown()
    acc = gk.create_accumulator()
    for lines in sure:
        for k in known_removals((0, lines), asked):
            acc = gk.add_input(acc, k)
    known = gk.extract_output(acc)
    sent = [r for lines in sure for r in lines_by_file(lines)]
    if grouping == "representative":
        assert 0 < len(known[0]) < sum(len(s[0]) for s in sure)
    want_removed, want = _outputs(merge_cells(cells, plan, spec, PER_SIDE, truth, known))
    got_removed, got = _outputs(merge_cells(out, plan, spec, PER_SIDE, truth, known))
    assert want.stats["removed"] > 3000 and want.stats["pairs_estimated"]
    assert want.stats["removed"] == sum(len(r) for _, r in sent + want_removed)
    lines = sorted((f, p) for f, r in sent + want_removed for p in r.position.tolist())
    assert len(set(lines)) == len(lines)  # each removal once, from a cell or the merge
    assert got.stats == want.stats
    assert got.pairs.keys() == want.pairs.keys()
    assert all(np.array_equal(got.pairs[k], want.pairs[k]) for k in want.pairs)
    assert np.array_equal(got.nn, want.nn)
    assert got.borderline.equals(want.borderline)
    assert len(got_removed) == len(want_removed)
    for (gf, g), (wf, w) in zip(got_removed, want_removed, strict=True):
        assert gf == wf
        assert np.array_equal(g.position, w.position) and g.record_id.equals(w.record_id)
        assert g.duplicate_of.equals(w.duplicate_of)
        assert np.array_equal(g.distance, w.distance)


@pytest.mark.parametrize("grouping", ["representative", "components"])
def test_cells_decide_alike_whatever_travels_together(tmp_path, grouping, monkeypatch):
    """A chunk writes one slice per bucket of cells (``Plan.per_bucket``), not per cell:
    every cell decides what it decides alone, and the slices number chunks x buckets;
    alike too where a bucket's values are read all at once (the default) or by each
    cell for itself (a bucket above READ_AT_ONCE bytes)."""
    batches, spec, plan = _planned(tmp_path, grouping, "bounded")
    cells = len(plan.parts)
    assert cells >= 12 and plan.per_bucket == -(-cells // MIN_BUCKETS)  # small cells
    runs = {k: _decided(tmp_path, batches, spec, dataclasses.replace(plan, per_bucket=k),
                        f"cells-{k}") for k in (1, 5, cells)}
    monkeypatch.setattr(near_cells, "READ_AT_ONCE", 0)
    runs[-cells] = _decided(tmp_path, batches, spec, dataclasses.replace(
        plan, per_bucket=cells), "cells-each")
    alone, slices = runs[1]
    assert slices > 5 * len(batches)  # one per chunk and cell it has rows of
    for k, (outs, slices) in runs.items():
        k = abs(k)
        assert slices <= len(batches) * -(-cells // k)
        assert len(outs) == len(alone)
        for got, want in zip(outs, alone, strict=True):
            if getattr(want, "tag", None) == SURE:
                assert got.tag == SURE and got.value[0] == want.value[0]
                (gg, gd, gdist), (wg, wd, wdist) = got.value[1], want.value[1]
                assert np.array_equal(gg.words, wg.words) and np.array_equal(gd.words, wd.words)
                assert np.array_equal(gdist, wdist)
                continue
            assert (got.searched, got.arrived, got.members, got.compared, got.sent) == (
                want.searched, want.arrived, want.members, want.compared, want.sent)
            assert np.array_equal(got.unsure.words, want.unsure.words)
            assert np.array_equal(got.unsure.x, want.unsure.x)
            assert np.array_equal(got.role, want.role) and np.array_equal(got.nn, want.nn)
            assert got.borderline.equals(want.borderline)


@pytest.mark.parametrize("dtype", [np.float32, np.uint8])
def test_rows_spilled_in_blocks_read_back_as_taken(tmp_path, dtype):
    """``spill_rows`` writes a cell's linked values block by block (more than one block
    here: 64 MB of 3 KB rows) and reads back what ``take`` then ``spill`` would."""
    rng = np.random.default_rng(1)
    n, dim = 30_000, 768 if dtype == np.float32 else 3072
    x = (rng.standard_normal((n, dim)) * 50).astype(dtype)
    b = VecBatch(rng.integers(0, 2**63, (n, 2)).astype(np.uint64), np.zeros(n),
                 np.arange(n), np.zeros(n, np.int32), np.arange(n),
                 pa.array([f"r{i}" for i in range(n)]), x)
    rows = np.sort(rng.choice(n, 25_000, replace=False))[::-1]  # any order
    got = b.spill_rows(rows, str(tmp_path / "a"))
    want = b.take(rows).spill(str(tmp_path / "b"))
    assert got.x.shape == (len(rows), 0) and got.spilled[1] == dim
    assert np.array_equal(got.words, want.words) and got.ids.equals(want.ids)
    back = got.loaded().x
    assert back.dtype == dtype and np.array_equal(back, x[rows])
    assert np.array_equal(back, want.loaded().x)


class _Payload:
    """What an attacker with write access to the scratch folder would plant: unpickling
    it creates ``marker`` (any code could run there)."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def test_spill_files_are_never_unpickled(tmp_path):
    """The cells' joined outputs and the agreed plan wait in scratch files, which may be
    on shared storage (gs://): a file planted there with a pickle payload is refused,
    never run; so is one in the spill layout naming a class or dtype it must not."""
    from transforms.io.agreed import first_written

    marker = tmp_path / "ran"
    planted = tmp_path / "cells" / "planted.cells"
    planted.parent.mkdir()
    planted.write_bytes(pickle.dumps(_Payload(marker), protocol=5))
    with pytest.raises(ValueError, match="not a spill file"):
        loaded(Spilled(str(planted)))
    plan_at = tmp_path / "plan" / "plan.spill"
    plan_at.parent.mkdir()
    plan_at.write_bytes(pickle.dumps(_Payload(marker), protocol=5))
    with pytest.raises(ValueError, match="not a spill file"):
        first_written(str(plan_at), {"cells": 25})
    assert not marker.exists()

    from transforms.io.spill import MAGIC, SpillFormatError, decode

    def crafted(tree: dict, data: bytes = b"") -> bytes:  # the layout, by hand
        header = json.dumps({"tree": tree, "buffers": [[0, len(data)]]}).encode()
        return MAGIC + struct.pack("<Q", len(header)) + header + data

    for tree, words in (({"$": "dc", "kind": "Popen", "v": {}}, "not a kind this job"),
                        ({"$": "nd", "dtype": "|O", "shape": [1], "scalar": False, "b": 0},
                         "would hold Python objects"),
                        ({"$": "reduce", "v": "os.system"}, "unknown entry")):
        planted.write_bytes(crafted(tree, bytes(8)))
        with pytest.raises(SpillFormatError, match=words):
            loaded(Spilled(str(planted)))
    assert decode(crafted({"$": "nd", "dtype": "<i8", "shape": [1], "scalar": False,
                           "b": 0}, bytes(8)))[0] == 0  # the same layout, well formed
    assert not marker.exists()


def test_bfloat16_values_read_back_in_a_process_that_never_imported_ml_dtypes(tmp_path):
    """The job's start leaves ml_dtypes alone (its import was a third of it); a spill of
    bfloat16 values read in such a fresh process (a worker's) still names their dtype."""
    import subprocess
    import sys

    import ml_dtypes

    from transforms.io.spill import write

    x = np.random.default_rng(3).standard_normal((50, 8)).astype(ml_dtypes.bfloat16)
    write(str(tmp_path / "x.spill"), {"x": x})
    (tmp_path / "want").write_bytes(x.view(np.uint16).tobytes())
    code = ("import sys; import pipeline.run; import pipeline.graph; "
            "assert 'ml_dtypes' not in sys.modules, 'imported at the start'; "
            "from pathlib import Path; from transforms.io.spill import load; "
            f"x = load({str(tmp_path / 'x.spill')!r})['x']; "
            "assert x.dtype.name == 'bfloat16', x.dtype; "
            f"assert x.view('<u2').tobytes() == Path({str(tmp_path / 'want')!r}).read_bytes()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0, r.stderr[-2000:]


def test_spilled_values_come_back_as_written(tmp_path):
    """Every kind of value a spill holds, bit for bit: bfloat16 values, Arrow ids, a
    spilled batch's file reference, float scalars (NaN too), nested tuples and dicts."""
    import ml_dtypes

    from transforms.io.spill import decode, encode_bytes

    rng = np.random.default_rng(2)
    n = 500
    b = VecBatch(rng.integers(0, 2**63, (n, 2)).astype(np.uint64), rng.random(n),
                 np.arange(n), np.zeros(n, np.int32), np.arange(n),
                 pa.array([f"r{i}" for i in range(n)]),
                 rng.standard_normal((n, 24)).astype(ml_dtypes.bfloat16),
                 pa.array([None] * n, pa.string()))
    value = {"batch": b, "spilled": b.take(np.arange(7), values=False).spill_rows(
        np.arange(7), str(tmp_path)), "pair": (1.5, float("nan"), np.float64(2.25)),
        ("k", 3): [np.int64(7), None, True, 2**70],
        "table": pa.table({"a": [1, 2], "b": ["x", None]})}
    back = decode(bytearray(encode_bytes(value)))
    got = back["batch"]
    assert got.x.dtype == b.x.dtype and np.array_equal(got.x.view(np.uint16),
                                                       b.x.view(np.uint16))
    for f in ("words", "prio", "order", "file_index", "position"):
        assert np.array_equal(getattr(got, f), getattr(b, f))
        assert getattr(got, f).dtype == getattr(b, f).dtype
    assert got.ids.equals(b.ids) and got.run.equals(b.run)
    assert back["spilled"].spilled == value["spilled"].spilled
    one, nan, scalar = back["pair"]
    assert one == 1.5 and np.isnan(nan) and scalar == 2.25 and type(scalar) is np.float64
    assert back[("k", 3)] == [7, None, True, 2**70] and back["table"].equals(value["table"])
    got.x[0, 0] = 1  # read into a buffer of its own: writable, as unpickled arrays were
