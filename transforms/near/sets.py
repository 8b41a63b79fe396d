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
- **No pair lists in crowds.** A group of more than ALL_PAIRS records (one boilerplate
  copied 100,000 times) lists no pairs: when its turn comes in keep order, each member
  is compared with the crowd's records kept so far, so m near copies cost about m
  comparisons, not m^2 / 2. No false edge is ever drawn (every edge is verified), so
  components cannot chain unrelated records.
- **Decisions in keep order** over the verified edges (``decide_edges``): a record is
  removed when an earlier *kept* record is within the threshold, and ``duplicate_of``
  names the kept one with the highest J (ties: keep order). ``components`` grouping joins
  verified edges only. Pairs of small groups are all verified where the groups are;
  a group of more than ALL_PAIRS records (a crowd) is decided with the rest, each member
  compared with the crowd's kept records only (``decide``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from transforms.near.recall import splitmix64

UNITS = ("word", "char", "token")
DEFAULT_SIZE = {"word": 5, "char": 24, "token": 5}  # char: shorter n-grams match by chance
PERMUTATIONS = 128  # MinHash signature length unless set
ALL_PAIRS = 64  # groups up to this size verify every pair; larger ones (crowds) go by
# the kept records (``group_edges``)
TARGET_AT_THRESHOLD = 0.995  # LSH: the chance a pair at J = threshold becomes a candidate
_SALT = np.uint64(0x6A09E667F3BCC909)  # tokens' and bands' hashes apart from words'
_PRIME = 0x100000001B3  # char n-grams: polynomial base (odd: invertible mod 2^64)


@dataclass(frozen=True)
class Shingles:
    """How a record becomes a set: ``unit`` word (of normalised text), char (n-grams of
    its characters) or token (of an integer sequence as stored), ``size`` units per
    shingle (None: 5 for words and tokens, 24 for characters), ``normalize`` (text: NFKC,
    lower case, punctuation and whitespace collapsed), and the MinHash signature:
    ``permutations`` and ``bands`` (None: chosen from the threshold, ``lsh_params``)."""

    unit: str = "word"
    size: int | None = None
    normalize: bool = True
    permutations: int | None = None
    bands: int | None = None

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ValueError(f"shingles.unit must be one of {', '.join(UNITS)}, got "
                             f"{self.unit!r}")
        if self.size is not None and self.size < 1:
            raise ValueError(f"shingles.size must be at least 1, got {self.size}")

    @property
    def n(self) -> int:
        """Units per shingle."""
        return self.size if self.size is not None else DEFAULT_SIZE[self.unit]


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
        sizes = self.sizes[idx]
        offsets = np.zeros(len(idx) + 1, np.int64)
        np.cumsum(sizes, out=offsets[1:])
        flat = np.repeat(self.offsets[idx] - offsets[:-1], sizes) + np.arange(offsets[-1])
        return Sets(offsets, self.hashes[flat], self.empty[idx] if len(self.empty) else
                    np.zeros(len(idx), bool))

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


def normalized(texts: pa.Array) -> pa.Array:
    """NFKC, lower case, punctuation and symbols as spaces, whitespace collapsed."""
    t = pc.utf8_normalize(texts, "NFKC")
    t = pc.utf8_lower(t)
    t = pc.replace_substring_regex(t, r"[\p{P}\p{S}]", " ")
    t = pc.replace_substring_regex(t, r"\s+", " ")
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
    arr = texts if isinstance(texts, pa.Array) else pa.array(list(texts), pa.large_string())
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if shingles.unit == "word":
        if shingles.normalize:  # NFKC, lower case; words: runs of letters, marks, digits
            arr = pc.utf8_lower(pc.utf8_normalize(arr, "NFKC"))
            split = pc.split_pattern_regex(arr, r"[^\p{L}\p{M}\p{N}]+")
        else:
            split = pc.split_pattern_regex(arr, r"\s+")
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


def token_sets(sequences: Sequence[np.ndarray] | np.ndarray, shingles: Shingles) -> Sets:
    """The shingle sets of integer sequences (``unit`` token): a list of 1-d arrays, or
    one (n, length) array (a chunk of sequences of one length, as the readers give)."""
    if isinstance(sequences, np.ndarray) and sequences.dtype != object:
        n = len(sequences)
        flat = sequences.reshape(n, -1).astype(np.int64).reshape(-1)
        offsets = np.arange(n + 1, dtype=np.int64) * (len(flat) // max(n, 1))
    else:
        lengths = np.fromiter((len(s) for s in sequences), np.int64, len(sequences))
        offsets = np.zeros(len(sequences) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = (np.concatenate([np.asarray(s).reshape(-1).astype(np.int64) for s in sequences])
                if len(sequences) and offsets[-1] else np.zeros(0, np.int64))
    with np.errstate(over="ignore"):
        units = splitmix64(flat.view(np.uint64) ^ _SALT)
    grams_off, grams = _ngrams(offsets, units, shingles.n)
    return _unique_per_record(grams_off, grams)


def blank_rows(values: Sequence | np.ndarray, shingles: Shingles) -> np.ndarray:
    """Records with no unit to compare (an empty or blank text, an empty sequence): the
    job reports them invalid, as a set of nothing is no record to compare."""
    if shingles.unit == "token":
        if isinstance(values, np.ndarray) and values.dtype != object:
            return np.full(len(values), values.reshape(len(values), -1).shape[1] == 0)
        return np.fromiter((len(v) == 0 for v in values), bool, len(values))
    arr = pa.array(list(values), pa.large_string()) if not isinstance(values, pa.Array) \
        else values
    if shingles.unit == "word" and shingles.normalize:
        has = pc.match_substring_regex(pc.utf8_normalize(arr, "NFKC"), r"[\p{L}\p{M}\p{N}]")
    elif shingles.unit == "char" and shingles.normalize:
        has = pc.greater(pc.utf8_length(normalized(arr)), 0)
    elif shingles.unit == "word":
        has = pc.match_substring_regex(arr, r"\S")
    else:
        has = pc.greater(pc.utf8_length(arr), 0)
    return ~pc.fill_null(has, False).to_numpy(zero_copy_only=False)


def record_sets(values: Sequence, shingles: Shingles) -> Sets:
    """Shingle sets of records as the job reads them: texts (str) for word and char,
    integer arrays for token."""
    if shingles.unit == "token":
        return token_sets(values, shingles)
    return text_sets(values, shingles)


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


def signatures(sets: Sets, permutations: int) -> np.ndarray:
    """(n, permutations) uint32 MinHash signatures: for each hash function h_i(x) =
    high 32 bits of (a_i x + b_i) mod 2^64 (a_i odd: a permutation of the 64-bit space),
    each record's minimum. Records must hold at least one shingle."""
    a, b = _perm_coefficients(permutations)
    n = len(sets)
    out = np.empty((n, permutations), np.uint32)
    starts = sets.offsets[:-1]
    h = sets.hashes
    with np.errstate(over="ignore"):
        for i in range(permutations):
            v = (h * a[i] + b[i]) >> np.uint64(32)
            out[:, i] = np.minimum.reduceat(v, starts).astype(np.uint32)
    return out


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


def prefix_tokens(sets: Sets, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """(record index, token) for each record's prefix: its ``|x| - ceil(t |x|) + 1``
    smallest hashes (sets are sorted, so the first ones). Two records with J >= t share
    a prefix token (AllPairs' lemma, for this order of the tokens)."""
    sizes = sets.sizes
    plen = np.minimum(sizes, sizes - np.ceil(threshold * sizes - 1e-9).astype(np.int64) + 1)
    plen = np.maximum(plen, np.minimum(sizes, 1))
    rec = np.repeat(np.arange(len(sets), dtype=np.int64), plen)
    within = np.arange(plen.sum()) - np.repeat(np.cumsum(plen) - plen, plen)
    return rec, sets.hashes[sets.offsets[:-1][rec] + within]


# ------------------------------------------------------------------- the exact Jaccard


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Exact Jaccard of two sorted hash sets without repeats."""
    if len(a) == 0 and len(b) == 0:
        return 1.0
    inter = np.intersect1d(a, b, assume_unique=True).size
    return inter / (len(a) + len(b) - inter)


def length_fits(na: int, nb: int, threshold: float) -> bool:
    """The length filter: J(a, b) <= min(|a|, |b|) / max(|a|, |b|)."""
    return min(na, nb) >= threshold * max(na, nb) - 1e-9


# ---------------------------------------------------------------- groups and decisions


@dataclass
class Edges:
    """Verified pairs: ``later`` is within the threshold of the earlier ``earlier`` (in
    keep order), at Jaccard ``j``. Records are integer handles of the caller's."""

    later: np.ndarray
    earlier: np.ndarray
    j: np.ndarray
    compared: int = 0  # pairs whose exact Jaccard was computed

    @staticmethod
    def concat(parts: Sequence[Edges]) -> Edges:
        if not parts:
            return Edges(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0))
        return Edges(np.concatenate([p.later for p in parts]),
                     np.concatenate([p.earlier for p in parts]),
                     np.concatenate([p.j for p in parts]), sum(p.compared for p in parts))


def _first_common(a: np.ndarray, b: np.ndarray, banded: bool):
    """The first key two records share: bands compare position by position (band j of
    one with band j of the other), prefix tokens as sorted sets."""
    if banded:
        same = np.flatnonzero(a == b)
        return a[same[0]] if len(same) else None
    both = np.intersect1d(a, b, assume_unique=True)
    return both[0] if len(both) else None


def group_edges(members: np.ndarray, row_of, threshold: float, key=None, keys_of=None,
                banded: bool = True) -> Edges:
    """Every pair of a small group (records that share a band or a prefix token ``key``,
    ``members`` in keep order) verified; those within the threshold become edges.
    ``row_of(m)``: the member's sorted hash set. ``keys_of(m)`` (with ``key``): its keys
    (bands, or prefix tokens), so that a pair that meets in several groups is compared
    in the first one only."""
    later, earlier, js = [], [], []
    compared = 0
    rows = [(m, row_of(m), None if keys_of is None else keys_of(m)) for m in members.tolist()]
    for i, (m, x, kx) in enumerate(rows):
        for e, y, ky in rows[:i]:
            if not length_fits(len(x), len(y), threshold):
                continue
            if kx is not None and _first_common(kx, ky, banded) != key:
                continue  # the pair's first shared group decides it
            compared += 1
            j = jaccard(x, y)
            if j >= threshold:
                later.append(m)
                earlier.append(e)
                js.append(j)
    return Edges(np.asarray(later, np.int64), np.asarray(earlier, np.int64),
                 np.asarray(js, np.float64), compared)


def groups(keys: np.ndarray, members: np.ndarray, rank: np.ndarray
           ) -> Iterator[tuple[int, np.ndarray]]:
    """(key, members) for each key shared by at least two members (handles), members in
    keep order (``rank``: smaller first; a member listed twice under a key counts once)."""
    if len(keys) == 0:
        return
    order = np.lexsort((members, rank, keys))
    k, m = keys[order], members[order]
    cut = np.flatnonzero(np.r_[True, k[1:] != k[:-1], True])
    for a, b in zip(cut[:-1], cut[1:], strict=True):
        if b - a > 1:
            g = m[a:b]
            if (g[1:] == g[:-1]).any():
                g = g[np.r_[True, g[1:] != g[:-1]]]
            if len(g) > 1:
                yield k[a], g


@dataclass
class Decided:
    """``decide``'s answer: removed records (handles), each with the kept record it
    duplicates and their Jaccard; ``compared``: pairs verified while deciding (crowds)."""

    removed: np.ndarray
    kept: np.ndarray
    j: np.ndarray
    compared: int = 0


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
            self.parent[rb] = ra


def decide(edges: Edges, crowds: Sequence[np.ndarray], row_of, rank_of, threshold: float,
           grouping: str = "representative", protected: frozenset = frozenset()) -> Decided:
    """Decisions in keep order. ``edges``: the verified pairs of the small groups;
    ``crowds``: the members (keep order) of groups of more than ALL_PAIRS records, whose
    pairs were not listed: each member is compared, when its turn comes, with the
    crowd's earlier records that are kept (representative) or with one record of each
    earlier component it is not in yet (components), so a crowd of m near copies costs
    about m comparisons and every decision is the one all pairs would give.

    representative: a record is removed when an earlier kept record is within the
    threshold, as the duplicate of the one with the highest J (ties: keep order);
    components: a record joined by verified edges to an earlier one is removed, as a
    duplicate of its component's first record, at the highest J of its own edges.
    ``rank_of(handles)``: keep order (smaller first); ``row_of(h)``: a sorted hash set;
    ``protected``: handles never removed (reference records; they rank first)."""
    later, earlier, js = edges.later, edges.earlier, edges.j
    crowd_of: dict[int, list[tuple[int, int]]] = {}  # record -> (crowd, its place there)
    for c, members in enumerate(crowds):
        for i, m in enumerate(members.tolist()):
            crowd_of.setdefault(m, []).append((c, i))
    nodes = np.unique(np.concatenate([later, earlier] + [np.asarray(m) for m in crowds]))
    if len(nodes) == 0:
        z = np.zeros(0, np.int64)
        return Decided(z, z, np.zeros(0))
    nodes = nodes[np.lexsort((nodes, rank_of(nodes)))]
    by_later: dict[int, list[tuple[int, float]]] = {}
    for a, b, j in zip(later.tolist(), earlier.tolist(), js.tolist(), strict=True):
        by_later.setdefault(a, []).append((b, j))
    place = {int(n): i for i, n in enumerate(nodes.tolist())}
    kept_in: list[list[int]] = [[] for _ in crowds]  # representative: kept members
    seen_in: list[list[int]] = [[] for _ in crowds]  # components: earlier members
    verified: dict[tuple[int, int], float] = {}
    removed: dict[int, tuple[int, float]] = {}
    union = _Union()
    best: dict[int, float] = {}

    def jac(a: int, b: int) -> float:
        k = (a, b) if a < b else (b, a)
        if k not in verified:
            x, y = row_of(a), row_of(b)
            verified[k] = (jaccard(x, y) if length_fits(len(x), len(y), threshold)
                           else 0.0)
        return verified[k]

    for d in nodes.tolist():
        cands = [(e, j) for e, j in by_later.get(d, ()) if e not in removed]
        if grouping == "components":
            for e, j in by_later.get(d, ()):
                union.join(e, d)
                best[d] = max(best.get(d, 0.0), j)
        for c, _ in crowd_of.get(d, ()):
            if grouping == "components":
                for e in seen_in[c]:
                    if union.root(e) != union.root(d) and (j := jac(d, e)) >= threshold:
                        union.join(e, d)
                        best[d] = max(best.get(d, 0.0), j)
                seen_in[c].append(d)
                continue
            for e in kept_in[c]:
                if (j := jac(d, e)) >= threshold:
                    cands.append((e, j))
        if grouping == "components":
            continue
        if cands and d not in protected:
            e, j = min(cands, key=lambda ej: (-ej[1], place.get(ej[0], -1)))
            removed[d] = (e, j)
        else:
            for c, _ in crowd_of.get(d, ()):
                kept_in[c].append(d)
    compared = len(verified)
    if grouping == "components":
        first: dict[int, int] = {}
        for d in nodes.tolist():
            first.setdefault(union.root(d), d)
        out = [(d, first[union.root(d)], best.get(d, 0.0)) for d in nodes.tolist()
               if first[union.root(d)] != d and d not in protected]
        return Decided(np.array([o[0] for o in out], np.int64),
                       np.array([o[1] for o in out], np.int64),
                       np.array([o[2] for o in out], np.float64), compared)
    r = np.fromiter(removed, np.int64, len(removed))
    return Decided(r, np.array([v[0] for v in removed.values()], np.int64),
                   np.array([v[1] for v in removed.values()], np.float64), compared)


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
    compared: int  # pairs verified
    groups: int  # groups (buckets or prefix tokens) of two records or more


def candidate_keys(sets: Sets, threshold: float, shingles: Shingles, mode: str
                   ) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(record index, key) of every record's group keys: its LSH bands (bounded) or its
    prefix tokens (exact), and the bands x rows used (0, 0 for exact)."""
    if mode == "exact":
        rec, keys = prefix_tokens(sets, threshold)
        return rec, keys, 0, 0
    bands, rows = lsh_params(threshold, shingles.permutations, shingles.bands)
    bk = band_keys(signatures(sets, bands * rows), bands, rows)
    return np.repeat(np.arange(len(sets)), bands), bk.reshape(-1), bands, rows


EXACT_WORK = 64  # auto: exact when its predicted comparisons are at most this many per record
EXACT_ANYWAY = 2_000_000  # ... or at most this many in all (a few seconds)


def choose_mode(sets: Sets, threshold: float, mode: str) -> tuple[str, str]:
    """(mode, why): ``auto`` takes the exact join when the pairs its prefix groups would
    compare (groups of more than ALL_PAIRS count one comparison per member: crowds) are
    at most EXACT_WORK per record or EXACT_ANYWAY in all, else bounded (MinHash-LSH)."""
    if mode != "auto":
        return mode, f"near.mode: {mode}"
    rec, keys = prefix_tokens(sets, threshold)
    _, sizes = np.unique(keys, return_counts=True)
    sizes = sizes[sizes > 1].astype(np.float64)
    work = float(np.where(sizes > ALL_PAIRS, sizes, sizes * (sizes - 1) / 2).sum())
    per = work / max(1, len(sets))
    pick = "exact" if per <= EXACT_WORK or work <= EXACT_ANYWAY else "bounded"
    return pick, (f"auto: the exact join predicts {work:,.0f} comparisons ({per:.1f} per "
                  f"record; exact up to {EXACT_WORK} per record or {EXACT_ANYWAY:,} in all)")


def near_sets(sets: Sets, rank: np.ndarray, threshold: float, shingles: Shingles = Shingles(),
              *, mode: str = "bounded", grouping: str = "representative",
              protected: np.ndarray | None = None) -> SetResult:
    """Near duplicates among records given as sets (``record_sets``), none empty, at
    Jaccard >= ``threshold``, in keep order ``rank`` (smaller first); ``protected``
    (bool per record): never removed (reference records)."""
    mode, _ = choose_mode(sets, threshold, mode)
    sub, ok = sets, np.arange(len(sets))
    keep = frozenset() if protected is None else frozenset(np.flatnonzero(protected).tolist())
    rank = np.asarray(rank)
    rec, keys, bands, rows = candidate_keys(sub, threshold, shingles, mode)
    if mode == "exact":
        starts = np.searchsorted(rec, np.arange(len(sub) + 1))
        keys_of = lambda m: keys[starts[m]:starts[m + 1]]  # noqa: E731  (sorted)
    else:
        table = keys.reshape(len(sub), bands)
        keys_of = table.__getitem__
    parts, crowds, n_groups = [], [], 0
    for key, g in groups(keys, rec, rank[rec]):
        n_groups += 1
        if len(g) > ALL_PAIRS:
            crowds.append(g)
        else:
            parts.append(group_edges(g, sub.row, threshold, key, keys_of, mode != "exact"))
    edges = Edges.concat(parts)
    dec = decide(edges, crowds, sub.row, lambda h: rank[h], threshold, grouping, keep)
    return SetResult(ok[dec.removed], ok[dec.kept], dec.j, np.zeros(0, np.int64), mode,
                     bands, rows, edges.compared + dec.compared, n_groups)


def find_near_sets(values: Sequence, rank: np.ndarray, threshold: float,
                   shingles: Shingles = Shingles(), *, mode: str = "bounded",
                   grouping: str = "representative") -> SetResult:
    """Near duplicates among ``values`` (texts, or integer sequences for unit token) at
    Jaccard >= ``threshold``, in keep order ``rank`` (smaller first): the library's
    single-process form of the job's jaccard stage. Records with nothing to compare
    (empty texts) are returned as ``invalid``, never removed."""
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
    rec, keys = prefix_tokens(sets, threshold)
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
    """The oracle: every pair's exact Jaccard, decisions in keep order (tests, benches)."""
    n = len(sets)
    later, earlier, js = [], [], []
    order = np.argsort(rank, kind="stable")
    for ia in range(n):
        a = order[ia]
        for ib in range(ia):
            b = order[ib]
            j = jaccard(sets.row(a), sets.row(b))
            if j >= threshold:
                later.append(a)
                earlier.append(b)
                js.append(j)
    edges = Edges(np.asarray(later, np.int64), np.asarray(earlier, np.int64),
                  np.asarray(js, np.float64))
    return decide(edges, (), sets.row, lambda h: rank[h], threshold, grouping)


def expected_pairs(bands: int, rows: int, threshold: float) -> dict:
    """The S-curve at the threshold and 0.1 below it (docs and the CLI's note)."""
    return {"at_threshold": candidate_chance(threshold, bands, rows),
            "below_0_1": candidate_chance(max(threshold - 0.1, 0.0), bands, rows),
            "bands": bands, "rows": rows}


__all__ = ["UNITS", "Shingles", "Sets", "text_sets", "token_sets", "record_sets",
           "blank_rows", "near_sets", "choose_mode", "sample_partners",
           "lsh_params", "candidate_chance", "signatures", "band_keys", "prefix_tokens",
           "jaccard", "group_edges", "groups", "decide", "find_near_sets", "candidate_keys",
           "brute_force_sets", "Edges", "Decided", "SetResult", "expected_pairs"]
