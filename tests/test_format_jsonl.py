"""JSON lines input (``input.format: jsonl``): the same removals as the same records in
Parquet, clean copies that are the kept lines byte for byte (compressed as the input),
bad lines reported with their reasons and their neighbours read.

Files are written as users get them: texts by pandas' ``to_json(lines=True)`` (gzip,
bz2), numbers and plain files by Python's ``json``, zstd through pyarrow's stream; read
back by pyarrow's JSON reader and Python's decompressors. The Parquet twin's job is the
oracle of the decisions (its readers are checked against brute force elsewhere); what
is JSON lines' own (lines, blank lines, compression, bad lines) is checked line by line
here.
"""

from __future__ import annotations

import bz2
import gzip
import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.json as pj
import pyarrow.parquet as pq
import pytest

from tests.jobkit import report, run_job
from tests.textkit import crawl_corpus, package_texts, token_ids

CODECS = {"": None, ".gz": "gzip", ".bz2": "bz2", ".zst": "zstd"}


def _write_lines(path, rows: list[dict], suffix: str) -> None:
    """``rows`` as JSON lines: texts by pandas for gzip/bz2 (its ``to_json`` keeps 10
    decimals of a float: not numbers' writer), pyarrow's zstd stream, Python otherwise."""
    texts = all(isinstance(v, str) for r in rows for v in r.values())
    if suffix in (".gz", ".bz2") and texts:
        pd.DataFrame(rows).to_json(path, orient="records", lines=True,
                                   compression=CODECS[suffix])
        return
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    if suffix in (".gz", ".bz2"):
        path.write_bytes(gzip.compress(data) if suffix == ".gz" else bz2.compress(data))
    elif suffix == ".zst":
        with pa.CompressedOutputStream(str(path), "zstd") as out:
            out.write(data)
    else:
        path.write_bytes(data)


def _raw(path) -> bytes:
    """A file's bytes, decompressed by Python's (or pyarrow's, zstd) own reader."""
    name = str(path)
    if name.endswith(".gz"):
        return gzip.decompress(path.read_bytes())
    if name.endswith(".bz2"):
        return bz2.decompress(path.read_bytes())
    if name.endswith(".zst"):
        with pa.CompressedInputStream(pa.OSFile(name), "zstd") as f:
            return f.read()
    return path.read_bytes()


def _twin_jobs(tmp_path, rows: list[dict], tensor: str, *sets: str, **cfg
               ) -> tuple[pa.Table, pa.Table, list]:
    """The same rows as four JSON lines files (plain, gzip, bz2, zstd) and as four Parquet
    files: each job's duplicates, and the JSON lines job's files."""
    parts = np.array_split(np.arange(len(rows)), len(CODECS))
    (tmp_path / "j" / "in").mkdir(parents=True)
    (tmp_path / "p" / "in").mkdir(parents=True)
    files = []
    for k, (suffix, idx) in enumerate(zip(CODECS, parts, strict=True)):
        files.append(tmp_path / "j" / "in" / f"part-{k}.jsonl{suffix}")
        _write_lines(files[-1], [rows[i] for i in idx], suffix)
        table = pa.Table.from_pylist([rows[i] for i in idx])
        if cfg.get("input", {}).get("dtype") == "float32":  # as the JSON lines job reads it
            table = table.set_column(1, tensor, table.column(tensor).cast(
                pa.list_(pa.float32())))
        pq.write_table(table, tmp_path / "p" / "in" / f"part-{k}.parquet", row_group_size=40)
    got = []
    for fmt, where, glob in (("jsonl", "j", "*.jsonl*"), ("parquet", "p", "*.parquet")):
        assert run_job(tmp_path / where, fmt, str(tmp_path / where / "in" / glob),
                       "tuning.chunk_rows=64", *sets,
                       input={"tensor": tensor, "id": "id", **cfg.get("input", {})},
                       **{k: v for k, v in cfg.items() if k != "input"}) == 0
        dups, invalid = report(tmp_path / where)
        assert invalid.num_rows == 0
        got.append(dups.select(["record_id", "duplicate_of", "kind"]).sort_by("record_id"))
    return got[0], got[1], files


def _kept_lines(files, drop: set[str]) -> None:
    """Each clean copy is its input's lines without the removed ones, byte for byte, in
    order, compressed as the input was (its first bytes), and read back by pyarrow."""
    for src in files:
        dst = src.parents[1] / "out" / "clean" / src.name
        assert dst.read_bytes()[:2] == src.read_bytes()[:2]  # gzip / bz2 / zstd magic
        if src.suffix == ".gz":  # no name, no time: the same bytes on every run and runner
            assert dst.read_bytes()[3] & 0x08 == 0 and dst.read_bytes()[4:8] == bytes(4)
        want = [line for line in _raw(src).splitlines(keepends=True)
                if json.loads(line)["id"] not in drop]
        assert _raw(dst).splitlines(keepends=True) == want
        back = pj.read_json(pa.input_stream(str(dst), compression="detect"))
        assert back.column("id").to_pylist() == [json.loads(line)["id"] for line in want]


def test_texts_as_json_lines_give_the_parquet_jobs_removals(tmp_path):
    """Real licence / METADATA texts with near and exact copies (jaccard 0.8), in four
    JSON lines files of every compression, read in chunks of 64 lines: the removals of
    the same rows in Parquet, and clean copies that are the kept lines."""
    texts = crawl_corpus()
    rows = [{"id": f"d{i}", "text": t, "lang": "en"} for i, t in enumerate(texts)]
    mine, theirs, files = _twin_jobs(tmp_path, rows, "text", input={"decode": "text"},
                                     near={"metric": "jaccard", "threshold": 0.8})
    assert mine.equals(theirs)
    kinds = mine.column("kind").to_pylist()
    assert kinds.count("exact") >= 2 and kinds.count("near") > 50
    _kept_lines(files, set(mine.column("record_id").to_pylist()))
    page = (tmp_path / "j" / "out" / "report" / "index.html").read_text()
    shown = rows[int(mine.column("record_id")[0].as_py()[1:])]["text"].split()[:6]
    assert " ".join(shown) in " ".join(page.split()), "the page shows no removed text"


@pytest.mark.parametrize("what", ["vectors", "tokens", "tokens-exact"])
def test_numbers_as_json_lines_give_the_parquet_jobs_removals(tmp_path, what):
    """Embeddings (lists of floats, read as float32) near by cosine, token ids (lists of
    integers of any length) near by jaccard or exact alone: the same removals as in
    Parquet."""
    rng = np.random.default_rng(7)
    if what == "vectors":
        x = rng.normal(size=(600, 24)).astype(np.float32)
        x[300:340] = x[:40] + rng.normal(scale=1e-3, size=(40, 24)).astype(np.float32)
        x[340:360] = x[40:60]
        values = [v.tolist() for v in x]
        sets, cfg = (), {"input": {"dtype": "float32"},
                         "near": {"metric": "cosine", "threshold": 0.001}}
    else:
        ids = token_ids(crawl_corpus()[:300])
        values = [t.tolist() for t in ids] + [t.tolist() for t in ids[:20]]
        sets = ("near=null",) if what == "tokens-exact" else ()
        cfg = {} if what == "tokens-exact" else {"near": {"metric": "jaccard",
                                                          "threshold": 0.8}}
    rows = [{"id": f"r{i}", "v": v} for i, v in enumerate(values)]
    mine, theirs, files = _twin_jobs(tmp_path, rows, "v", *sets, **cfg)
    assert mine.equals(theirs) and mine.num_rows >= 20
    _kept_lines(files, set(mine.column("record_id").to_pylist()))


BAD = {  # a line, and the reason the job gives it
    b'{"id": "x1", "text": 5}': "field 'text' is a number, not a string as in the first lines",
    b'{"id": "x2", "text": ["a", "b"]}': "field 'text' is a list, not a string",
    b'{"id": "x3" "text": "a"}': "not a JSON line (JSONDecodeError: Expecting ',' delimiter",
    b'["x4", "a"]': "the line is a list, not a JSON object",
    b'{"id": "x5", "text": "a"} {"id": "x6", "text": "b"}': "not a JSON line (JSONDecodeError: "
                                                          "Extra data",
    b'{"id": "x7"}': "column 'text': null (no text)",
    b'{"id": "x8", "text": "caf\xe9 au lait"}': "not UTF-8 text",
}


def test_bad_lines_are_invalid_records_and_their_neighbours_are_read(tmp_path):
    """Bad lines among good ones (another type, not JSON, an array, two objects on a
    line, no text, Latin-1 bytes), blank lines, CRLF endings and no newline at the end:
    each bad line is one invalid record with its reason, at its position; every good
    line is read; read = kept + removed + invalid; the clean copy keeps the blank lines
    and the good lines byte for byte, and not the bad ones. A gzip file cut short: its
    lines up to the cut are read, the rest is one invalid record."""
    texts = package_texts(110)
    good = [json.dumps({"id": f"g{i}", "text": t}).encode() for i, t in enumerate(texts[:80])]
    good[40] = good[3].replace(b'"g3"', b'"g40"')  # an exact copy of g3
    lines, expect = [], {}
    for i, line in enumerate(good):
        lines.append(line + (b"\r" if i % 7 == 0 else b""))
        if i % 10 == 5 and i // 10 < len(BAD) - 2:
            bad = list(BAD)[i // 10]
            expect[len([x for x in lines if x.strip()])] = BAD[bad]
            lines.append(bad)
        if i % 13 == 0:
            lines.append(b"   ")
    for bad in list(BAD)[len(expect):]:  # the rest of the kinds, at the end
        expect[len([x for x in lines if x.strip()])] = BAD[bad]
        lines.append(bad)
    lines.append(json.dumps({"id": "last", "text": texts[0][::-1]}).encode())
    src = tmp_path / "in" / "docs.jsonl"
    src.parent.mkdir()
    src.write_bytes(b"\n".join(lines))  # no newline after the last line
    others = [json.dumps({"id": f"c{i}", "text": t}).encode() for i, t in enumerate(texts[80:])]
    whole = gzip.compress(b"\n".join(others) + b"\n")
    (tmp_path / "in" / "cut.jsonl.gz").write_bytes(whole[:len(whole) * 2 // 3])
    assert run_job(tmp_path, "jsonl", str(tmp_path / "in" / "*"), "max_invalid_fraction=0.5",
                   input={"tensor": "text", "decode": "text", "id": "id"}) == 0
    dups, invalid = report(tmp_path)
    mine = {r["record_id"]: r["reason"] for r in invalid.to_pylist()
            if r["source"] == str(src)}
    assert len(mine) == len(BAD) == len(expect)
    for position, why in expect.items():  # a line whose id is read is named by it
        named = {"column 'text': null (no text)": "x7", "not UTF-8 text": "x8"}.get(why)
        assert why in mine[named or f"{src}:{position}"], (position, mine)
    cut = [r for r in invalid.to_pylist() if r["source"].endswith(".gz")]
    assert len(cut) == 1 and "cannot be read from here on" in cut[0]["reason"]
    summary = json.loads((tmp_path / "out" / "report" / "summary.json").read_text())
    at_cut = next(f for f in summary["files"] if f["input"].endswith(".gz"))
    assert 0 < at_cut["kept"] < len(others) and at_cut["read"] == at_cut["kept"] + 1
    assert summary["read"] == len(good) + 1 + len(BAD) + at_cut["read"] == \
        summary["kept"] + summary["removed_exact"] + summary["invalid"]
    assert dups.column("record_id").to_pylist() == ["g40"]
    kept = [json.loads(line)["id"] for line in _raw(
        tmp_path / "out" / "clean" / "cut.jsonl.gz").splitlines()]
    assert kept == [f"c{i}" for i in range(at_cut["kept"])]
    out = (tmp_path / "out" / "clean" / "docs.jsonl").read_bytes()
    assert out == b"\n".join(line for line in lines if line not in BAD and
                             not line.startswith(b'{"id": "g40"'))


@pytest.mark.parametrize("tensor", ["doc.body", "src.body", "messages"])
def test_nested_fields_and_chat_messages_are_read(tmp_path, tensor):
    """A text inside an object (``doc.body``, as Table.flatten names it), a top-level key
    with a dot in it (``"src.body"``: not looked for inside a ``src`` object) and a chat's
    messages (a list of role/content objects, read as their texts): the removals of the
    same texts as a top-level field (for messages: the same rows in Parquet), a planted
    copy among them; the copy's lines are the others' lines."""
    texts = package_texts(20)
    texts.append(texts[4].replace(" the ", " a ", 1))
    rows = [{"id": f"r{i}", "body": t, "doc": {"lang": "en", "body": t}, "src.body": t,
             "messages": [{"role": "user", "content": t[:200]},
                          {"role": "assistant", "content": t[200:]}]}
            for i, t in enumerate(texts)]
    src = tmp_path / "j" / "in" / "chat.jsonl"
    src.parent.mkdir(parents=True)
    _write_lines(src, rows, "")
    (tmp_path / "p").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "p" / "chat.parquet")
    twin = ("jsonl", str(src), "body") if tensor.endswith(".body") else (
        "parquet", str(tmp_path / "p" / "chat.parquet"), "messages")
    got = []
    for where, (fmt, path, field) in (("j", ("jsonl", str(src), tensor)), ("p", twin)):
        assert run_job(tmp_path / where, fmt, path, near={"metric": "jaccard", "threshold": 0.8},
                       input={"tensor": field, "decode": "text"}) == 0
        dups, invalid = report(tmp_path / where)
        assert invalid.num_rows == 0
        got.append([(d["record_id"], d["duplicate_of"], d["kind"]) for d in dups.to_pylist()])
    assert got[0] == got[1] and ("r20", "r4", "near") in got[0]
    _kept_lines([src], {r for r, _, _ in got[0]})


@pytest.mark.parametrize("lines", [0, 64, 128, 130])
def test_files_read_in_whole_chunks_and_empty_ones(tmp_path, lines):
    """A file of a multiple of the chunk's rows (the last block ends the file), an empty
    file and one of blank lines only: every line read once, in order, as the format's
    reader and its clean copy count them (the reader had recursed without end on the
    empty block after a full one)."""
    from transforms.io.formats import jsonl
    from transforms.io.formats.base import TensorSpec, Unit

    path = tmp_path / "x.jsonl"
    path.write_text("".join(json.dumps({"id": f"r{i}", "v": [i, i + 1]}) + "\n"
                            for i in range(lines)) or "\n \n")
    spec = jsonl.check(str(path), TensorSpec("v", id="id"))
    chunks = list(jsonl.read(Unit(0, str(path)), spec, 64))
    assert [c.positions.tolist() for c in chunks] == [
        list(range(a, min(a + 64, lines))) for a in range(0, lines, 64)]
    assert np.concatenate([c.tensors for c in chunks] or [np.zeros((0, 2))]).tolist() == [
        [i, i + 1] for i in range(lines)]
    assert jsonl.write(str(path), str(tmp_path / "y.jsonl"), np.array([1, 3])) == max(
        0, lines - 2)


def test_an_empty_first_file_does_not_stand_for_the_input(tmp_path):
    """A store's second run whose first file is empty (input.dtype given, no shape): the
    empty file tells no shape, so the run takes the next file's and meets the store's
    settings (it was refused: "store [8], this run null"); the first run's records are
    found in the store."""
    x = np.random.default_rng(3).normal(size=(40, 8)).astype(np.float32)
    for k, (names, rows) in enumerate(((["a"], x[:30]), (["0-empty", "b"], x[20:]))):
        folder = tmp_path / f"in{k}"
        folder.mkdir()
        (tmp_path / f"run{k}").mkdir()
        for name in names:
            part = rows if name != "0-empty" else rows[:0]
            (folder / f"{name}.jsonl").write_text("".join(
                json.dumps({"id": f"r{i}-{k}", "v": v.tolist()}) + "\n"
                for i, v in enumerate(part)))
        assert run_job(tmp_path / f"run{k}", "jsonl", str(folder / "*.jsonl"),
                       f"store.path={tmp_path / 'store'}", f"run_id=run{k}",
                       input={"tensor": "v", "dtype": "float32"}) == 0
    summary = json.loads((tmp_path / "run1" / "out" / "report" / "summary.json").read_text())
    assert summary["removed_store_exact"] == 10 and summary["kept"] == 10
