"""Write the small text dataset the README's "Deduplicate a text or token dataset" runs on.

Python's own help pages (``pydoc_data.topics``: real prose and code, 400 to 20,000
characters each) as a crawl stores them, in two Parquet files (``data/text/parquet/``)
with ``url``, ``text`` and ``note`` (what each planted record is) columns, and the same
rows as one gzip JSON lines file (``data/text/jsonl/pages.jsonl.gz``), and tokenized as
a Megatron dataset (``data/text/megatron/pages.bin`` / ``.idx``, ``write_megatron``):

- every page once, in a shuffled order; two of them (``if`` and ``else``) are the same
  page in Python's docs, an exact copy that nobody planted, and ``execmodel`` /
  ``naming`` share two thirds of their word 5-grams (J 0.66: related, not copies);
- exact copies: three pages stored again byte for byte;
- near copies (Jaccard of word 5-grams at least 0.8 with their page, not equal): one
  word changed, a line appended, a crawl header prepended, the page re-wrapped with
  other line breaks and upper case (one set after normalisation), a paragraph dropped;
- decoys (below 0.7): a page whose second half is another page's, a page cut to its
  first third;
- one empty text (an invalid record).

The planted counts go to ``data/text/EXPECTED.json``, checked here against a plain
Python oracle (NFKC, lower case, words as runs of letters and digits, all pairs).
Usage: ``python scripts/make_text_samples.py [--out data/text]``.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import itertools
import json
import re
import unicodedata
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

THRESHOLD = 0.8  # configs/dedupe-text.yaml's near.threshold


def pages() -> dict[str, str]:
    """The help pages of a useful length, by topic."""
    from pydoc_data.topics import topics

    return {k: v for k, v in sorted(topics.items()) if 400 <= len(v) <= 20_000}


@functools.cache
def shingles(text: str) -> frozenset[tuple[str, ...]]:
    """Word 5-grams as the job's defaults take them (the oracle's own code), each text's
    once: the oracle compares every pair."""
    words = re.findall(r"[^\W_]+", unicodedata.normalize("NFKC", text).lower())
    return frozenset(tuple(words[i:i + 5]) for i in range(max(1, len(words) - 4)))


def jaccard(a: str, b: str) -> float:
    x, y = shingles(a), shingles(b)
    return len(x & y) / len(x | y)


def planted(p: dict[str, str]) -> list[tuple[str, str, str]]:
    """(url, text, note) of the edited records, each from a named page."""
    def url(k: str, tag: str) -> str:
        return f"https://docs.python.org/3/reference/{k}.html?{tag}"

    paragraphs = p["exceptions"].split("\n\n")
    wrapped = " ".join(p["while"].split()).upper()
    half = len(p["class"]) // 2
    return [
        (url("for", "a"), p["for"].replace("loop", "cycle", 1), "near: for, one word changed"),
        (url("try", "a"), p["try"] + "\nSee also: the raise statement.\n",
         "near: try, a line appended"),
        (url("import", "a"), "Retrieved 2026-12-07 from docs.python.org\n\n" + p["import"],
         "near: import, a crawl header"),
        (url("while", "a"), wrapped, "near: while, re-wrapped and upper case"),
        (url("exceptions", "a"), "\n\n".join(paragraphs[:-2] + paragraphs[-1:]),
         "near: exceptions, a paragraph dropped"),
        (url("class", "b"), p["class"][:half] + p["function"][len(p["function"]) // 2:],
         "decoy: class, its second half another page's"),
        (url("assignment", "b"), p["assignment"][:len(p["assignment"]) // 3],
         "decoy: assignment, cut to its first third"),
        (url("dict", "copy"), p["dict"], "exact: dict"),
        (url("with", "copy"), p["with"], "exact: with"),
        (url("return", "copy"), p["return"], "exact: return"),
        ("https://docs.python.org/3/reference/empty.html", "", "invalid: empty"),
    ]


def write_megatron(texts: list[str], prefix: Path) -> None:
    """The texts as a Megatron dataset (``prefix``.bin / .idx), as Megatron-LM's
    ``preprocess_data.py`` writes one: each text tokenized whole by the bundled
    all-MiniLM-L6-v2 (BERT) tokenizer, its ids as one document of uint16 tokens (an
    empty text: an empty document)."""
    import warnings

    import torch
    from all_minilm_l6_v2 import get_model_path
    from tokenizers import Tokenizer

    with warnings.catch_warnings():  # "Transformer Engine and Apex are not installed"
        warnings.simplefilter("ignore", UserWarning)
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    tok = Tokenizer.from_file(str(Path(get_model_path()) / "tokenizer.json"))
    tok.no_truncation()  # whole texts, not the model's first 128 tokens
    tok.no_padding()  # nor padded to 128 (its tokenizer.json pads)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
    for e in tok.encode_batch(texts, add_special_tokens=False):
        builder.add_document(torch.tensor(e.ids, dtype=torch.int64), [len(e.ids)])
    builder.finalize(f"{prefix}.idx")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="data/text")
    out = Path(ap.parse_args().out)
    p = pages()
    rows = [(f"https://docs.python.org/3/reference/{k}.html", v, "page") for k, v in p.items()]
    rows = [rows[i] for i in np.random.default_rng(3).permutation(len(rows))]
    rows += planted(p)  # after the pages: keep first keeps the page
    exact = len(rows) - len({t for _, t, _ in rows})
    texts = [t for _, t, _ in rows if t]
    # the oracle: in keep order, a record is removed when J >= t with an earlier kept one
    kept: list[str] = []
    near = 0
    for t in dict.fromkeys(texts):  # exact copies first (the job's exact stage)
        if any(jaccard(t, k) >= THRESHOLD for k in kept):
            near += 1
        else:
            kept.append(t)
    for _, t, note in rows:
        kind = note.split(":")[0]
        src = note.split(": ")[-1].split(",")[0]
        if kind == "near":
            assert t != p[src] and jaccard(t, p[src]) >= THRESHOLD, note
        elif kind == "decoy":
            assert jaccard(t, p[src]) < 0.7, note
    expected = {"records": len(rows), "exact": exact, "near": near, "invalid": 1,
                "kept": len(rows) - exact - near - 1, "threshold": THRESHOLD}
    assert near == sum(n.startswith("near") for _, _, n in rows), expected
    (out / "parquet").mkdir(parents=True, exist_ok=True)
    half = len(rows) // 2
    for i, part in enumerate((rows[:half], rows[half:])):
        url, text, note = (list(c) for c in zip(*part, strict=True))
        pq.write_table(pa.table({"url": url, "text": text, "note": note}),
                       out / "parquet" / f"part-{i:05d}.parquet")
    (out / "jsonl").mkdir(exist_ok=True)  # the same rows as one JSON lines file, gzip
    lines = "".join(json.dumps({"url": u, "text": t, "note": n}) + "\n" for u, t, n in rows)
    (out / "jsonl" / "pages.jsonl.gz").write_bytes(gzip.compress(lines.encode(), mtime=0))
    write_megatron([t for _, t, _ in rows], out / "megatron" / "pages")
    (out / "EXPECTED.json").write_text(json.dumps(expected, indent=2) + "\n")
    print(json.dumps(expected))
    pairs = ((jaccard(p[a], p[b]), a, b) for a, b in itertools.combinations(p, 2))
    related = [(round(j, 3), a, b) for j, a, b in pairs if j >= 0.5 and p[a] != p[b]]
    print("pages related at J >= 0.5 (not copies):", related)


if __name__ == "__main__":
    main()
