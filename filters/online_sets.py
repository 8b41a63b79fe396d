"""Online near dedup of texts and token sequences (``NearSpec("jaccard", t)``).

Why a key index and not the vectors' blocks: a record's near duplicates at Jaccard >= t
share one of its group keys with it, the same keys the batch job groups by
(``transforms.near.sets``): its LSH bands (bounded, the S-curve's recall) or its prefix
tokens in hash order (exact: AllPairs' lemma holds for any fixed order). So the state is
a dict from key to the kept records that hold it, and each new record is compared (true
Jaccard of the 64-bit shingle hashes) with the kept records it shares a key with, in
stream order: greedy, representative grouping, precision 1.0 as in the job.

Records with nothing to compare (an empty or blank text) are never near duplicates;
exact dedup still drops their repeats. Memory: a kept record's shingle hashes (8 B each)
and its keys (bands, or the prefix) in the index; ``max_items`` forgets the oldest
blocks of kept records.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xxhash

from transforms.near.sets import (
    POOL_CAP,
    Sets,
    band_keys,
    jaccards,
    length_fits,
    lsh_params,
    prefix_tokens,
    record_sets,
    signatures,
    token_values,
)
from transforms.near.spec import NearSpec

BLOCK_ROWS = 65_536  # kept records per index block (the unit of eviction)


def stream_values(batch: Any, unit: str) -> list:
    """A batch of records as the shingler takes them: ``str`` texts (bytes decoded as
    UTF-8, as tf.data hands strings over), or 1-d integer arrays for ``unit`` token.
    Accepts lists, numpy / tf / torch arrays (a 2-d integer array is a batch of
    sequences of one length; each record flattened) and pyarrow arrays; one text alone
    is refused (iterated, it would be a batch of characters)."""
    if isinstance(batch, str | bytes):
        raise TypeError(f"a batch of records, not one {type(batch).__name__} "
                        f"({batch[:40]!r}): pass [text]")
    if hasattr(batch, "to_pylist"):
        batch = batch.to_pylist()
    elif hasattr(batch, "numpy"):
        batch = batch.numpy()
    if unit == "token":
        seqs = token_values(batch)
        return list(seqs) if isinstance(seqs, np.ndarray) else seqs
    out = []
    for v in (batch.reshape(-1).tolist() if isinstance(batch, np.ndarray) else batch):
        if isinstance(v, (bytes, bytearray, memoryview)):
            v = bytes(v).decode("utf-8", errors="replace")
        if v is None:
            out.append(v)
            continue
        if not isinstance(v, str):
            raise TypeError(f"unit {unit} takes texts (str or UTF-8 bytes), got "
                            f"{type(v).__name__}; token sequences need shingles unit token")
        if not v.isascii():  # lone surrogates (json.loads of a broken escape): as bytes
            v = _SURROGATE.sub("\ufffd", v)  # that are not UTF-8, U+FFFD (Arrow takes no other)
        out.append(v)
    return out


_SURROGATE = re.compile("[\ud800-\udfff]")


NULL_DIGEST = bytes(16)  # a None record's: such records are passed on, never compared


def value_digests(values: list, unit: str) -> np.ndarray:
    """Exact digests (V16) of texts or token sequences: XXH3-128 of the UTF-8 bytes, or of
    the tokens as little-endian int64 (so [1, 2] stored as int32 or int64 is one value);
    ``NULL_DIGEST`` for None."""
    if unit == "token":
        raw = (None if v is None else b"T" + np.asarray(v, "<i8").tobytes() for v in values)
    else:
        raw = (None if v is None else b"S" + v.encode("utf-8", errors="surrogatepass")
               for v in values)
    return np.frombuffer(b"".join(NULL_DIGEST if r is None else xxhash.xxh3_128_digest(r)
                                  for r in raw), "V16", len(values))


def null_rows(digests: np.ndarray) -> np.ndarray:
    """The rows of ``value_digests`` that were None."""
    return digests.view(np.uint64).reshape(-1, 2).any(axis=1) == 0


def _any_near(x: np.ndarray, cands: list[np.ndarray], threshold: float) -> bool:
    """Whether any candidate set has Jaccard >= ``threshold`` with the sorted set ``x``:
    the sizes that cannot reach it are skipped, the rest intersected in one vector pass."""
    sizes = np.fromiter((len(c) for c in cands), np.int64, len(cands))
    fit = length_fits(sizes, len(x), threshold)
    if not fit.any():
        return False
    v = np.concatenate([c for c, f in zip(cands, fit.tolist(), strict=True) if f])
    return bool((jaccards(x, v, sizes[fit]) >= threshold).any())


@dataclass
class _Block:
    sets: list[np.ndarray] = field(default_factory=list)  # kept records' shingle hashes
    index: dict[int, list[int]] = field(default_factory=dict)  # key -> positions in sets


class SetIndex:
    """Kept records' shingle sets and their group keys, in blocks of BLOCK_ROWS."""

    def __init__(self, spec: NearSpec):
        self.spec = spec
        self.shingles = spec.shingles
        self.exact = spec.mode == "exact"  # auto: LSH bands, the streaming norm
        self.bands, self.rows = (0, 0) if self.exact else lsh_params(
            spec.threshold, self.shingles.permutations, self.shingles.bands)
        self.blocks: list[_Block] = []

    def __len__(self) -> int:
        return sum(len(b.sets) for b in self.blocks)

    def keys(self, sets: Sets) -> list[list[int]]:
        """Each record's group keys (none: empty records)."""
        n = len(sets)
        out: list[list[int]] = [[] for _ in range(n)]
        ok = np.flatnonzero(~sets.empty) if len(sets.empty) else np.arange(n)
        if not len(ok):
            return out
        part = sets.take(ok)
        if self.exact:
            rec, keys = prefix_tokens(part, self.spec.threshold)
            bounds = np.searchsorted(rec, np.arange(len(ok) + 1))
            flat = keys.view(np.int64).tolist()
            for i, (a, b) in zip(ok.tolist(), itertools.pairwise(bounds.tolist()),
                                 strict=True):
                out[i] = flat[a:b]
        else:
            sig = signatures(part, self.bands * self.rows, self.spec.device)
            for i, row in zip(ok.tolist(), band_keys(sig, self.bands, self.rows)
                              .view(np.int64).tolist(), strict=True):
                out[i] = row
        return out

    def decide(self, values: list) -> tuple[np.ndarray, int]:
        """(rows of ``values`` near a kept record or an earlier row, pairs compared): in
        order, each row is compared with the kept records it shares a key with; a row
        with none at J >= threshold is kept and joins the index."""
        sets = record_sets(values, self.shingles)
        keys = self.keys(sets)
        t = self.spec.threshold
        drop, compared = [], 0
        for i, ks in enumerate(keys):
            if not ks:
                continue
            x = sets.row(i)
            near = False
            for block in self.blocks:
                seen: set[int] = set()
                for k in ks:
                    seen.update(block.index.get(k, ()))
                if seen:
                    compared += len(seen)
                    near = _any_near(x, [block.sets[m] for m in seen], t)
                    if near:
                        break
            if near:
                drop.append(i)
            else:
                self._add(x, ks)
        return np.asarray(drop, np.int64), compared

    def _add(self, x: np.ndarray, ks: Sequence[int]) -> None:
        if not self.blocks or len(self.blocks[-1].sets) >= BLOCK_ROWS:
            self.blocks.append(_Block())
        block = self.blocks[-1]
        pos = len(block.sets)
        block.sets.append(x)
        for k in ks:  # bounded: a key offers its first POOL_CAP records (as the job's groups)
            at = block.index.setdefault(k, [])
            if self.exact or len(at) < POOL_CAP:
                at.append(pos)

    def forget_beyond(self, max_items: int) -> None:
        """Drop the oldest blocks while more than ``max_items`` records are kept."""
        while len(self) > max_items and len(self.blocks) > 1:
            self.blocks.pop(0)

    def clear(self) -> None:
        self.blocks.clear()

    def arrays(self) -> dict[str, np.ndarray]:
        """The kept sets for ``OnlineDedup.save``: CSR offsets and hashes, block sizes
        (the keys are recomputed on load)."""
        sets = [s for b in self.blocks for s in b.sets]
        offsets = np.zeros(len(sets) + 1, np.int64)
        np.cumsum([len(s) for s in sets], out=offsets[1:])
        return {"set_offsets": offsets,
                "set_hashes": np.concatenate(sets) if sets else np.zeros(0, np.uint64),
                "set_blocks": np.array([len(b.sets) for b in self.blocks], np.int64)}

    def restore(self, offsets: np.ndarray, hashes: np.ndarray, blocks: np.ndarray) -> None:
        sets = Sets(offsets, hashes, np.zeros(len(offsets) - 1, bool))
        keys = self.keys(sets)
        start = 0
        for size in blocks.tolist():
            self.blocks.append(_Block())
            for i in range(start, start + size):
                self._add(sets.row(i), keys[i])
            start += size

    def nbytes(self) -> int:
        """Approximate: the hashes, and ~100 B per index entry (dict slot, list, int)."""
        return sum(sum(s.nbytes + 100 for s in b.sets) + 100 * sum(
            len(v) for v in b.index.values()) for b in self.blocks)
