"""Megatron indexed datasets (``input.format: megatron``): each document's tokens a record;
the same removals as the same documents in Parquet lists, clean ``.idx`` / ``.bin`` pairs
that Megatron's own ``IndexedDataset`` reads as the kept documents with their sequences
(and sequence modes) as they were, a ``.bin`` cut short read up to the cut, checks
before any work.

Datasets are written by megatron-core's ``IndexedDatasetBuilder`` (as
``preprocess_data.py`` does) from real licence and METADATA texts tokenized by the
bundled MiniLM tokenizer, with edited and exact copies; some documents are split into
several sequences, one dataset is multimodal (a mode per sequence), one ends with
sequences after its last document's end. The Parquet twin's job is the oracle of the
decisions (its readers are checked against brute force elsewhere).
"""

from __future__ import annotations

import json
import re
import struct
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from pipeline.run import main
from tests import fakefs
from tests.jobkit import report
from tests.test_checks import nothing_written, one_error_line
from tests.test_format_npy import _decisions, _job, _row
from tests.textkit import crawl_corpus, token_ids
from transforms.io.formats import megatron

with warnings.catch_warnings():  # "Transformer Engine and Apex are not installed"
    warnings.simplefilter("ignore", UserWarning)
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder


def _build(prefix: Path, docs: list[np.ndarray], rng: np.random.Generator, *,
           multimodal: bool = False, trailing: bool = False) -> list[list[int]]:
    """A dataset of ``docs`` by Megatron's builder, some split into 2-3 sequences (the
    sequence lengths of each returned); ``trailing``: the last document's sequences are
    added without its end (a builder finalized before ``end_document``)."""
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16, multimodal=multimodal)
    splits = []
    for k, doc in enumerate(docs):
        parts = int(rng.integers(1, 4)) if len(doc) > 3 else 1
        cuts = np.sort(rng.choice(np.arange(1, len(doc)), parts - 1, replace=False)) \
            if parts > 1 else np.zeros(0, int)
        lengths = np.diff(np.r_[0, cuts, len(doc)]).tolist()
        splits.append(lengths)
        tokens = torch.from_numpy(doc.astype(np.int64))
        if trailing and k == len(docs) - 1:
            for seq in torch.split(tokens, lengths):
                builder.add_item(seq)
        elif multimodal:
            for j, seq in enumerate(torch.split(tokens, lengths)):
                builder.add_item(seq, mode=j % 2)
            builder.end_document()
        else:
            builder.add_document(tokens, lengths)
    builder.finalize(f"{prefix}.idx")
    return splits


def _documents(prefix: Path, multimodal: bool = False) -> list[tuple[list[int], list[int],
                                                                      list[int]]]:
    """(tokens, sequence lengths, modes) of each document, as Megatron reads them."""
    d = IndexedDataset(str(prefix))
    bounds = d.document_indices.tolist()
    modes = []
    if multimodal:  # the index's own (IndexedDataset.sequence_modes asserts an array's
        # truth); held while read: its memory map closes with it
        m = IndexedDataset(str(prefix), multimodal=True)
        modes = m.index.sequence_modes.tolist()
    return [(np.concatenate([d[s] for s in range(a, b)]).tolist() if b > a else [],
             d.sequence_lengths[a:b].tolist(), modes[a:b])
            for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


@pytest.mark.parametrize("near", [None, {"metric": "jaccard", "threshold": 0.7}])
def test_documents_give_the_parquet_jobs_removals(tmp_path, near):
    """Three datasets (one multimodal, one ending with sequences after its last end), exact
    dedup and jaccard 0.7: the removals of the same documents as Parquet lists of token
    ids; each clean pair, read by Megatron, holds the kept documents in order with their
    sequence lengths and modes; read = kept + removed."""
    rng = np.random.default_rng(5)
    docs = [t.astype(np.uint16) for t in token_ids(crawl_corpus())]
    docs += [docs[3], docs[40], docs[3]]  # exact copies, in other datasets too
    parts = np.array_split(np.arange(len(docs)), 3)
    (tmp_path / "m" / "in").mkdir(parents=True)
    (tmp_path / "p" / "in").mkdir(parents=True)
    kinds = [{}, {"multimodal": True}, {"trailing": True}]
    splits = []
    for k, rows in enumerate(parts):
        splits.append(_build(tmp_path / "m" / "in" / f"part-{k}", [docs[i] for i in rows],
                             rng, **kinds[k]))
        pq.write_table(pa.table({"tokens": pa.array([docs[i].tolist() for i in rows],
                                                    pa.list_(pa.uint16()))}),
                       tmp_path / "p" / "in" / f"part-{k}.parquet", row_group_size=50)
    cfg = {"near": near} if near else {}
    assert _job(tmp_path / "m", "megatron", str(tmp_path / "m" / "in" / "*.idx"),
                "tuning.unit_rows=60", **cfg) == 0
    assert _job(tmp_path / "p", "parquet", str(tmp_path / "p" / "in" / "*.parquet"),
                input={"tensor": "tokens"}, **cfg) == 0
    got, want = _decisions(tmp_path / "m"), _decisions(tmp_path / "p")
    assert got == want and len(got) >= (100 if near else 3)
    removed = {r for r, *_ in got}
    summary = json.loads((tmp_path / "m" / "out" / "report" / "summary.json").read_text())
    assert summary["read"] == len(docs) == summary["kept"] + len(removed)
    for k, rows in enumerate(parts):
        keep = [j for j in range(len(rows)) if f"part-{k}:{j}" not in removed]
        clean = _documents(tmp_path / "m" / "out" / "clean" / f"part-{k}", k == 1)
        assert [c[0] for c in clean] == [docs[rows[j]].tolist() for j in keep]
        assert [c[1] for c in clean] == [splits[k][j] for j in keep]
        if k == 1:
            assert all(c[2] == [m % 2 for m in range(len(c[2]))] for c in clean)


def test_a_bin_cut_short_keeps_its_whole_documents(tmp_path, monkeypatch):
    """A .bin whose end is missing (an interrupted copy): its whole documents are read,
    each document it cuts is an invalid record with the reason; a dataset whose .bin is
    missing is an unreadable file; read = kept + removed + invalid, and the clean copy
    (written a few documents per step) holds the kept whole documents."""
    monkeypatch.setattr(megatron, "_WRITE_STEP_BYTES", 2_000)  # about 60 documents a step
    rng = np.random.default_rng(6)
    docs = [rng.integers(0, 50, int(rng.integers(1, 30))).astype(np.uint16) for _ in range(400)]
    docs += docs[:100]  # exact copies
    (tmp_path / "in").mkdir()
    _build(tmp_path / "in" / "part-0", docs, rng)
    _build(tmp_path / "in" / "part-1", docs[:10], rng)
    (tmp_path / "in" / "part-1.bin").unlink()
    whole = 450
    size = 2 * sum(len(t) for t in docs[:whole])
    with open(tmp_path / "in" / "part-0.bin", "r+b") as f:
        f.truncate(size + 1)  # a byte of the next document
    assert _job(tmp_path, "megatron", str(tmp_path / "in" / "*.idx"),
                "tuning.unit_rows=100", max_invalid_fraction=1.0) == 0
    summary = json.loads((tmp_path / "out" / "report" / "summary.json").read_text())
    dups, invalid = report(tmp_path)
    bad = invalid.to_pylist()
    cut = [r for r in bad if r["record_id"] and r["record_id"].endswith(tuple(
        f"part-0.idx:{i}" for i in range(len(docs))))]
    assert sorted(int(r["record_id"].rsplit(":", 1)[1]) for r in cut) == list(
        range(whole, len(docs)))
    assert all(f"the .bin ends at byte {size + 1:,}" in r["reason"] for r in cut)
    (unreadable,) = summary["unreadable_files"]
    assert unreadable["path"].endswith("part-1.idx") and "part-1.bin is missing" in \
        unreadable["reason"]
    assert summary["read"] == len(docs) == summary["kept"] + dups.num_rows + len(cut)
    first = {}
    for i, t in enumerate(docs[:whole]):
        first.setdefault(t.tobytes(), i)
    removed = sorted(int(r.rsplit(":", 1)[1]) for r in dups.column("record_id").to_pylist())
    assert removed == sorted(set(range(whole)) - set(first.values()))
    clean = _documents(tmp_path / "out" / "clean" / "part-0")
    assert [c[0] for c in clean] == [docs[i].tolist() for i in sorted(first.values())]


def test_remote_run_equals_local_run(tmp_path, monkeypatch):
    """The same datasets in an object store (fake gs://, ranged reads): the same report
    and the same clean .idx and .bin bytes as the local run."""
    url = fakefs.bucket(monkeypatch, tmp_path / "gcs")
    bucket = tmp_path / "gcs" / url.removeprefix(f"{fakefs.SCHEME}://")
    docs = [t.astype(np.uint16) for t in token_ids(crawl_corpus())]
    for where in (tmp_path / "local" / "in", bucket / "in"):
        where.mkdir(parents=True)
        rng = np.random.default_rng(7)
        _build(where / "part-0", docs[:250], rng)
        _build(where / "part-1", docs[250:], rng, multimodal=True)
    local, remote = tmp_path / "local", tmp_path / "remote"
    remote.mkdir()
    for where, root in ((local, str(local)), (remote, url)):
        doc = {"input": {"format": "megatron", "path": f"{root}/in/*.idx"},
               "output": {"path": f"{root}/out/clean"}, "report": f"{root}/out/report",
               "runner": {"processes": False},
               "near": {"metric": "jaccard", "threshold": 0.7}}
        (where / "job.yaml").write_text(yaml.safe_dump(doc))
        assert main(["--config", str(where / "job.yaml"), "--quiet",
                     "--set", "tuning.unit_rows=100"]) == 0
    for name in ("part-0.idx", "part-0.bin", "part-1.idx", "part-1.bin"):
        assert (bucket / "out" / "clean" / name).read_bytes() == (
            local / "out" / "clean" / name).read_bytes()
    a, b = (sorted((_row(d["record_id"]), _row(d["duplicate_of"]), d["kind"]) for d in
                   pq.read_table(p / "report" / "duplicates.parquet").to_pylist())
            for p in (local / "out", bucket / "out"))
    assert a == b and len(a) > 100


def test_checks_before_any_work_and_a_rerun(tmp_path, capsys):
    """Exit 2 before any work, one line each: a fairseq index, the .bin files named (the
    .idx named in the fix), a vector metric, an embed section, input.shape, input.id, keep
    by a column, a dtype that disagrees. Then a run, its dry run (records counted from the
    index, the .bin's bytes in the plan) and reruns over its output (the .bin files are
    its own), with the .bin files matched beside their .idx and with the dataset named by
    its prefix."""
    folder = tmp_path / "in"
    folder.mkdir()
    rng = np.random.default_rng(8)
    docs = [rng.integers(0, 9, 20).astype(np.uint16) for _ in range(50)] * 2
    _build(folder / "part-0", docs, rng)
    fairseq = tmp_path / "fairseq"  # fairseq's layout: no document count, no document index
    fairseq.mkdir()
    sizes = np.array([3, 5, 2], np.int32)
    (fairseq / "train.idx").write_bytes(
        b"MMIDIDX\x00\x00" + struct.pack("<QBQ", 1, 8, len(sizes)) + sizes.tobytes()
        + (np.r_[0, np.cumsum(sizes)[:-1]] * 2).astype(np.int64).tobytes())
    np.arange(10, dtype=np.uint16).tofile(fairseq / "train.bin")
    for glob, extra, want in (
            ("../fairseq/*.idx", {}, "train.idx: input.path: it is a fairseq "
             "MMapIndexedDataset index (sequences, no documents), which this job does not "
             "read"),
            ("*.bin", {}, "part-0.bin is not a Megatron .idx file"),
            ("*.idx", {"near": {"metric": "l2", "threshold": 1.0}}, "near.metric: l2 compares "
             "tensors of one shape; a Megatron dataset's documents are token sequences of any "
             "length: use near.metric: jaccard"),
            ("*.idx", {"embed": {"model": "torchscript", "path": str(tmp_path / "m.pt")}},
             "embed: a Megatron dataset holds token ids"),
            ("*.idx", {"input": {"shape": [20]}}, "input.shape: a Megatron dataset's "
             "documents have their own lengths"),
            ("*.idx", {"input": {"id": "doc"}}, "input.id: a Megatron dataset holds token ids, "
             "no column 'doc': remove input.id (ids are <file>:<document>)"),
            ("*.idx", {"keep": {"max": "score"}}, "keep: a Megatron dataset holds tokens"),
            ("*.idx", {"input": {"dtype": "int32"}}, "input.dtype: its tokens are uint16, not "
             "int32")):
        assert _job(tmp_path, "megatron", str(folder / glob), **extra) == 2, glob
        line = one_error_line(capsys)
        assert want in line, line
        assert nothing_written(tmp_path)
    assert _job(tmp_path, "megatron", str(folder / "*.idx"), args=("--dry-run",)) == 0
    plan = capsys.readouterr().out
    bin_bytes = (folder / "part-0.bin").stat().st_size + (folder / "part-0.idx").stat().st_size
    stored = re.search(r"input: 100 records .*, ([\d.]+) kB in files", plan)
    assert stored and abs(float(stored[1]) * 1000 - bin_bytes) < 10, plan
    # a rerun over the output; the .idx and .bin matched together, and the dataset named by
    # its prefix as Megatron names it: the same dataset
    for glob, args in (("*.idx", ()), ("*", ("--overwrite",)), ("part-0", ("--overwrite",))):
        assert _job(tmp_path, "megatron", str(folder / glob), args=args) == 0
        assert [c[0] for c in _documents(tmp_path / "out" / "clean" / "part-0")] == [
            d.tolist() for d in docs[:50]]
