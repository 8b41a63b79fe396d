"""near.metric: jaccard on real texts (the licence and METADATA files of the installed
packages, edited as crawls edit) and real token ids (all-MiniLM-L6-v2's tokenizer),
against a brute-force oracle in exact fractions (tests/textkit.py): the exact join
equals it, bounded mode keeps its recall with precision 1.0, crowds cost linear work,
and the job writes what the kernel decides, from Parquet, TFRecord and HDF5.
"""

from __future__ import annotations

import json
import re
import sysconfig
import tracemalloc
from fractions import Fraction
from pathlib import Path

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from pipeline.run import main
from tests.textkit import CROWD, edited, lsh_misses_allowed, oracle, package_texts
from transforms.near import sets as sets_module
from transforms.near.components import component_labels
from transforms.near.sets import (
    PAIR_GROUP,
    POOL_CAP,
    Sets,
    Shingles,
    blank_rows,
    brute_force_sets,
    find_near_sets,
    first_shared,
    frequent_tokens,
    group_pairs,
    jaccard,
    linked_members,
    lsh_params,
    members_of,
    near_sets,
    pair_jaccards,
    prefix_tokens,
    record_sets,
    text_sets,
)


def _survivors(values: list) -> list[int]:
    """First occurrence of each distinct record (what exact dedup keeps)."""
    seen, out = set(), []
    for i, v in enumerate(values):
        k = v if isinstance(v, str) else v.tobytes()
        if k not in seen:
            seen.add(k)
            out.append(i)
    return out


def _values(unit: str, corpus, tokens) -> list:
    """Characters: the texts' first 1,500 (24-grams of each character: big sets, and the
    oracle compares every pair in Python)."""
    return tokens if unit == "token" else [t[:1500] for t in corpus] if unit == "char" else corpus


@pytest.mark.parametrize("grouping", ["representative", "components"])
@pytest.mark.parametrize("unit", ["word", "char", "token"])
def test_the_exact_join_equals_the_oracle(corpus, tokens, unit, grouping):
    values = _values(unit, corpus, tokens)
    keep = _survivors(values)
    sh = Shingles(unit)
    sets = record_sets([values[i] for i in keep], sh)
    assert not sets.empty.any()
    want = oracle(sets, 0.8, grouping)
    got = near_sets(sets, np.arange(len(sets)), 0.8, sh, mode="exact", grouping=grouping)
    assert got.largest >= CROWD // 2  # the crowd met as one group
    assert {int(r): int(k) for r, k in zip(got.removed, got.kept, strict=True)} == {
        r: k for r, (k, _) in want.items()}
    for r, j in zip(got.removed.tolist(), got.j.tolist(), strict=True):
        assert j == pytest.approx(float(want[r][1]), abs=1e-12)
    assert len(want) >= 40  # planted copies (and, for words, the crowd) were there to find
    if grouping == "components":  # chains: some removals below the threshold (reported)
        assert all(float(j) <= 1 for _, j in want.values())


@pytest.mark.parametrize("threshold", [0.7, 0.8, 0.9])
def test_bounded_mode_recall_and_precision(corpus, threshold):
    keep = _survivors(corpus)
    sh = Shingles("word", permutations=112, bands=14 if threshold == 0.8 else None)
    sets = record_sets([corpus[i] for i in keep], sh)
    want = oracle(sets, threshold)
    got = near_sets(sets, np.arange(len(sets)), threshold, sh, mode="bounded")
    removed = set(got.removed.tolist())
    missed = set(want) - removed
    assert len(missed) <= lsh_misses_allowed([j for _, j in want.values()],
                                             *lsh_params(threshold, 112, sh.bands))
    kept = set(range(len(sets))) - removed
    for r, k, j in zip(got.removed.tolist(), got.kept.tolist(), got.j.tolist(), strict=True):
        assert k in kept and k < r and j >= threshold  # precision 1.0: verified, earlier, kept
        assert Fraction(len(np.intersect1d(sets.row(r), sets.row(k))),
                        len(np.union1d(sets.row(r), sets.row(k)))) >= Fraction(str(threshold))


def test_a_crowd_costs_linear_work_and_decides_as_all_pairs():
    """800 copies of one licence with small edits (0.2-1% of words: boilerplate as crawls
    copy it; every pair a candidate): each member compared with the few records the crowd
    keeps, not with every other member (m x kept comparisons, not m^2 / 2), and the
    decisions of the brute force over all pairs."""
    rng = np.random.default_rng(7)
    text = package_texts(1, min_bytes=2000)[0][:4000]
    vocab = sorted(set(text.split()))
    docs = list(dict.fromkeys(edited(text, rng.uniform(0.002, 0.01), rng, vocab)
                              for _ in range(800)))  # exact copies: the exact stage's
    sh = Shingles("word")
    sets = record_sets(docs, sh)
    for mode in ("exact", "bounded"):
        got = near_sets(sets, np.arange(len(docs)), 0.8, sh, mode=mode)
        kept = len(docs) - len(got.removed)
        assert kept <= 10 and got.largest > len(docs) // 2
        assert got.compared <= len(docs) * kept, (mode, got.compared, kept)
        want = brute_force_sets(sets, np.arange(len(docs)), 0.8)
        assert dict(zip(got.removed.tolist(), got.kept.tolist(), strict=True)) == dict(
            zip(want.removed.tolist(), want.kept.tolist(), strict=True))


def test_a_crowd_that_differs_among_itself_costs_linear_work_in_bounded_mode():
    """2,000 copies of one licence at edit rates 2-6%: each within J >= 0.8 of the
    template but about half as near to each other, so greedy decisions keep 1,211 and
    every later copy had met all of them (m x kept: a 100,000-copy crowd ran for hours).
    Bounded mode offers each copy at most POOL_CAP kept records per group: linear work,
    every removal still verified, and most of the brute force's removals found."""
    sets, want, got = _licence_crowd(11, (0.02, 0.06), 2000, 0.8)
    assert len(sets) - len(want.removed) > 2 * POOL_CAP  # the crowd keeps many
    assert got.compared <= len(sets) * got.bands * POOL_CAP // 4, got.compared
    assert (got.j >= 0.8).all()
    assert len(np.intersect1d(got.removed, want.removed)) >= 0.95 * len(want.removed)


def _licence_crowd(seed: int, rates: tuple[float, float], m: int, threshold: float):
    """m copies of one real licence at edit rates drawn from ``rates`` (the distinct
    ones), and the brute force's and bounded mode's decisions at ``threshold``: (sets,
    want, got), every removal of ``got`` checked to be verified at J >= threshold."""
    rng = np.random.default_rng(seed)
    text = package_texts(1, min_bytes=2000)[0][:3000]
    vocab = sorted(set(text.split()))
    docs = list(dict.fromkeys(edited(text, rng.uniform(*rates), rng, vocab)
                              for _ in range(m)))
    sh = Shingles("word")
    sets = record_sets(docs, sh)
    rank = np.arange(len(docs))
    got = near_sets(sets, rank, threshold, sh, mode="bounded")
    assert all(jaccard(sets.row(r), sets.row(k)) >= threshold
               for r, k in zip(got.removed.tolist(), got.kept.tolist(), strict=True))
    return sets, brute_force_sets(sets, rank, threshold), got


def test_blank_short_and_normalised_records():
    sh = Shingles("word")
    values = ["", "   ", "!!! ...", "Hello", "hello!", "a b c", "a b c d", "ÉCOLE  École", None]
    assert blank_rows(values, sh).tolist() == [True, True, True, False, False, False, False,
                                               False, True]
    sets = record_sets(values[3:8], sh)
    # shorter than a shingle: one shingle of what they have; NFKC + lower case + punctuation
    assert jaccard(sets.row(0), sets.row(1)) == 1.0
    assert jaccard(sets.row(2), sets.row(3)) == 0.0
    assert len(sets.row(4)) == 1
    raw = record_sets(values[3:5], Shingles("word", normalize=False))
    assert jaccard(raw.row(0), raw.row(1)) == 0.0
    assert blank_rows([np.zeros(0, np.int32), np.arange(3)], Shingles("token")).tolist() == [
        True, False]
    # NFKC (composed): a voiced kana stays one character, a decomposed accent composes
    assert find_near_sets(["ドア", "トア"], np.arange(2), 0.6, Shingles("word", 1),
                          mode="exact").removed.size == 0
    accents = record_sets(["école", "e\u0301cole"], sh)
    assert jaccard(accents.row(0), accents.row(1)) == 1.0
    # Chinese and Japanese have no spaces: each ideograph or kana is a word
    cjk = record_sets(["今天天气很好，我们去公园散步吧。", "今天天气很好，我们去公园散步。"], sh)
    assert cjk.sizes.tolist() == [10, 9] and jaccard(cjk.row(0), cjk.row(1)) == 9 / 10


@pytest.mark.parametrize("invisible", ["\u00ad", "\u200b", "\u200c", "\u200d", "\u2060",
                                       "\ufeff", "\u200f"])
def test_invisible_format_characters_do_not_split_words(corpus, invisible):
    """Soft hyphens (HTML &shy; in scraped news and e-books), zero-width spaces and
    joiners, the word joiner, a BOM, direction marks: NFKC keeps them and each split a
    word, so a copy with one in every third word was no near copy (J 0.02-0.49). They
    are dropped by normalize, in words and in characters."""
    text = next(t for t in corpus if t.isascii() and len(t.split()) > 40)
    words = text.split()
    other = " ".join(w[:len(w) // 2] + invisible + w[len(w) // 2:] if k % 3 == 0 else w
                     for k, w in enumerate(words))
    for sh in (Shingles("word"), Shingles("char")):
        sets = record_sets([text, other], sh)
        assert jaccard(sets.row(0), sets.row(1)) == 1.0, sh
    assert blank_rows([invisible * 3], Shingles("word")).tolist() == [True]
    raw = record_sets([text, other], Shingles("word", normalize=False))
    assert jaccard(raw.row(0), raw.row(1)) < 1.0  # as stored: another text


def test_emoji_only_texts_have_no_word_and_emoji_are_no_words():
    """The emoji presentation selector U+FE0F is a mark (Mn): after an emoji it made a
    word of its own, so every emoji-only text was the word "\ufe0f" and all of them near
    copies of each other at J 1 (a sweep: "🔥❤️🔥" removed as a copy of "❤️"). A mark
    with no letter or digit before it is no word: such texts have nothing to compare
    (invalid, as "★★★★☆" was), and an emoji inside a text is no word. Characters too:
    the selector alone was a text of one character there."""
    sh = Shingles("word")
    emoji = ["❤️", "🔥❤️🔥", "👍 ❤️ 🎉", "✔️", "⚠️ ⚠️", "★★★★☆", "\u0301\u0302"]
    assert blank_rows(emoji, sh).tolist() == [True] * len(emoji)
    assert blank_rows(emoji, Shingles("char")).tolist() == [True] * len(emoji)  # symbols
    sets = record_sets(["I ❤️ NY and you", "I NY and you", "école", "e\u0301cole", "1️⃣ 2️⃣"],
                       sh)
    assert jaccard(sets.row(0), sets.row(1)) == 1.0
    assert jaccard(sets.row(2), sets.row(3)) == 1.0  # a mark after its letter stays
    assert not blank_rows(["1️⃣ 2️⃣"], sh)[0] and len(sets.row(4)) == 1
    found = find_near_sets(["❤️ a", "🔥 a"], np.arange(2), 0.8, Shingles("word", 1),
                           mode="exact")
    assert found.removed.tolist() == [1]  # the word "a" is what they share


@pytest.mark.parametrize("space", ["\u00a0", "\u2003", "\u3000", "\v", "\u2028", "\x85",
                                   "\x1c"])
def test_unicode_whitespace_separates_words_and_collapses(corpus, space):
    """Where whitespace decides (words without normalizing, char units), Python's idea of
    it: RE2's \\s is ASCII only, so a no-break space, an em space, a line separator
    joined the words around it (J 0 for a text against itself with other spaces)."""
    text = next(t for t in corpus if t.isascii() and len(t.split()) > 40)
    other = text.replace(" ", space)
    assert other.split() == text.split()
    for sh in (Shingles("word", normalize=False), Shingles("char"), Shingles("word")):
        sets = record_sets([text, other, space * 3], sh)
        assert jaccard(sets.row(0), sets.row(1)) == 1.0, sh
        assert blank_rows([space * 3], sh).tolist() == [True]


def test_word_shingles_are_the_words_5_grams(corpus):
    """The hashed sets give the Jaccard of the plain 5-gram sets (ASCII texts, split as
    the docs say: runs of letters and digits, lower case)."""
    import re

    texts = [t for t in corpus[:60] if t.isascii()]
    sets = record_sets(texts, Shingles("word"))

    def grams(t: str) -> set:
        w = [x for x in re.split(r"[^0-9a-z]+", t.lower()) if x]
        return {tuple(w[i:i + 5]) for i in range(max(1, len(w) - 4))}

    for a in range(0, len(texts) - 1, 3):
        b = a + 1
        ga, gb = grams(texts[a]), grams(texts[b])
        assert jaccard(sets.row(a), sets.row(b)) == pytest.approx(
            len(ga & gb) / len(ga | gb), abs=1e-12)


# ----------------------------------------------------------------------------- the job


def _write(fmt: str, path: Path, ids: list[str], values: list) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = isinstance(values[0], str)
    if fmt == "parquet":
        col = (pa.array(values, pa.string()) if text
               else pa.array([v.tolist() for v in values], pa.list_(pa.int32())))
        pq.write_table(pa.table({"id": ids, "doc": col}), path, row_group_size=100)
    elif fmt == "tfrecord":
        import tensorflow as tf

        with tf.io.TFRecordWriter(str(path)) as w:
            for i, v in zip(ids, values, strict=True):
                doc = (tf.train.Feature(bytes_list=tf.train.BytesList(value=[v.encode()]))
                       if text else
                       tf.train.Feature(int64_list=tf.train.Int64List(value=v.tolist())))
                feat = {"id": tf.train.Feature(bytes_list=tf.train.BytesList(value=[i.encode()])),
                        "doc": doc}
                w.write(tf.train.Example(features=tf.train.Features(feature=feat))
                        .SerializeToString())
    else:
        with h5py.File(path, "w") as h:
            if text:
                h.create_dataset("doc", data=values, dtype=h5py.string_dtype())
            else:
                d = h.create_dataset("doc", (len(values),), dtype=h5py.vlen_dtype(np.int32))
                for k, v in enumerate(values):
                    d[k] = v
            h.create_dataset("id", data=[i.encode() for i in ids])


EXT = {"parquet": "parquet", "tfrecord": "tfrecord", "hdf5": "h5"}


def _job(tmp: Path, fmt: str, values: list, near: dict | None, files: int = 2, **extra
         ) -> dict:
    """``values`` split over ``files`` files; runs the CLI; returns summary.json."""
    ids = [f"doc{i}" for i in range(len(values))]
    for f, part in enumerate(np.array_split(np.arange(len(values)), files)):
        _write(fmt, tmp / "in" / f"part{f}.{EXT[fmt]}", [ids[i] for i in part],
               [values[i] for i in part])
    text = isinstance(values[0], str)
    cfg = {"input": {"format": fmt, "path": str(tmp / "in" / f"*.{EXT[fmt]}"), "tensor": "doc",
                     "id": "id", **({"decode": "text"} if text else {})},
           "output": {"path": str(tmp / "out")}, "report": str(tmp / "report"),
           **({} if near is None else {"near": near}), **extra}
    (tmp / "job.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["--config", str(tmp / "job.yaml"), "--quiet"]) == 0
    return json.loads((tmp / "report" / "summary.json").read_text())


def _removals(tmp: Path) -> dict[str, tuple[str, str, float]]:
    t = pq.read_table(tmp / "report" / "duplicates.parquet").to_pylist()
    return {r["record_id"]: (r["duplicate_of"], r["kind"], r["distance"]) for r in t}


def _expected(values: list, threshold: float, unit: str, grouping: str = "representative",
              size: int | None = None) -> dict[str, tuple[str, str, float]]:
    """The oracle in the job's terms: exact copies first, then near over the survivors."""
    keep = _survivors(values)
    first = {}
    out = {}
    for i, v in enumerate(values):
        k = v if isinstance(v, str) else v.tobytes()
        if k in first:
            out[f"doc{i}"] = (f"doc{first[k]}", "exact", 0.0)
        else:
            first[k] = i
    sh = Shingles(unit) if size is None else Shingles(unit, size)
    sets = record_sets([values[i] for i in keep], sh)
    for r, (k, j) in oracle(sets, threshold, grouping).items():
        out[f"doc{keep[r]}"] = (f"doc{keep[k]}", "near", 1.0 - float(j))
    return out


def _same(got: dict, want: dict) -> None:
    assert {k: v[:2] for k, v in got.items()} == {k: v[:2] for k, v in want.items()}
    for k, v in got.items():
        assert v[2] == pytest.approx(want[k][2], abs=1e-9)


@pytest.mark.parametrize("column", ["dictionary", "string_view"])
def test_dictionary_and_view_text_columns_are_read_and_written_as_texts(tmp_path, corpus, column):
    """pandas writes categoricals as dictionaries; Arrow's newer writers string_view: the
    texts are the same, the output keeps the column's type (Arrow has no filter for
    views)."""
    values = corpus[:300]
    col = pa.array(values, pa.string())
    col = col.dictionary_encode() if column == "dictionary" else col.cast(pa.string_view())
    (tmp_path / "in").mkdir()
    table = pa.table({"id": [f"doc{i}" for i in range(len(values))], "doc": col,
                      "note": pa.array(values, pa.string_view())})
    pq.write_table(table, tmp_path / "in" / "part0.parquet", row_group_size=100)
    cfg = {"input": {"format": "parquet", "path": str(tmp_path / "in" / "*.parquet"),
                     "tensor": "doc", "id": "id", "decode": "text"},
           "output": {"path": str(tmp_path / "out")}, "report": str(tmp_path / "report"),
           "near": {"metric": "jaccard", "threshold": 0.8, "mode": "exact"}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["--config", str(tmp_path / "job.yaml"), "--quiet"]) == 0
    want = _expected(values, 0.8, "word")
    _same(_removals(tmp_path), want)
    out = pq.read_table(tmp_path / "out")
    assert out.schema == table.schema
    assert out.column("id").to_pylist() == [i for i in table.column("id").to_pylist()
                                            if i not in want]


def _joined(v) -> str:
    """A record's text as the job reads a list-of-texts column, in Python: texts depth
    first, a struct's by a line break, a list's items by a blank line, nulls, empty
    texts and other values (numbers) left out."""
    if isinstance(v, str):
        return v
    parts = v.values() if isinstance(v, dict) else v if isinstance(v, list) else []
    return ("\n" if isinstance(v, dict) else "\n\n").join(
        t for t in (_joined(p) for p in parts if p is not None) if t)


@pytest.mark.parametrize("layout", ["chat", "multimodal", "strings", "fixed"])
def test_a_list_of_texts_is_one_text_per_record(tmp_path, corpus, layout):
    """Instruction sets store a conversation per record (``list<struct<role, content>>``,
    as Hugging Face chat datasets do; a multimodal one's content a list of parts) or a
    list of passages: each record's texts are joined (``_joined``) and compared as one
    text; a null list and an empty one are invalid records; the clean copy keeps the
    column as stored."""
    n = 240
    part = pa.struct([("type", pa.string()), ("text", pa.string()), ("image", pa.binary())])
    item = pa.struct([("role", pa.string()), ("turn", pa.int32()),
                      ("content", pa.list_(part) if layout == "multimodal"
                       else pa.large_string())])
    rows = []
    for i in range(n):
        body = corpus[i % 200]  # records 200.. repeat 0..39: exact copies
        if layout in ("chat", "multimodal"):
            ask = f"Question {i % 200 % 7}: what?"
            answer = body
            if layout == "multimodal":  # a picture in between: bytes, no text
                ask = [{"type": "text", "text": ask, "image": None},
                       {"type": "image", "text": None, "image": b"\x89PNG"}]
                answer = [{"type": "text", "text": body, "image": None}]
            rows.append([{"role": "user", "turn": 0, "content": ask},
                         {"role": None if i % 200 % 5 == 0 else "assistant", "turn": 1,
                          "content": answer}])
        else:
            rows.append([body[: len(body) // 2], None if i % 3 else "", body[len(body) // 2:]])
    # invalid: a null list and an empty one (a fixed size's: items null or empty; pyarrow
    # 25 cannot read a null fixed-size list back from Parquet)
    rows[17], rows[18] = (None, []) if layout != "fixed" else ([None] * 3, [""] * 3)
    texts = [None if r is None else _joined(r) for r in rows]
    t = (pa.list_(pa.string()) if layout == "strings" else pa.list_(pa.string(), 3)
         if layout == "fixed" else pa.list_(item))
    table = pa.table({"id": [f"doc{i}" for i in range(n)], "doc": pa.array(rows, t)})
    (tmp_path / "in").mkdir()
    pq.write_table(table, tmp_path / "in" / "part0.parquet", row_group_size=100)
    cfg = {"input": {"format": "parquet", "path": str(tmp_path / "in" / "*.parquet"),
                     "tensor": "doc", "id": "id", "decode": "text"},
           "output": {"path": str(tmp_path / "out")}, "report": str(tmp_path / "report"),
           "near": {"metric": "jaccard", "threshold": 0.8, "mode": "exact"},
           "max_invalid_fraction": 0.5}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["--config", str(tmp_path / "job.yaml"), "--quiet"]) == 0
    s = json.loads((tmp_path / "report" / "summary.json").read_text())
    valid = [i for i in range(n) if i not in (17, 18)]
    want = {f"doc{valid[int(k[3:])]}": (f"doc{valid[int(v[0][3:])]}", *v[1:])
            for k, v in _expected([texts[i] for i in valid], 0.8, "word").items()}
    assert s["invalid"] == 2 and s["removed_exact"] >= 35 and s["removed_near"] > 0
    _same(_removals(tmp_path), want)
    bad = pq.read_table(tmp_path / "report" / "invalid.parquet").to_pylist()
    assert sorted(r["record_id"] for r in bad) == ["doc17", "doc18"]
    out = pq.read_table(tmp_path / "out")
    assert out.schema == table.schema
    assert out.column("doc").to_pylist() == [rows[i] for i in valid
                                             if f"doc{i}" not in want]


@pytest.mark.parametrize("fmt,unit", [("parquet", "word"), ("tfrecord", "char"),
                                      ("hdf5", "word"), ("parquet", "token"),
                                      ("tfrecord", "token"), ("hdf5", "token")])
def test_the_job_in_exact_mode_writes_the_oracle(tmp_path, corpus, tokens, fmt, unit):
    values = _values(unit, corpus, tokens)
    near = {"metric": "jaccard", "threshold": 0.8, "mode": "exact"}
    if unit == "char":
        near["shingles"] = {"unit": "char"}
    s = _job(tmp_path, fmt, values, near)
    assert s["read"] == s["kept"] + s["removed_exact"] + s["removed_near"] + s["invalid"]
    assert s["invalid"] == 0 and s["near"]["mode"] == "exact"
    assert (s["near"]["unit"], s["near"]["size"]) == (unit, 24 if unit == "char" else 5)
    settings = s["near"]["settings"]  # as resolved, and only the keys that apply
    assert settings["shingles"]["unit"] == unit and "probes" not in settings
    _same(_removals(tmp_path), _expected(values, 0.8, unit))
    assert s["near"]["recall"]["recall"] == 1.0


def test_a_key_shard_of_crowds_only_equals_the_oracle(tmp_path):
    """Bags of tokens (1-grams) from a 35-token vocabulary, with copies and one-token
    edits: every prefix hash is shared by more than PAIR_GROUP records, so the job's key
    shards hold crowds only (it failed with an IndexError there, found by
    scripts/fuzz_megatron.py): the oracle's decisions."""
    rng = np.random.default_rng(9)
    values: list[np.ndarray] = []
    for _ in range(300):
        if values and rng.random() < 0.3:
            v = values[int(rng.integers(len(values)))].copy()
            v[int(rng.integers(len(v)))] = rng.integers(0, 35)
        else:
            v = rng.integers(0, 35, int(rng.integers(1, 60))).astype(np.int32)
        values.append(v)
    near = {"metric": "jaccard", "threshold": 0.7, "mode": "exact",
            "shingles": {"unit": "token", "size": 1}}
    s = _job(tmp_path, "parquet", values, near)
    assert s["near"]["largest_group"] > PAIR_GROUP and s["removed_near"] > 0
    _same(_removals(tmp_path), _expected(values, 0.7, "token", size=1))


def test_token_windows_of_one_length_in_hdf5_are_written_back(tmp_path, tokens):
    """Pre-tokenized shards hold windows of one length in a variable-length dataset: h5py
    turned a block of such rows into a 2-d array and refused to write it (the job failed
    at its last step). The clean files hold exactly the records the oracle keeps."""
    rng = np.random.default_rng(5)
    values = [t[:64].astype(np.int32) for t in tokens if len(t) >= 64]
    for i in range(0, len(values), 4):  # near copies: 2 of 64 tokens changed
        v = values[i].copy()
        v[rng.choice(64, 2, replace=False)] = 7
        values.append(v)
    s = _job(tmp_path, "hdf5", values, {"metric": "jaccard", "threshold": 0.8,
                                        "mode": "exact"})
    want = _expected(values, 0.8, "token")
    _same(_removals(tmp_path), want)
    assert s["removed_near"] > 10
    kept = {}
    for f in sorted((tmp_path / "out").glob("*.h5")):
        with h5py.File(f, "r") as h:
            kept.update(zip((i.decode() for i in h["id"][:]), h["doc"][:], strict=True))
    assert sorted(kept) == sorted(f"doc{i}" for i in range(len(values))
                                  if f"doc{i}" not in want)
    for k, v in kept.items():
        np.testing.assert_array_equal(v, values[int(k[3:])])


@pytest.mark.parametrize("fmt", ["parquet", "hdf5", "tfrecord"])
def test_exact_dedup_of_token_sequences_in_every_format(tmp_path, tokens, fmt):
    """Token shards deduplicated exactly, without near: an HDF5 variable-length dataset
    and a TFRecord int64_list of several lengths were refused ("near.metric: jaccard
    compares them", "set input.shape") where a Parquet list<int32> column ran. The
    removals are the exact oracle's in each format (a copy cut one token short is not an
    exact copy), and the clean files, read back by pyarrow, h5py and tf.data, hold the
    rest."""
    rng = np.random.default_rng(9)
    values = [t.astype(np.int32) for t in tokens[:240]]
    values += [values[i].copy() for i in rng.choice(240, 40, replace=False)]  # exact copies
    values += [values[i][:-1].copy() for i in range(0, 240, 30) if len(values[i]) > 1]
    values = [values[i] for i in rng.permutation(len(values))]
    summary = _job(tmp_path, fmt, values, None)
    want = {k: v for k, v in _expected(values, 0.8, "token").items() if v[1] == "exact"}
    _same(_removals(tmp_path), want)
    assert summary["removed_exact"] == len(want) >= 30 and summary["invalid"] == 0
    ids = []
    for f in sorted((tmp_path / "out").glob(f"*.{EXT[fmt]}")):
        if fmt == "parquet":
            ids += pq.read_table(f).column("id").to_pylist()
        elif fmt == "hdf5":
            with h5py.File(f, "r") as h:
                ids += [i.decode() for i in h["id"][:]]
        else:
            import tensorflow as tf

            one = {"id": tf.io.FixedLenFeature([], tf.string)}
            ids += [tf.io.parse_single_example(r, one)["id"].numpy().decode()
                    for r in tf.data.TFRecordDataset(str(f))]
    assert ids == [f"doc{i}" for i in range(len(values)) if f"doc{i}" not in want]


def test_a_reference_set_of_token_sequences_without_near(tmp_path, tokens, capsys):
    """Exact leaks of a reference shard of token ids (HDF5, variable length) removed from
    an HDF5 input; a TFRecord input (int64) against it is refused in one line that says
    what each holds ('int32 tensors of shape []' before)."""
    values = list({t.tobytes(): t for t in (t.astype(np.int32) for t in tokens)}.values())[:120]
    _write("hdf5", tmp_path / "ref" / "r.h5", [f"ref{i}" for i in range(40)], values[:40])
    ref = [{"format": "hdf5", "path": str(tmp_path / "ref" / "*.h5"), "tensor": "doc"}]
    summary = _job(tmp_path / "h", "hdf5", values, None, reference=ref)
    assert summary["removed_reference_exact"] == 40 and summary["kept"] == 80
    for f, part in enumerate(np.array_split(np.arange(120), 2)):
        _write("tfrecord", tmp_path / "t" / "in" / f"part{f}.tfrecord",
               [f"doc{i}" for i in part], [values[i] for i in part])
    cfg = {"input": {"format": "tfrecord", "path": str(tmp_path / "t" / "in" / "*.tfrecord"),
                     "tensor": "doc", "id": "id"}, "reference": ref,
           "output": {"path": str(tmp_path / "t" / "out")}, "report": str(tmp_path / "t" / "r")}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["--config", str(tmp_path / "t.yaml"), "--quiet"]) == 2
    assert capsys.readouterr().err.strip().endswith(
        "holds sequences of int32, the input sequences of int64: no record could match; "
        "use a reference set of the input's dtype and size")


def test_the_recall_check_of_a_crowd_of_long_texts_is_bounded(tmp_path, corpus, monkeypatch):
    """The recall brute force caps what a sampled member of a crowd of long texts lists
    (a spread of its prefix tokens) and verifies (fewer candidates for longer texts):
    without caps that took most of a job's time at 1,000 copies of a 3,600-word text.
    Here the caps bind (a 3,000-word text's prefix lists the chunk's crowd some 600
    times); the crowd's sampled members still find their partners and the judgement
    stays the uncapped run's."""
    from pipeline.steps import near_sets

    long_text = " ".join(t for t in corpus[:40] if t.isascii())  # real text, 3,000+ words
    vocab = sorted(set(long_text.split()))
    rng = np.random.default_rng(5)
    texts = [edited(long_text, 0.01, rng, vocab) for _ in range(200)] + corpus[:100]
    texts = [texts[i] for i in rng.permutation(len(texts))]
    near = {"metric": "jaccard", "threshold": 0.8, "recall_sample": 400}
    verified: list[int] = []
    overlaps = near_sets.overlaps

    def counted(sets, x, cands):
        verified.append((len(x), len(cands)))
        return overlaps(sets, x, cands)

    monkeypatch.setattr(near_sets, "overlaps", counted)
    one = {"runner": {"workers": 1}}  # in this process: the caps below apply
    monkeypatch.setattr(near_sets, "TRUTH_LISTED", 1 << 40)  # no caps
    monkeypatch.setattr(near_sets, "TRUTH_HASHES", 1 << 40)
    full = _job(tmp_path / "full", "parquet", texts, near, **one)["near"]["recall"]
    uncapped, verified[:] = list(verified), []
    monkeypatch.setattr(near_sets, "TRUTH_LISTED", 2048)
    monkeypatch.setattr(near_sets, "TRUTH_HASHES", 10 * len(long_text.split()))
    capped = _job(tmp_path / "capped", "parquet", texts, near, **one)["near"]["recall"]
    assert len(long_text.split()) > 3000 and full["with_partners"] > 100
    # the crowd's members (their sets: ~6,800 shingles); a short sampled text may verify
    # more, by design: its cap is TRUTH_HASHES over its own size
    crowd = [n for size, n in verified if size > 3000]
    assert max(n for size, n in uncapped if size > 3000) > 50
    assert 0 < max(crowd) <= near_sets.PARTNERS
    for k in ("sampled", "with_partners", "recalled", "recall"):
        assert capped[k] == full[k], k


def test_components_grouping_in_the_job(tmp_path, corpus):
    near = {"metric": "jaccard", "threshold": 0.8, "mode": "exact", "grouping": "components"}
    _job(tmp_path, "parquet", corpus, near)
    _same(_removals(tmp_path), _expected(corpus, 0.8, "word", "components"))


def _mosaics(n: int, rng: np.random.Generator) -> list[str]:
    """Texts made of three real paragraphs each, drawn from one pool: no two are near
    (sharing one paragraph of three is J ~ 0.2), but every shingle occurs in several
    texts, so each text's prefix tokens are shared and the prefix groups link them all."""
    paras = sorted({q.strip() for t in package_texts(120) for q in t.split("\n\n")
                    if len(q.split()) >= 30})[:60]
    return [" ".join(paras[int(k)] for k in rng.choice(len(paras), 3, replace=False)) + f" {i}"
            for i in range(n)]


@pytest.mark.parametrize("grouping", ["representative", "components"])
def test_exact_join_links_only_verified_pairs(tmp_path, grouping):
    """Exact mode: the records the prefix groups put together (here every text) are not
    decided as one component: a group of at most PAIR_GROUP records has its pairs
    verified where it is found, and only pairs at J >= threshold (and crowd groups)
    link records. The decisions equal the oracle's; the records decided are those with
    a near partner, and the components are the near clusters."""
    rng = np.random.default_rng(5)
    docs = _mosaics(400, rng)
    vocab = sorted({w for t in docs for w in t.split()})
    sources = rng.choice(len(docs), 40, replace=False)
    docs += [edited(docs[int(i)], 0.02, rng, vocab) for i in sources]
    rng.shuffle(docs)
    near = {"metric": "jaccard", "threshold": 0.8, "mode": "exact", "grouping": grouping}
    s = _job(tmp_path, "parquet", docs, near)
    want = _expected(docs, 0.8, "word", grouping)
    _same(_removals(tmp_path), want)
    keep = _survivors(docs)  # exact copies never reach the near stage
    sets = record_sets([docs[i] for i in keep], Shingles("word"))
    near_pairs = np.array([(a, b) for a in range(len(keep)) for b in range(a) if
                           jaccard(sets.row(a), sets.row(b)) >= 0.8])
    linked = np.unique(near_pairs)
    assert s["near"]["largest_group"] <= PAIR_GROUP < len(docs)  # pairs verified in groups
    assert s["near"]["candidate_groups"] > len(docs)  # the groups link every text ...
    assert s["near"]["records_searched"] == len(linked) < len(docs) // 4  # ... decided: not
    labels = component_labels(len(keep), near_pairs[:, 0], near_pairs[:, 1])
    assert s["near"]["components"] == len(np.unique(labels[linked]))


def test_membership_through_a_table_equals_numpys(corpus):
    """``members_of`` (the verification's hash lookups, through a probing table when many
    are asked of one set) answers as ``np.isin`` does: on real shingle sets against the
    corpus's hashes, and on sets made to collide (hashes equal in their low or high bits,
    a 0, the largest value), asked more and fewer times than the table pays."""
    sets = record_sets(corpus, Shingles("word"))
    rng = np.random.default_rng(3)
    cases = [(sets.row(i), sets.hashes) for i in rng.choice(len(corpus), 20)]
    for n in (1, 7, 300, 5000):
        for x in (np.arange(n, dtype=np.uint64) << np.uint64(40),  # one low-bit pattern
                  np.arange(n, dtype=np.uint64),  # small values, 0 among them
                  np.uint64(2 ** 64 - 1) - np.arange(n, dtype=np.uint64)):
            x = np.sort(x)
            for m in (n + 3, 8 * n + 4096):
                q = np.where(rng.random(m) < 0.5, x[rng.integers(0, n, m)],
                             rng.integers(0, 2 ** 64, m, dtype=np.uint64))
                q[:3] = (0, 2 ** 64 - 1, 1)
                cases.append((x, q))
    for x, q in cases:
        np.testing.assert_array_equal(members_of(x, q), np.isin(q, x))
    assert members_of(np.zeros(0, np.uint64), cases[0][1]).sum() == 0


def test_sets_gathered_from_parts_equal_their_concatenation_taken(corpus):
    """The Groups and Decide steps assemble records' sets read file by file with
    ``Sets.gather``: the same as concatenating the parts and taking the order."""
    texts = [*corpus, "", " ,;"]  # two records without a word
    sets = text_sets(texts, Shingles())
    n = len(texts)
    cuts = [0, 0, 1, n // 2, n - 1, n]  # an empty part, parts of one record, large ones
    parts = [sets.take(np.arange(a, b)) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    order = np.random.default_rng(5).permutation(len(texts))
    got, want = Sets.gather(parts, order), Sets.concat(parts).take(order)
    assert np.array_equal(got.offsets, want.offsets)
    assert np.array_equal(got.hashes, want.hashes)
    assert np.array_equal(got.empty, want.empty)
    assert got.empty.any() and np.array_equal(got.hashes, sets.take(order).hashes)


@pytest.mark.parametrize("unit", ["word", "char", "token"])
def test_sets_shingled_in_slices_equal_those_shingled_whole(corpus, tokens, unit, monkeypatch):
    """``record_sets`` cuts a chunk into slices of about SLICE_UNITS units: the sets are
    the same as of the chunk at once (a str list or an Arrow array; ragged and dense token
    sequences), with records without a unit and shorter than a shingle among them."""
    sh = Shingles(unit=unit)
    values = (list(tokens) + [np.zeros(0, np.int32), np.arange(3)] if unit == "token" else
              [*corpus, "", " ,;", "one", None])
    kinds = [values]
    if unit == "token":
        kinds.append(np.stack([t[:40] for t in tokens if len(t) >= 40]))
    else:
        kinds.append(pa.array(values, pa.large_string()))
    for vals in kinds:
        monkeypatch.setattr(sets_module, "SLICE_UNITS", 1 << 40)
        whole = record_sets(vals, sh)
        monkeypatch.setattr(sets_module, "SLICE_UNITS", 3_000)
        sliced = record_sets(vals, sh)
        assert np.array_equal(whole.offsets, sliced.offsets)
        assert np.array_equal(whole.hashes, sliced.hashes)
        assert np.array_equal(whole.empty, sliced.empty)
        assert whole.empty.any() or isinstance(vals, np.ndarray)  # the dense have no blank


@pytest.mark.parametrize("unit", ["word", "char", "token"])
def test_a_large_chunks_sets_take_memory_of_their_size_not_ten_times_it(unit):
    """24 MB of Python's own sources in one chunk (a chunk holds up to 64 MB of text):
    shingled at once, their n-grams, hashes, starts and sorted copies took 10x the result
    (word 199 MB for 19 MB of sets, char 946 MB for 120 MB, token 1.5 GB for 60 MB; on
    the job's 64 MB chunks of real text +612 MB per worker). In slices the numpy memory
    traced stays within the result twice (slices, then their concatenation) plus what one
    slice's work takes."""
    texts, size = [], 0
    for f in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        try:
            texts.append(f.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            continue
        size += len(texts[-1])
        if size > 24 << 20:
            break
    values = (texts if unit != "token" else
              [np.frombuffer(t.encode(), np.uint8).astype(np.int32) for t in texts])
    tracemalloc.start()
    try:
        got = record_sets(values, Shingles(unit=unit))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= 2 * got.hashes.nbytes + 64 * sets_module.SLICE_UNITS, (peak, got.hashes.nbytes)


def test_signatures_of_a_large_chunk_are_made_in_slices_of_records(monkeypatch):
    """MinHash signatures went over all of a chunk's shingles at once per permutation: a
    product and a shift per shingle, 3 arrays of 512 MB for char 24-grams of 64 MB of
    text. Now SLICE_UNITS shingles' worth of records at a time: numpy memory within the
    signatures plus a few slices' products, and the same values as the whole at once and
    as each record's minimum by hand."""
    from transforms.near.sets import _perm_coefficients, signatures

    rng = np.random.default_rng(3)
    sizes = rng.integers(1, 16_000, 1_000)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    sets = Sets(offsets, rng.integers(0, 2**64, int(offsets[-1]), np.uint64),
                np.zeros(len(sizes), bool))
    tracemalloc.start()
    try:
        got = signatures(sets, 8)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= got.nbytes + 24 * sets_module.SLICE_UNITS < sets.hashes.nbytes, peak
    monkeypatch.setattr(sets_module, "SLICE_UNITS", 1 << 40)
    assert np.array_equal(signatures(sets, 8), got)
    a, b = _perm_coefficients(8)
    for r in (0, 1, 999):
        with np.errstate(over="ignore"):
            want = [int(((sets.row(r) * a[i] + b[i]) >> np.uint64(32)).min()) for i in range(8)]
        assert got[r].tolist() == want


def test_pairs_of_groups_and_their_jaccards_are_exact(corpus):
    """``group_pairs`` lists each pair of co-members once, whatever groups repeat it;
    ``pair_jaccards`` equals the set Jaccard, also where two hashes share the 40 bits
    its lookup keys hold (hashes that differ in their last bits only)."""
    rng = np.random.default_rng(2)
    gid, member = rng.integers(0, 30, 600), rng.integers(0, 200, 600)
    want = {(min(a, b), max(a, b)) for g in range(30) for a in member[gid == g].tolist()
            for b in member[gid == g].tolist() if a != b}
    a, b = group_pairs(gid, member)
    assert list(zip(a.tolist(), b.tolist(), strict=True)) == sorted(want)
    sets = record_sets(corpus, Shingles("word"))
    n = len(sets)
    both = Sets.concat([sets, Sets(sets.offsets, np.concatenate(
        [np.sort(sets.row(i) ^ np.uint64(1)) for i in range(n)]))])
    a = np.r_[rng.integers(0, 2 * n, 5000), np.arange(n)]  # with each record's twin
    b = np.r_[rng.integers(0, 2 * n, 5000), np.arange(n) + n]
    got = pair_jaccards(both, a, b)
    assert np.array_equal(got, [jaccard(both.row(int(x)), both.row(int(y)))
                                for x, y in zip(a, b, strict=True)])
    assert (got >= 0.8).sum() > 100
    rec, tok = prefix_tokens(sets, 0.8, frequent_tokens(sets))  # each prefix in its order
    ordered = Sets(np.r_[0, np.cumsum(np.bincount(rec, minlength=n))], tok)
    a, b = rng.integers(0, n, 3000), rng.integers(0, n, 3000)
    first = first_shared(ordered, a, b)
    want = [next((t for t in ordered.row(x).tolist() if t in set(ordered.row(y).tolist())), 0)
            for x, y in zip(a.tolist(), b.tolist(), strict=True)]
    assert first.tolist() == want and np.array_equal(first_shared(ordered, b, a), first)
    assert (first != 0).sum() > 100


def test_a_groups_linked_members_are_those_with_a_near_partner(corpus):
    """``linked_members`` on groups of unrelated texts with near pairs and a few edited
    copies, in several orders: exactly the members with a partner at J >= t in the group
    (brute force over every pair). A group that is mostly a crowd of copies goes on
    whole, for a few comparisons per member."""
    rng = np.random.default_rng(4)
    vocab = sorted({w for t in corpus for w in t.split()})
    docs = corpus[:150] + [edited(corpus[0], rng.uniform(0, 0.01), rng, vocab)
                           for _ in range(250)]
    sets = record_sets(docs, Shingles("word"))
    n = len(docs)
    j = np.array([[jaccard(sets.row(a), sets.row(b)) for b in range(n)] for a in range(n)])
    np.fill_diagonal(j, 0)
    alone = np.flatnonzero((j[:150, :150] < 0.8).all(axis=1))  # near none of the texts
    paired = np.flatnonzero(~(j[:150, :150] < 0.8).all(axis=1))
    group = np.r_[alone[:80], paired[:20], np.arange(150, 170)]  # and 20 of the copies
    assert len(alone) >= 80 and len(paired) >= 20
    for seed in range(3):
        members = np.random.default_rng(seed).permutation(group)
        linked, compared = linked_members(members, sets, 0.8)
        assert np.array_equal(linked, (j[np.ix_(members, members)] >= 0.8).any(axis=1))
        assert 0 < linked.sum() < len(members) // 2
    crowd = np.random.default_rng(0).permutation(n)
    linked, compared = linked_members(crowd, sets, 0.8)
    assert linked.all() and len(compared) < 50 * PAIR_GROUP


def test_bounded_job_blank_records_and_the_report(tmp_path, corpus):
    values = corpus + ["", "   \n", "—"]
    near = {"metric": "jaccard", "threshold": 0.8, "mode": "bounded",
            "shingles": {"permutations": 112, "bands": 14}}
    s = _job(tmp_path, "parquet", values, near)
    assert s["invalid"] == 3
    bad = pq.read_table(tmp_path / "report" / "invalid.parquet").to_pylist()
    assert {b["record_id"] for b in bad} == {f"doc{len(corpus) + i}" for i in range(3)}
    assert all("no word to compare" in b["reason"] for b in bad)
    n = s["near"]
    assert (n["mode"], n["bands"], n["rows"]) == ("bounded", 14, 8)
    assert n["recall"]["recall"] >= 0.95
    got, want = _removals(tmp_path), _expected(corpus, 0.8, "word")
    near_want = {k for k, v in want.items() if v[1] == "near"}
    near_got = {k for k, v in got.items() if v[1] == "near"}
    assert len(near_want - near_got) <= lsh_misses_allowed(
        [1 - want[k][2] for k in near_want], 14, 8)
    kept = set(pq.read_table(tmp_path / "out" / "part0.parquet").column("id").to_pylist()
               + pq.read_table(tmp_path / "out" / "part1.parquet").column("id").to_pylist())
    for k, (dup, kind, d) in got.items():  # precision 1.0: every near removal's keeper kept
        assert k not in kept
        if kind == "near":  # (an exact copy names the record exact dedup kept)
            assert dup in kept and d <= 0.2 + 1e-12
    hist = json.loads((tmp_path / "report" / "near_distances.json").read_text())
    assert hist["metric"] == "jaccard" and hist["threshold_jaccard"] == 0.8
    near_j = sorted(1 - v[2] for v in got.values() if v[1] == "near")
    assert hist["removed"]["n"] == len(near_j) == s["removed_near"]
    assert sum(hist["removed"]["counts"][:80]) == 0  # every removal at J >= 0.8
    assert hist["verified"]["n"] == n["compared"] >= len(near_j)
    border = pq.read_table(tmp_path / "report" / "borderline_pairs.parquet").to_pylist()
    below = [1 - b["distance"] for b in border if not b["within"]]
    above = [1 - b["distance"] for b in border if b["within"]]
    assert below and max(below) < 0.8 <= min(above)  # near misses: candidates under t
    gaps = [abs(1 - b["distance"] - 0.8) for b in border]
    assert gaps == sorted(gaps)  # nearest the threshold first
    page = (tmp_path / "report" / "index.html").read_text()
    assert page.count("<mark>") >= 2  # the borderline pairs' texts, their edits marked
    assert "J &gt;= 0.8 (distance 1 - J &lt;= 0.2)" in page and "lower it" in page


def test_a_pair_of_texts_is_shown_from_its_first_difference_with_the_edits_marked():
    from pipeline.report.html import word_diff

    text = package_texts(1, min_bytes=2000)[0]
    words = text.split()
    edited_text = " ".join(words[:150] + ["INSERTED"] + words[150:160] + words[161:])
    a, b = word_diff(edited_text, text)
    assert a.startswith('<div class="text">...') and "<mark>INSERTED</mark>" in a
    assert f"<mark>{words[160]}</mark>" in b  # the word the copy dropped
    assert a.count("<mark>") == 1 and b.count("<mark>") == 1


def test_a_copy_that_differs_in_case_and_punctuation_only_shows_no_change(tmp_path):
    """A page re-cased and re-punctuated is J = 1 with normalisation (the default): its
    borderline card marks no word as changed, only the word really edited; the marks
    follow the job's normalisation (NFKC: a decomposed accent is the composed one)."""
    from pydoc_data.topics import topics

    from pipeline.report.html import word_diff

    text = topics["while"]
    words = text.split()
    shouted = " ".join(w.upper().strip('"') + ("," if i % 7 == 0 else "")
                       for i, w in enumerate(words))
    a, b = word_diff(shouted, text, normalize=True)
    assert "<mark>" not in a + b
    a, b = word_diff(shouted, text)  # as stored: every word shown differs
    assert a.count("<mark>") >= 20 and a.startswith('<div class="text"><mark>THE,</mark>')
    edited = shouted.replace("REPEATEDLY", "AGAIN", 1) + " Caf\u0065\u0301"
    a, b = word_diff(edited, text + " CAF\u00c9", normalize=True)
    assert a.count("<mark>") == b.count("<mark>") == 1
    assert "<mark>AGAIN</mark>" in a and "<mark>repeatedly</mark>" in b
    summary = _job(tmp_path, "parquet", [text, shouted], {"metric": "jaccard", "threshold": 0.8},
                   files=1)
    assert summary["removed_near"] == 1
    page = (tmp_path / "report" / "index.html").read_text()
    borderline = page.split('id="borderline"')[1].split("</section>")[0]
    assert "WHILE" in borderline and "<mark>" not in borderline


def test_token_pairs_show_their_ids_with_the_changed_ones_marked(tmp_path):
    """Token sequences (Parquet list<int32>): a borderline card shows the ids as a
    sequence from a few before the first change, the replaced id marked on each side,
    and a group card writes ids whole (12345, not 1.234e+04)."""
    rng = np.random.default_rng(5)
    a = rng.integers(10_000, 30_000, 400).astype(np.int32)
    b = a.copy()
    b[200] = 7
    summary = _job(tmp_path, "parquet", [a, b], {"metric": "jaccard", "threshold": 0.8},
                   files=1)
    assert summary["removed_near"] == 1 and summary["near"]["unit"] == "token"
    page = (tmp_path / "report" / "index.html").read_text()
    borderline = page.split('id="borderline"')[1].split("</section>")[0]
    assert f"<mark>{a[200]}</mark>" in borderline and "<mark>7</mark>" in borderline
    assert borderline.count("<mark>") == 2 and f"... {a[192]} {a[193]}" in borderline
    groups = page.split('id="groups"')[1] if 'id="groups"' in page else page
    assert f"[{a[0]}, {a[1]}, " in groups and "e+04" not in page


def test_reference_texts_remove_their_near_copies(tmp_path, corpus):
    """Benchmark decontamination: training texts that near-copy an evaluation set go, as
    reference_near; the evaluation set is never touched. Training texts that are exact
    copies of evaluation texts with near copies in the evaluation set go as
    reference_exact and are not judged by the recall check (each counted as a miss of
    its evaluation neighbours: recall 0.0 where every decision was right)."""
    from pydoc_data.topics import topics  # Python's own help texts: no licence among them

    rng = np.random.default_rng(3)
    evals = [topics[k][:3000] for k in sorted(topics) if len(topics[k]) > 1500][:10]
    vocab = sorted({w for t in evals for w in t.split()})
    leaks = [edited(t, 0.005, rng, vocab) for t in evals[:5]]
    evals += [edited(t, 0.005, rng, vocab) for t in evals[5:]]  # near copies of its own
    _write("parquet", tmp_path / "ref" / "eval.parquet", [f"e{i}" for i in range(15)], evals)
    s = _job(tmp_path, "parquet", corpus[:100] + leaks + evals[5:10],
             {"metric": "jaccard", "threshold": 0.8, "recall_sample": 1000},
             reference=[{"format": "parquet", "path": str(tmp_path / "ref" / "*.parquet"),
                         "tensor": "doc", "id": "id", "decode": "text"}])
    got = _removals(tmp_path)
    leaked = {f"doc{100 + i}": f"e{i}" for i in range(5)}
    assert {k: v[0] for k, v in got.items() if v[1] == "reference_near"} == leaked
    assert {k: v[0] for k, v in got.items() if v[1] == "reference_exact"} == {
        f"doc{105 + i}": f"e{5 + i}" for i in range(5)}
    assert s["removed_reference_near"] == 5
    r = s["near"]["recall"]
    assert r["recall"] == 1.0 and r["with_partners"] >= 5
    assert r["sampled"] == len(set(corpus[:100] + leaks))


def _run(tmp: Path, name: str, ids: list[str], texts: list[str], near: dict, **extra) -> int:
    """One run over ``texts`` (one Parquet file) into tmp/name; its exit code."""
    _write("parquet", tmp / name / "in" / "part.parquet", ids, texts)
    cfg = {"input": {"format": "parquet", "path": str(tmp / name / "in" / "*.parquet"),
                     "tensor": "doc", "id": "id", "decode": "text"},
           "output": {"path": str(tmp / name / "out")}, "report": str(tmp / name / "report"),
           "near": near, **extra}
    (tmp / name / "job.yaml").write_text(yaml.safe_dump(cfg))
    return main(["--config", str(tmp / name / "job.yaml"), "--quiet"])


def test_the_store_removes_near_copies_of_earlier_runs(tmp_path, corpus, capsys):
    """A new crawl against an earlier one: run 2's copies of what run 1 kept go as
    store_exact / store_near (the oracle over run 1's kept texts first, then run 2's);
    a run with other shingle settings is refused, one line."""
    rng = np.random.default_rng(5)
    vocab = sorted({w for t in corpus for w in t.split()})
    store = {"path": str(tmp_path / "store")}
    near = {"metric": "jaccard", "threshold": 0.8, "mode": "exact"}
    first = corpus[:150]
    assert _run(tmp_path, "r1", [f"a{i}" for i in range(150)], first, near, store=store,
                run_id="r1") == 0
    kept1 = pq.read_table(tmp_path / "r1" / "out" / "part.parquet").to_pylist()
    assert 0 < len(kept1) < 150
    second = corpus[150:] + [edited(k["doc"], 0.02, rng, vocab) for k in kept1[:20]] + [
        kept1[3]["doc"]]
    ids2 = [f"b{i}" for i in range(len(second))]
    # the recall sample is drawn among run 2's texts only (stored ones are never judged:
    # drawn among all, it shrank as the store grew)
    assert _run(tmp_path, "r2", ids2, second, {**near, "recall_sample": 40}, store=store,
                run_id="r2") == 0
    table = pq.read_table(tmp_path / "r2" / "report" / "duplicates.parquet").to_pylist()
    got = {r["record_id"]: (r["duplicate_of"], r["kind"], r["distance"]) for r in table}
    assert {r["duplicate_of_run"] for r in table if r["kind"].startswith("store")} == {"r1"}
    # the oracle: run 1's kept texts (protected, first), then run 2's texts in order
    old = {k["doc"]: k["id"] for k in kept1}
    want, first_of, rows, names = {}, {}, [k["doc"] for k in kept1], [k["id"] for k in kept1]
    for i, t in zip(ids2, second, strict=True):
        if t in old:
            want[i] = (old[t], "store_exact", 0.0)
        elif t in first_of:
            want[i] = (first_of[t], "exact", 0.0)
        else:
            first_of[t] = i
            rows.append(t)
            names.append(i)
    for r, (k, j) in oracle(record_sets(rows, Shingles()), 0.8).items():
        assert r >= len(kept1)  # run 1's kept texts are not near each other
        want[names[r]] = (names[k], "store_near" if k < len(kept1) else "near", 1.0 - float(j))
    _same(got, want)
    assert sum(v[1] == "store_near" for v in got.values()) >= 20
    s = json.loads((tmp_path / "r2" / "report" / "summary.json").read_text())
    for kind in ("store_exact", "store_near", "near", "exact"):
        assert s[f"removed_{kind}"] == sum(v[1] == kind for v in want.values())
    assert s["near"]["recall"]["sampled"] == 40
    capsys.readouterr()
    other = {**near, "shingles": {"unit": "char"}}
    assert _run(tmp_path, "r3", ["c0"], [corpus[0]], other, store=store, run_id="r3") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "shingles" in err[0] and "store.path" in err[0], err


@pytest.mark.parametrize("near,extra,words", [
    ({"metric": "jaccard"}, {}, "needs near.threshold"),
    ({"metric": "jaccard", "threshold": 1.5}, {}, "in (0, 1]"),
    ({"metric": "jaccard", "threshold": 0.8, "probes": 4}, {}, "near.probes applies to vector"),
    ({"metric": "jaccard", "threshold": 0.8, "shingles": {"unit": "token"}}, {},
     "for input.decode: text use word or char"),
    ({"metric": "cosine", "threshold": 0.1, "shingles": {"unit": "word"}}, {},
     "near.shingles applies to metric jaccard"),
    ({"metric": "jaccard", "threshold": 0.8, "shingles": {"bands": 300}}, {}, "bands <="),
    ({"metric": "jaccard", "threshold": 0.8},
     {"embed": {"model": "sentence-transformers", "path": "x"}}, "remove the embed section"),
])
def test_bad_jaccard_settings_are_one_line_before_any_work(tmp_path, capsys, near, extra,
                                                           words):
    _write("parquet", tmp_path / "in" / "a.parquet", ["a", "b"], ["one text", "another"])
    cfg = {"input": {"format": "parquet", "path": str(tmp_path / "in" / "*.parquet"),
                     "tensor": "doc", "id": "id", "decode": "text"},
           "output": {"path": str(tmp_path / "out")}, "report": str(tmp_path / "report"),
           "near": near, **extra}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["--config", str(tmp_path / "job.yaml"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
    assert not (tmp_path / "out").exists()


def test_a_low_threshold_is_warned_of(tmp_path, corpus, capsys):
    _job(tmp_path, "parquet", corpus[:50], {"metric": "jaccard", "threshold": 0.3})
    assert "warning: near.threshold 0.3 for jaccard" in capsys.readouterr().err


def test_short_char_shingles_and_unused_signature_settings_are_said(tmp_path, corpus,
                                                                    capsys):
    _job(tmp_path / "a", "parquet", corpus[:50], {"metric": "jaccard", "threshold": 0.8,
                                                  "shingles": {"unit": "char", "size": 3}})
    assert "warning: near.shingles.size 3 for unit char" in capsys.readouterr().err
    _job(tmp_path / "b", "parquet", corpus[:50], {
        "metric": "jaccard", "threshold": 0.8, "mode": "exact",
        "shingles": {"permutations": 64, "bands": 8}})
    assert "mode exact does not use them" in capsys.readouterr().err


@pytest.mark.parametrize("doc, words", [
    (pa.array([[0.5, 1.0], [2.0]], pa.list_(pa.float32())), "integer sequences"),
    (pa.array([3, 4], pa.int64()), "not one sequence of integers per record"),  # crashed
    (pa.array([[[1, 2]], [[3]]], pa.list_(pa.list_(pa.int32()))),
     "not one sequence of integers per record"),
])
def test_jaccard_on_other_than_sequences_is_refused(tmp_path, capsys, doc, words):
    """Floats, one integer per record (a scalar column: AttributeError after the work
    started, before), lists of lists: exit 2 with one line."""
    path = tmp_path / "in" / "a.parquet"
    path.parent.mkdir(parents=True)
    pq.write_table(pa.table({"id": ["a", "b"], "doc": doc}), path)
    cfg = {"input": {"format": "parquet", "path": str(path), "tensor": "doc", "id": "id"},
           "output": {"path": str(tmp_path / "out")}, "report": str(tmp_path / "report"),
           "near": {"metric": "jaccard", "threshold": 0.8}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["--config", str(tmp_path / "job.yaml"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err


@pytest.mark.parametrize("fmt", ["parquet", "tfrecord", "hdf5"])
def test_texts_without_decode_text_are_one_line_naming_it(tmp_path, corpus, capsys, fmt):
    """A text column, feature or dataset under jaccard with no input.decode says which
    decode to set, in each format (an HDF5 string dataset raised AttributeError after the
    work started; a TFRecord text feature was "not a serialized tensor")."""
    _write(fmt, tmp_path / "in" / f"a.{EXT[fmt]}", ["a", "b"], corpus[:2])
    cfg = {"input": {"format": fmt, "path": str(tmp_path / "in" / f"a.{EXT[fmt]}"),
                     "tensor": "doc", "id": "id"},
           "output": {"path": str(tmp_path / "out")}, "report": str(tmp_path / "report"),
           "near": {"metric": "jaccard", "threshold": 0.8}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["--config", str(tmp_path / "job.yaml"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "set input.decode: text (jaccard" in err[0], err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("runner", [("runner.name=dask", "runner.workers=2"),
                                    ("runner.name=portable", "runner.workers=2")])
def test_every_runner_writes_the_local_runners_bytes(tmp_path, corpus, runner):
    near = {"metric": "jaccard", "threshold": 0.8, "mode": "bounded"}
    local = _job(tmp_path / "local", "parquet", corpus, near, files=3)
    cfg = yaml.safe_load((tmp_path / "local" / "job.yaml").read_text())
    other = tmp_path / "other"
    cfg["output"]["path"], cfg["report"] = str(other / "out"), str(other / "report")
    other.mkdir()
    (other / "job.yaml").write_text(yaml.safe_dump(cfg))
    sets = [a for s in runner for a in ("--set", s)]
    assert main(["--config", str(other / "job.yaml"), "--quiet", *sets]) == 0
    theirs = json.loads((other / "report" / "summary.json").read_text())
    for key in ("read", "kept", "removed_exact", "removed_near", "invalid"):
        assert theirs[key] == local[key]
    assert local["removed_near"] > CROWD
    for sub in ("out", "report"):
        mine = {p.relative_to(tmp_path / "local"): p.read_bytes()
                for p in sorted((tmp_path / "local" / sub).rglob("*.parquet"))}
        them = {p.relative_to(other): p.read_bytes()
                for p in sorted((other / sub).rglob("*.parquet"))}
        assert mine == them


def test_above_the_plan_sample_the_job_equals_the_kernel(tmp_path):
    """21,000 records, more than the plan's sample (PLAN_SAMPLE): the exact join's order
    then comes from a sample, not all records, and auto estimates from a share of them;
    exact mode still finds what the kernel finds over every record (any fixed order is
    complete), and auto's choice is printed in summary.json."""
    from pipeline.steps.near_sets import PLAN_SAMPLE

    rng = np.random.default_rng(11)
    base = [t[:1500] for t in package_texts(300)]
    vocab = sorted({w for t in base for w in t.split()})
    docs = [edited(base[int(rng.integers(len(base)))], rng.uniform(0.0, 0.3), rng, vocab)
            for _ in range(21_000)]
    assert len(docs) > PLAN_SAMPLE
    s = _job(tmp_path, "parquet", docs, {"metric": "jaccard", "threshold": 0.8,
                                         "mode": "exact"}, files=4)
    keep = _survivors(docs)
    sets = record_sets([docs[i] for i in keep], Shingles("word"))
    want = near_sets(sets, np.arange(len(sets)), 0.8, mode="exact")
    got = {k: v[0] for k, v in _removals(tmp_path).items() if v[1] == "near"}
    assert got == {f"doc{keep[r]}": f"doc{keep[k]}" for r, k in
                   zip(want.removed.tolist(), want.kept.tolist(), strict=True)}
    assert s["removed_near"] > 1000


def test_the_library_takes_a_tables_text_column_as_a_list_of_its_texts(corpus):
    """``find_near_sets(table["text"], ...)``: a pyarrow column (chunked, or one array)
    was refused as "unit word takes texts, got StringScalar"; now the same result as the
    texts in a list, and unit token on it is refused as on a list of texts."""
    texts = [*corpus[:300], None]
    rank = np.arange(len(texts))
    want = find_near_sets(texts, rank, 0.8)
    whole = pa.array(texts, pa.string())
    for column in (pa.chunked_array([whole.slice(0, 100), whole.slice(100)]),
                   whole.cast(pa.large_string())):
        got = find_near_sets(column, rank, 0.8)
        assert len(got.removed) > 0 and got.mode == want.mode
        for name in ("removed", "kept", "j", "invalid"):
            assert np.array_equal(getattr(got, name), getattr(want, name)), name
        with pytest.raises(TypeError, match="unit token takes integer sequences, got texts"):
            find_near_sets(column, rank, 0.8, Shingles(unit="token"))


def test_the_library_checks_its_arguments_as_the_job_does(corpus):
    texts = corpus[:50]
    with pytest.raises(ValueError, match=r"in \(0, 1\]"):
        find_near_sets(texts, np.arange(50), 80)
    with pytest.raises(ValueError, match="near.mode must be one of"):
        find_near_sets(texts, np.arange(50), 0.8, mode="exactt")
    with pytest.raises(ValueError, match="rank holds 49 values for 50 records"):
        find_near_sets(texts, np.arange(49), 0.8)
    with pytest.raises(TypeError, match="token sequences need unit token"):
        find_near_sets([np.arange(9)], np.arange(1), 0.8)
    res = find_near_sets(texts, np.arange(50), 0.8)  # auto, as the job's default
    exact = find_near_sets(texts, np.arange(50), 0.8, mode="exact")
    assert res.mode == "exact" and res.removed.tolist() == exact.removed.tolist()
    assert len(res.removed) > 0


@pytest.mark.parametrize("unit", ["word", "token"])
def test_signatures_through_torch_equal_numpys(corpus, tokens, unit):
    """near.device's path (torch, run here on the CPU): the same signatures, in blocks of
    permutations (these sets' hashes make two blocks of 112); read-only hashes (a
    memory-mapped or Arrow buffer) go up without torch's not-writable warning."""
    import warnings

    import torch

    from transforms.near.sets import SIGNATURE_BLOCK, signatures, signatures_torch

    sets = record_sets(corpus if unit == "word" else tokens, Shingles(unit))
    assert SIGNATURE_BLOCK // len(sets.hashes) < 112
    want = signatures(sets, 112)
    assert np.array_equal(signatures_torch(sets, 112, torch.device("cpu")), want)
    sets.hashes.setflags(write=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.array_equal(signatures_torch(sets, 112, torch.device("cpu")), want)


def test_token_records_are_their_integer_values_flattened():
    """unit token: each record is its values flattened (a list of 2-d arrays was cut at
    their first axis), floats are refused (they were truncated into other records'
    tokens), None and empty records are invalid, and no record at all is no text."""
    a = np.arange(1, 21).reshape(2, 10)
    a2, c = a.copy(), np.arange(100, 130).reshape(3, 10)
    a2[1, 9] = 99

    def grams(x):
        v = np.ravel(x).tolist()
        return {tuple(v[i:i + 2]) for i in range(len(v) - 1)}

    want = len(grams(a) & grams(a2)) / len(grams(a) | grams(a2))
    res = find_near_sets([a, c, a2], np.arange(3), 0.8, Shingles("token", 2), mode="exact")
    assert (res.removed.tolist(), res.kept.tolist()) == ([2], [0])
    assert res.j.tolist() == [pytest.approx(want)]
    same = find_near_sets([np.array([[1, 2], [3, 4]])] * 3, np.arange(3), 0.8,
                          Shingles("token", 2))
    assert same.removed.tolist() == [1, 2]
    floats = [np.array([1.2, 2.7, 3.1, 4.9]), np.array([1.0, 2.0, 3.0, 4.0])]
    with pytest.raises(TypeError, match="integer sequences, got float64 values"):
        find_near_sets(floats, np.arange(2), 0.8, Shingles("token"))
    with pytest.raises(TypeError, match="integer sequences, got float64 values"):
        find_near_sets(np.stack(floats), np.arange(2), 0.8, Shingles("token"))
    res = find_near_sets([None, np.arange(5), np.zeros(0, np.int64)], np.arange(3), 0.8,
                         Shingles("token"))
    assert res.invalid.tolist() == [0, 2] and len(res.removed) == 0
    assert len(find_near_sets([], np.arange(0), 0.8, Shingles("token")).removed) == 0


def test_a_near_copy_names_the_protected_set_before_a_nearer_one_of_the_run():
    """Sets P (a reference record), R and X in keep order: J(X, P) = 0.82 and J(X, R) =
    0.88 are both at or above 0.8, J(R, P) = 0.71 is not (R is kept). X is removed as a
    copy of P, as for exact copies (it named R: a leak the report did not count)."""
    from transforms.exact import NEW, REFERENCE
    from transforms.near.sets import Sets, decide, jaccard

    core, a, b = np.arange(100), np.arange(100, 120), np.arange(200, 220)
    rows = [np.r_[core, a], np.r_[core, b], np.r_[core, a[:12], b[:16]]]
    hashes = [np.sort(r.astype(np.uint64)) for r in rows]
    sets = Sets(np.r_[0, np.cumsum([len(h) for h in hashes])], np.concatenate(hashes),
                np.zeros(3, bool))
    j = {(i, k): jaccard(sets.row(i), sets.row(k)) for i, k in ((2, 0), (2, 1), (1, 0))}
    assert j[2, 1] > j[2, 0] >= 0.8 > j[1, 0]
    member = np.arange(3)
    for tier, dup in ((None, 1), (np.array([REFERENCE, NEW, NEW], np.int8), 0)):
        d = decide(np.zeros(3, np.int64), member, sets, member, 0.8,
                   protected=np.array([True, False, False]), tier=tier)
        assert d.removed.tolist() == [2] and d.kept.tolist() == [dup]
        assert d.j[0] == pytest.approx(j[2, dup])


@pytest.mark.parametrize("near", [{"metric": "jaccard", "threshold": 0.8}, None])
def test_a_string_column_with_bytes_that_are_not_utf8_makes_invalid_records(tmp_path, corpus,
                                                                            near):
    """Writers that do not validate (Spark, Hive, C++) leave bytes that are not UTF-8 in
    a Parquet string column, which pyarrow reads without a word: each such value is an
    invalid record with the reason, as in a binary column. The whole job failed (exit
    1, "UnicodeDecodeError ... [while running 'Read/ReadChunks/Run']")."""
    texts = [t.encode() for t in corpus[:200]]
    bad = {3: "Le caf\xe9 est chaud".encode("latin-1"), 50: b"\xed\xa0\x80 a lone surrogate",
           120: b"\xc0\xaf overlong"}
    values = [bad.get(i, t) for i, t in enumerate(texts)]
    offsets = np.cumsum([0] + [len(v) for v in values]).astype(np.int32)
    col = pa.Array.from_buffers(pa.string(), len(values),
                                [None, pa.py_buffer(offsets.tobytes()),
                                 pa.py_buffer(b"".join(values))])
    ids = [f"doc{i}" for i in range(len(values))]
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"id": ids, "doc": col}), tmp_path / "in" / "part0.parquet",
                   row_group_size=64)
    cfg = {"input": {"format": "parquet", "path": str(tmp_path / "in" / "*.parquet"),
                     "tensor": "doc", "id": "id", "decode": "text"},
           "output": {"path": str(tmp_path / "out")}, "report": str(tmp_path / "report"),
           **({"near": near} if near else {})}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["--config", str(tmp_path / "job.yaml"), "--quiet"]) == 0
    s = json.loads((tmp_path / "report" / "summary.json").read_text())
    removed = sum(v for k, v in s.items() if k.startswith("removed_"))
    assert s["read"] == s["kept"] + removed + s["invalid"] == len(values)
    assert s["invalid"] == len(bad)
    invalid = pq.read_table(tmp_path / "report" / "invalid.parquet").to_pylist()
    assert {r["record_id"] for r in invalid} == {f"doc{i}" for i in bad}
    assert all(re.search(r"not UTF-8 text \(invalid (start|continuation) byte at byte \d+\)",
                         r["reason"]) for r in invalid)
    good = [v.decode() for i, v in enumerate(values) if i not in bad]
    kept = pq.read_table(tmp_path / "out").column("doc").to_pylist()
    want = {f"doc{i}" for i in range(len(values)) if i not in bad} - set(_removals(tmp_path))
    assert len(kept) == len(want) and set(kept) <= set(good)


@pytest.mark.parametrize("unit", ["word", "char"])
def test_a_chunk_of_texts_shingles_to_sets_within_the_decoded_chunk_bytes(tmp_path, unit):
    """Real sources in one row group (as pandas and pq.write_table write them): a chunk
    held decoded_chunk_bytes of text whatever the unit, and char sets hold an 8-byte hash
    per character, so a 64 MB chunk became 512 MB of sets per worker (the run's peak above
    max(3 GB, 3x the text)). Read as the job reads them, each chunk's sets fit the budget
    (one record alone may exceed it), every record once and in order."""
    from pipeline.config import parse_config
    from pipeline.inputs import as_sequences
    from transforms.io.formats import get_format
    from transforms.io.formats.base import Chunking

    texts = package_texts(300)
    path = tmp_path / "texts.parquet"
    pq.write_table(pa.table({"text": texts}), path, row_group_size=len(texts))
    budget = sum(len(t.encode()) for t in texts) // 6
    cfg = parse_config({
        "input": {"format": "parquet", "path": str(path), "tensor": "text", "decode": "text"},
        "output": {"path": str(tmp_path / "out")}, "report": str(tmp_path / "report"),
        "near": {"metric": "jaccard", "threshold": 0.8, "shingles": {"unit": unit}},
        "tuning": {"decoded_chunk_bytes": budget}})
    spec = as_sequences(cfg, cfg.input.to_spec(None, cfg.tuning.decoded_chunk_bytes))
    f, rows = get_format("parquet", spec), Chunking().chunk_rows
    chunks = [c for u in f.plan(str(path), 0, rows, f.check(str(path), spec))
              for c in f.read(u, spec, rows)]
    assert np.array_equal(np.concatenate([c.positions for c in chunks]), np.arange(len(texts)))
    assert [t for c in chunks for t in c.tensors] == texts
    sizes = [record_sets(list(c.tensors), Shingles(unit=unit)).hashes.nbytes for c in chunks]
    longest = max(record_sets([t], Shingles(unit=unit)).hashes.nbytes for t in texts)
    assert max(sizes) <= budget + longest, (max(sizes), budget)
    assert len(chunks) <= 4 * sum(sizes) // budget + 1  # and not cut finer than it needs
