"""End-to-end: the job with the near stage, against exact + all-pairs float64 oracles."""

from __future__ import annotations

import base64
import json
import re

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.embeddings import embeddings, planted_copies
from tests.jobkit import EXT, read_output, report, run_job, write_input
from tests.oracle import expected_removals, near_oracle, near_pairs
from tests.test_near import int_rows, int_truth
from tests.test_near import planted as planted_vectors
from transforms.near.spec import NearSpec
from transforms.near.verify import exact_distance

DIM = 16


def dataset(seed: int, metric: str, files: int = 3, nan_rows: int = 4):
    """Near copies, decoys and chains (from the kernel tests) plus exact copies of some of
    them (exact dedup must take those first) and NaN rows, split over ``files`` files."""
    x, spec = planted_vectors(seed, metric, n_base=240, d=DIM)
    rng = np.random.default_rng(seed)
    copies = x[rng.choice(len(x), 40)]
    x = np.concatenate([x, copies, np.full((nan_rows, DIM), np.nan, np.float32)])
    x = x[rng.permutation(len(x))]
    cuts = np.array_split(np.arange(len(x)), files)
    return [([f"f{f}-{i}" for i in range(len(c))], x[c]) for f, c in enumerate(cuts)], spec


def near_config(spec: NearSpec, **extra) -> dict:
    cfg = {"metric": spec.metric, "grouping": spec.grouping, **extra}
    if spec.metric == "allclose":
        cfg.update(atol=spec.atol, rtol=spec.rtol)
    else:
        cfg["threshold"] = spec.threshold
    return cfg


def expected(parts, spec: NearSpec, keep: str = "first") -> tuple[dict, dict]:
    """({removed id: kept id} for exact, the same for near): exact dedup first, then the
    all-pairs near oracle over the finite survivors in keep order."""
    recs = [(i, t, 0.0) for ids, ts in parts for i, t in zip(ids, ts, strict=True)]
    exact = expected_removals(recs, keep)
    survivors = [(i, t) for i, t, _ in recs if i not in exact and np.isfinite(t).all()]
    if keep == "last":
        survivors = survivors[::-1]
    x = np.array([t for _, t in survivors])
    near = near_oracle(x, spec)
    return exact, {survivors[r][0]: survivors[k][0] for r, k in near.items()}


def run(tmp_path, fmt, parts, spec, *sets, **overrides):
    for f, (ids, t) in enumerate(parts):
        write_input(fmt, tmp_path / "in" / f"part-{f}.{EXT[fmt]}", ids, t,
                    np.arange(len(ids)) % 7)
    inp = overrides.pop("input", {})
    near = near_config(spec, **overrides.pop("near", {}))
    return run_job(tmp_path, fmt, str(tmp_path / "in" / f"*.{EXT[fmt]}"), *sets, input=inp,
                   near=near, **overrides)


def test_tfrecord_number_lists_need_no_input_shape(tmp_path):
    """A float_list feature of one size (how TensorFlow users store embeddings) is read
    without input.shape or input.dtype, as a Parquet list column of one size is: the size
    of the file's first records is the input's (it was refused: "set input.shape")."""
    parts, spec = dataset(2, "cosine")
    assert run(tmp_path, "tfrecord", parts, spec) == 0
    want_exact, want_near = expected(parts, spec)
    dups, invalid = report(tmp_path)
    assert len(want_near) > 20
    assert by_kind(dups, "exact") == want_exact and by_kind(dups, "near") == want_near
    assert invalid.num_rows == 0


def by_kind(dups, kind: str) -> dict:
    rows = [r for r in dups.to_pylist() if r["kind"] == kind]
    return {r["record_id"]: r["duplicate_of"] for r in rows}


def values(parts) -> dict:
    return {i: t for ids, ts in parts for i, t in zip(ids, ts, strict=True)}


@pytest.mark.parametrize("fmt,metric,grouping", [
    ("parquet", "l2", "representative"),
    ("parquet", "cosine", "components"),
    ("parquet", "allclose", "representative"),
    ("tfrecord", "l2", "components"),
    ("hdf5", "cosine", "representative"),
])
def test_job_near_matches_oracle(tmp_path, fmt, metric, grouping):
    parts, spec = dataset(1, metric)
    spec = NearSpec(**{**spec.__dict__, "grouping": grouping})
    assert run(tmp_path, fmt, parts, spec) == 0
    want_exact, want_near = expected(parts, spec)
    assert len(want_exact) >= 30 and 20 < len(want_near) < 120
    dups, invalid = report(tmp_path)
    assert by_kind(dups, "exact") == want_exact
    assert by_kind(dups, "near") == want_near
    assert invalid.num_rows == 0  # nonfinite: keep (the default)

    v = values(parts)
    near_rows = [r for r in dups.to_pylist() if r["kind"] == "near"]
    a = np.array([v[r["record_id"]] for r in near_rows])
    b = np.array([v[r["duplicate_of"]] for r in near_rows])
    d, within = exact_distance(a, b, spec)
    np.testing.assert_allclose([r["distance"] for r in near_rows], d, rtol=1e-12)
    if grouping == "representative":
        assert within.all()  # no chaining

    kept = set()
    for f in range(len(parts)):
        ids, _, _ = read_output(fmt, tmp_path / "out" / "clean" / f"part-{f}.{EXT[fmt]}",
                                (DIM,))
        assert ids == [i for i in parts[f][0] if i not in want_exact and i not in want_near]
        kept |= set(ids)
    nan_ids = {i for i, t in v.items() if not np.isfinite(t).all()}
    nan_kept = nan_ids - set(want_exact)  # all-NaN copies: exact dedup keeps one
    assert len(nan_kept) == 1 and nan_kept <= kept  # and near never compares it
    summary = json.loads((tmp_path / "out" / "report" / "summary.json").read_text())
    assert summary["removed_near"] == len(want_near)
    assert summary["read"] == summary["kept"] + summary["removed_exact"] + summary["removed_near"]
    assert summary["near"]["settings"]["metric"] == metric
    assert summary["near"]["removed"] == len(want_near)


@pytest.mark.parametrize("levels", [1, 2])
@pytest.mark.parametrize("grouping", ["representative", "components"])
def test_partitioned_search_equals_the_oracle(tmp_path, grouping, levels):
    """Many small k-means partitions searched separately, in one level or two (coarse
    cells cut into fine ones, forced by ``near.levels``): the same removals as all pairs."""
    parts, spec = dataset(2, "l2")
    spec = NearSpec(**{**spec.__dict__, "grouping": grouping})
    assert run(tmp_path, "parquet", parts, spec, "tuning.chunk_rows=50",
               near={"single_index_rows": 50, "partition_rows": 40, "mode": "exact",
                     "levels": levels}) == 0
    summary = json.loads((tmp_path / "out" / "report" / "summary.json").read_text())
    assert summary["near"]["partitions"] >= 8 and summary["near"]["mode"] == "exact"
    assert summary["near"]["levels"] == levels
    assert (summary["near"]["coarse_cells"] or 0) >= (3 if levels == 2 else 0)
    assert summary["near"]["recall"]["recall"] == 1.0
    dups, _ = report(tmp_path)
    want_exact, want_near = expected(parts, spec)
    assert by_kind(dups, "exact") == want_exact and by_kind(dups, "near") == want_near


@pytest.mark.parametrize("cells", [1, 8])
def test_a_record_beyond_float32_leaves_the_others_searched(tmp_path, cells):
    """float64 records, one holding 1e39 (beyond float32): the planning sample is kept
    in float32, where it became inf, so the mean and every centred distance were NaN
    and the job removed no near copy at all (exit 0). The plan now leaves it out."""
    parts, spec = dataset(5, "l2", nan_rows=0)
    parts = [(ids, t.astype(np.float64)) for ids, t in parts]
    big = parts[0][1][:1].copy()
    big[0, 0] = 1e39
    parts[0] = (parts[0][0] + ["huge"], np.concatenate([parts[0][1], big]))
    more = {"single_index_rows": 50, "partition_rows": 40, "mode": "exact"} if cells > 1 \
        else {}
    assert run(tmp_path, "parquet", parts, spec, "tuning.chunk_rows=50", near=more) == 0
    summary = json.loads((tmp_path / "out" / "report" / "summary.json").read_text())
    assert (summary["near"]["partitions"] >= cells) and summary["near"]["mode"] == "exact"
    dups, _ = report(tmp_path)
    want_exact, want_near = expected(parts, spec)
    assert len(want_near) > 20
    assert by_kind(dups, "exact") == want_exact and by_kind(dups, "near") == want_near


@pytest.mark.parametrize("grouping", ["representative", "components"])
def test_cosine_with_blank_records_at_a_wide_tolerance(tmp_path, grouping):
    """Zero vectors (blank records) have no direction: under cosine they are within
    nothing. At cosine 0.5 the search radius is 1, their distance from every unit
    vector, so the search met them and verified NaN, and the borderline sample failed
    the job ("distance holds NaN"). Found by scripts/fuzz_near.py."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((300, 3)).astype(np.float32)
    x[rng.choice(300, 12, replace=False)] = 0
    parts = [([f"f{f}-{i}" for i in range(150)], x[150 * f:150 * (f + 1)]) for f in range(2)]
    spec = NearSpec("cosine", threshold=0.5, grouping=grouping)
    assert run(tmp_path, "parquet", parts, spec, near={
        "single_index_rows": 50, "partition_rows": 20, "mode": "exact"}) == 0
    want_exact, want_near = expected(parts, spec)
    assert len(want_exact) == 11 and len(want_near) > 100
    dups, _ = report(tmp_path)
    assert by_kind(dups, "exact") == want_exact and by_kind(dups, "near") == want_near
    border = pq.read_table(tmp_path / "out" / "report" / "borderline_pairs.parquet")
    assert border.num_rows and np.isfinite(border.column("distance").to_numpy()).all()


def test_keep_last_decides_near_survivors(tmp_path):
    parts, spec = dataset(3, "l2")
    assert run(tmp_path, "parquet", parts, spec, keep="last") == 0
    dups, _ = report(tmp_path)
    want_exact, want_near = expected(parts, spec, keep="last")
    assert by_kind(dups, "exact") == want_exact and by_kind(dups, "near") == want_near


def test_bounded_mode_on_one_cells_records_says_it_searched_exactly(tmp_path):
    """Records that fit one cell are all compared with each other, whatever near.mode
    asks: the run says so (summary.json's reason, the progress line) where it had
    searched exactly without a word under mode: bounded."""
    parts, spec = dataset(5, "cosine")
    assert run(tmp_path, "parquet", parts, spec, near={"mode": "bounded"}) == 0
    dups, _ = report(tmp_path)
    want_exact, want_near = expected(parts, spec)
    assert by_kind(dups, "exact") == want_exact and by_kind(dups, "near") == want_near
    s = json.loads((tmp_path / "out" / "report" / "summary.json").read_text())["near"]
    n = sum(len(ids) for ids, _ in parts)
    assert (s["mode"], s["cells"]) == ("exact", 1), s
    assert re.fullmatch(r"near\.mode: bounded needs more than one cell: \d+ records fit one "
                        r"\(near\.single_index_rows: 20,000\), where every record is "
                        r"compared with every other", s["reason"]), s["reason"]
    assert 0 < s["records_searched"] <= n


def test_nonfinite_invalid_goes_to_the_report(tmp_path):
    parts, spec = dataset(4, "l2", nan_rows=5)
    parts[0][1][3, 2] = np.inf
    assert run(tmp_path, "hdf5", parts, spec, near={"nonfinite": "invalid"}) == 0
    dups, invalid = report(tmp_path)
    bad = {i for i, t in values(parts).items() if not np.isfinite(t).all()}
    assert set(invalid["record_id"].to_pylist()) == bad and len(bad) == 6
    assert all("NaN or inf" in r and "set near.nonfinite: keep to keep" in r
               for r in invalid["reason"].to_pylist())
    finite = [([i for i in ids if i not in bad], ts[np.isfinite(ts).all(axis=1)])
              for ids, ts in parts]
    want_exact, want_near = expected(finite, spec)
    assert by_kind(dups, "exact") == want_exact and by_kind(dups, "near") == want_near
    s = json.loads((tmp_path / "out" / "report" / "summary.json").read_text())
    assert s["invalid"] == 6
    assert s["read"] == s["kept"] + s["removed_exact"] + s["removed_near"] + s["invalid"]


def test_near_report_files(tmp_path):
    parts, spec = dataset(5, "l2")
    assert run(tmp_path, "parquet", parts, spec, near={"borderline_pairs": 7}) == 0
    rep = tmp_path / "out" / "report"
    png = (rep / "near_distances.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    # the page embeds the whole plot (drawn while the page read rows back)
    assert base64.b64encode(png).decode() in (rep / "index.html").read_text()
    hist = json.loads((rep / "near_distances.json").read_text())
    exact = expected(parts, spec)[0]
    survivors = [i for i, t in values(parts).items() if i not in exact and np.isfinite(t).all()]
    nn = hist["nearest_neighbour"]
    assert nn["n"] == len(survivors)  # small input: every record gets its NN distance
    assert hist["metric_threshold"] == spec.threshold
    # records with a near duplicate have a nearest neighbour within the threshold
    assert nn["below_threshold"] >= len(expected(parts, spec)[1])
    # pairs: every pair within tolerance among the exact survivors, each once (all-pairs)
    v = values(parts)
    pairs = near_pairs(np.array([v[i] for i in survivors]), spec)
    assert hist["pairs"]["n"] == hist["pairs"]["at_or_below_threshold"] == sum(
        len(p) for p in pairs.values())
    assert hist["removed"] == len(expected(parts, spec)[1]) <= hist["pairs"]["n"]
    border = pq.read_table(rep / "borderline_pairs.parquet").to_pylist()
    inside = [r for r in border if r["within"]]
    outside = [r for r in border if not r["within"]]
    assert len(inside) == 7 and len(outside) == 7
    assert max(r["distance"] for r in inside) <= spec.threshold < min(
        r["distance"] for r in outside)
    v = values(parts)
    for r in border:  # the distances are the metric's, between the named records
        d, _ = exact_distance(v[r["record_id"]][None], v[r["neighbour_id"]][None], spec)
        assert r["distance"] == pytest.approx(d[0], rel=1e-12)
    # the decoys sit just outside: the closest outside pair is a planted decoy (1.05 t)
    assert min(r["distance"] for r in outside) < 1.1 * spec.threshold


@pytest.mark.parametrize("index", ["hnsw", "ivf"])
def test_approximate_index_in_partitions_keeps_precision_one(tmp_path, index):
    """IVF/HNSW inside each partition may miss pairs, never add wrong ones."""
    parts, spec = dataset(6, "l2")
    assert run(tmp_path, "parquet", parts, spec, near={
        "index": index, "nlist": 4, "nprobe": 2, "M": 8, "single_index_rows": 50,
        "partition_rows": 40}) == 0
    dups, _ = report(tmp_path)
    want_exact, want_near = expected(parts, spec)
    got = by_kind(dups, "near")
    v = values(parts)
    _, within = exact_distance(np.array([v[r] for r in got]),
                               np.array([v[k] for k in got.values()]), spec)
    assert within.all() and not set(got) & set(got.values())  # precision 1.0, nothing chained
    recall = len(set(got) & set(want_near)) / len(want_near)
    assert recall >= 0.8, recall
    assert by_kind(dups, "exact") == want_exact


def test_job_on_embeddings_takes_bounded_mode_and_reports_recall(tmp_path, capsys):
    """30k sentence-like 384-d embeddings through the CLI: auto predicts the cost of both
    modes and takes bounded; summary.json and the last line carry the measured recall;
    removals have precision 1 and resolve the planted copies; the spill is gone."""
    x, planted = planted_copies(embeddings(28_000))
    ids = [f"r{i}" for i in range(len(x))]
    write_input("parquet", tmp_path / "in" / "part-0.parquet", ids, x, np.zeros(len(x), int),
                row_group_size=8192)
    spec = NearSpec("cosine", threshold=0.01)
    assert run_job(tmp_path, "parquet", str(tmp_path / "in" / "*.parquet"),
                   near={"metric": "cosine", "threshold": 0.01}) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("near: bounded search in") and "recall" in last
    s = json.loads((tmp_path / "out" / "report" / "summary.json").read_text())["near"]
    assert s["mode"] == "bounded" and s["reason"].startswith("auto chose bounded")
    p = s["prediction"]
    assert p["joins_exact"] > s["probes"] >= p["joins_bounded"]
    assert p["work_bounded"] < p["work_exact"] < p["work_all_pairs"]
    r = s["recall"]
    assert 1500 < r["sampled"] < 2500 and r["with_partners"] > 30
    assert r["recall"] >= 0.97 and r["low"] <= r["recall"] <= r["high"]
    # drawn in strata: most of the sample among the capped records, the only ones the
    # cap can cost a pair; the job's own count of them weights the stratum
    c = r["strata"]["capped"]
    assert r["drawn"] == "stratified" and c["records"] == s["capped_records"] > 1000
    assert c["sampled"] + r["strata"]["others"]["sampled"] == r["sampled"]
    assert c["sampled"] > 0.6 * r["sampled"]
    assert "drawn among the" in last
    dups, _ = report(tmp_path)
    row = {i: k for k, i in enumerate(ids)}
    removed = np.array([row[i] for i in dups.column("record_id").to_pylist()])
    kept = np.array([row[i] for i in dups.column("duplicate_of").to_pylist()])
    assert exact_distance(x[removed], x[kept], spec)[1].all()  # precision 1
    gone = np.zeros(len(x), bool)
    gone[removed] = True
    within = exact_distance(x[planted[:, 0]], x[planted[:, 1]], spec)[1]
    resolved = gone[planted[within, 0]] | gone[planted[within, 1]]
    assert within.sum() > 500 and resolved.mean() >= 0.99
    assert not [p for p in (tmp_path / "out").iterdir() if ".staging-" in p.name]


def test_ragged_lists_need_a_shape_for_near(tmp_path, capsys):
    """A pandas column of arrays of two lengths (variable-size lists): near stops before
    any work (exit 2) with one line quoting the sizes and naming input.shape (not a
    numpy error); with input.shape set, records of the other length are invalid with the
    reason and the rest match the oracle."""
    import pandas as pd

    parts, spec = dataset(5, "l2", files=1, nan_rows=0)
    ids, x = parts[0]
    short = np.arange(len(ids)) % 9 == 4
    (tmp_path / "in").mkdir()
    pd.DataFrame({"id": ids, "emb": [t[:DIM // 2] if s else t for t, s in zip(
        x, short, strict=True)]}).to_parquet(tmp_path / "in" / "part-0.parquet")
    glob = str(tmp_path / "in" / "*.parquet")
    assert run_job(tmp_path, "parquet", glob, near=near_config(spec)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "set input.shape" in err[0]
    assert f"hold {DIM // 2:,} to {DIM:,} values" in err[0]
    assert "set near.metric: jaccard" in err[0] and "planned" not in err[0]  # (it is there)
    assert not (tmp_path / "out").exists()
    assert run_job(tmp_path, "parquet", glob, "max_invalid_fraction=0.5",
                   near=near_config(spec), input={"shape": [DIM]}) == 0
    dups, invalid = report(tmp_path)
    assert set(invalid["record_id"].to_pylist()) == {i for i, s in zip(ids, short, strict=True)
                                                      if s}
    assert all(f"[{DIM}]" in r for r in invalid["reason"].to_pylist())
    want_exact, want_near = expected([([i for i, s in zip(ids, short, strict=True) if not s],
                                       x[~short])], spec)
    assert by_kind(dups, "exact") == want_exact and by_kind(dups, "near") == want_near
    assert len(want_near) > 10


def test_recall_removed_counts_what_keep_order_leaves_in(tmp_path, capsys):
    """Chains a, b, c in keep order with b within tolerance of a and c of b but not of a:
    b goes as a copy of a, c stays (its only earlier partner was removed and the
    survivor is farther). Judged against the records kept every decision is right
    (recall 1.0); of the records with an earlier near duplicate, kept or not, only the
    b's were removed, which recall_removed says. Every record sampled; the oracle is
    the brute-force list of earlier partners."""
    rng = np.random.default_rng(6)
    t = 0.1
    base = rng.standard_normal((300, DIM)).astype(np.float32) * 10
    step = rng.standard_normal((300, DIM))
    step = (step / np.linalg.norm(step, axis=1, keepdims=True) * 0.6 * t).astype(np.float32)
    x = np.concatenate([base, base + step, base + 2 * step,  # a's, then b's, then c's
                        rng.standard_normal((900, DIM)).astype(np.float32) * 10])
    ids = [f"r{i}" for i in range(len(x))]
    write_input("parquet", tmp_path / "in" / "p.parquet", ids, x, np.zeros(len(x), int))
    assert run_job(tmp_path, "parquet", str(tmp_path / "in" / "*.parquet"),
                   near={"metric": "l2", "threshold": t, "recall_sample": 100_000}) == 0
    spec = NearSpec("l2", threshold=t)
    d = np.sqrt(((x[:, None, :].astype(np.float64) - x[None]) ** 2).sum(-1))
    earlier = np.tril(d <= t, -1).any(axis=1)  # an earlier record within tolerance
    dups, _ = report(tmp_path)
    gone = np.isin(ids, dups.column("record_id").to_pylist())
    r = json.loads((tmp_path / "out" / "report" / "summary.json").read_text())["near"]
    assert r["recall"]["recall"] == 1.0 and r["recall"]["with_partners"] == earlier.sum()
    assert r["recall_removed"] == r["recall"]["recall_removed"] == gone[earlier].mean()
    assert 0.45 < r["recall_removed"] < 0.55  # the b's, not the c's
    assert r["recall"]["removed_low"] < r["recall_removed"] < r["recall"]["removed_high"]
    kept_of = dict(zip(dups.column("record_id").to_pylist(),
                       dups.column("duplicate_of").to_pylist(), strict=True))
    row = {i: k for k, i in enumerate(ids)}
    pairs = np.array([(row[a], row[b]) for a, b in kept_of.items()])
    assert exact_distance(x[pairs[:, 0]], x[pairs[:, 1]], spec)[1].all()  # precision 1
    out = capsys.readouterr().out
    assert f"recall_removed {r['recall_removed']:.4f}" in out and "against the records kept" in out
    if r["mode"] == "exact" and not r["recall"]["unsure"]:  # a check that agrees
        assert (f"recall 1.0000 (exact mode: every pair within the threshold is compared; a "
                f"brute-force check of the decisions against the records kept agrees on all "
                f"{earlier.sum():,} of ") in out and "95% interval 0." not in out.split(
                    "recall_removed")[0], out


@pytest.mark.parametrize("fmt", ["parquet", "tfrecord"])
def test_int64_values_beyond_2_53_are_judged_exactly(tmp_path, fmt):
    """int64 records (a Parquet list<int64> written by pyarrow, a TFRecord int64_list
    written by TensorFlow) with values above 2^53: copies moved by 1-3 units were removed
    at l2 1.5 whatever their true distance (498 of 500 such copies in a trial at 2^60-2^62,
    none within). Against Python's exact integers; several chunks and files."""
    rows, pairs = int_rows(np.int64, random_bases=60)
    ids = [f"r{i}" for i in range(len(rows))]
    for f, cut in enumerate(np.array_split(np.arange(len(rows)), 3)):
        write_input(fmt, tmp_path / "in" / f"part-{f}.{EXT[fmt]}", [ids[i] for i in cut],
                    rows[cut], np.zeros(len(cut), int))
    spec = NearSpec("l2", threshold=1.5)
    inp = {"shape": [3], "dtype": "int64"} if fmt == "tfrecord" else {}
    assert run_job(tmp_path, fmt, str(tmp_path / "in" / f"*.{EXT[fmt]}"),
                   "tuning.chunk_rows=50", input=inp, near=near_config(spec)) == 0
    dups, _ = report(tmp_path)
    truth = int_truth(rows, pairs, spec)
    want = {ids[c]: ids[b] for c, (b, within, _) in truth.items() if within}
    assert 0 < len(want) < len(pairs)
    assert by_kind(dups, "near") == want and by_kind(dups, "exact") == {}


def test_a_recall_sample_drawn_among_exact_copies_only(tmp_path):
    """170 records of 16 distinct values (pairs of small integers: crowds of exact
    copies) and a recall sample of 50: the records it draws are all exact copies, so
    none reaches the near stage. The job finishes, keeps the 16 distinct values and
    says the recall was not measured (it failed: "cannot reshape array of size 0 into
    shape (0,newaxis)", an empty sample's width)."""
    x = np.random.default_rng(0).integers(0, 4, (170, 2)).astype(np.uint8)
    write_input("parquet", tmp_path / "in" / "a.parquet", [f"r{i}" for i in range(170)], x,
                np.zeros(170, np.int64))
    assert run_job(tmp_path, "parquet", str(tmp_path / "in" / "*.parquet"),
                   near={"metric": "l2", "threshold": 0.67, "recall_sample": 50}) == 0
    s = json.loads((tmp_path / "out" / "report" / "summary.json").read_text())
    assert s["kept"] == len(np.unique(x, axis=0)) == 16 and s["removed_near"] == 0
    assert s["near"]["recall"]["sampled"] == 0 and s["near"]["recall"]["recall"] is None


def _exact_run_with_reference(tmp_path, ref: np.ndarray, values: np.ndarray) -> dict:
    """A job over ``values`` (ids r0, r1, ...) with the reference set ``ref`` (e0, e1,
    ...), l2 0.05 in exact mode, every record in the recall sample: its summary.json."""
    write_input("parquet", tmp_path / "ref" / "r.parquet", [f"e{i}" for i in range(len(ref))],
                ref, np.zeros(len(ref), np.int64))
    write_input("parquet", tmp_path / "in" / "a.parquet",
                [f"r{i}" for i in range(len(values))], values, np.zeros(len(values), np.int64))
    assert run_job(tmp_path, "parquet", str(tmp_path / "in" / "*.parquet"),
                   reference=[{"format": "parquet", "path": str(tmp_path / "ref" / "*.parquet"),
                               "tensor": "emb", "id": "id"}],
                   near={"metric": "l2", "threshold": 0.05, "mode": "exact",
                         "recall_sample": 1000}) == 0
    return json.loads((tmp_path / "out" / "report" / "summary.json").read_text())


def test_records_that_copy_a_reference_with_near_references_are_not_judged(tmp_path):
    """Input records that are exact copies of reference records whose near copies are in
    the reference set too: the exact stage removes them as reference_exact, so the
    recall check does not judge them (it counted each as a miss of its reference
    neighbours: recall 0.0000 on a run whose every decision was right). Near copies
    among this run's own records are judged as before."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((100, 16)).astype(np.float32)
    ref = np.concatenate([x[:20], x[:20] + 0.001])
    values = np.concatenate([x[20:], x[:20], x[20:30] + 0.001])
    s = _exact_run_with_reference(tmp_path, ref, values)
    assert s["removed_reference_exact"] == 20 and s["removed_near"] == 10
    r = s["near"]["recall"]
    assert (r["sampled"], r["with_partners"], r["recall"]) == (90, 10, 1.0)


def test_a_removal_named_after_a_reference_before_a_nearer_record_is_judged_right(tmp_path):
    """A record within tolerance of a reference record and, nearer, of a kept record of
    this run is removed as the reference's near copy (a reference record is named
    first); the recall check judges that right (it counted it a miss, as a nearer kept
    partner: exact mode printed recall 0.0000 where every decision was the rule's)."""
    rng = np.random.default_rng(1)
    base = rng.standard_normal((10, 16)).astype(np.float32) * 10
    u = rng.standard_normal((10, 16))
    u = (u / np.linalg.norm(u, axis=1, keepdims=True)).astype(np.float32)
    ref, later, earlier = base, base + 0.045 * u, base + 0.08 * u  # on one line each
    values = np.concatenate([earlier, rng.standard_normal((50, 16)).astype(np.float32) * 10,
                             later])
    s = _exact_run_with_reference(tmp_path, ref, values)
    dups, _ = report(tmp_path)
    assert {(d["record_id"], d["duplicate_of"], d["kind"]) for d in dups.to_pylist()} == {
        (f"r{60 + i}", f"e{i}", "reference_near") for i in range(10)}
    r = s["near"]["recall"]
    assert (r["with_partners"], r["recall"]) == (10, 1.0)
