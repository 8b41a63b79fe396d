"""Online dedup of a stream: drop what is an exact (or near) duplicate of something kept earlier.

Why one class for both frameworks: the decision is plain arrays in, a keep mask out,
using the same kernels as the batch job (``fingerprint_batch`` for exact digests,
``transforms.near.find`` for the radius, the float64 check and the greedy grouping). The
tf.data and PyTorch front ends only move batches in and out.

Identity across epochs: with record ids, the state remembers which record owns each
digest (and which vectors were kept), so every epoch keeps the same records whatever
the order, and a restored state never re-admits a duplicate. Without ids each epoch is
deduplicated on its own: ``new_epoch()`` (the front ends call it when a new pass starts)
forgets what was seen.

Texts and token sequences (``NearSpec("jaccard", t)``): ``filters.online_sets`` keeps
the kept records' shingle sets under their LSH bands (``mode`` bounded or auto) or
prefix tokens (exact), and exact digests are of the texts' bytes.

Memory (docs/filters.md measures it): exact digests in a dict, 100-140 B per record;
``max_items`` bounds it (the oldest ~10% are forgotten when it is full, so an old
record seen again is admitted once more); ``bloom`` replaces the dict by an rbloom
Bloom filter of a stated false-positive rate (~2 B per record at 1e-3), where a false
positive drops a new record. Near mode also keeps each kept record's values and an
index over them.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import zipfile
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xxhash

from filters.online_sets import SetIndex, null_rows, stream_values, value_digests
from transforms.canonical import to_numpy
from transforms.exact import digest_words
from transforms.fingerprint import fingerprint_batch
from transforms.near.find import decide_cell
from transforms.near.greedy import STATE_REMOVED
from transforms.near.search import Vectors, pairs_within, precision_for
from transforms.near.sets import Shingles
from transforms.near.space import (
    finite_rows,
    search_radius,
    search_space,
    search_vectors,
    value_scale,
)
from transforms.near.spec import NearSpec
from transforms.near.verify import exact_distance

DROPPED = -1  # owner of a digest whose first record was removed as a near duplicate
NO_ID = 0  # owner when the stream has no ids
NEAR_BLOCK_ROWS = 65_536  # kept vectors per index block (the unit of eviction)
STATE_VERSION = 1


def id_hashes(ids: Any) -> np.ndarray:
    """64-bit hashes of record ids (ints and strings alike, as their text), never 0 or -1."""
    if hasattr(ids, "numpy"):
        ids = ids.numpy()
    if isinstance(ids, np.ndarray) and ids.ndim != 1:
        raise ValueError(f"ids must be one per record (a 1-d sequence), got shape {ids.shape}")
    out = np.fromiter(
        (xxhash.xxh3_64_intdigest(i if isinstance(i, bytes) else str(i).encode()) for i in
         (ids.tolist() if isinstance(ids, np.ndarray) else
          (i.item() if hasattr(i, "item") else i for i in ids))), np.uint64).view(np.int64)
    return np.where((out == DROPPED) | (out == NO_ID), 1, out)


def _digest_keys(digests: np.ndarray) -> list[bytes]:
    """Digests (V16, or (n, 16) uint8) as 16-byte dict keys."""
    raw = digests.tobytes()
    return [raw[i:i + 16] for i in range(0, len(raw), 16)]


def _same(x: int) -> int:
    """The Bloom filters' hash: the key already is a 64-bit slice of a digest."""
    return x


@dataclass
class _NearBlock:
    values: np.ndarray  # (n, d) the kept records' values, for the float64 check
    vectors: Vectors  # their search vectors (float32; float64 once a tolerance needs it)

    def at(self, dtype: np.dtype, spec: NearSpec, radius: float) -> Vectors:
        if self.vectors.v.dtype != dtype:
            self.vectors = search_vectors(self.values, spec, radius, dtype=dtype)
        return self.vectors


@dataclass
class Stats:
    seen: int = 0
    kept: int = 0
    dropped_exact: int = 0
    dropped_near: int = 0
    readmitted: int = 0  # records kept again in a later epoch (their id owns the digest)


@dataclass
class OnlineDedup:
    """Keep masks for batches of a stream, remembering what was kept before.

    ``near``: also drop records within this tolerance of a kept record (a ``NearSpec``;
    its grouping must be ``representative``). ``max_items``: bound on remembered
    digests (and kept vectors, in blocks). ``bloom``: false-positive rate of a Bloom
    filter instead of exact digests (needs ``bloom_capacity``, the expected number of
    distinct records; the rate holds up to it). ``bloom`` and ``near`` do not combine.
    Torch tensors on a GPU are hashed there; only the 16-byte digests are copied back
    (near mode also copies the values of records not seen before).
    """

    near: NearSpec | None = None
    max_items: int | None = None
    bloom: float | None = None
    bloom_capacity: int = 10_000_000
    backend: str = "auto"  # fingerprint_batch backend: "torch" runs the device kernel on CPU
    stats: Stats = field(default_factory=Stats)

    def __post_init__(self) -> None:
        if self.near is not None and self.near.grouping != "representative":
            raise ValueError("online near dedup is greedy in stream order: grouping must be "
                             "'representative'")
        if self.bloom is not None:
            if not 0 < self.bloom < 1:
                raise ValueError(f"bloom is a false-positive rate in (0, 1), got {self.bloom}")
            if self.near is not None or self.max_items is not None:
                raise ValueError("bloom replaces the digest memory: it does not combine with "
                                 "near or max_items")
        if self.max_items is not None and self.max_items < 1:
            raise ValueError(f"max_items must be >= 1, got {self.max_items}")
        self._with_ids: bool | None = None
        self._owner: dict[bytes, int] = {}
        self._blooms = self._new_blooms() if self.bloom is not None else None
        self._blocks: list[_NearBlock] = []
        self._scale = 0.0
        self._sets = SetIndex(self.near) if self.near is not None and self.near.is_sets \
            else None

    # --- the decision -------------------------------------------------------------------

    def keep_mask(self, batch: Any, ids: Any = None, digests: np.ndarray | None = None
                  ) -> np.ndarray:
        """Decide the rows of ``batch`` (first axis = records) in order; updates the state.

        ``ids``: one record id per row (ints, strings or bytes), or None. A stream must
        either always or never pass ids. ``digests``: the rows' ``digests`` when the
        caller has them already (not hashed again). With a jaccard ``near``, ``batch``
        holds texts (str or UTF-8 bytes) or integer sequences (unit token)."""
        if self._sets is not None:
            batch = stream_values(batch, self._sets.shingles.unit)
        if digests is None:
            digests = self._digests(batch)
        n = len(digests)
        with_ids = ids is not None
        if self._with_ids is None:
            self._with_ids = with_ids
        elif self._with_ids != with_ids:
            raise ValueError("this stream was started " + ("with" if self._with_ids else
                             "without") + " record ids: pass ids always or never")
        owners = id_hashes(ids) if with_ids else np.full(n, NO_ID, np.int64)
        if with_ids and len(owners) != n:
            raise ValueError(f"{len(owners)} ids for a batch of {n} records")
        if self._sets is not None and (null := null_rows(digests)).any():
            keep = np.ones(n, dtype=bool)  # None is no text: passed on, never compared
            rest = np.flatnonzero(~null)
            keep[rest] = self._decide([batch[i] for i in rest.tolist()], digests[rest],
                                      owners[rest])
            self.stats.seen += n - len(rest)
            self.stats.kept += n - len(rest)
            return keep
        return self._decide(batch, digests, owners)

    def _decide(self, batch: Any, digests: np.ndarray, owners: np.ndarray) -> np.ndarray:
        n = len(digests)
        if self._blooms is not None:
            keep, new = self._bloom_step(digests, owners)
        else:
            keep, new = self._exact_step(digests, owners)
        self.stats.seen += n
        self.stats.dropped_exact += int(n - keep.sum())
        self.stats.readmitted += int((keep & ~new).sum())
        if self.near is not None and new.any():
            near_drop = self._near_step(batch, np.flatnonzero(new))
            keep[near_drop] = False
            for k in near_drop.tolist():
                self._owner[bytes(digests[k])] = DROPPED
            self.stats.dropped_near += len(near_drop)
        self.stats.kept += int(keep.sum())
        return keep

    def digests(self, batch: Any) -> np.ndarray:
        """The exact digests this filter compares: ``fingerprint_batch`` of tensors, or
        of texts and token sequences their bytes' (``filters.online_sets``)."""
        if self._sets is not None:
            batch = stream_values(batch, self._sets.shingles.unit)
        return self._digests(batch)

    def _digests(self, values: Any) -> np.ndarray:
        """``digests`` of a batch already in the form the filter compares."""
        if self._sets is not None:
            return value_digests(values, self._sets.shingles.unit)
        return fingerprint_batch(values, backend=self.backend)

    def keep(self, t: Any, id: Any = None) -> bool:
        """One record: ``keep_mask`` of a batch of one."""
        if self._sets is not None:
            return bool(self.keep_mask([t], None if id is None else [id])[0])
        arr, _ = to_numpy(t)
        return bool(self.keep_mask(arr[None], None if id is None else [id])[0])

    def new_epoch(self) -> None:
        """A new pass over the data starts. Without ids this forgets everything seen (each
        epoch is deduplicated on its own); with ids it changes nothing."""
        if self._with_ids:
            return
        self._owner.clear()
        self._blocks.clear()
        if self._sets is not None:
            self._sets.clear()
        if self._blooms is not None:
            self._blooms = self._new_blooms()

    def _exact_step(self, digests: np.ndarray, owners: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray]:
        """(keep, new): new rows own their digest from now on; a row whose id owns its
        digest is kept again (a later epoch); any other row with a known digest is dropped."""
        keys = _digest_keys(digests)
        keep = np.zeros(len(keys), dtype=bool)
        new = np.zeros(len(keys), dtype=bool)
        mem = self._owner
        with_ids = self._with_ids
        for i, (k, o) in enumerate(zip(keys, owners.tolist(), strict=True)):
            have = mem.get(k)
            if have is None:
                mem[k] = o
                keep[i] = new[i] = True
            elif with_ids and have == o:
                keep[i] = True
        if self.max_items is not None and len(mem) > self.max_items:
            self._owner = dict(itertools.islice(mem.items(), len(mem) - self.max_items
                                                + self.max_items // 10, None))
        return keep, new

    def _new_blooms(self) -> tuple:
        from rbloom import Bloom

        # digests: has this value been seen; (digest, id): which record was kept for it
        return Bloom(self.bloom_capacity, self.bloom, _same), Bloom(self.bloom_capacity,
                                                                    self.bloom, _same)

    def _bloom_step(self, digests: np.ndarray, owners: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray]:
        words = digest_words(digests)
        seen_b, kept_b = self._blooms
        k_digest = words[:, 1].view(np.int64).tolist()
        k_owner = (words[:, 0] ^ owners.view(np.uint64)).view(np.int64).tolist()
        keep = np.zeros(len(k_digest), dtype=bool)
        new = np.zeros(len(k_digest), dtype=bool)
        with_ids = self._with_ids
        for i, (kd, ko) in enumerate(zip(k_digest, k_owner, strict=True)):
            if kd not in seen_b:
                seen_b.add(kd)
                kept_b.add(ko)
                keep[i] = new[i] = True
            elif with_ids and ko in kept_b:
                keep[i] = True
        return keep, new

    def _near_step(self, batch: Any, rows: np.ndarray) -> np.ndarray:
        """Rows (of ``rows``) within tolerance of a kept record or of an earlier kept row of
        this batch; the others join the kept vectors. Rows with NaN/inf are never compared."""
        spec = self.near
        if self._sets is not None:
            drop, _ = self._sets.decide([batch[i] for i in rows.tolist()])
            if self.max_items is not None:
                self._sets.forget_beyond(self.max_items)
            return rows[drop]
        arr, _ = to_numpy(batch)
        x = np.asarray(arr[rows]).reshape(len(rows), -1)
        if self._blocks and x.shape[1] != self._blocks[0].values.shape[1]:
            raise ValueError(f"records of {x.shape[1]} values after records of "
                             f"{self._blocks[0].values.shape[1]}: near dedup compares records "
                             "of one size (a new stream of another: a new OnlineDedup)")
        if np.iscomplexobj(x):
            raise TypeError("near-duplicate filtering compares real values: got complex")
        ok = finite_rows(x)
        rows, x = rows[ok], x[ok]
        if not len(rows):
            return rows
        self._scale = max(self._scale, value_scale(x, spec))
        radius = search_radius(spec, x.shape[1], self._scale)
        z = search_space(x, spec)
        z_norm = float(np.linalg.norm(z, axis=1).max(initial=0))
        near_old = np.zeros(len(rows), dtype=bool)
        queries: dict[np.dtype, Vectors] = {}  # this batch's rows, per search precision
        for block in self._blocks:
            dtype = precision_for(max(z_norm, float(block.vectors.norm.max(initial=0))),
                                  x.shape[1], radius)
            if dtype not in queries:
                queries[dtype] = search_vectors(x, spec, radius, dtype=dtype)
            q, j, _ = pairs_within(queries[dtype], block.at(dtype, spec, radius), radius,
                                   spec.device)
            near_old[q[exact_distance(x[q], block.values[j], spec)[1]]] = True
        fresh = np.flatnonzero(~near_old)
        drop_fresh = (self._within_batch(x[fresh], z[fresh].mean(axis=0), radius)
                      if len(fresh) else np.zeros(0, bool))  # all near old: no mean
        kept = np.setdiff1d(fresh, fresh[drop_fresh])
        self._remember(x[kept])
        return np.sort(np.concatenate([rows[near_old], rows[fresh[drop_fresh]]]))

    def _within_batch(self, x: np.ndarray, center: np.ndarray, radius: float) -> np.ndarray:
        """Greedy in batch order among new rows: the kernel's decisions for one cell
        (every row at home, centred on ``center``, the rows' mean in the search space),
        representative grouping."""
        if len(x) < 2:
            return np.empty(0, np.int64)
        spec = dataclasses.replace(self.near, grouping="representative")
        d = decide_cell(x, np.ones(len(x), dtype=bool), spec, radius, center, census=False)
        return np.flatnonzero(d.state == STATE_REMOVED)

    def _remember(self, x: np.ndarray) -> None:
        for s in range(0, len(x), NEAR_BLOCK_ROWS):
            xs = x[s:s + NEAR_BLOCK_ROWS]
            last = self._blocks[-1] if self._blocks else None
            if last is None or len(last.values) + len(xs) > NEAR_BLOCK_ROWS:
                self._remember_block(xs)
                continue
            new = search_vectors(xs, self.near, 0.0, dtype=last.vectors.v.dtype)
            last.values = np.concatenate([last.values, xs])
            last.vectors = Vectors(np.concatenate([last.vectors.v, new.v]),
                                   np.concatenate([last.vectors.norm, new.norm]))
        if self.max_items is not None:
            while sum(len(b.values) for b in self._blocks) > self.max_items and len(
                    self._blocks) > 1:
                self._blocks.pop(0)

    def __getstate__(self) -> dict:
        """Pickling (DataLoader workers under spawn): Bloom filters travel as bytes."""
        state = dict(self.__dict__)
        if self._blooms is not None:
            state["_blooms"] = tuple(b.save_bytes() for b in self._blooms)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if self._blooms is not None:
            from rbloom import Bloom

            self._blooms = tuple(Bloom.load_bytes(b, _same) for b in self._blooms)

    # --- state ---------------------------------------------------------------------------

    @property
    def remembered(self) -> int:
        """Distinct digests remembered (Bloom: the filter's estimate)."""
        if self._blooms is not None:
            return int(self._blooms[0].approx_items)
        return len(self._owner)

    def settings(self) -> dict:
        return {"near": None if self.near is None else dataclasses.asdict(self.near),
                "max_items": self.max_items, "bloom": self.bloom,
                "bloom_capacity": self.bloom_capacity, "backend": self.backend}

    def save(self, path: str | os.PathLike) -> None:
        """Write the state (settings, digests and owners, kept vectors, counters) to an
        ``.npz`` file atomically; ``load`` restores it exactly."""
        keys = b"".join(self._owner)
        arrays = {
            "meta": np.array(json.dumps({"version": STATE_VERSION, "settings": self.settings(),
                                         "with_ids": self._with_ids, "scale": self._scale,
                                         "stats": dataclasses.asdict(self.stats)})),
            "digests": np.frombuffer(keys, np.uint8).reshape(-1, 16),
            "owners": np.fromiter(self._owner.values(), np.int64, len(self._owner)),
            "block_rows": np.array([len(b.values) for b in self._blocks], np.int64),
        }
        if self._blocks:
            arrays["values"] = np.concatenate([b.values for b in self._blocks])
        if self._sets is not None:
            arrays.update(self._sets.arrays())
        if self._blooms is not None:
            for i, b in enumerate(self._blooms):
                arrays[f"bloom{i}"] = np.frombuffer(b.save_bytes(), np.uint8)
        tmp = f"{os.fspath(path)}.tmp"
        with open(tmp, "wb") as f:  # a file object: savez adds no ".npz" to the name
            np.savez(f, **arrays)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> OnlineDedup:
        """A state saved by ``save`` (no pickles are read). The file is closed on every way
        out: numpy's loader left it open when it refused a damaged archive."""
        with open(path, "rb") as f:
            try:
                if f.read(4) != b"PK\x03\x04":  # numpy's refusal of anything else offers pickle
                    raise ValueError("not an .npz archive")
                f.seek(0)
                z = np.load(f, allow_pickle=False)
                meta = json.loads(str(z["meta"]))
            except (ValueError, KeyError, zipfile.BadZipFile) as e:
                raise ValueError(f"{path}: not a state that OnlineDedup.save wrote ({e})"
                                 ) from None
            if meta.get("version") != STATE_VERSION:
                raise ValueError(f"{path}: state version {meta.get('version')} is not "
                                 f"{STATE_VERSION}")
            s = meta["settings"]
            self = cls(near=None if s["near"] is None else _near_spec(s["near"]),
                       max_items=s["max_items"], bloom=s["bloom"],
                       bloom_capacity=s["bloom_capacity"], backend=s.get("backend", "auto"),
                       stats=Stats(**meta["stats"]))
            self._with_ids, self._scale = meta["with_ids"], meta["scale"]
            self._owner = dict(zip(_digest_keys(z["digests"]), z["owners"].tolist(),
                                   strict=True))
            if self._blooms is not None:
                from rbloom import Bloom

                self._blooms = tuple(Bloom.load_bytes(z[f"bloom{i}"].tobytes(), _same)
                                     for i in range(2))
            if self._sets is not None:
                self._sets.restore(z["set_offsets"], z["set_hashes"], z["set_blocks"])
            if len(z["block_rows"]):
                values = z["values"]
                bounds = np.cumsum(np.r_[0, z["block_rows"]])
                for lo, hi in itertools.pairwise(bounds.tolist()):
                    self._remember_block(values[lo:hi])
            return self

    def _remember_block(self, x: np.ndarray) -> None:
        self._blocks.append(_NearBlock(x, search_vectors(x, self.near, 0.0, dtype=np.float32)))

    def nbytes(self) -> int:
        """Approximate bytes the state holds (dict entries measured at 100-140 B each)."""
        if self._blooms is not None:
            return sum(b.size_in_bits // 8 for b in self._blooms)
        if self._sets is not None:
            return 140 * len(self._owner) + self._sets.nbytes()
        vec = sum(b.values.nbytes + b.vectors.v.nbytes for b in self._blocks)
        return 140 * len(self._owner) + vec


def _near_spec(saved: dict) -> NearSpec:
    """A NearSpec from its saved dict (shingles, for jaccard, as a dict of their own)."""
    shingles = saved.get("shingles")
    return NearSpec(**{**saved, "shingles": None if shingles is None else Shingles(**shingles)})
