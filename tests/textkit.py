"""Real texts for the jaccard tests, and a brute-force oracle that shares nothing with the
kernel's candidate search or its decisions.

Texts: the licence and METADATA files the installed packages ship (real boilerplate with
natural near copies: the same licence with another holder), deterministic by name.
Edits of the kinds crawls have: words replaced, dropped or inserted at random places.
"""

from __future__ import annotations

import math
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np

from transforms.near.sets import Sets, candidate_chance

# the test runner's own parallel plugin (pyproject's addopts): not part of the corpus, so
# the texts are those of the packages the project installs, whatever runs the tests
RUNNER_PACKAGES = ("pytest_xdist-", "execnet-")


def package_texts(limit: int, min_bytes: int = 400, max_bytes: int = 20_000) -> list[str]:
    """Distinct licence / METADATA texts of the installed packages, sorted by path."""
    site = Path(np.__file__).resolve().parents[1]
    names = ("LICENSE*", "LICENCE*", "COPYING*", "METADATA")
    paths = sorted({p for n in names for p in site.glob(f"*.dist-info/**/{n}") if p.is_file()
                    and not p.relative_to(site).parts[0].startswith(RUNNER_PACKAGES)})
    out, seen = [], set()
    for p in paths:
        text = p.read_text(errors="replace")[:max_bytes]
        if len(text) >= min_bytes and text not in seen:
            seen.add(text)
            out.append(text)
        if len(out) == limit:
            break
    assert len(out) == limit, f"only {len(out)} package texts under {site} ({sys.prefix})"
    return out


def edited(text: str, rate: float, rng: np.random.Generator, vocab: list[str]) -> str:
    """``text`` with about ``rate`` of its words replaced, dropped or preceded by another."""
    words = text.split(" ")
    out = []
    for w in words:
        r = rng.random()
        if r < rate / 3:
            out.append(vocab[rng.integers(len(vocab))])
        elif r < 2 * rate / 3:
            continue
        elif r < rate:
            out += [vocab[rng.integers(len(vocab))], w]
        else:
            out.append(w)
    return " ".join(out)


BASES = 90  # crawl_corpus: real texts; each gets a few edited copies, some before it
CROWD = 120  # crawl_corpus: copies of one licence, with small edits


def crawl_corpus() -> list[str]:
    """Real texts, near copies at edit rates spread over 0-20% of words, a crowd, and
    exact copies; shuffled so that copies come before their source too."""
    rng = np.random.default_rng(43)
    base = [t[:3000] for t in package_texts(BASES + 1)]
    vocab = sorted({w for t in base for w in t.split()})
    docs = list(base[1:])
    for i, t in enumerate(base[1:]):
        for _ in range(1 + i % 3):
            docs.append(edited(t, rng.uniform(0.0, 0.2), rng, vocab))
    docs += [edited(base[0], 0.01, rng, vocab) for _ in range(CROWD)]
    docs += [docs[5], docs[7]]  # exact copies
    return [docs[i] for i in rng.permutation(len(docs))]


def token_ids(texts: list[str]) -> list[np.ndarray]:
    """Texts as the all-MiniLM-L6-v2 tokenizer's ids (variable lengths, whole texts), as a
    pretraining shard holds them."""
    from all_minilm_l6_v2 import get_model_path
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(get_model_path()) / "tokenizer.json"))
    tok.no_truncation()  # the whole text, not the model's first 128 tokens
    tok.no_padding()  # nor padded to 128 (the tokenizer.json pads)
    return [np.asarray(e.ids[1:-1], np.int32) for e in tok.encode_batch(texts)]


def oracle(sets: Sets, threshold: float, grouping: str = "representative"
           ) -> dict[int, tuple[int, Fraction]]:
    """removed record -> (the record it duplicates, J), records in keep order (index
    order), every pair compared in exact fractions. representative: removed when an
    earlier kept record has J >= t, as the duplicate of the one with the highest J (ties:
    the earlier); components: every record joined to an earlier one by J >= t (any
    chain) is removed, as a duplicate of its component's first record (with their own J,
    below t where the component chains)."""
    t = Fraction(str(threshold))
    rows = [set(sets.row(i).tolist()) for i in range(len(sets))]

    def jac(a: int, b: int) -> Fraction:
        return Fraction(len(rows[a] & rows[b]), len(rows[a] | rows[b]))

    n = len(rows)
    out: dict[int, tuple[int, Fraction]] = {}
    if grouping == "representative":
        kept: list[int] = []
        for d in range(n):
            best = None
            for k in kept:
                j = jac(d, k)
                if j >= t and (best is None or j > best[1]):
                    best = (k, j)
            if best is None:
                kept.append(d)
            else:
                out[d] = best
        return out
    parent = list(range(n))

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a in range(n):
        for b in range(a):
            if jac(a, b) >= t:
                ra, rb = root(a), root(b)
                parent[max(ra, rb)] = min(ra, rb)
    for d in range(n):
        if root(d) != d:
            out[d] = (root(d), jac(d, root(d)))
    return out


def lsh_misses_allowed(similarities, bands: int, rows: int) -> float:
    """Records bounded mode may miss among records whose best earlier partner has these
    Jaccard similarities: each is missed when that partner shares no band (its other
    partners only add chances), so the S-curve's expected misses, plus three standard
    deviations and one. A fixed recall floor fails when a corpus (the installed packages'
    texts) shifts towards pairs at the threshold, where LSH finds a pair with 1 - (1 -
    t^rows)^bands, not 1."""
    p = np.array([1.0 - candidate_chance(float(j), bands, rows) for j in similarities])
    return float(p.sum() + 3 * math.sqrt(float((p * (1 - p)).sum())) + 1)
