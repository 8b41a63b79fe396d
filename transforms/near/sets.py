"""Near duplicates of texts and token sequences by the Jaccard similarity of their shingle
sets: shingling, MinHash-LSH candidates or an exact set-similarity join, every candidate
verified by its true Jaccard, decisions in keep order.

Why this way:

- **Shingles as 64-bit hashes.** A record becomes the set of its shingles (word or
  character n-grams of normalised text, or token n-grams), each a 64-bit hash; Jaccard is
  computed over those hashes (two different shingles collide with probability ~2^-64 per
  pair, which the docs state). A set is a sorted array, so the exact Jaccard of two
  records is one merge of two sorted arrays, and records travel as flat arrays (CSR:
  ``offsets`` and ``hashes``), never as one Python object per shingle.
- **Vectorised over a chunk.** Normalisation and splitting are pyarrow compute; words are
  hashed once per distinct word of the chunk (a dictionary), n-grams are combined with
  array operations; MinHash signatures are ``permutations`` passes over the chunk's flat
  hashes with a segmented minimum (``np.minimum.reduceat``): no per-document Python loop
  on the hot path.
- **Candidates, then the truth.** ``bounded`` mode: records that share a band of their
  MinHash signature meet (LSH); ``exact`` mode: records that share a token of their
  prefix (the smallest ``|x| - ceil(t |x|) + 1`` hashes of the set) meet, which every
  pair at J >= t does (the prefix-filtering lemma of AllPairs / PPJoin, for any total
  order of the tokens), with the length filter ``t |x| <= |y| <= |x| / t``. A candidate is
  never a decision: each pair is verified by its exact Jaccard (precision 1.0).
- **No pair lists, decisions in keep order** (``decide``): each record, in its turn, is
  compared with the earlier records of its groups that can decide it, all at once: the
  kept ones (representative: removed when one is at J >= t, as the duplicate of the one
  with the highest J, ties by keep order) or one record of each other earlier component
  (components: joined by verified pairs only, so no false edge chains unrelated
  records). A crowd (one boilerplate copied 100,000 times) that keeps one record costs
  about one comparison per member, not m^2 / 2. Bounded mode also skips candidates whose
  MinHash estimate is far below the threshold (``SIGNATURE_MARGIN``).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from transforms.io.formats.base import byte_slices
from transforms.near.recall import splitmix64
from transforms.near.search import on_device, to_device, use_cuda
from transforms.near.spec import NearSpec, Shingles, check_rank

WORDS = Shingles()  # the default: word 5-grams of normalised text
PERMUTATIONS = 128  # MinHash signature length unless set
TARGET_AT_THRESHOLD = 0.995  # LSH: the chance a pair at J = threshold becomes a candidate
_SALT = np.uint64(0x6A09E667F3BCC909)  # tokens' and bands' hashes apart from words'
# Chinese and Japanese are written without spaces: each of these characters is a word (as
# BERT's basic tokenizer splits Han characters); Korean separates its words with spaces
_IDEOGRAPHS = r"[\p{Han}\p{Hiragana}\p{Katakana}]"
_PRIME = 0x100000001B3  # char n-grams: polynomial base (odd: invertible mod 2^64)


# ------------------------------------------------------------------------- shingling


@dataclass
class Sets:
    """Records as sets of 64-bit shingle hashes, CSR: record i holds
    ``hashes[offsets[i]:offsets[i + 1]]``, sorted, without repeats; ``empty`` marks the
    records that hold no unit at all (invalid: nothing to compare)."""

    offsets: np.ndarray  # (n + 1,) int64
    hashes: np.ndarray  # (offsets[-1],) uint64
    empty: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # (n,)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    def row(self, i: int) -> np.ndarray:
        return self.hashes[self.offsets[i]:self.offsets[i + 1]]

    def take(self, idx: np.ndarray) -> Sets:
        idx = np.asarray(idx, np.int64)
        offsets = np.zeros(len(idx) + 1, np.int64)
        np.cumsum(self.offsets[idx + 1] - self.offsets[idx], out=offsets[1:])
        return Sets(offsets, _flat(self, idx), self.empty[idx] if len(self.empty) else
                    np.zeros(len(idx), bool))

    @staticmethod
    def gather(parts: Sequence[Sets], order: np.ndarray) -> Sets:
        """``Sets.concat(parts).take(order)`` (``order``: a permutation of the parts' rows
        laid end to end) built once: each part's hashes go straight to their places. The
        concatenated copy beside the parts and the result was a key shard's peak (at 1M
        documents, 220k records' sets: 3 x 330 MB)."""
        where = np.empty(len(order), np.int64)
        where[order] = np.arange(len(order))
        sizes = np.concatenate([p.sizes for p in parts]) if parts else np.zeros(0, np.int64)
        offsets = np.zeros(len(order) + 1, np.int64)
        np.cumsum(sizes[order], out=offsets[1:])
        hashes = np.empty(int(offsets[-1]), np.uint64)
        empty = np.zeros(len(order), bool)
        base = 0
        for p in parts:
            at, lo = where[base:base + len(p)], int(p.offsets[0])
            hashes[np.repeat(offsets[at] - (p.offsets[:-1] - lo), p.sizes)
                   + np.arange(int(p.offsets[-1]) - lo)] = p.hashes[lo:p.offsets[-1]]
            if len(p.empty):
                empty[at] = p.empty
            base += len(p)
        return Sets(offsets, hashes, empty)

    @staticmethod
    def concat(parts: Sequence[Sets]) -> Sets:
        starts = np.cumsum([0] + [p.offsets[-1] for p in parts[:-1]])
        offsets = np.concatenate([np.zeros(1, np.int64)] + [
            p.offsets[1:] + s for p, s in zip(parts, starts, strict=True)])
        return Sets(offsets, np.concatenate([p.hashes for p in parts]) if parts else
                    np.zeros(0, np.uint64),
                    np.concatenate([p.empty if len(p.empty) else np.zeros(len(p), bool)
                                    for p in parts]) if parts else np.zeros(0, bool))


def _unique_per_record(offsets: np.ndarray, h: np.ndarray) -> Sets:
    """Each record's hashes sorted, repeats dropped (CSR in, CSR out). One sort per
    record: a record's few hundred hashes sort in cache (a chunk's 11M hashes: 0.16 s,
    against 2.1 s for one sort of (record, hash) pairs)."""
    n = len(offsets) - 1
    h = h.copy()
    bounds = offsets.tolist()
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        if b - a > 1:
            h[a:b].sort()
    keep = np.ones(len(h), bool)
    keep[1:] = h[1:] != h[:-1]
    keep[offsets[:-1][np.diff(offsets) > 0]] = True  # a record's first hash stays
    rec = np.repeat(np.arange(n, dtype=np.int64), np.diff(offsets))[keep]
    out = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(rec, minlength=n), out=out[1:])
    return Sets(out, h[keep], np.diff(offsets) == 0)


def _ngrams(offsets: np.ndarray, units: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Hashes of every run of ``k`` consecutive unit hashes inside each record (a record
    of fewer than k units but at least one: one hash of all it has), CSR. A run is the
    polynomial sum(u_j P^(k-1-j)) mod 2^64 of its (already well mixed) unit hashes, mixed
    once more (splitmix64): k - 1 multiply-adds per unit."""
    n = len(offsets) - 1
    length = np.diff(offsets)
    total = len(units)
    acc = units.copy()
    p = np.uint64(_PRIME)
    with np.errstate(over="ignore"):
        for j in range(1, k):  # acc[i] = the run units[i .. i + j] (across records too:
            nxt = np.zeros_like(acc)  # only starts whose run stays inside are read)
            if j < total:
                nxt[:total - j] = units[j:]
            acc = acc * p + nxt
    counts = np.maximum(length - k + 1, 0)
    short = (length > 0) & (length < k)
    counts[short] = 1
    out_off = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=out_off[1:])
    starts = np.repeat(offsets[:-1], counts) + (np.arange(out_off[-1])
                                                 - np.repeat(out_off[:-1], counts))
    grams = acc[starts] if len(starts) else np.zeros(0, np.uint64)
    if short.any():  # the whole short record: the run of all its units
        grams[out_off[:-1][short]] = _short_runs(offsets[:-1][short], length[short], units)
    with np.errstate(over="ignore"):
        return out_off, splitmix64(grams + np.uint64(k))


def _short_runs(starts: np.ndarray, lengths: np.ndarray, units: np.ndarray) -> np.ndarray:
    """The run of all the units of records shorter than a shingle (as ``_ngrams``)."""
    acc = units[starts].copy()
    p = np.uint64(_PRIME)
    with np.errstate(over="ignore"):
        for j in range(1, int(lengths.max())):
            more = lengths > j
            nxt = np.zeros_like(acc)
            nxt[more] = units[starts[more] + j]
            acc = np.where(more, acc * p + nxt, acc)
    return acc


# whitespace as Python's str.split sees it: RE2's \s is ASCII [\t\n\f\r ] only, so a
# no-break space, an em space or a line separator (U+2028) were parts of words
SPACE = r"[\s\x0b\x1c-\x1f\x{85}\p{Z}]"


def by_whitespace(shingles: Shingles) -> bool:
    """Whether ``text_sets`` finds these shingles' units through SPACE: words without
    normalizing, and characters normalized (whitespace runs become one space)."""
    return (shingles.unit, shingles.normalize) in (("word", False), ("char", True))


_WORD_SEPARATORS = r"[^\p{L}\p{M}\p{N}]+"  # the word unit: words are runs of the rest

# a mark with no letter or digit before it (after a symbol, a space, or first): the emoji
# presentation selector U+FE0F is one, so every emoji-only text was the one word "\ufe0f"
# and all of them near copies of each other at J 1
_ORPHAN_MARKS = r"(^|[^\p{L}\p{M}\p{N}])\p{M}+"


def unformatted(texts: pa.Array) -> pa.Array:
    """Unicode NFKC, without the invisible format characters and without marks that
    follow no letter, mark or digit (``_ORPHAN_MARKS``). NFKC by Python's
    ``unicodedata``: pyarrow 25's ``utf8_normalize`` returns the decomposed form for
    "NFKC" (a voiced kana became two characters). Format characters (category Cf: soft
    hyphen, zero-width space and joiners, word joiner, byte-order mark, direction marks),
    which NFKC keeps, each split a word ("hyphen" U+00AD "ation" was two words), so a
    scraped copy with soft hyphens or zero-width spaces was no near copy (J 0.02-0.49
    for every third word). ASCII texts hold none of these and skip it all."""
    if pc.all(pc.string_is_ascii(texts)).as_py() in (True, None):
        return texts
    t = pa.array([None if v is None else unicodedata.normalize("NFKC", v)
                  for v in texts.to_pylist()], texts.type)
    t = pc.replace_substring_regex(t, r"\p{Cf}+", "")
    return pc.replace_substring_regex(t, _ORPHAN_MARKS, r"\1")


def word_keys(words: list[str]) -> list[str]:
    """Each whitespace-separated token as the ``word`` unit compares it when it
    normalises: NFKC, lower case, only its letters, marks and digits (``text_sets``), so
    a page shown beside its re-cased or re-punctuated copy marks no word as changed."""
    arr = pc.utf8_lower(unformatted(pa.array(words, pa.large_string())))
    return pc.replace_substring_regex(arr, _WORD_SEPARATORS, "").to_pylist()


def normalized(texts: pa.Array) -> pa.Array:
    """``unformatted``, lower case, punctuation and symbols as spaces, whitespace
    collapsed."""
    t = unformatted(texts)
    t = pc.utf8_lower(t)
    t = pc.replace_substring_regex(t, r"[\p{P}\p{S}]", " ")
    t = pc.replace_substring_regex(t, SPACE + "+", " ")
    return pc.utf8_trim_whitespace(t)


def _word_hashes(words: pa.Array) -> np.ndarray:
    """A 64-bit hash per word: each distinct word of the chunk hashed once."""
    enc = pc.dictionary_encode(words)
    if isinstance(enc, pa.ChunkedArray):
        enc = enc.combine_chunks()
    vocab = enc.dictionary.to_pylist()
    table = np.fromiter((xxhash.xxh64_intdigest(w.encode()) for w in vocab), np.uint64,
                        len(vocab))
    return table[enc.indices.to_numpy(zero_copy_only=False)]


def text_sets(texts: Sequence[str] | pa.Array, shingles: Shingles) -> Sets:
    """The shingle sets of texts (``unit`` word or char)."""
    arr = (texts if isinstance(texts, pa.Array | pa.ChunkedArray) else
           pa.array(list(texts), pa.large_string()))
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if shingles.unit == "word":
        if shingles.normalize:  # NFKC, lower case; words: runs of letters, marks, digits
            arr = pc.utf8_lower(unformatted(arr))  # that start with a letter or digit
            if pc.any(pc.match_substring_regex(arr, _IDEOGRAPHS)).as_py():  # each a word
                arr = pc.replace_substring_regex(arr, f"({_IDEOGRAPHS})", r" \1 ")
            split = pc.split_pattern_regex(arr, _WORD_SEPARATORS)
        else:
            split = pc.split_pattern_regex(arr, SPACE + "+")
        offsets = np.asarray(split.offsets, np.int64)
        offsets = offsets - offsets[0]
        words = split.flatten()
        if len(words):  # an empty text, or a separator at either end, splits off ""
            nonempty = pc.not_equal(words, "").to_numpy(zero_copy_only=False)
            if not nonempty.all():
                rec = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))[nonempty]
                offsets = np.zeros(len(offsets), np.int64)
                np.cumsum(np.bincount(rec, minlength=len(offsets) - 1), out=offsets[1:])
                words = words.filter(pa.array(nonempty))
        units = _word_hashes(words) if len(words) else np.zeros(0, np.uint64)
    else:
        if shingles.normalize:
            arr = normalized(arr)
        offsets, units = _codepoints(arr)
    grams_off, grams = _ngrams(offsets, units, shingles.n)
    return _unique_per_record(grams_off, grams)


def _codepoints(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Each text's Unicode code points as uint64 (CSR), for character n-grams."""
    parts, lengths = [], []
    for s in arr.to_pylist():
        cp = np.frombuffer((s or "").encode("utf-32-le"), np.uint32)
        parts.append(cp)
        lengths.append(len(cp))
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    units = (np.concatenate(parts).astype(np.uint64) if parts else np.zeros(0, np.uint64))
    with np.errstate(over="ignore"):
        return offsets, splitmix64(units * np.uint64(_PRIME) + _SALT)


def token_values(batch) -> np.ndarray | list:
    """Integer sequences as unit token reads them: one (n, ...) integer array, each row a
    record flattened, or a list of records each flattened to 1-d (None stays None: no
    token). Why refuse floats: cast to int64, 1.2 and 1.0 would be one token."""
    if isinstance(batch, np.ndarray) and batch.dtype != object:
        if batch.ndim < 2:
            raise TypeError("unit token takes integer sequences: a batch of them as a "
                            f"2-d integer array or a list of 1-d arrays, got {batch.dtype} "
                            f"of shape {batch.shape}")
        if batch.dtype.kind not in "iu" and batch.size:
            raise TypeError(f"unit token takes integer sequences, got {batch.dtype} values")
        return batch.reshape(len(batch), -1)
    out = [None if s is None else np.asarray(s.numpy() if hasattr(s, "numpy") else s)
           .reshape(-1) for s in batch]
    bad = next((s.dtype for s in out if s is not None and s.dtype.kind not in "iu"
                and len(s)), None)
    if bad is not None:
        raise TypeError(f"unit token takes integer sequences, got {bad} values")
    return out


def token_sets(sequences: Sequence[np.ndarray] | np.ndarray, shingles: Shingles) -> Sets:
    """The shingle sets of integer sequences (``unit`` token): a list of arrays, or one
    (n, ...) array (a chunk of sequences of one length, as the readers give); each record
    is its values flattened (``token_values``), None an empty one."""
    seqs = token_values(sequences)
    if isinstance(seqs, np.ndarray):
        n = len(seqs)
        flat = seqs.astype(np.int64).reshape(-1)
        offsets = np.arange(n + 1, dtype=np.int64) * (len(flat) // max(n, 1))
    else:
        seqs = [np.zeros(0, np.int64) if s is None else s for s in seqs]
        lengths = np.fromiter((len(s) for s in seqs), np.int64, len(seqs))
        offsets = np.zeros(len(seqs) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = (np.concatenate([s.astype(np.int64) for s in seqs])
                if offsets[-1] else np.zeros(0, np.int64))
    with np.errstate(over="ignore"):
        units = splitmix64(flat.view(np.uint64) ^ _SALT)
    grams_off, grams = _ngrams(offsets, units, shingles.n)
    return _unique_per_record(grams_off, grams)


def blank_rows(values: Sequence | np.ndarray, shingles: Shingles) -> np.ndarray:
    """Records with no unit to compare (an empty or blank text, an empty sequence): the
    job reports them invalid, as a set of nothing is no record to compare."""
    if shingles.unit == "token":
        seqs = token_values(values)
        if isinstance(seqs, np.ndarray):
            return np.full(len(seqs), seqs.shape[1] == 0)
        return np.fromiter((v is None or len(v) == 0 for v in seqs), bool, len(seqs))
    arr = pa.array(list(values), pa.large_string()) if not isinstance(values, pa.Array) \
        else values
    if shingles.unit == "word" and shingles.normalize:
        has = pc.match_substring_regex(unformatted(arr), r"[\p{L}\p{N}]")
    elif shingles.unit == "char" and shingles.normalize:
        has = pc.greater(pc.utf8_length(normalized(arr)), 0)
    elif shingles.unit == "word":
        has = pc.match_substring_regex(arr, "[^" + SPACE[1:])
    else:
        has = pc.greater(pc.utf8_length(arr), 0)
    return ~pc.fill_null(has, False).to_numpy(zero_copy_only=False)


def blank_reason(unit: str) -> str:
    """Why a ``blank_rows`` record is invalid (the job's read and the steps say it alike)."""
    return f"no {unit} to compare (an empty or blank record; near.metric: jaccard)"


def unit_refusal(values: Sequence | np.ndarray, shingles: Shingles) -> str | None:
    """Why records of one kind (texts, or integer sequences: a chunk holds one) have no
    sets of ``shingles.unit`` (None: they have)."""
    arrow_texts = isinstance(values, pa.Array | pa.ChunkedArray) and (  # a table's column
        pa.types.is_string(values.type) or pa.types.is_large_string(values.type))
    kind = "" if arrow_texts else next((v for v in values if v is not None), None)
    if kind is None or (shingles.unit == "token") != isinstance(kind, str):
        return None
    if shingles.unit == "token":
        return "unit token takes integer sequences, got texts: use unit word or char"
    return (f"unit {shingles.unit} takes texts, got {type(kind).__name__}: token sequences "
            "need unit token")


# units shingled at once: each unit costs about a dozen 8-byte values on its way to a set
# (its hash, the n-gram sums, their starts, a sorted copy), so a chunk of 64 MB of text
# shingled whole took 10 times its size (+612 MB for word 5-grams of real code and prose)
SLICE_UNITS = 1 << 21
_CHARS_PER_UNIT = {"word": 6, "char": 1}  # about: a word and the space after it


def _unit_counts(values: Sequence | np.ndarray, unit: str) -> np.ndarray:
    """Each record's units, about (characters per ``_CHARS_PER_UNIT``; token: its values)."""
    if unit == "token":
        if isinstance(values, np.ndarray) and values.dtype != object:
            return np.full(len(values), values[0].size if len(values) else 0, np.int64)
        return np.fromiter((0 if v is None else np.size(v) for v in values), np.int64,
                           len(values))
    if isinstance(values, pa.Array | pa.ChunkedArray):
        chars = pc.fill_null(pc.binary_length(values), 0).to_numpy(zero_copy_only=False)
    else:
        chars = np.fromiter((len(v) if isinstance(v, str | bytes) else 0 for v in values),
                            np.int64, len(values))
    return chars // _CHARS_PER_UNIT[unit]


def record_sets(values: Sequence, shingles: Shingles) -> Sets:
    """Shingle sets of records as the job reads them: texts (str) for word and char,
    integer arrays for token; ``SLICE_UNITS`` units at a time, so the memory a chunk
    takes on its way to its sets does not grow with the chunk."""
    one = token_sets if shingles.unit == "token" else text_sets
    cuts = byte_slices(_unit_counts(values, shingles.unit), len(values), SLICE_UNITS)
    if len(cuts) <= 1:
        return one(values, shingles)
    return Sets.concat([one(values[a:b], shingles) for a, b in cuts])


# --------------------------------------------------------------------- MinHash and LSH


def lsh_params(threshold: float, permutations: int | None = None,
               bands: int | None = None) -> tuple[int, int]:
    """(bands, rows): ``bands`` bands of ``rows`` signature values each. Unset, the most
    rows (fewest chance candidates below the threshold) whose chance of making a pair at
    J = threshold a candidate, 1 - (1 - t^r)^b, is at least TARGET_AT_THRESHOLD."""
    k = permutations or PERMUTATIONS
    if bands is not None:
        if not 1 <= bands <= k:
            raise ValueError(f"shingles.bands must be between 1 and permutations ({k})")
        return bands, k // bands
    for rows in range(k, 0, -1):
        b = k // rows
        if candidate_chance(threshold, b, rows) >= TARGET_AT_THRESHOLD:
            return b, rows
    return k, 1


def candidate_chance(j: float, bands: int, rows: int) -> float:
    """The chance that a pair of Jaccard ``j`` shares at least one band (the S-curve)."""
    return 1.0 - (1.0 - j ** rows) ** bands


def _perm_coefficients(k: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0x5EED)
    a = rng.integers(1, 2 ** 63, k, dtype=np.uint64) * np.uint64(2) + np.uint64(1)  # odd
    b = rng.integers(0, 2 ** 63, k, dtype=np.uint64)
    return a, b


def signatures(sets: Sets, permutations: int, device: str = "cpu") -> np.ndarray:
    """(n, permutations) uint32 MinHash signatures: for each hash function h_i(x) =
    high 32 bits of (a_i x + b_i) mod 2^64 (a_i odd: a permutation of the 64-bit space),
    each record's minimum. Records must hold at least one shingle. ``device``: auto |
    cpu | cuda (``near.device``): on a GPU through torch (``signatures_torch``), the
    same values."""
    if use_cuda(device):
        import torch

        return on_device(lambda: signatures_torch(sets, permutations, torch.device("cuda")),
                         lambda: signatures(sets, permutations, "cpu"), "MinHash signatures")
    a, b = _perm_coefficients(permutations)
    out = np.empty((len(sets), permutations), np.uint32)
    off = sets.offsets
    # Records of SLICE_UNITS shingles at a time: a product per shingle of a 64 MB chunk
    # of text in char 24-grams was 3 arrays of 512 MB.
    for lo, hi in byte_slices(np.diff(off), len(sets), SLICE_UNITS):
        h = sets.hashes[off[lo]:off[hi]]
        starts = off[lo:hi] - off[lo]
        with np.errstate(over="ignore"):
            for i in range(permutations):
                v = (h * a[i] + b[i]) >> np.uint64(32)
                out[lo:hi, i] = np.minimum.reduceat(v, starts).astype(np.uint32)
    return out


SIGNATURE_BLOCK = 8 << 20  # torch: products computed at once (64 MB of int64)


def signatures_torch(sets: Sets, permutations: int, dev) -> np.ndarray:
    """``signatures`` on a torch device: int64 arithmetic wraps as uint64 does (two's
    complement), the high 32 bits are masked after the arithmetic shift, and each
    record's minimum is a scatter-reduce; permutations go in blocks that bound memory."""
    import torch

    a, b = (to_device(c.view(np.int64), dev) for c in _perm_coefficients(permutations))
    h = to_device(sets.hashes.view(np.int64), dev)
    n = len(sets)
    rec = to_device(np.repeat(np.arange(n, dtype=np.int64), sets.sizes), dev)
    out = torch.empty((n, permutations), dtype=torch.int64, device=dev)
    step = max(1, SIGNATURE_BLOCK // max(len(h), 1))
    for lo in range(0, permutations, step):
        hi = min(permutations, lo + step)
        v = ((h[:, None] * a[None, lo:hi] + b[None, lo:hi]) >> 32) & 0xFFFFFFFF
        m = torch.full((n, hi - lo), 1 << 32, dtype=torch.int64, device=dev)
        out[:, lo:hi] = m.scatter_reduce(0, rec[:, None].expand(-1, hi - lo), v, "amin")
    return out.cpu().numpy().astype(np.uint32)


def band_keys(sig: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(n, bands) uint64: a hash of each band of ``rows`` signature values (with the
    band's index, so equal values in different bands do not meet)."""
    n = len(sig)
    keys = np.empty((n, bands), np.uint64)
    with np.errstate(over="ignore"):
        for j in range(bands):
            acc = np.full(n, splitmix64(np.array([j], np.uint64) ^ _SALT)[0], np.uint64)
            for r in range(rows):
                acc = splitmix64(acc ^ sig[:, j * rows + r].astype(np.uint64))
            keys[:, j] = acc
    return keys


Frequent = tuple  # (sorted uint64 hashes, their counts): common shingles, in a sample


def frequent_tokens(sets: Sets, min_count: int = 2) -> Frequent:
    """The shingles ``sets`` hold at least ``min_count`` times, with their counts: the
    exact join orders them last (``prefix_tokens``)."""
    h, c = np.unique(sets.hashes, return_counts=True)
    keep = c >= min_count
    return h[keep], c[keep].astype(np.int64)


def prefix_tokens(sets: Sets, threshold: float, frequent: Frequent | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(record index, token) for each record's prefix: the first ``|x| - ceil(t |x|) + 1``
    of its hashes in one global order. Two records with J >= t share a prefix token
    (AllPairs' lemma, for any fixed order). The order: rarest first, as AllPairs orders
    its tokens, where ``frequent`` (``frequent_tokens`` of all records, or of a sample)
    says which shingles are common (by their count, then hash); a boilerplate phrase
    shared by thousands of documents then stays out of their prefixes, and with it a
    group of thousands of candidates. Without it: hash order."""
    sizes = sets.sizes
    plen = np.minimum(sizes, sizes - np.ceil(threshold * sizes - 1e-9).astype(np.int64) + 1)
    plen = np.maximum(plen, np.minimum(sizes, 1))
    rec = np.repeat(np.arange(len(sets), dtype=np.int64), plen)
    within = np.arange(plen.sum()) - np.repeat(np.cumsum(plen) - plen, plen)
    if frequent is None or not len(frequent[0]) or not len(sets.hashes):
        return rec, sets.hashes[sets.offsets[:-1][rec] + within]
    common, counts = frequent
    h = sets.hashes
    pos = np.minimum(np.searchsorted(common, h), len(common) - 1)
    weight = np.where(common[pos] == h, counts[pos], 0)
    owner = np.repeat(np.arange(len(sets), dtype=np.int64), sizes)
    # each record's hashes, rarest first (then by hash: a record's hashes are sorted, and
    # a stable sort of one int64 key keeps that order; lexsort of three took 3.5x longer)
    order = np.argsort((owner << 32) | np.minimum(weight, (1 << 32) - 1), kind="stable")
    return rec, h[order[sets.offsets[:-1][rec] + within]]


# ------------------------------------------------------------------- the exact Jaccard


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Exact Jaccard of two sorted hash sets without repeats."""
    if len(a) == 0 and len(b) == 0:
        return 1.0
    inter = np.intersect1d(a, b, assume_unique=True).size
    return inter / (len(a) + len(b) - inter)


def length_fits(na: int | np.ndarray, nb: int | np.ndarray, threshold: float
                ) -> bool | np.ndarray:
    """The length filter: J(a, b) <= min(|a|, |b|) / max(|a|, |b|) (sizes, or arrays of
    them elementwise)."""
    return np.minimum(na, nb) >= threshold * np.maximum(na, nb) - 1e-9


# ---------------------------------------------------------------- groups and decisions


POOL_CAP = 64  # bounded mode: kept records a group offers later ones, at most
SIGNATURE_MARGIN = 0.25  # bounded mode: a candidate whose MinHash estimate of J is more
# than this below the threshold is not verified (6.6 standard deviations at 112
# permutations and J = 0.8: a pair at the threshold is lost with chance ~1e-11)


def groups(keys: np.ndarray, members: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(group, member) of every key shared by at least two members (a member listed twice
    under one key counts once): groups are numbered from 0."""
    if len(keys) == 0:
        z = np.zeros(0, np.int64)
        return z, z
    order = np.lexsort((members, keys))
    k, m = keys[order], members[order]
    first = np.r_[True, (k[1:] != k[:-1]) | (m[1:] != m[:-1])]  # one (key, member) each
    k, m = k[first], m[first]
    start = np.r_[True, k[1:] != k[:-1]]
    gid = np.cumsum(start) - 1
    size = np.bincount(gid)
    shared = size[gid] > 1
    _, gid = np.unique(gid[shared], return_inverse=True)
    return gid.astype(np.int64), m[shared]


PAIR_GROUP = 64  # exact join: groups of at most this many records verify every pair


def group_pairs(gid: np.ndarray, member: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(a, b), a < b: every pair of members of one group, each pair once however many
    groups hold it (``gid`` and ``member`` as ``groups`` gives them; a member listed
    twice in a group counts once)."""
    o = np.lexsort((member, gid))
    g, m = gid[o], member[o]
    # [:len(g)]: no line at all (a key shard whose groups all exceed PAIR_GROUP)
    keep = np.r_[True, (g[1:] != g[:-1]) | (m[1:] != m[:-1])][:len(g)]
    g, m = g[keep], m[keep]
    start = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    size = np.diff(np.r_[start, len(g)])
    later = np.repeat(size, size) - 1 - (np.arange(len(g)) - np.repeat(start, size))
    first = np.repeat(np.arange(len(g)), later)
    second = first + 1 + np.arange(len(first)) - np.repeat(np.cumsum(later) - later, later)
    a, b = m[first], m[second]  # a < b: members sorted in each group
    span = np.int64(m.max(initial=0)) + 1
    pair = np.unique(a * span + b)  # one int64 per pair: 1-d unique (rows: ~10x slower)
    return pair // span, pair % span


def group_links(gid: np.ndarray, member: np.ndarray, sets: Sets, threshold: float,
                owned=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(a, b, J): every pair of co-members of these groups (``group_pairs``) that passes
    the length filter (and ``owned(a, b)``, a mask, when given), with its exact Jaccard
    (``pair_jaccards``)."""
    a, b = group_pairs(gid, member)
    fit = length_fits(sets.offsets[a + 1] - sets.offsets[a],
                      sets.offsets[b + 1] - sets.offsets[b], threshold)
    a, b = a[fit], b[fit]
    if owned is not None:
        mine = owned(a, b)
        a, b = a[mine], b[mine]
    return a, b, pair_jaccards(sets, a, b)


def linked_members(members: np.ndarray, sets: Sets, threshold: float
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Of one group's ``members`` (records of ``sets``, in keep order), which have a
    partner at J >= threshold in the group, and the J of every pair compared. Each
    member is compared with the earlier members near no earlier one (the pool), and one
    that joins the pool with the other earlier members too: of a near pair, the later
    end meets the earlier in the pool, or both ends are out of it (each near a pool
    member), or the later joins the pool and meets the earlier then. A crowd of copies
    keeps a small pool (each copy costs about the pool), a group of unrelated records
    costs its pairs; the members near nothing in it need not be decided together. Once
    most of the first PAIR_GROUP members or more are linked, or the members so far cost
    more than PAIR_GROUP comparisons each, every member is returned as linked (a crowd's
    members are in one component anyway, and its copies share dozens of such groups:
    sorting out each, on 1M documents, cost several times the whole decisions)."""
    linked = np.zeros(len(members), bool)
    pooled = np.zeros(len(members), bool)
    sizes = sets.offsets[members + 1] - sets.offsets[members]
    found = []
    spent = 0
    for i in range(len(members)):
        x = sets.row(int(members[i]))
        fits = length_fits(sizes[:i], sizes[i], threshold)
        for pool in (True, False):  # the pool first; the others if it joins the pool
            c = np.flatnonzero(fits & (pooled[:i] == pool))
            j = overlaps(sets, x, members[c]) if len(c) else np.zeros(0)
            found.append(j)
            spent += len(c)
            near = c[j >= threshold]
            if len(near):
                linked[near] = linked[i] = True
            if pool and len(near):
                break  # near a pool member: out of the pool
            pooled[i] = True
        if spent > PAIR_GROUP * (i + 1) or (i + 1 >= PAIR_GROUP and (i + 1) % 16 == 0 and
                                           2 * np.count_nonzero(linked[:i + 1]) > i + 1):
            linked[:] = True  # a crowd (or too dear to sort out): all of it goes on
            break
    return linked, np.concatenate(found) if found else np.zeros(0)


def check_groups(gid: np.ndarray, member: np.ndarray, key: np.ndarray, sets: Sets,
                 ordered: Sets, rank: np.ndarray, threshold: float
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The exact join's groups checked before any decision (one line per group and
    member; ``key``: each line's group key, a prefix hash; ``ordered``: the records'
    prefixes in their order; ``rank``: keep order). A group of at most PAIR_GROUP
    records has its pairs verified, each pair in one group only: that of the first
    prefix hash the two share (``first_shared``; when that group is larger, its
    membership links them). A larger group keeps only its ``linked_members``. Returns
    (a, b, J) of the verified pairs, which lines of larger groups go on, and the J of
    every pair compared."""
    small = np.bincount(gid)[gid] <= PAIR_GROUP
    small_keys = np.unique(key[small])
    a, b, j = group_links(gid[small], member[small], sets, threshold,
                          lambda a, b: np.isin(first_shared(ordered, a, b), small_keys))
    goes = np.zeros(len(gid), bool)
    found = [j]
    big = np.flatnonzero(~small)
    big = big[np.lexsort((rank[member[big]], gid[big]))]  # each group in keep order
    cuts = np.flatnonzero(np.r_[True, gid[big][1:] != gid[big][:-1], True]).tolist()
    for s, e in zip(cuts[:-1], cuts[1:], strict=True):
        linked, jj = linked_members(member[big[s:e]], sets, threshold)
        found.append(jj)
        goes[big[s:e][linked]] = True
    return a, b, j, goes, np.concatenate(found)


PAIR_HASHES = 1 << 22  # pair_jaccards: hashes looked up at once (32 MB each array)


def pair_jaccards(sets: Sets, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The exact Jaccard of records a[k] and b[k] of ``sets``, vectorised over the pairs
    (``_holds``: every hash of b[k] looked up among a[k]'s), a block of pairs at a time
    (a Python call per record cost 15 us a pair)."""
    na, nb = (sets.offsets[r + 1] - sets.offsets[r] for r in (a, b))
    inter = np.empty(len(a))
    for blk in _blocks_of(na + nb):
        pair = np.repeat(np.arange(len(blk)), nb[blk])
        hit = _holds(sets, a[blk][pair], _flat(sets, b[blk]))
        inter[blk] = np.bincount(pair, weights=hit, minlength=len(blk))
    return inter / (na + nb - inter)


def first_shared(ordered: Sets, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """For each pair (a[k], b[k]) of records of ``ordered`` (each record's prefix hashes
    in the global prefix order, ``prefix_tokens``): the first hash of a[k]'s that b[k]'s
    holds, which is also the first of b[k]'s that a[k]'s holds (one order); 0 where
    they share none. The exact join verifies a pair in that hash's group only."""
    owner = np.repeat(np.arange(len(ordered)), np.diff(ordered.offsets))
    lookup = Sets(ordered.offsets, ordered.hashes[np.lexsort((ordered.hashes, owner))])
    na, nb = (ordered.offsets[r + 1] - ordered.offsets[r] for r in (a, b))
    out = np.zeros(len(a), np.uint64)
    for blk in _blocks_of(na + nb):
        pair = np.repeat(np.arange(len(blk)), na[blk])
        q = _flat(ordered, a[blk])
        hit = np.flatnonzero(_holds(lookup, b[blk][pair], q))
        first = hit[np.r_[True, pair[hit][1:] != pair[hit][:-1]]] if len(hit) else hit
        out[blk[pair[first]]] = q[first]
    return out


def _blocks_of(work: np.ndarray) -> Iterator[np.ndarray]:
    """Indices of the pairs in blocks of about PAIR_HASHES ``work`` each."""
    done = np.cumsum(work)
    lo = 0
    while lo < len(work):
        hi = max(lo + 1, int(np.searchsorted(done, done[lo] + PAIR_HASHES)))
        yield np.arange(lo, hi)
        lo = hi


def _holds(sets: Sets, rec: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Whether record rec[k] of ``sets`` (each sorted) holds the hash h[k], vectorised:
    one sorted array of keys (the record's place among those asked, 24 bits; the hash's
    top 40 bits); a key shared by two hashes of one set (rare) is walked until the full
    hashes agree or the key changes."""
    if not len(h):
        return np.zeros(0, bool)
    ua, seg = np.unique(rec, return_inverse=True)
    xh = _flat(sets, ua)
    kx = (np.repeat(np.arange(len(ua), dtype=np.uint64), sets.offsets[ua + 1]
                    - sets.offsets[ua]) << np.uint64(40)) | (xh >> np.uint64(24))
    ky = (seg.astype(np.uint64) << np.uint64(40)) | (h >> np.uint64(24))
    pos = np.minimum(np.searchsorted(kx, ky), max(len(kx) - 1, 0))
    if not len(kx):
        return np.zeros(len(h), bool)
    same = kx[pos] == ky
    hit = same & (xh[pos] == h)
    walk = np.flatnonzero(same & ~hit)
    while len(walk):  # the next entries of a shared key
        pos[walk] += 1
        walk = walk[pos[walk] < len(kx)]
        walk = walk[kx[pos[walk]] == ky[walk]]
        found = xh[pos[walk]] == h[walk]
        hit[walk[found]] = True
        walk = walk[~found]
    return hit


FLAT_SLICES = 256  # _flat: records this long on average are copied slice by slice


def _flat(sets: Sets, recs: np.ndarray) -> np.ndarray:
    """The hashes of records ``recs``, laid end to end."""
    sizes = sets.offsets[recs + 1] - sets.offsets[recs]  # not ``sizes``: O(len(recs))
    if len(recs) and int(sizes.sum()) >= FLAT_SLICES * len(recs):  # long texts: a copy
        # per record beats building an index per hash (2-3x at 1,000 hashes each)
        h, lo, hi = sets.hashes, sets.offsets[recs].tolist(), sets.offsets[recs + 1].tolist()
        return np.concatenate([h[a:b] for a, b in zip(lo, hi, strict=True)])
    starts = np.zeros(len(recs), np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    return sets.hashes[np.repeat(sets.offsets[recs] - starts, sizes)
                       + np.arange(int(sizes.sum()))]


@dataclass
class Decided:
    """``decide``'s answer: removed records, each with the kept record it duplicates and
    their Jaccard; ``compared``: pairs whose exact Jaccard was computed, ``verified``
    their J counted in J_BINS bins of [0, 1] (the last holds 1); ``missed``: (record,
    candidate, J) of the candidates nearest the threshold from below (the report's
    pairs just outside it: at most MISSED, the highest J, one per record)."""

    removed: np.ndarray
    kept: np.ndarray
    j: np.ndarray
    compared: int = 0
    verified: np.ndarray = field(default_factory=lambda: np.zeros(J_BINS, np.int64))
    missed: tuple = (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0))


class _Union:
    def __init__(self) -> None:
        self.parent: dict[int, int] = {}

    def root(self, x: int) -> int:
        p = self.parent.setdefault(x, x)
        while p != x:
            self.parent[x] = self.parent.setdefault(p, p)
            x, p = p, self.parent[p]
        return x

    def join(self, a: int, b: int) -> None:
        ra, rb = self.root(a), self.root(b)
        if ra != rb:
            self.parent[max(ra, rb, key=self.rank)] = min(ra, rb, key=self.rank)

    rank = staticmethod(lambda x: x)  # replaced per use: keep order of the handles


def overlaps(sets: Sets, x: np.ndarray, cands: np.ndarray) -> np.ndarray:
    """Exact Jaccard of the sorted set ``x`` with each record of ``cands`` at once: every
    hash of theirs looked up in ``x`` (one vector pass, no Python loop per pair)."""
    return jaccards(x, _flat(sets, cands), sets.offsets[cands + 1] - sets.offsets[cands])


def jaccards(x: np.ndarray, flat: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Exact Jaccard of the sorted set ``x`` with each of the non-empty sets laid end to
    end in ``flat`` (``sizes`` hashes each)."""
    starts = np.zeros(len(sizes), np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    inter = np.add.reduceat(members_of(x, flat), starts, dtype=np.int64)
    return inter / (len(x) + sizes - inter)


_MIX = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: a table slot from a hash's top bits
_TAIL = 64  # table slots past the last one, for probe runs that pass the end
TABLE_ASKED = 4096  # members_of: hashes asked at least, and 8 per hash of the set


def members_of(x: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Whether each hash of ``q`` is in ``x`` (sorted, distinct). Many asked of one set
    (a record's candidates, the recall sample's): through an open-addressing table of
    ``x`` at most a quarter full, built and probed a round at a time (3-7x binary
    search's speed past 10^5 asked: a gather or two per hash, not log2 |x| dependent
    ones); few: binary search."""
    n = len(x)
    if not n:
        return np.zeros(len(q), bool)
    zero = bool(x[0] == 0)  # 0 marks a free slot: a set's own 0 (sorted first) apart
    many = len(q) >= max(TABLE_ASKED, 8 * n) and q.dtype == x.dtype == np.uint64
    built = _table(x[1:] if zero else x) if many else None
    if built is None:
        return x[np.minimum(np.searchsorted(x, q), n - 1)] == q
    table, shift = built
    s = ((q * _MIX) >> shift).astype(np.intp)
    t = table[s]
    hit = t == q
    more = np.flatnonzero((t != 0) & ~hit)  # an occupied slot of another hash: probe on
    while len(more):
        s[more] += 1
        t = table[s[more]]
        found = t == q[more]
        hit[more[found]] = True
        more = more[(t != 0) & ~found]
    return hit | (q == 0) if zero else hit & (q != 0)


def _table(v: np.ndarray) -> tuple[np.ndarray, np.uint64] | None:
    """``v`` (non-zero hashes) in a linear-probing table of 4-8x their number (slot: the
    top bits of hash x _MIX), placed a round at a time: each round fills one free slot
    per slot asked for, the others move one on. None when a run would reach the last
    slot (which must stay free to end every probe); never seen at a quarter full."""
    bits = len(v).bit_length() + 2
    shift = np.uint64(64 - bits)
    table = np.zeros((1 << bits) + _TAIL, np.uint64)
    slot = ((v * _MIX) >> shift).astype(np.intp)
    todo = np.arange(len(v))
    while len(todo):
        s = slot[todo]
        if s.max() >= len(table) - 1:
            return None
        free = np.flatnonzero(table[s] == 0)
        win = free[np.unique(s[free], return_index=True)[1]]
        table[s[win]] = v[todo[win]]
        todo = np.delete(todo, win)
        slot[todo] += 1
    return table, shift


def _join_pool(pool: dict, d: int, union: _Union, near) -> None:
    """Components: ``d`` joins each earlier component of one group (root -> members) that
    one of its members is near, the members tried in growing blocks (1, 2, 4...: in a
    crowd of near copies the first one decides); then ``d`` is a member."""
    merged: dict[int, list[int]] = {}
    for r, members in pool.items():  # components that merged since: one entry each
        merged.setdefault(union.root(r), []).extend(members)
    pool.clear()
    pool.update(merged)
    for r, members in list(merged.items()):
        a, step = 0, 1
        while a < len(members) and union.root(r) != union.root(d):
            c, _ = near(d, members[a:a + step])
            if len(c):
                union.join(r, d)
            a, step = a + step, step * 2
    pool.setdefault(union.root(d), []).append(d)
    root = union.root(d)
    for r in [r for r in pool if r != root and union.root(r) == root]:
        pool[root].extend(pool.pop(r))


J_BINS = 100  # the verified pairs' J histogram: bins of 0.01
MISSED = 500  # near misses a decision keeps (the report's borderline pairs below t)


def _best_missed(missed: list) -> tuple:
    """The MISSED near misses of highest J, one per record (its highest)."""
    best: dict[int, tuple[int, float]] = {}
    for d, c, j in missed:
        if d not in best or j > best[d][1]:
            best[d] = (c, j)
    top = sorted(best.items(), key=lambda kv: (-kv[1][1], kv[0]))[:MISSED]
    return (np.array([d for d, _ in top], np.int64), np.array([c for _, (c, _) in top],
            np.int64), np.array([j for _, (_, j) in top], np.float64))


def decide(gid: np.ndarray, member: np.ndarray, sets: Sets, rank: np.ndarray,
           threshold: float, grouping: str = "representative",
           protected: np.ndarray | None = None, sig: np.ndarray | None = None,
           tier: np.ndarray | None = None) -> Decided:
    """Decisions in keep order (``rank``: smaller first) over candidate groups
    (``groups``: records sharing an LSH band or a prefix token). Each record, in its
    turn, is compared with the earlier records of its groups that can decide it: the
    kept ones (representative, all at once: ``overlaps``), or the members of each
    earlier component not its own until one is near (components, ``_join_pool``). No
    pair is listed: a crowd of m near copies that keeps one record costs about m
    comparisons, not m^2 / 2.

    representative: a record is removed when an earlier kept record is within the
    threshold, as the duplicate of the one of the highest ``tier`` (``transforms.exact``:
    a reference record before a stored one before one of this run; None: all alike),
    then the highest J (ties: keep order);
    components: a record joined by verified pairs to an earlier one is removed, as a
    duplicate of its component's first record, with their own Jaccard (below the
    threshold where the component chains). ``protected`` (bool per record): never
    removed. ``sig`` (bounded mode): MinHash signatures; a candidate whose estimate is
    more than SIGNATURE_MARGIN below the threshold is not verified, and a group offers
    its first POOL_CAP kept records only: a crowd whose copies differ among themselves
    by about 1 - threshold keeps thousands, and each later copy met all of them (a
    100,000-copy crowd ran for hours); past the cap a copy near only later kept ones is
    kept (recall, measured, not precision)."""
    n = len(sets)
    protected = np.zeros(n, bool) if protected is None else protected
    tier = np.zeros(n, np.int8) if tier is None else tier
    if not len(gid):
        z = np.zeros(0, np.int64)
        return Decided(z, z, np.zeros(0))
    by = np.argsort(member, kind="stable")  # each record's groups (CSR)
    m_sorted, g_sorted = member[by], gid[by]
    nodes, first = np.unique(m_sorted, return_index=True)
    bounds = np.r_[first, len(m_sorted)].tolist()
    at = {int(v): i for i, v in enumerate(nodes.tolist())}
    order = nodes[np.argsort(rank[nodes], kind="stable")].tolist()
    sizes = sets.sizes
    pools: list = [[] if grouping != "components" else {} for _ in range(int(gid.max()) + 1)]
    union = _Union()
    union.rank = lambda h: (rank[h], h)
    removed: list[tuple[int, int, float]] = []
    compared = 0
    verified = np.zeros(J_BINS, np.int64)
    missed: list[tuple[int, int, float]] = []
    cap = POOL_CAP if sig is not None else None

    def near(d: int, cands: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """The candidates at J >= threshold, with their J (filters first)."""
        nonlocal compared
        c = np.asarray(cands, np.int64)
        c = c[length_fits(sizes[c], sizes[d], threshold)]
        if sig is not None and len(c):
            c = c[(sig[c] == sig[d]).mean(axis=1) >= threshold - SIGNATURE_MARGIN]
        if not len(c):
            return c, np.zeros(0)
        compared += len(c)
        j = overlaps(sets, sets.row(d), c)
        verified[:] += np.bincount(np.minimum((j * J_BINS).astype(np.int64), J_BINS - 1),
                                   minlength=J_BINS)
        ok = j >= threshold
        if not ok.all():
            b = int(np.argmax(np.where(ok, -1.0, j)))
            missed.append((d, int(c[b]), float(j[b])))
        return c[ok], j[ok]

    for d in order:
        i = at[d]
        mine = g_sorted[bounds[i]:bounds[i + 1]].tolist()
        if grouping == "components":
            for g in mine:
                _join_pool(pools[g], d, union, near)
            continue
        cands = list({e for g in mine for e in pools[g]})
        c, j = near(d, cands) if cands else (np.zeros(0, np.int64), np.zeros(0))
        if len(c) and not protected[d]:
            best = np.lexsort((rank[c], -j, -tier[c]))[0]
            removed.append((d, int(c[best]), float(j[best])))
        else:
            for g in mine:
                if cap is None or len(pools[g]) < cap:
                    pools[g].append(d)
    if grouping == "components":
        out = [(d, union.root(d)) for d in order if union.root(d) != d and not protected[d]]
        removed = [(d, f, jaccard(sets.row(d), sets.row(f))) for d, f in out]
    return Decided(np.array([r[0] for r in removed], np.int64),
                   np.array([r[1] for r in removed], np.int64),
                   np.array([r[2] for r in removed], np.float64), compared, verified,
                   _best_missed(missed))


# ---------------------------------------------------------------- the whole, in one go


@dataclass
class SetResult:
    """``find_near_sets``' answer: removals (record indices) with the record each
    duplicates and their Jaccard, and what the search did."""

    removed: np.ndarray
    kept: np.ndarray
    j: np.ndarray
    invalid: np.ndarray  # records with no unit at all (empty texts)
    mode: str
    bands: int
    rows: int
    compared: int  # pairs whose exact Jaccard was computed
    groups: int  # groups (buckets or prefix tokens) of two records or more
    largest: int = 0  # records in the largest group


def candidate_keys(sets: Sets, threshold: float, shingles: Shingles, mode: str
                   ) -> tuple[np.ndarray, np.ndarray, int, int, np.ndarray | None]:
    """(record index, key) of every record's group keys: its LSH bands (bounded) or its
    prefix tokens (exact), the bands x rows used (0, 0 for exact) and the signatures."""
    if mode == "exact":
        rec, keys = prefix_tokens(sets, threshold, frequent_tokens(sets))
        return rec, keys, 0, 0, None
    bands, rows = lsh_params(threshold, shingles.permutations, shingles.bands)
    sig = signatures(sets, bands * rows)
    bk = band_keys(sig, bands, rows)
    return np.repeat(np.arange(len(sets)), bands), bk.reshape(-1), bands, rows, sig


EXACT_WORK = 64  # auto: exact when its predicted comparisons are at most this many per record
EXACT_ANYWAY = 2_000_000  # ... or at most this many in all (a few seconds)
GROUP_KEPT = 64  # the join's cost model: a record meets at most this many kept ones per group


def join_work(sizes: np.ndarray) -> float:
    """A bound on the comparisons of candidate groups of these sizes: all pairs of a
    small group, and for a large one (a crowd) each member against the group's kept
    records, taken as at most GROUP_KEPT (``decide`` compares with kept records only).
    Pairs that meet in several groups count in each, so the join does fewer (on a 30k
    crawl sample: 2.3M bounded, 20k done)."""
    g = np.asarray(sizes, np.float64)
    return float(np.minimum(g * (g - 1) / 2, GROUP_KEPT * g).sum())


def choose_mode(sets: Sets, threshold: float, mode: str) -> tuple[str, str]:
    """(mode, why): ``auto`` takes the exact join when the comparisons its prefix groups
    predict (``join_work``) are at most EXACT_WORK per record or EXACT_ANYWAY in all,
    else bounded (MinHash-LSH)."""
    if mode != "auto":
        return mode, f"near.mode: {mode}"
    _, keys = prefix_tokens(sets, threshold, frequent_tokens(sets))
    _, sizes = np.unique(keys, return_counts=True)
    work = join_work(sizes[sizes > 1])
    return auto_choice(work, len(sets), "")


def auto_choice(work: float, n: int, source: str) -> tuple[str, str]:
    """``auto``'s rule and the line that says why."""
    per = work / max(1, n)
    pick = "exact" if per <= EXACT_WORK or work <= EXACT_ANYWAY else "bounded"
    return pick, (f"auto: the exact join's groups bound its comparisons at about {work:,.0f} "
                  f"({per:.1f} per record{source}; exact up to {EXACT_WORK} per record or "
                  f"{EXACT_ANYWAY:,} in all)")


def near_sets(sets: Sets, rank: np.ndarray, threshold: float, shingles: Shingles = WORDS,
              *, mode: str = "auto", grouping: str = "representative",
              protected: np.ndarray | None = None) -> SetResult:
    """Near duplicates among records given as sets (``record_sets``), none empty, at
    Jaccard >= ``threshold``, in keep order ``rank`` (smaller first); ``protected``
    (bool per record): never removed (reference records)."""
    _checked(len(sets), rank, threshold, shingles, mode, grouping)
    mode, _ = choose_mode(sets, threshold, mode)
    rank = np.asarray(rank)
    rec, keys, bands, rows, sig = candidate_keys(sets, threshold, shingles, mode)
    gid, member = groups(keys, rec)
    dec = decide(gid, member, sets, rank, threshold, grouping, protected, sig)
    largest = int(np.bincount(gid).max()) if len(gid) else 0
    return SetResult(dec.removed, dec.kept, dec.j, np.zeros(0, np.int64), mode, bands, rows,
                     dec.compared, int(gid.max()) + 1 if len(gid) else 0, largest)


def _checked(n: int, rank: np.ndarray, threshold: float, shingles: Shingles, mode: str,
             grouping: str) -> None:
    """The library's arguments checked as the job checks its config (``NearSpec``)."""
    NearSpec("jaccard", threshold, mode=mode, grouping=grouping, shingles=shingles)
    check_rank(n, rank)


def find_near_sets(values: Sequence, rank: np.ndarray, threshold: float,
                   shingles: Shingles = WORDS, *, mode: str = "auto",
                   grouping: str = "representative") -> SetResult:
    """Near duplicates among ``values`` (texts, or integer sequences for unit token) at
    Jaccard >= ``threshold``, in keep order ``rank`` (smaller first): the library's
    single-process form of the job's jaccard stage (``mode`` auto, exact or bounded, as
    the job's). Records with nothing to compare (empty texts) are returned as
    ``invalid``, never removed."""
    _checked(len(values), rank, threshold, shingles, mode, grouping)
    if refused := unit_refusal(values, shingles):
        raise TypeError(refused)
    sets = record_sets(values, shingles)
    ok = np.flatnonzero(~sets.empty)
    res = near_sets(sets.take(ok), np.asarray(rank)[ok], threshold, shingles, mode=mode,
                    grouping=grouping)
    res.removed, res.kept = ok[res.removed], ok[res.kept]
    res.invalid = np.flatnonzero(sets.empty)
    return res


def sample_partners(sets: Sets, rank: np.ndarray, sample: np.ndarray, threshold: float
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The recall's brute force: (sampled record, partner, J) for every partner earlier
    in keep order at J >= threshold of each ``sample`` record, found through the prefix
    index (complete: every such pair shares a prefix token) and verified exactly."""
    rec, keys = prefix_tokens(sets, threshold, frequent_tokens(sets))
    order = np.argsort(keys, kind="stable")
    skeys, srec = keys[order], rec[order]
    out_s, out_p, out_j = [], [], []
    for s in np.asarray(sample).tolist():
        mine = _prefix_of(rec, keys, s)
        lo, hi = np.searchsorted(skeys, mine), np.searchsorted(skeys, mine, side="right")
        cand = np.unique(np.concatenate([srec[a:b] for a, b in zip(lo, hi, strict=True)]
                                        or [np.zeros(0, np.int64)]))
        cand = cand[rank[cand] < rank[s]]
        x = sets.row(s)
        for c in cand.tolist():
            y = sets.row(c)
            if length_fits(len(x), len(y), threshold) and (j := jaccard(x, y)) >= threshold:
                out_s.append(s)
                out_p.append(c)
                out_j.append(j)
    return (np.asarray(out_s, np.int64), np.asarray(out_p, np.int64),
            np.asarray(out_j, np.float64))


def _prefix_of(rec: np.ndarray, keys: np.ndarray, s: int) -> np.ndarray:
    """Record ``s``'s prefix tokens (``rec`` is sorted: prefix_tokens lists by record)."""
    a, b = np.searchsorted(rec, s), np.searchsorted(rec, s, side="right")
    return keys[a:b]


def brute_force_sets(sets: Sets, rank: np.ndarray, threshold: float,
                     grouping: str = "representative") -> Decided:
    """The kernel's decisions with every record in one group (all pairs candidates, no
    signature filter): the oracle for tests and benches."""
    n = len(sets)
    return decide(np.zeros(n, np.int64), np.arange(n, dtype=np.int64), sets, np.asarray(rank),
                  threshold, grouping)


def expected_pairs(bands: int, rows: int, threshold: float) -> dict:
    """The S-curve at the threshold and 0.1 below it (docs and the CLI's note)."""
    return {"at_threshold": candidate_chance(threshold, bands, rows),
            "below_0_1": candidate_chance(max(threshold - 0.1, 0.0), bands, rows),
            "bands": bands, "rows": rows}


__all__ = ["Shingles", "Sets", "text_sets", "token_sets", "record_sets",
           "blank_rows", "blank_reason", "unit_refusal", "token_values", "near_sets",
           "choose_mode", "sample_partners",
           "lsh_params", "candidate_chance", "signatures", "band_keys", "prefix_tokens",
           "frequent_tokens", "jaccard", "overlaps", "groups", "join_work", "auto_choice",
           "decide", "find_near_sets", "candidate_keys",
           "brute_force_sets", "Decided", "SetResult", "expected_pairs"]
