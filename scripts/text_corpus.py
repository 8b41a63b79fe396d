"""Realistic text corpora for the Jaccard near-duplicate benchmark (issue 43), built from
real text found offline, deterministic by seed.

Why: MinHash-LSH tools are judged on crawls, so the data must have a real vocabulary,
real word frequencies, real boilerplate and the edits crawls have, and the truth of every
planted copy must be exact, not assumed from the edit rate.

Sources, all read from disk, nothing executed or unpickled:
- the LICENSE / README / METADATA / COPYING / NOTICE / AUTHORS files that installed
  packages ship (``site-packages/*/`` and everything under ``*.dist-info/``);
- Python's own help topics (``pydoc_data.topics``) and the docstrings of its standard
  library, read with ``ast`` (the same text ``inspect.getdoc`` gives, without importing
  a module, so no import side effects);
- CJK: the zh_CN, zh_TW, ja and ko translations in the system's gettext catalogues
  (``/usr/share/locale/*/LC_MESSAGES/*.mo``, parsed as the documented .mo format); where
  there are none, pseudo-text drawn from the CJK Unified Ideographs with Zipf frequencies.

Documents:
- ``real``: the package files (all of them, once each: licences that differ only in the
  holder's name are natural near duplicates) and docstrings, as they are;
- ``synthetic``: ~1 KB (log-normal lengths) drawn from a word-bigram Markov chain over
  the real texts' whitespace tokens (real vocabulary, real frequencies, real
  punctuation and case); ``banner``: a share of them inside a cookie banner and a
  site footer (boilerplate shared by different pages);
- ``near``: planted copies of base documents whose exact Jaccard to their source is
  drawn uniformly from [t, min(t + 0.1, 1)] for each threshold t given (split evenly);
  ``decoy``: the same in [t - 0.1, t) (near misses, not duplicates at t);
- ``crowd``: one crowd of m copies of a "404 page not found" page (one site, another
  URL, date and a few word edits each) plus its template;
- ``cjk`` (and ``cjk-near`` copies), ``long`` (1 MB each, one ``long-near`` copy),
  ``one-word``, ``empty`` (empty, whitespace-only or punctuation-only texts).

Edits (``recipe`` in the truth): word insertions / deletions / substitutions, truncation,
a boilerplate header or footer (cookie banner, licence header, navigation), paragraph
reordering plus word edits, and mixes; then format edits that normalisation undoes
(case, whitespace, punctuation, full-width letters), on half of the copies. A copy is
planted by drawing its target J, then searching how many of a random sequence of edits
to apply (bisection on the count) to land near it.

Jaccard (``jaccard`` in the truth) is over word 5-gram shingles of the normalised text,
the rule ``near.shingles`` documents: Unicode NFKC, lower case, words = runs of letters,
marks and digits (punctuation, symbols and whitespace collapsed), each Han, Hiragana or
Katakana character a word of its own (Chinese and Japanese); a text of fewer than 5
words is one shingle of what it has; one with no word has no shingle (invalid). It is
measured on the final texts, exactly (shingles as 64-bit hashes of the word sequence).
``jaccard_token``: the same over 5-grams of all-MiniLM-L6-v2 token ids.

Output (``--out DIR``): ``text/part-NNNNN.parquet`` (id string, text string, rows in keep
order), ``tokens/part-NNNNN.parquet`` (id, tokens list<int32>: the same documents,
tokenized without special tokens), ``truth.parquet`` (every document: id, kind, source,
jaccard, jaccard_token, lo, hi, recipe) and ``corpus.json`` (settings and counts).

Usage: python scripts/text_corpus.py --docs 100000 --out bench-data/jaccard-100k
           [--seed 0] [--threshold 0.8 ...] [--near 0.1] [--crowd M] [--parts 4]
           [--no-tokens]
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import hashlib
import json
import math
import re
import struct
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
SHINGLE = 5
WORD_SPLIT = r"[^\p{L}\p{M}\p{N}]+"  # after NFKC and lower case: words are the rest
# Chinese and Japanese are written without spaces: each of these characters is a word of
# its own, as the job's word shingles have them (transforms/near/sets.py)
IDEOGRAPH = r"[\p{Han}\p{Hiragana}\p{Katakana}]"
PARA = "\n\n"  # the paragraph break, as a token of its own
PACKAGE_FILES = re.compile(r"^(LICEN[CS]E|COPYING|NOTICE|AUTHORS|README)([._-].*)?$|^METADATA$",
                           re.I)
CJK_LOCALES = ("zh_CN", "zh_TW", "ja", "ko")
CJK_CHARS = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")

COOKIE = ("We use cookies and similar technologies to improve your browsing experience, "
          "personalise content and ads, provide social media features and analyse our "
          "traffic. By clicking \"Accept all\" you agree to the storing of cookies on your "
          "device. You can change your preferences at any time under Cookie Settings. "
          "Accept all | Reject all | Cookie Settings")
FOOTER = ("Home | About us | Products | Blog | Careers | Contact | Privacy Policy | Terms of "
          "Service | Sitemap. Follow us on social media. Subscribe to our newsletter for "
          "updates. Copyright {year} {site}. All rights reserved.")
LICENCE_HEADER = (
    "Copyright {year} {site} Licensed under the Apache License, Version 2.0 (the "
    "\"License\"); you may not use this file except in compliance with the License. You "
    "may obtain a copy of the License at http://www.apache.org/licenses/LICENSE-2.0 Unless "
    "required by applicable law or agreed to in writing, software distributed under the "
    "License is distributed on an \"AS IS\" BASIS, WITHOUT WARRANTIES OR CONDITIONS OF ANY "
    "KIND, either express or implied. See the License for the specific language governing "
    "permissions and limitations under the License.")
NOT_FOUND = (
    "404 Page Not Found - {site}\n\nSkip to main content. Menu. Search {site}. "
    "Oops! That page can't be found. The requested URL /{path} was not found on this "
    "server. Sorry, the page you are looking for does not exist, has been moved, renamed "
    "or is temporarily unavailable. Please check the address for typing errors, go back to "
    "the previous page, or return to the {site} home page. If you followed a link from "
    "another site, please let us know so that we can fix it. You may also try searching "
    "our site or browsing the most popular pages below.\n\nPopular pages: Getting started, "
    "Documentation, Downloads, Frequently asked questions, Community forum, Release notes."
    "\n\nLast updated {date}. Request id {rid}.\n\n" + COOKIE + "\n\n" + FOOTER)
SITES = [f"{a}{b}.{tld}" for a in ("open", "data", "py", "web", "cloud", "neo", "tech")
         for b in ("hub", "base", "works", "lab", "press", "forge", "zone")
         for tld in ("com", "org", "net")]


# ------------------------------------------------------------------------ normalisation


def words_array(texts: Sequence[str] | pa.Array) -> pa.ListArray:
    """Each text's normalised words (NFKC, lower case, runs of letters, marks, digits; a
    Han, Hiragana or Katakana character is a word of its own)."""
    import unicodedata

    if isinstance(texts, (pa.Array, pa.ChunkedArray)):
        texts = texts.to_pylist()
    # NFKC by Python: pyarrow 25's utf8_normalize returns the decomposed form (NFKD) for
    # "NFKC" (ド -> ト + U+3099), which splits Japanese kana from their voicing marks
    arr = pa.array([unicodedata.normalize("NFKC", t) for t in texts], pa.large_string())
    arr = pc.utf8_lower(arr)
    arr = pc.replace_substring_regex(arr, f"({IDEOGRAPH})", r" \1 ")
    arr = pc.utf8_trim(pc.replace_substring_regex(arr, WORD_SPLIT, " "), " ")
    return pc.split_pattern(arr, " ")


def words_of(texts: Sequence[str]) -> list[list[str]]:
    """Normalised words of each text as Python lists (an empty text: no words)."""
    return [[w for w in ws if w] for ws in words_array(texts).to_pylist()]


def python_words(text: str) -> list[str]:
    """The same rule in plain Python, character by character: a slow reference that
    checks the vectorised path (``check_shingles``)."""
    import unicodedata

    import regex  # Python's re has no script classes

    ideograph = regex.compile(IDEOGRAPH)
    out, cur = [], []
    for c in unicodedata.normalize("NFKC", text).lower():
        if ideograph.fullmatch(c):
            if cur:
                out.append("".join(cur))
                cur = []
            out.append(c)
        elif unicodedata.category(c)[0] in "LMN":
            cur.append(c)
        elif cur:
            out.append("".join(cur))
            cur = []
    if cur:
        out.append("".join(cur))
    # pyarrow lower-cases after NFKC: a character whose lower case is not NFKC-stable would
    # differ here, and none of the corpus' sources has one (the check would say)
    return out


def shingle_strings(words: Sequence[str], size: int = SHINGLE) -> set[str]:
    """A word list's shingles as strings (words joined by spaces): the unit the peers
    hash. Fewer than ``size`` words: one shingle of them all; none: the empty set."""
    if not words:
        return set()
    if len(words) < size:
        return {" ".join(words)}
    return {" ".join(words[i:i + size]) for i in range(len(words) - size + 1)}


def _splitmix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _word_hash(w: str) -> int:
    return int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(), "little")


@dataclass
class ShingleSets:
    """Documents as sorted sets of 64-bit shingle hashes, CSR: document i holds
    ``hashes[offsets[i]:offsets[i + 1]]``. This script's own (it also runs in the peers'
    environments, without the project), so the oracle stays independent of the job."""

    offsets: np.ndarray
    hashes: np.ndarray

    def __len__(self) -> int:
        return self.offsets.size - 1

    sizes = property(lambda self: np.diff(self.offsets))

    def row(self, i: int) -> np.ndarray:
        start, stop = self.offsets[i:i + 2]
        return self.hashes[start:stop]


def _grams(offsets: np.ndarray, units: np.ndarray, size: int) -> ShingleSets:
    """Every run of ``size`` consecutive unit hashes of each document (fewer units: one
    run of them all), hashed, sorted and made unique per document."""
    n = len(offsets) - 1
    length = np.diff(offsets)
    counts = np.where(length >= size, length - size + 1, (length > 0).astype(np.int64))
    out_off = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=out_off[1:])
    doc = np.repeat(np.arange(n, dtype=np.int64), counts)
    start = offsets[:-1][doc] + (np.arange(out_off[-1]) - out_off[:-1][doc])
    end = offsets[1:][doc]
    h = np.full(len(start), 0x9E3779B97F4A7C15, np.uint64)
    with np.errstate(over="ignore"):
        for k in range(size):
            idx = start + k
            inside = idx < end
            u = units[np.minimum(idx, max(len(units) - 1, 0))] if len(units) else h
            h = np.where(inside, _splitmix64(h ^ u) + np.uint64(k + 1), h)
        h = _splitmix64(h ^ np.minimum(end - start, size).astype(np.uint64))
    order = np.lexsort((h, doc))
    h, doc = h[order], doc[order]
    keep = np.ones(len(h), bool)
    keep[1:] = (h[1:] != h[:-1]) | (doc[1:] != doc[:-1])
    h, doc = h[keep], doc[keep]
    out = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(doc, minlength=n), out=out[1:])
    return ShingleSets(out, h)


def _concat(parts: list[ShingleSets]) -> ShingleSets:
    if not parts:
        return ShingleSets(np.zeros(1, np.int64), np.zeros(0, np.uint64))
    starts = np.cumsum([0] + [int(p.offsets[-1]) for p in parts[:-1]])
    offsets = np.concatenate([np.zeros(1, np.int64)] + [p.offsets[1:] + s for p, s in
                                                          zip(parts, starts, strict=True)])
    return ShingleSets(offsets, np.concatenate([p.hashes for p in parts]))


def shingle_sets(texts: Sequence[str] | pa.Array, size: int = SHINGLE,
                 chunk: int = 20_000) -> ShingleSets:
    """Word ``size``-gram shingle sets of texts (vectorised per chunk: pyarrow for the
    normalisation, one hash per distinct word of the chunk)."""
    parts = []
    for a in range(0, len(texts), chunk):
        part = texts[a:a + chunk]
        split = words_array(part if isinstance(part, pa.Array) else list(part))
        offsets = np.asarray(split.offsets, np.int64)
        offsets = offsets - offsets[0]
        words = split.flatten()
        nonempty = pc.not_equal(words, "").to_numpy(zero_copy_only=False)
        if len(words) and not nonempty.all():  # "" splits off an empty text
            doc = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))[nonempty]
            offsets = np.zeros(len(offsets), np.int64)
            np.cumsum(np.bincount(doc, minlength=len(offsets) - 1), out=offsets[1:])
            words = words.filter(pa.array(nonempty))
        enc = pc.dictionary_encode(words)
        table = np.fromiter(map(_word_hash, enc.dictionary.to_pylist()), np.uint64,
                            len(enc.dictionary))
        units = table[enc.indices.to_numpy(zero_copy_only=False)] if len(words) else \
            np.zeros(0, np.uint64)
        parts.append(_grams(offsets, units, size))
    return _concat(parts)


def token_shingle_sets(tokens: pa.Array, size: int = SHINGLE) -> ShingleSets:
    """Token-id ``size``-gram shingle sets of a list<int> array."""
    if isinstance(tokens, pa.ChunkedArray):
        tokens = tokens.combine_chunks()
    offsets = np.asarray(tokens.offsets, np.int64)
    offsets = offsets - offsets[0]
    ids = tokens.flatten().to_numpy(zero_copy_only=False).astype(np.int64)
    return _grams(offsets, _splitmix64(ids.view(np.uint64) + np.uint64(0x51ED)), size)


def pair_jaccard(sets: ShingleSets, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact Jaccard of documents a[i] and b[i] (two empty sets: 1.0; one empty: 0.0)."""
    out = np.zeros(len(a))
    for i, (x, y) in enumerate(zip(a.tolist(), b.tolist(), strict=True)):
        u, v = sets.row(x), sets.row(y)
        inter = np.intersect1d(u, v, assume_unique=True).size
        union = len(u) + len(v) - inter
        out[i] = inter / union if union else 1.0
    return out


# ------------------------------------------------------------------------------ sources


def site_packages() -> Path:
    venv = ROOT / ".venv" / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    return venv / "site-packages" if venv.exists() else Path(sysconfig.get_paths()["purelib"])


def package_texts(site: Path | None = None) -> list[str]:
    """The licence, README and METADATA files installed packages ship, once per content."""
    site = site or site_packages()
    paths = []
    for d in sorted(site.iterdir()):
        if not d.is_dir():
            continue
        found = d.rglob("*") if d.name.endswith(".dist-info") else d.iterdir()
        paths += sorted(p for p in found if p.is_file() and PACKAGE_FILES.match(p.name))
    out, seen = [], set()
    for p in paths:
        try:
            t = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if t.strip() and t not in seen:
            seen.add(t)
            out.append(t)
    return out


def docstring_texts() -> list[str]:
    """Python's help topics, then its standard library's docstrings (read with ast: no
    module is imported), once each, in a fixed order."""
    from pydoc_data.topics import topics

    out = [topics[k] for k in sorted(topics)]
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if {"test", "tests", "site-packages", "idle_test"} & set(path.parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                 ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) >= 40:
                    out.append(doc)
    seen: set[str] = set()
    return [t for t in out if not (t in seen or seen.add(t))]


def mo_messages(path: Path) -> list[str]:
    """The translations in a GNU gettext .mo catalogue (its documented binary layout)."""
    data = path.read_bytes()
    if len(data) < 20:
        return []
    magic = struct.unpack("<I", data[:4])[0]
    end = "<" if magic == 0x950412DE else ">" if magic == 0xDE120495 else None
    if end is None:
        return []
    n, _, trans = struct.unpack(end + "3I", data[8:20])
    out = []
    for i in range(n):
        length, offset = struct.unpack(end + "2I", data[trans + 8 * i:trans + 8 * i + 8])
        try:
            msg = data[offset:offset + length].decode("utf-8")
        except UnicodeDecodeError:
            continue
        out += [m for m in msg.split("\x00") if m.strip()]
    return out


def cjk_messages(locale_dir: Path = Path("/usr/share/locale")) -> dict[str, list[str]]:
    """Real CJK sentences by language: gettext translations of the installed programs
    (mostly CJK characters), once each, in a fixed order."""
    out: dict[str, list[str]] = {}
    seen: set[str] = set()
    for loc in CJK_LOCALES:
        for mo in sorted((locale_dir / loc / "LC_MESSAGES").glob("*.mo")):
            for m in mo_messages(mo):
                m = " ".join(m.split())
                if len(m) >= 4 and len(CJK_CHARS.findall(m)) >= 0.3 * len(m) and m not in seen:
                    seen.add(m)
                    out.setdefault(loc, []).append(m)
    return out


def pseudo_cjk(n: int, rng: np.random.Generator) -> dict[str, list[str]]:
    """Fallback CJK sentences: ideographs with Zipf frequencies, clause punctuation."""
    chars = np.array([chr(c) for c in range(0x4E00, 0x4E00 + 3000)])
    p = 1.0 / np.arange(1, 3001)
    p /= p.sum()
    return {"pseudo": ["，".join("".join(rng.choice(chars, rng.integers(3, 12), p=p))
                                for _ in range(rng.integers(1, 4))) + "。" for _ in range(n)]}


# ------------------------------------------------------------------------ Markov chain


class Chain:
    """A word-bigram Markov chain over whitespace tokens of real texts: the synthetic
    documents' vocabulary, word frequencies, punctuation and case are real."""

    def __init__(self, texts: Iterable[str]):
        index: dict[str, int] = {}
        stream = [index.setdefault(t, len(index)) for text in texts for t in text.split()]
        self.vocab = np.array(list(index), dtype=object)
        ids = np.array(stream + stream[:1], np.int64)  # cyclic: every token has a successor
        v = len(self.vocab)
        pairs, counts = np.unique(ids[:-1] * v + ids[1:], return_counts=True)
        self.row = pairs // v
        self.next = pairs % v
        cum = np.cumsum(counts).astype(np.float64)
        row_start = np.searchsorted(self.row, np.arange(v))
        row_total = np.add.reduceat(counts, row_start).astype(np.float64)
        before = np.concatenate([[0.0], cum])[row_start]
        cdf = (cum - before[self.row]) / row_total[self.row]
        last = np.r_[self.row[1:] != self.row[:-1], True]
        cdf[last] = 1.0
        self.key = self.row + cdf
        self.unigram = np.bincount(ids[:-1], minlength=v) / (len(ids) - 1)
        self.token_bytes = float(np.mean([len(t.encode()) for t in self.vocab[ids[:100_000]]]))
        ends = np.array([t.endswith((".", "!", "?", ":")) for t in self.vocab])
        self.breakable = ends

    def sample_unigram(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return rng.choice(len(self.vocab), n, p=self.unigram)

    def generate(self, lengths: np.ndarray, rng: np.random.Generator,
                 chains: int = 4096) -> list[np.ndarray]:
        """Token id sequences of the given lengths: ``chains`` chains walked in parallel,
        their concatenation cut into documents."""
        total = int(lengths.sum())
        steps = max(1, math.ceil(total / chains))
        walk = np.empty((steps, chains), np.int32)
        cur = self.sample_unigram(chains, rng)
        for s in range(steps):
            walk[s] = cur
            u = 1.0 - rng.random(chains)  # (0, 1]
            cur = self.next[np.searchsorted(self.key, cur + u, side="left")]
        flat = walk.T.reshape(-1)[:total]
        cuts = np.cumsum(lengths)[:-1]
        return np.split(flat, cuts)

    def render(self, ids: np.ndarray, rng: np.random.Generator, para: float = 0.2) -> str:
        """Tokens joined by spaces, a paragraph break after some sentence ends."""
        toks = self.vocab[ids]
        brk = self.breakable[ids] & (rng.random(len(ids)) < para)
        if brk.any():
            toks = toks.copy()
            toks[brk] = [t + PARA for t in toks[brk]]
        return " ".join(toks.tolist()).replace(PARA + " ", PARA)


# -------------------------------------------------------------------------------- edits


def tokens_of(text: str) -> list[str]:
    """A text as edit units: whitespace tokens, with PARA between paragraphs."""
    out: list[str] = []
    for p in re.split(r"\n\s*\n", text):
        ws = p.split()
        if ws:
            if out:
                out.append(PARA)
            out += ws
    return out


def render(tokens: Sequence[str]) -> str:
    return " ".join(tokens).replace(" " + PARA + " ", PARA)


class Words:
    """Normalised words of edit tokens, as small ints (cached per distinct token)."""

    def __init__(self) -> None:
        self.cache: dict[str, tuple[int, ...]] = {PARA: ()}
        self.ids: dict[str, int] = {}

    def learn(self, tokens: Iterable[str]) -> None:
        """Normalise the tokens not seen yet: in one pyarrow batch when there are many,
        else by the plain-Python rule (the same words, without a call's fixed cost)."""
        new = list({t for t in tokens if t not in self.cache})
        for a in range(0, len(new), 200_000):
            part = new[a:a + 200_000]
            split = words_of(part) if len(part) > 64 else map(python_words, part)
            for t, ws in zip(part, split, strict=True):
                self.cache[t] = tuple(self.ids.setdefault(w, len(self.ids)) for w in ws)

    def shingles(self, tokens: Sequence[str], size: int = SHINGLE) -> set:
        self.learn(t for t in tokens if t not in self.cache)
        w = [i for t in tokens for i in self.cache[t]]
        if len(w) < size:
            return {tuple(w)} if w else set()
        return set(zip(*(w[k:] for k in range(size)), strict=False))


def jaccard_sets(a: set, b: set) -> float:
    union = len(a | b)
    return len(a & b) / union if union else 1.0


RECIPES = ("words", "words", "truncate", "boilerplate", "reorder+words", "mixed")


def _plan(recipe: str, n: int, pool: Sequence[str], rng: np.random.Generator,
          site: str) -> tuple[list, list]:
    """(fixed ops applied first, graded ops of which a prefix is applied)."""
    fixed: list = []
    graded: list = []
    k = max(n, 8)

    def word_ops(m: int) -> list:
        kinds = rng.choice(3, m, p=[0.5, 0.25, 0.25])
        pos = rng.random(m)
        new = rng.integers(0, len(pool), m)
        return [("sub", p, pool[w]) if c == 0 else ("ins", p, pool[w]) if c == 1
                else ("del", p) for c, p, w in zip(kinds, pos, new, strict=True)]

    if recipe == "words":
        graded = word_ops(k)
    elif recipe == "truncate":
        graded = [("trunc",)] * n
    elif recipe == "boilerplate":
        text = [COOKIE, LICENCE_HEADER, FOOTER][rng.integers(0, 3)]
        bp = tokens_of(text.format(year=rng.integers(2005, 2026), site=site))
        where = "head" if rng.random() < 0.5 else "tail"
        graded = [(where, t) for t in bp] + word_ops(k)
    elif recipe == "reorder+words":
        fixed = [("swap", rng.random(), rng.random())]
        graded = word_ops(k)
    else:  # mixed: a footer, some truncation and word edits, interleaved
        bp = tokens_of(FOOTER.format(year=rng.integers(2005, 2026), site=site))
        ops = [("tail", t) for t in bp] + [("trunc",)] * (n // 4) + word_ops(k)
        graded = [ops[i] for i in rng.permutation(len(ops))]
    return fixed, graded


def apply_ops(tokens: Sequence[str], ops: Iterable) -> list[str]:
    toks = list(tokens)
    head: list[str] = []
    tail: list[str] = []
    for op in ops:
        kind = op[0]
        if kind == "sub" and toks:
            toks[min(int(op[1] * len(toks)), len(toks) - 1)] = op[2]
        elif kind == "ins":
            toks.insert(int(op[1] * (len(toks) + 1)), op[2])
        elif kind == "del" and toks:
            del toks[min(int(op[1] * len(toks)), len(toks) - 1)]
        elif kind == "trunc":
            while toks and toks[-1] == PARA:
                toks.pop()
            if toks:
                toks.pop()
        elif kind == "head":
            head.append(op[1])
        elif kind == "tail":
            tail.append(op[1])
        elif kind == "swap":
            paras = " ".join(toks).split(f" {PARA} ")
            if len(paras) > 1:
                i = int(op[1] * len(paras))
                j = int(op[2] * len(paras))
                paras[i], paras[j] = paras[j], paras[i]
                toks = [t for p in paras for t in (p.split(" ") + [PARA]) if t][:-1]
    return head + ([PARA] if head else []) + toks + ([PARA] if tail else []) + tail


def _closest(src: Sequence[str], fixed: list, graded: list, base: set, words: Words,
             target: float, lo: float, hi: float) -> tuple[list[str], float] | None:
    """Of the copies with the first k graded ops applied, the one in range whose J is
    closest to ``target``: bisection on k (J falls with k, roughly), then its neighbours."""
    cache: dict[int, tuple[float, list[str]]] = {}

    def at(k: int) -> tuple[float, list[str]]:
        if k not in cache:
            toks = apply_ops(src, fixed + graded[:k])
            cache[k] = (jaccard_sets(base, words.shingles(toks)), toks)
        return cache[k]

    a, b = 0, len(graded)
    while a < b:
        m = (a + b) // 2
        if at(m)[0] > target:
            a = m + 1
        else:
            b = m
    best = None
    for k in (a - 1, a, a + 1):
        if 0 <= k <= len(graded):
            j, toks = at(k)
            if in_range(j, lo, hi) and (best is None or abs(j - target) < abs(best[1] - target)):
                best = (toks, j)
    return best


def plant(src: Sequence[str], lo: float, hi: float, words: Words, pool: Sequence[str],
          rng: np.random.Generator, recipes: Sequence[str] = RECIPES, site: str = "",
          tries: int = 4) -> tuple[list[str], float, str] | None:
    """An edited copy of ``src`` whose J to it is in range (``in_range``), near a target
    drawn uniformly from [lo, hi]: (tokens, J, recipe), or None."""
    base = words.shingles(src)
    if not base:
        return None
    target = rng.uniform(lo, hi)
    best = None
    for _ in range(tries):
        recipe = recipes[rng.integers(0, len(recipes))]
        fixed, graded = _plan(recipe, len(src), pool, rng, site)
        got = _closest(src, fixed, graded, base, words, target, lo, hi)
        if got is not None and (best is None or abs(got[1] - target) < abs(best[1] - target)):
            best = (got[0], got[1], recipe)
        if best is not None and abs(best[1] - target) <= 0.02:
            break
    return best


def format_edit(tokens: Sequence[str], rng: np.random.Generator) -> str:
    """Render with edits that normalisation undoes: case, whitespace, punctuation,
    full-width letters (each kind on a random share of the tokens, or not at all)."""
    toks = list(tokens)
    n = len(toks)
    on = rng.random(4) < 0.5
    if on[0]:  # case
        for i in np.flatnonzero(rng.random(n) < 0.15).tolist():
            if toks[i] != PARA:
                toks[i] = [str.upper, str.capitalize, str.lower][i % 3](toks[i])
    if on[1]:  # punctuation attached to words
        marks = [",", ".", ";", ":", "!", "?", ")", "\u201d"]
        for i in np.flatnonzero(rng.random(n) < 0.05).tolist():
            if toks[i] != PARA:
                toks[i] = toks[i] + marks[i % len(marks)]
    if on[2]:  # full-width letters and digits (NFKC folds them back)
        for i in np.flatnonzero(rng.random(n) < 0.03).tolist():
            if toks[i] != PARA and toks[i].isascii():
                toks[i] = "".join(chr(ord(c) + 0xFEE0) if c.isalnum() else c for c in toks[i])
    text = render(toks)
    if on[3]:  # whitespace: doubled, tabs, no-break and ideographic spaces, line breaks
        seps = np.array(["  ", "\t", "\u00a0", "\u3000", "\n", " \n "])
        parts = text.split(" ")
        if len(parts) > 1:
            pick = rng.random(len(parts) - 1) < 0.1
            glue = np.where(pick, seps[rng.integers(0, len(seps), len(parts) - 1)], " ")
            text = "".join(p + g for p, g in zip(parts, [*glue.tolist(), ""], strict=True))
    return text


# -------------------------------------------------------------------------------- build


@dataclass
class Corpus:
    ids: list[str]
    texts: list[str]
    kind: list[str]
    source: list[str | None]
    lo: list[float | None]
    hi: list[float | None]
    recipe: list[str | None]


def _counts(n: int, a: argparse.Namespace, real_available: int) -> dict[str, int]:
    c = {"near": round(a.near * n), "decoy": round(a.decoy * n),
         "crowd": a.crowd if a.crowd is not None else n // 20,
         "cjk": round(a.cjk * n), "long": a.long, "one-word": max(3, round(0.001 * n)),
         "empty": max(3, round(0.0005 * n))}
    c["cjk-near"] = c["cjk"] // 5
    c["cjk"] -= c["cjk-near"]
    c["long-near"] = 1 if a.long else 0
    c["crowd-template"] = 1 if c["crowd"] else 0
    rest = n - sum(c.values())
    c["real"] = min(real_available, max(0, round(a.real * n)), max(rest, 0))
    c["synthetic"] = rest - c["real"]
    if c["synthetic"] < 0:
        sys.exit(f"--docs {n} is too small for these shares (need {n - c['synthetic']})")
    c["banner"] = round(a.banner * c["synthetic"])
    c["synthetic"] -= c["banner"]
    return c


def build(n: int, a: argparse.Namespace, log=print) -> tuple[Corpus, dict]:
    """The documents in keep order, with what each is."""
    rng = np.random.default_rng(a.seed)
    t0 = time.perf_counter()
    pkg = package_texts()
    docs = docstring_texts()
    log(f"  sources: {len(pkg):,} package files, {len(docs):,} help texts and docstrings "
        f"({time.perf_counter() - t0:.0f} s)")
    c = _counts(n, a, len(pkg) + len(docs))
    real = pkg + [docs[i] for i in np.sort(rng.choice(len(docs), max(0, c["real"] - len(pkg)),
                                                     replace=False))]
    real = real[:c["real"]]
    chain = Chain(pkg + docs)
    cjk_by_lang = cjk_messages()
    cjk_source = "gettext catalogues " + ", ".join(f"{k}: {len(v):,}" for k, v in
                                                   cjk_by_lang.items())
    if sum(map(len, cjk_by_lang.values())) < 200:
        cjk_by_lang, cjk_source = pseudo_cjk(5000, rng), "pseudo-text (no catalogues found)"
    cjk_langs = sorted(cjk_by_lang)
    cjk_pool = [m for k in cjk_langs for m in cjk_by_lang[k]]
    log(f"  chain: {len(chain.vocab):,} distinct tokens; CJK messages: {cjk_source}")

    rows: list[tuple[str, str, str | None, float | None, float | None, str | None]] = []

    def add(text: str, kind: str, source: int | None = None, lo: float | None = None,
            hi: float | None = None, recipe: str | None = None) -> int:
        rows.append((text, kind, source, lo, hi, recipe))
        return len(rows) - 1

    for t in real:
        add(t, "real")
    per_token = 1 + chain.token_bytes
    size = np.exp(rng.normal(math.log(a.doc_bytes), 0.35, c["synthetic"] + c["banner"]))
    lengths = np.clip(np.round(size / per_token), 20, None).astype(np.int64)
    long_len = np.full(c["long"], round(a.long_bytes / per_token), np.int64)
    seqs = chain.generate(np.concatenate([lengths, long_len]), rng)
    for i, s in enumerate(seqs[:len(lengths)]):
        text = chain.render(s, rng)
        if i >= c["synthetic"]:  # banner pages: the same boilerplate around other content
            site = SITES[rng.integers(0, len(SITES))]
            text = (COOKIE + PARA + text + PARA
                    + FOOTER.format(year=rng.integers(2015, 2026), site=site))
            add(text, "banner")
        else:
            add(text, "synthetic")
    long_rows = [add(chain.render(s, rng), "long") for s in seqs[len(lengths):]]
    del seqs
    cjk_rows = []
    for _ in range(c["cjk"]):  # one language a page
        lang = cjk_by_lang[cjk_langs[rng.integers(0, len(cjk_langs))]]
        msgs, size_b = [], 0
        while size_b < a.doc_bytes:
            m = lang[rng.integers(0, len(lang))]
            msgs.append(m)
            size_b += len(m.encode())
        cjk_rows.append(add("\n".join(msgs), "cjk"))
    log(f"  base documents: {len(rows):,} ({time.perf_counter() - t0:.0f} s)")

    words = Words()
    pool = chain.vocab[chain.sample_unigram(200_000, rng)].tolist()
    cjk_tokens = [t for m in cjk_pool for t in m.split()]
    words.learn([*chain.vocab.tolist(), *cjk_tokens, *tokens_of(COOKIE), *tokens_of(FOOTER),
                 *tokens_of(LICENCE_HEADER)])
    thresholds = sorted(a.threshold)
    base = [i for i, r in enumerate(rows) if r[1] in ("real", "synthetic", "banner")]
    missed = 0

    def copies(count: int, sources: Sequence[int], ranges: list[tuple[float, float]],
               kind: str, tok_pool: Sequence[str]) -> None:
        nonlocal missed
        for i in range(count):
            lo, hi = ranges[i % len(ranges)]
            for _ in range(20):
                s = sources[rng.integers(0, len(sources))]
                got = plant(tokens_of(rows[s][0]), lo, hi, words, tok_pool, rng,
                            site=SITES[rng.integers(0, len(SITES))])
                if got is not None:
                    toks, _, recipe = got
                    text = render(toks)
                    if rng.random() < 0.5:  # format edits, unless they move J (ß -> SS)
                        edited = format_edit(toks, rng)
                        j = jaccard_sets(words.shingles(tokens_of(rows[s][0])),
                                         words.shingles(tokens_of(edited)))
                        if in_range(j, lo, hi):
                            text, recipe = edited, recipe + "+format"
                    add(text, kind, s, lo, hi, recipe)
                    break
            else:
                missed += 1

    near_ranges = [(t, min(t + 0.1, 1.0)) for t in thresholds]
    decoy_ranges = [(max(t - 0.1, 0.0), t) for t in thresholds]
    copies(c["near"], base, near_ranges, "near", pool)
    log(f"  near copies: {c['near']:,} ({time.perf_counter() - t0:.0f} s)")
    copies(c["decoy"], base, decoy_ranges, "decoy", pool)
    copies(c["cjk-near"], cjk_rows, near_ranges, "cjk-near", cjk_tokens)
    copies(c["long-near"], long_rows[:1], near_ranges[:1], "long-near", pool)

    if c["crowd"]:
        site = SITES[0]
        template = add(NOT_FOUND.format(site=site, path="index.html", date="2024-01-01",
                                        rid="0", year=2024), "crowd-template")
        vocab_words = [w for w in pool[:20_000] if w.isalpha()]
        for _ in range(c["crowd"]):
            path = "/".join(vocab_words[j] for j in rng.integers(0, len(vocab_words),
                                                                  rng.integers(1, 4)))
            date = f"20{rng.integers(15, 26)}-{rng.integers(1, 13):02d}-{rng.integers(1, 29):02d}"
            text = NOT_FOUND.format(site=site, path=path.lower() + ".html", date=date,
                                    rid="0", year=2024)
            m = int(rng.integers(0, 2))
            ops = [("sub", rng.random(), pool[rng.integers(0, len(pool))]) for _ in range(m)]
            toks = apply_ops(tokens_of(text), ops)
            add(format_edit(toks, rng) if rng.random() < 0.5 else render(toks), "crowd",
                template, None, None, f"slots+{m} words")
        log(f"  crowd: {c['crowd']:,} ({time.perf_counter() - t0:.0f} s)")

    vocab_one = [w for w in chain.vocab[chain.sample_unigram(4 * c["one-word"], rng)].tolist()]
    one = [w for w, ws in zip(vocab_one, words_of(vocab_one), strict=True) if len(ws) == 1]
    for w in one[:c["one-word"]]:
        add(w, "one-word")
    for i in range(c["empty"]):
        add(["", " ", PARA, "...", "\u2014 \u2014", "\t"][i % 6], "empty")

    order = rng.permutation(len(rows))  # keep order: copies land before or after sources
    name = {int(r): f"d{r:07d}" for r in range(len(rows))}
    corpus = Corpus(ids=[name[int(r)] for r in order], texts=[rows[r][0] for r in order],
                    kind=[rows[r][1] for r in order],
                    source=[None if rows[r][2] is None else name[rows[r][2]] for r in order],
                    lo=[rows[r][3] for r in order], hi=[rows[r][4] for r in order],
                    recipe=[rows[r][5] for r in order])
    counts = dict(sorted(c.items()))
    counts["not planted (no copy in range found)"] = missed
    info = {"counts": counts, "sources": {"package_files": len(pkg),
                                          "docstrings": len(docs), "cjk": cjk_source,
                                          "chain_vocabulary": len(chain.vocab)},
            "build_s": time.perf_counter() - t0}
    return corpus, info


def tokenize(texts: Sequence[str], log=print, batch: int = 5000) -> pa.Array:
    """all-MiniLM-L6-v2 token ids (no special tokens, no truncation) as list<int32>."""
    from tokenizers import Tokenizer

    with tempfile.TemporaryDirectory(prefix="minilm-") as tmp:
        with contextlib.redirect_stdout(sys.stderr):  # the package prints as it loads
            from all_minilm_l6_v2 import extract_model

            model = extract_model(tmp)
        tok = Tokenizer.from_file(str(Path(model) / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    lists = []
    t0 = time.perf_counter()
    for a in range(0, len(texts), batch):
        enc = tok.encode_batch(list(texts[a:a + batch]), add_special_tokens=False)
        lists += [np.asarray(e.ids, np.int32) for e in enc]
    log(f"  tokenized {len(texts):,} documents ({time.perf_counter() - t0:.0f} s)")
    offsets = np.zeros(len(lists) + 1, np.int64)
    np.cumsum([len(x) for x in lists], out=offsets[1:])
    flat = np.concatenate(lists) if lists else np.zeros(0, np.int32)
    return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(flat, pa.int32())) \
        .cast(pa.list_(pa.int32()))


def measure(corpus: Corpus, tokens: pa.Array | None) -> tuple[np.ndarray, np.ndarray]:
    """Exact J of every planted copy to its source: word 5-grams, and token 5-grams."""
    row = {d: i for i, d in enumerate(corpus.ids)}
    copy = np.array([i for i, s in enumerate(corpus.source) if s is not None], np.int64)
    src = np.array([row[corpus.source[i]] for i in copy.tolist()], np.int64)
    both = np.unique(np.concatenate([copy, src]))
    at = {int(r): k for k, r in enumerate(both.tolist())}
    sets = shingle_sets([corpus.texts[i] for i in both.tolist()])
    a = np.array([at[i] for i in copy.tolist()], np.int64)
    b = np.array([at[i] for i in src.tolist()], np.int64)
    jw = np.full(len(corpus.ids), np.nan)
    jt = np.full(len(corpus.ids), np.nan)
    jw[copy] = pair_jaccard(sets, a, b)
    if tokens is not None:
        jt[copy] = pair_jaccard(token_shingle_sets(tokens.take(pa.array(both))), a, b)
    return jw, jt


def check_shingles(corpus: Corpus, jw: np.ndarray, rng: np.random.Generator,
                   n: int = 300) -> str:
    """Where the vectorised shingles disagree with the plain-Python rule: set sizes of a
    sample of documents, and J of a sample of copies (empty: they agree)."""
    texts = corpus.texts
    pick = rng.choice(len(texts), min(n, len(texts)), replace=False).tolist()
    sizes = shingle_sets([texts[i] for i in pick]).sizes.tolist()
    bad = [corpus.ids[i] for i, s in zip(pick, sizes, strict=True)
           if len(shingle_strings(python_words(texts[i]))) != s]
    row = {d: i for i, d in enumerate(corpus.ids)}
    copies = np.flatnonzero(~np.isnan(jw))
    for i in rng.choice(copies, min(n, len(copies)), replace=False).tolist():
        if len(texts[i]) > 100_000:
            continue
        a = shingle_strings(python_words(texts[i]))
        b = shingle_strings(python_words(texts[row[corpus.source[i]]]))
        if abs(jaccard_sets(a, b) - jw[i]) > 1e-12:
            bad.append(f"J of {corpus.ids[i]}")
    return ", ".join(bad[:10])


def in_range(j: float, lo: float, hi: float) -> bool:
    """A planted J's range: [lo, hi), or [lo, 1] when hi is 1."""
    return lo <= j and (j < hi or hi >= 1.0)


def write(corpus: Corpus, out: Path, a: argparse.Namespace, info: dict, log=print) -> dict:
    rng = np.random.default_rng(a.seed + 1)
    tokens = None if a.no_tokens else tokenize(corpus.texts, log)
    jw, jt = measure(corpus, tokens)
    out_of_range = sum(1 for i in np.flatnonzero(~np.isnan(jw)).tolist()
                       if corpus.lo[i] is not None and not in_range(jw[i], corpus.lo[i],
                                                                    corpus.hi[i]))
    bad = check_shingles(corpus, jw, rng)
    if bad:
        sys.exit(f"the vectorised shingles differ from the plain-Python rule: {bad}")
    for sub in ("text", "tokens"):
        (out / sub).mkdir(parents=True, exist_ok=True)
        for old in (out / sub).glob("*.parquet"):
            old.unlink()
    n = len(corpus.ids)
    bounds = np.linspace(0, n, a.parts + 1).round().astype(int)
    for p in range(a.parts):
        s = slice(bounds[p], bounds[p + 1])
        ids = pa.array(corpus.ids[s], pa.string())
        pq.write_table(pa.table({"id": ids, "text": pa.array(corpus.texts[s], pa.string())}),
                       out / "text" / f"part-{p:05d}.parquet", row_group_size=a.row_group)
        if tokens is not None:
            pq.write_table(pa.table({"id": ids, "tokens": tokens[s]}),
                           out / "tokens" / f"part-{p:05d}.parquet", row_group_size=a.row_group)
    truth = pa.table({"id": pa.array(corpus.ids, pa.string()),
                      "kind": pa.array(corpus.kind, pa.string()),
                      "source": pa.array(corpus.source, pa.string()),
                      "jaccard": pa.array(jw, pa.float64(), mask=np.isnan(jw)),
                      "jaccard_token": pa.array(jt, pa.float64(), mask=np.isnan(jt)),
                      "lo": pa.array(corpus.lo, pa.float64()),
                      "hi": pa.array(corpus.hi, pa.float64()),
                      "recipe": pa.array(corpus.recipe, pa.string())})
    pq.write_table(truth, out / "truth.parquet")
    text_bytes = sum(len(t.encode()) for t in corpus.texts)
    planted = ~np.isnan(jw) & np.array([k in ("near", "cjk-near", "long-near")
                                        for k in corpus.kind])
    info = {**info, "docs": n, "seed": a.seed, "thresholds": sorted(a.threshold),
            "parts": a.parts, "text_bytes": text_bytes,
            "planted_out_of_range": out_of_range,
            "planted_jaccard_quantiles": np.quantile(jw[planted], [0, .25, .5, .75, 1]).tolist()
            if planted.any() else None,
            "tokenizer": None if tokens is None else "all-MiniLM-L6-v2 (tokenizers, "
                                                     "no special tokens)",
            "normalisation": "NFKC, lower case, words = runs of \\p{L}\\p{M}\\p{N}, each "
                             "\\p{Han}, \\p{Hiragana}, \\p{Katakana} character a word",
            "shingles": f"word {SHINGLE}-grams"}
    (out / "corpus.json").write_text(json.dumps(info, indent=2))
    return info


def make(n: int, out: Path, a: argparse.Namespace, log=print) -> dict:
    """Build and write a corpus of ``n`` documents into ``out``; returns corpus.json."""
    out.mkdir(parents=True, exist_ok=True)
    corpus, info = build(n, a, log)
    return write(corpus, out, a, info, log)


def arguments(ap: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The corpus' settings (shared with scripts/bench_jaccard.py)."""
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threshold", type=float, action="append", default=None,
                    help="planted copies' J in [t, t + 0.1] for each t (default 0.8)")
    ap.add_argument("--near", type=float, default=0.10, help="share of planted copies")
    ap.add_argument("--decoy", type=float, default=0.02,
                    help="share of copies in [t - 0.1, t)")
    ap.add_argument("--crowd", type=int, default=None, help="crowd size (default docs / 20)")
    ap.add_argument("--cjk", type=float, default=0.01, help="share of CJK documents")
    ap.add_argument("--long", type=int, default=2, help="documents of --long-bytes")
    ap.add_argument("--long-bytes", type=int, default=1 << 20)
    ap.add_argument("--real", type=float, default=0.05,
                    help="share of real texts (all package files, then docstrings)")
    ap.add_argument("--banner", type=float, default=0.03,
                    help="share of synthetic pages inside a cookie banner and footer")
    ap.add_argument("--doc-bytes", type=float, default=1000.0, help="median synthetic size")
    ap.add_argument("--parts", type=int, default=4, help="Parquet files")
    ap.add_argument("--row-group", type=int, default=16_384)
    ap.add_argument("--no-tokens", action="store_true", help="skip the token-id variant")
    return ap


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=100_000)
    ap.add_argument("--out", required=True)
    a = arguments(ap).parse_args()
    a.threshold = a.threshold or [0.8]
    info = make(a.docs, Path(a.out), a, lambda s: print(s, file=sys.stderr, flush=True))
    print(json.dumps(info, indent=2))


if __name__ == "__main__":
    main()
