"""The public Beam steps (pipeline.steps) in a user's own pipeline: TestPipeline +
assert_that on real files (pyarrow) and records, against brute-force oracles."""

from __future__ import annotations

import pickle
from pathlib import Path

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import assert_that, equal_to

from pipeline import steps
from pipeline.steps import (
    DECISIONS,
    FACTS,
    INVALID,
    KEPT,
    KEYS,
    NEAR_REPORT,
    REMOVED,
    VECTORS,
    Dedup,
    DedupExact,
    DedupNear,
    Fingerprint,
    Keep,
    NearSpec,
    ReadTensors,
    TensorSpec,
    WriteClean,
)
from tests.embeddings import embeddings, planted_copies
from tests.jobkit import write_input
from tests.oracle import expected_removals, near_oracle
from tests.textkit import edited, package_texts
from tests.textkit import oracle as sets_oracle
from transforms.fingerprint import fingerprint_batch
from transforms.near.sets import Shingles, record_sets


def pipeline() -> BeamTestPipeline:
    return BeamTestPipeline(runner=FnApiRunner(), blocking=True)


def with_copies(seed: int, n: int, dim: int) -> np.ndarray:
    """Clustered unit embeddings with near copies (cosine 0.001-0.02), decoys just
    outside 0.02, and exact copies of 3% of the rows, shuffled."""
    x, _ = planted_copies(embeddings(n, dim, clusters=max(n // 40, 2), seed=seed), seed=seed)
    rng = np.random.default_rng(seed)
    x = np.concatenate([x, x[rng.choice(len(x), len(x) * 3 // 100, replace=False)]])
    return x[rng.permutation(len(x))]


def oracle(x: np.ndarray, spec: NearSpec | None) -> dict[int, int]:
    """{removed row: kept row}, keeping the earliest row: exact copies first, then near
    duplicates among the exact survivors."""
    exact = expected_removals([(str(i), t, 0.0) for i, t in enumerate(x)], "first")
    out = {int(r): int(k) for r, k in exact.items()}
    if spec is not None:
        left = np.array([i for i in range(len(x)) if i not in out])
        out.update({int(left[r]): int(left[k]) for r, k in near_oracle(x[left], spec).items()})
    return out


def check(fn):
    """assert_that matcher from a function over the whole output list."""
    def match(actual):
        fn(list(actual))
    return match


@pytest.mark.parametrize("near", [None, NearSpec("cosine", 0.02)], ids=["exact", "near"])
def test_dedup_over_dicts_matches_brute_force(near):
    x = with_copies(0, 4000, 48)
    records = [{"id": f"r{i}", "emb": x[i], "i": i} for i in range(len(x))]
    want = oracle(x, near)
    with pipeline() as p:
        out = (p | beam.Create(records)
               | Dedup(key="emb", id="id", keep=Keep.min("i"), near=near, chunk_rows=500))
        assert_that(out[KEPT] | "KeptIds" >> beam.Map(lambda r: r["i"]),
                    equal_to([i for i in range(len(x)) if i not in want]), label="kept")
        assert_that(out[REMOVED] | "Pairs" >> beam.Map(
            lambda r: (int(r["record_id"][1:]), int(r["duplicate_of"][1:]), r["record"]["i"])),
            equal_to([(r, k, r) for r, k in want.items()]), label="removed")
        assert_that(out[INVALID], equal_to([]), label="invalid")
        if near is not None:
            assert_that(out[NEAR_REPORT] | beam.Map(lambda r: r.stats["recall"]["recall"]),
                        equal_to([1.0]), label="recall")
    assert len(want) > 100


def test_dedup_over_record_batches_keeps_batches():
    x = with_copies(1, 3000, 16)
    ids = [f"r{i}" for i in range(len(x))]
    col = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), x.shape[1])
    table = pa.table({"id": ids, "emb": col, "i": np.arange(len(x))})
    want = oracle(x, None)
    with pipeline() as p:
        out = (p | beam.Create(table.to_batches(max_chunksize=700))
               | Dedup(key="emb", id="id", keep=Keep.min("i")))
        assert_that(out[KEPT] | beam.FlatMap(lambda rb: rb.column("i").to_pylist()),
                    equal_to([i for i in range(len(x)) if i not in want]), label="kept")
        assert_that(out[REMOVED] | "Ids" >> beam.Map(
            lambda r: (r["record_id"], r["duplicate_of"])),
                    equal_to([(f"r{r}", f"r{k}") for r, k in want.items()]), label="removed")


def test_dedup_over_dicts_reports_unusable_records():
    good = np.arange(12, dtype=np.float32).reshape(3, 4)
    records = [{"id": "a", "emb": good[0]}, {"id": "b", "emb": good[0].copy()},
               {"id": "c", "emb": "not a tensor"}, {"id": "d"}, {"id": "g", "emb": None},
               {"id": "e", "emb": [[1.0, 2.0], [3.0]]}, {"id": "f", "emb": good[1]}]
    for i, r in enumerate(records):
        r["i"] = i
    with pipeline() as p:
        out = p | beam.Create(records) | Dedup(key="emb", id="id", keep=Keep.min("i"))
        assert_that(out[KEPT] | beam.Map(lambda r: r["id"]), equal_to(["a", "f"]),
                    label="kept")
        assert_that(out[REMOVED] | "R" >> beam.Map(lambda r: (r["record_id"], r["kind"])),
                    equal_to([("b", "exact")]), label="removed")

        def reasons(rows):
            assert sorted(r["record_id"] for r in rows) == ["c", "d", "e", "g"]
            assert all(r["reason"] and r["record"]["id"] == r["record_id"] for r in rows)
            why = {r["record_id"]: r["reason"] for r in rows}
            assert "emb" in why["d"]
            assert why["g"] == "ValueError: field 'emb': null", why["g"]  # was "dtype object"
        assert_that(out[INVALID], check(reasons), label="invalid")


def _jaccard_records(kind: str) -> tuple[list, dict[int, int]]:
    """Real texts (or them as word ids), near copies (2% of words edited), an exact copy,
    blank records and one of the other kind; the oracle: {removed: kept} of exact then
    near dedup (J >= 0.8 over the unit's 5-grams) in keep order, the blank invalid."""
    rng = np.random.default_rng(0)
    base = package_texts(12)
    vocab = sorted({w for t in base for w in t.split()})
    texts = base + [edited(base[i], 0.02, rng, vocab) for i in range(6)] + [base[3]]
    blank = ["", "  \n\t", "....", "\xa0"]
    if kind == "token":
        ids = {w: i for i, w in enumerate(vocab)}
        values = [np.array([ids[w] for w in t.split()], np.int64) for t in texts]
        blank, odd = [np.zeros(0, np.int64), []], "a text among token sequences"
    else:
        values, odd = texts, np.arange(1, 7)
    survivors = [i for i, v in enumerate(values)
                 if not any(np.array_equal(v, w) for w in values[:i])]
    unit = "word" if kind == "text" else "token"
    near = sets_oracle(record_sets([values[i] for i in survivors], Shingles(unit)), 0.8)
    want = {i: next(j for j in range(i) if np.array_equal(values[i], values[j]))
            for i in range(len(values)) if i not in survivors}
    want.update({survivors[r]: survivors[k] for r, (k, _) in near.items()})
    return values + blank + [odd], want


@pytest.mark.parametrize("kind", ["text", "token", "token, spec pickled"])
def test_dedup_jaccard_over_dicts_takes_the_unit_of_the_records(kind):
    """NearSpec("jaccard", t) without shingles: word for texts, token for integer
    sequences, as the job (texts went to INVALID, token sequences crashed the pipeline);
    blank records are INVALID with the job's reason (they were kept, their repeats removed
    as exact copies); a record of the other kind is compared with its own kind only. A
    spec that went through pickle (saved, or sent to a worker) does the same (it took
    word, and every token sequence went to INVALID)."""
    spec = NearSpec("jaccard", 0.8)
    if kind.endswith("pickled"):
        kind, spec = "token", pickle.loads(pickle.dumps(spec))
    values, want = _jaccard_records(kind)
    n, unit = len(values), "word" if kind == "text" else "token"
    records = [{"id": f"r{i}", "v": v, "i": i} for i, v in enumerate(values)]
    blank = list(range(n - 1 - (4 if kind == "text" else 2), n - 1))
    with pipeline() as p:
        out = p | beam.Create(records) | Dedup(key="v", id="id", keep=Keep.min("i"),
                                                near=spec, chunk_rows=8)
        assert_that(out[REMOVED] | beam.Map(lambda r: (r["record"]["i"],
                                                        int(r["duplicate_of"][1:]))),
                    equal_to(list(want.items())), label="removed")
        assert_that(out[INVALID] | "Bad" >> beam.Map(lambda r: (r["record"]["i"], r["reason"])),
                    equal_to([(i, f"no {unit} to compare (an empty or blank record; "
                                  "near.metric: jaccard)") for i in blank]), label="invalid")
        assert_that(out[KEPT] | "Kept" >> beam.Map(lambda r: r["i"]),
                    equal_to([i for i in range(n) if i not in want and i not in blank]),
                    label="kept")
        assert_that(out[NEAR_REPORT] | "Unit" >> beam.Map(lambda r: r.stats["unit"]),
                    equal_to([unit]), label="unit")  # (it said word for token sequences)
    assert len(want) >= 6


def test_dedup_shape_compares_records_of_that_shape_only():
    """Vectors of two sizes with near: ``shape`` keeps the search to the records of that
    shape (the others INVALID, naming it), removals as the oracle's over those; without
    it the pipeline stops, naming the setting."""
    x = with_copies(3, 600, 24)
    short = np.random.default_rng(3).normal(size=(40, 16)).astype(np.float32)
    short[1] = short[0]  # copies of another size are not compared either
    values = [*x, *short]
    records = [{"id": f"r{i}", "emb": v, "i": i} for i, v in enumerate(values)]
    near = NearSpec("cosine", 0.02)
    want = oracle(x, near)
    with pipeline() as p:
        out = (p | beam.Create(records)
               | Dedup(key="emb", id="id", keep=Keep.min("i"), near=near, shape=(24,),
                       chunk_rows=500))
        assert_that(out[REMOVED] | beam.Map(lambda r: (r["record"]["i"],
                                                        int(r["duplicate_of"][1:]))),
                    equal_to(list(want.items())), label="removed")

        def reasons(rows):
            assert sorted(r["record"]["i"] for r in rows) == list(range(len(x), len(values)))
            assert all("[24]" in r["reason"] for r in rows), rows[0]["reason"]
        assert_that(out[INVALID], check(reasons), label="invalid")
    assert len(want) > 20
    with pytest.raises(Exception, match="shape="), pipeline() as p:
        _ = p | beam.Create(records) | Dedup(key="emb", id="id", near=near, chunk_rows=500)


FAILING_NEAR = """
import numpy as np, apache_beam as beam
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from pipeline.steps import Dedup, NearSpec
rng = np.random.default_rng(0)
records = [{"id": f"r{i}", "emb": rng.normal(size=24 if i < 300 else 16)} for i in range(340)]
try:
    with beam.Pipeline(runner=FnApiRunner()) as p:
        _ = p | beam.Create(records) | Dedup(key="emb", id="id",
                                              near=NearSpec("cosine", 0.02), chunk_rows=100)
except Exception as e:
    print("failed:", "shape=" in str(e))
"""


def test_a_failed_pipeline_leaves_no_default_spill(tmp_path):
    """``Dedup`` with no ``spill=`` spills to a fresh folder in the temp directory and
    deletes it after the search; a pipeline that stops before (records of two sizes,
    no ``shape=``) left the vectors it had written there. Now gone when the process
    exits."""
    import os
    import subprocess
    import sys

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run([sys.executable, "-c", FAILING_NEAR], cwd=root, text=True,
                         capture_output=True, env={**os.environ, "TMPDIR": str(tmp)})
    assert run.stdout.strip() == "failed: True", run.stderr[-2000:]
    assert [p.name for p in tmp.iterdir() if p.name.startswith("tensordedup-")] == []


def test_dedup_over_records_needs_a_key():
    with pytest.raises(ValueError, match="key="), pipeline() as p:
        _ = p | beam.Create([{"emb": [1.0]}]) | Dedup()


@pytest.fixture
def parquet_files(tmp_path: Path):
    x = with_copies(2, 3000, 32)
    parts = np.array_split(np.arange(len(x)), 3)
    files = []
    for n, rows in enumerate(parts):
        path = tmp_path / "in" / f"part-{n}.parquet"
        write_input("parquet", path, [f"r{i}" for i in rows], x[rows], rows % 7,
                    row_group_size=256)
        files.append(str(path))
    return x, files


def test_read_fingerprint_and_exact_steps(parquet_files):
    x, files = parquet_files
    spec = TensorSpec("emb", "id")
    want = {f"r{r}": f"r{k}" for r, k in oracle(x, None).items()}
    with pipeline() as p:
        read = p | ReadTensors(str(Path(files[0]).parent / "*.parquet"), format="parquet",
                               spec=spec)
        assert_that(read[FACTS] | beam.Map(lambda kv: (kv[0], kv[1].n_read))
                    | beam.CombinePerKey(sum),
                    equal_to([(i, len(a)) for i, a in enumerate(np.array_split(x, 3))]),
                    label="facts")
        keys = read["chunks"] | Fingerprint(keep="first", shards=4)
        assert_that(keys[KEYS] | beam.FlatMap(
            lambda kv: [(i, bytes(w))
                        for i, w in zip(kv[1].ids.to_pylist(), kv[1].words, strict=True)]),
            equal_to([(f"r{i}", bytes(w)) for i, w in enumerate(_words(x))]), label="digests")
        exact = keys[KEYS] | DedupExact(keep=Keep.first())
        assert_that(exact[REMOVED] | beam.FlatMap(lambda kv: zip(
            kv[1].record_id.to_pylist(), kv[1].duplicate_of.to_pylist(), strict=True)),
            equal_to(sorted(want.items())), label="removed")


def _words(x: np.ndarray) -> np.ndarray:
    from transforms.exact import digest_words
    return digest_words(fingerprint_batch(x))


@pytest.mark.parametrize("carry", [False, True])
def test_near_step_over_fingerprint_vectors(parquet_files, tmp_path, carry):
    """``carry_rows`` (Dataflow): the cells' rows travel in the shuffle, and no cell file
    is written; the same removals as with references into spill files (about 15 cells)."""
    x, files = parquet_files
    spec = NearSpec("cosine", 0.02, single_index_rows=500, partition_rows=200, mode="exact")
    uniq = oracle(x, None)
    left = np.array([i for i in range(len(x)) if i not in uniq])
    want = sorted((f"r{left[r]}", f"r{left[k]}") for r, k in near_oracle(x[left], spec).items())
    with pipeline() as p:
        read = p | ReadTensors(files, format="parquet", spec=TensorSpec("emb", "id"))
        keys = read["chunks"] | Fingerprint(spill=str(tmp_path / "values"))
        exact = keys[KEYS] | DedupExact()
        near = keys[VECTORS] | DedupNear(spec, spill=str(tmp_path / "cells"), keep_spill=True,
                                         carry_rows=carry)
        assert_that(near[REMOVED] | beam.FlatMap(lambda kv: zip(
            kv[1].record_id.to_pylist(), kv[1].duplicate_of.to_pylist(), strict=True)),
            equal_to(want), label="near")
        assert_that(exact[REMOVED] | beam.Map(lambda kv: len(kv[1]))
                    | beam.CombineGlobally(sum), equal_to([len(uniq)]), label="exact")
    assert len(want) > 50
    assert bool(list((tmp_path / "cells").glob("*.arrows"))) is not carry


def test_dedup_and_write_clean_files(parquet_files, tmp_path):
    x, files = parquet_files
    spec = TensorSpec("emb", "id")
    removed = oracle(x, NearSpec("l2", 0.05))
    out_dir = tmp_path / "clean"
    with pipeline() as p:
        read = p | ReadTensors(files, format="parquet", spec=spec)
        dedup = read | Dedup(near=NearSpec("l2", 0.05), spill=str(tmp_path / "spill"))
        results = dedup[DECISIONS] | WriteClean(str(out_dir), format="parquet", spec=spec)
        assert_that(results | beam.Map(lambda r: (r.output, r.kept + sum(
            len(d) for d in r.decision.removed), r.decision.n_read)),
            equal_to([(Path(f).name, n, n) for f, n in
                      zip(files, [len(a) for a in np.array_split(x, 3)], strict=True)]))
    kept = pa.concat_tables([pq.read_table(out_dir / Path(f).name) for f in files])
    assert kept.column("id").to_pylist() == [f"r{i}" for i in range(len(x)) if i not in removed]
    got = np.stack(kept.column("emb").to_numpy(zero_copy_only=False))
    np.testing.assert_array_equal(got, np.delete(x, sorted(removed), axis=0))


def test_public_names():
    assert {"ReadTensors", "Fingerprint", "DedupExact", "DedupNear", "Dedup",
            "WriteClean"} <= set(steps.__all__)
    for name in steps.__all__:
        assert getattr(steps, name) is not None


def _decisions(files: list[str], lie_about: int | None = None) -> list:
    """One decision per file dropping every 5th record (as invalid ones); ``lie_about``:
    that file's decision counts one record more than the file holds (a file that
    changed while the job ran)."""
    from pipeline.steps.elements import FileDecision
    from transforms.io.formats.base import InvalidRecord

    out = []
    for i, f in enumerate(files):
        n = pq.ParquetFile(f).metadata.num_rows
        drop = [InvalidRecord(p, f"r{p}", "test") for p in range(0, n, 5)]
        out.append(FileDecision(i, f, n + (i == lie_about), [], drop))
    return out


def test_write_clean_copies_several_files_at_once(tmp_path):
    """More files than a worker copies at once: every copy complete and right (read back
    by pyarrow), one result per file; a file whose count no longer matches fails the
    step with the reason, also when other copies are still running beside it."""
    x = with_copies(4, 5000, 16)
    files = []
    for k, rows in enumerate(np.array_split(np.arange(len(x)), 5)):
        path = tmp_path / "in" / f"part-{k}.parquet"
        write_input("parquet", path, [f"r{i}" for i in rows], x[rows], rows % 3,
                    row_group_size=200)
        files.append(str(path))
    spec = TensorSpec("emb", "id")
    with pipeline() as p:
        results = (p | beam.Create(_decisions(files))
                   | WriteClean(str(tmp_path / "clean"), format="parquet", spec=spec,
                                files_at_once=2))
        sizes = [pq.ParquetFile(f).metadata.num_rows for f in files]
        assert_that(results | beam.Map(lambda r: (r.output, r.kept)),
                    equal_to([(Path(f).name, n - len(range(0, n, 5)))
                              for f, n in zip(files, sizes, strict=True)]))
    for k, (f, n) in enumerate(zip(files, sizes, strict=True)):
        got = pq.read_table(tmp_path / "clean" / Path(f).name)
        want = pq.read_table(f).filter(pa.array(np.arange(n) % 5 != 0))
        assert got.equals(want), k
    with pytest.raises(Exception, match="did the file change while the job ran"):
        with pipeline() as p:
            _ = (p | beam.Create(_decisions(files, lie_about=3))
                 | WriteClean(str(tmp_path / "clean2"), format="parquet", spec=spec,
                              files_at_once=2))
