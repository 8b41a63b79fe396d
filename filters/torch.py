"""PyTorch front end of the training-input filters: a sampler over what a dedup run kept,
an IterableDataset that deduplicates a stream online, and a keep mask for device batches.

Why three pieces: a finished batch run (``Manifest``) only has to be skipped, which a
sampler does with no hashing at all and composes with ``DistributedSampler``; a stream
no run has seen is deduplicated while it is read (``OnlineDedupDataset``, deciding
chunks of rows with one ``OnlineDedup.keep_mask`` call each, also inside DataLoader
workers); a batch already on a GPU is hashed there (``keep_mask_on_device``). The
decisions themselves are ``filters.manifest`` and ``filters.online``; this module only
moves indices, elements and batches in and out.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import (
    Dataset,
    DistributedSampler,
    IterableDataset,
    Sampler,
    Subset,
    get_worker_info,
)

from filters.manifest import Manifest, ManifestError
from filters.online import OnlineDedup
from transforms.canonical import to_numpy
from transforms.exact import digest_words

ROUTES = ("digest", "replicate")


# --- manifest mode -----------------------------------------------------------------------

class ManifestSampler(Sampler[int]):
    """Yields only the dataset indices a dedup run kept.

    ``kept``: kept dataset indices (``Manifest.kept_indices``) or a bool keep mask over
    the dataset. Alone: in order, or with ``shuffle`` a permutation seeded by
    ``seed + epoch`` (``set_epoch``). With ``num_replicas`` / ``rank`` (either one; the
    other comes from ``torch.distributed`` as in ``DistributedSampler``): a
    ``DistributedSampler`` over the kept positions, mapped back to dataset indices, so
    every rank gets the same number of indices (padded by repeating kept indices, or
    cut with ``drop_last``, exactly as ``DistributedSampler`` does) and DDP never waits
    on a rank that ran out. ``drop_last`` only applies with ranks.
    """

    def __init__(self, kept: Sequence[int] | np.ndarray | torch.Tensor, *,
                 shuffle: bool = False, seed: int = 0, num_replicas: int | None = None,
                 rank: int | None = None, drop_last: bool = False) -> None:
        arr = np.asarray(kept)
        if arr.ndim != 1:
            raise ValueError(f"kept must be 1-D indices or a keep mask, got shape {arr.shape}")
        if arr.dtype == bool:
            arr = np.flatnonzero(arr)
        elif arr.size and arr.dtype.kind not in "iu":
            raise TypeError(f"kept must hold integer indices or bools, got {arr.dtype}")
        self.kept = arr.astype(np.int64)
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self._ranks = None
        if num_replicas is not None or rank is not None:
            self._ranks = DistributedSampler(range(len(self.kept)), num_replicas=num_replicas,
                                             rank=rank, shuffle=shuffle, seed=seed,
                                             drop_last=drop_last)

    def set_epoch(self, epoch: int) -> None:
        """Reseed the shuffle (call before each epoch, as with ``DistributedSampler``)."""
        self.epoch = epoch
        if self._ranks is not None:
            self._ranks.set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        if self._ranks is not None:
            positions = np.fromiter(self._ranks, np.int64, len(self._ranks))
            return iter(self.kept[positions].tolist())
        if not self.shuffle:
            return iter(self.kept.tolist())
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        return iter(self.kept[torch.randperm(len(self.kept), generator=g).numpy()].tolist())

    def __len__(self) -> int:
        return len(self._ranks) if self._ranks is not None else len(self.kept)


def _plain_ids(ids: Any) -> Any:
    """Tensors of ids as numpy (``Manifest`` compares ids as text: ``str(tensor(3))`` is not
    ``"3"``)."""
    return ids.cpu().numpy() if isinstance(ids, torch.Tensor) else ids


def manifest_sampler(manifest: Manifest, ids: Any = None, **kw: Any) -> ManifestSampler:
    """A ``ManifestSampler`` over the records ``manifest`` kept; ``ids[i]`` is the record id
    of dataset index i (None: the dataset is the job's input files concatenated in the
    job's order, with default ids). ``kw``: ``ManifestSampler`` options."""
    return ManifestSampler(manifest.kept_indices(_plain_ids(ids)), **kw)


def manifest_subset(dataset: Dataset, manifest: Manifest, ids: Any = None) -> Subset:
    """``dataset`` restricted to the records ``manifest`` kept (``ids`` as in
    ``manifest_sampler``). Refuses a dataset whose length is not the number of ids, which
    would otherwise silently keep the wrong records."""
    ids = _plain_ids(ids)
    if ids is None and len(dataset) != (read := sum(f["read"] for f in manifest.files)):
        raise ManifestError(f"the dataset has {len(dataset)} records but the run read {read}: "
                            "without ids it must be the job's input files in the job's order")
    if ids is not None and len(dataset) != len(ids):
        raise ManifestError(f"the dataset has {len(dataset)} records but {len(ids)} ids were "
                            "given: ids[i] must name dataset index i")
    return Subset(dataset, manifest.kept_indices(ids).tolist())


# --- online mode -------------------------------------------------------------------------

def default_tensor(item: Any) -> Any:
    """The tensor to fingerprint in an element (or batch): the item itself, or its first
    component for a tuple/list such as ``(input, target)``. Mappings have no obvious
    field, so they need an explicit ``tensor_fn``."""
    if isinstance(item, torch.Tensor | np.ndarray):
        return item
    if isinstance(item, tuple | list):
        return item[0]
    if isinstance(item, Mapping):
        raise TypeError("elements are mappings: pass tensor_fn=lambda e: e['<field>'] to "
                        "say which tensor identifies a record")
    return item


def _stack(tensors: list[Any]) -> Any:
    """One batch of tensors of one dtype and shape: torch stays torch (on its device), numpy
    stays numpy; a mix of both goes through the canonical numpy form."""
    if all(isinstance(t, torch.Tensor) for t in tensors):
        return torch.stack(tensors)
    if all(isinstance(t, np.ndarray) for t in tensors):
        return np.stack(tensors)
    return np.stack([to_numpy(t)[0] for t in tensors])


def _kind(t: Any) -> tuple[str, tuple[int, ...]]:
    """dtype name and shape, the same for numpy and torch: what a digest depends on."""
    return str(t.dtype).removeprefix("torch."), tuple(t.shape)


def _same_kind(tensors: list[Any]) -> bool:
    """All tensors (or arrays) of one type, dtype and shape (the fast check): stacking
    others would promote dtypes or fail, and dtype and shape are part of a record's
    identity."""
    first = tensors[0]
    if not isinstance(first, torch.Tensor | np.ndarray):
        return False
    tp, dtype, shape = type(first), first.dtype, first.shape
    return all(type(t) is tp and t.dtype == dtype and t.shape == shape for t in tensors)


def _rows(batch: Any, rows: np.ndarray) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch[torch.from_numpy(rows).to(batch.device)]
    if isinstance(batch, (list, tuple)):  # texts, token sequences
        return [batch[i] for i in rows.tolist()]
    return batch[rows]


def _select(item: Any, keep: np.ndarray) -> Any:
    """The kept rows of a batch: tensors and arrays along their first axis; mappings and
    tuples (named too) component by component; a list of tensors/arrays/containers by
    component, any other list (ids, strings) row by row."""
    if isinstance(item, torch.Tensor):
        return item[torch.from_numpy(keep).to(item.device)]
    if isinstance(item, np.ndarray):
        return item[keep]
    if isinstance(item, Mapping):
        return {k: _select(v, keep) for k, v in item.items()}
    if isinstance(item, tuple):
        parts = [_select(v, keep) for v in item]
        return type(item)(*parts) if hasattr(item, "_fields") else tuple(parts)
    if isinstance(item, list):
        if any(isinstance(v, torch.Tensor | np.ndarray | Mapping | tuple | list) for v in item):
            return [_select(v, keep) for v in item]
        return list(itertools.compress(item, keep.tolist()))
    raise TypeError(f"cannot select rows of a {type(item).__name__} in a batch")


def _take(ids: Sequence | None, rows: np.ndarray) -> Sequence | None:
    if ids is None or isinstance(ids, np.ndarray):
        return None if ids is None else ids[rows]
    return [ids[i] for i in rows.tolist()]


def _owner_workers(digests: np.ndarray, num_workers: int) -> np.ndarray:
    """The worker that owns each digest: its low 64 bits modulo the number of workers."""
    return (digest_words(digests)[:, 1] % np.uint64(num_workers)).astype(np.int64)


class OnlineDedupDataset(IterableDataset):
    """Yields the elements of ``source`` that are not duplicates of an earlier one.

    ``source``: a map-style dataset (anything with ``__getitem__`` and ``__len__`` that is
    not an ``IterableDataset``, a list too; read in index order) or any other iterable
    (iterated again each epoch, so a bare generator gives one epoch). ``dedup``: the
    state, an ``OnlineDedup`` (exact, or near with a ``NearSpec``).
    ``tensor_fn(element)``: the tensor that identifies a record
    (default ``default_tensor``: the element, or ``element[0]`` of a tuple/list).
    ``id_fn(element, index)``: its record id or None (default: the index for a
    map-style source, no ids for an iterable). With ids, every epoch keeps the same
    records whatever the order; without, each epoch is deduplicated on its own (see
    ``filters.online``). ``chunk``: elements decided per ``keep_mask`` call (a chunk
    whose elements differ in dtype or shape is decided one kind after another; exact
    copies share both, so the result is the same).

    ``batched=True``: ``source`` yields batches (a tensor with a first axis of records,
    or a tuple/list/mapping of such, or rows of plain values); ``tensor_fn(batch)`` is the
    batch tensor, ``id_fn(batch, index)`` the ids of its rows (index = position of its
    first row; default for a map-style source: ``index + arange(n)``), and the filtered
    batch is yielded (an empty one is skipped). Each source batch is one ``keep_mask``
    call; ``chunk`` is not used. Use it for speed: it avoids per-element Python work.

    With DataLoader workers (``torch.utils.data.get_worker_info``), every worker reads
    the whole ``source`` (which must give every worker the same sequence and not shard
    itself) and ``route`` decides who yields what:

    * ``"digest"`` (default in exact mode): a record belongs to the worker
      ``low 64 bits of its exact digest % num_workers``; each worker fingerprints every
      record but decides, remembers and yields only its own. All copies of a value
      belong to the same worker, so "seen before" means exactly what it means in one
      process: an earlier record of the whole source order (whichever worker it came
      from) with the same value; the kept set is the single-process kept set. Memory:
      each worker holds its share of the digests (``max_items`` and ``bloom_capacity``
      apply per worker, to its share). Not possible in near mode (near
      copies have different digests): ``ValueError``.
    * ``"replicate"`` (default in near mode): every worker decides every record with a
      full copy of the state, so "seen before" is again the single-process meaning
      (exact or within tolerance of an earlier kept record of the source order), and
      yields the kept records at stream positions ``p % num_workers == worker id``
      (``batched``: whole batches, by batch number). Costs num_workers x the dedup work.

    Either way the DataLoader interleaves the workers, so the yielded order is not the
    source order. Without workers both routes are the single-process filter.

    Epochs and state: each ``__iter__`` calls ``dedup.new_epoch()``. Worker processes
    hold copies of ``dedup``: the main process's object is not updated, and a new set
    of workers starts from it again. To carry state between epochs use
    ``persistent_workers=True`` (or no workers); to carry it between DataLoaders or
    runs set ``state_dir``: each worker loads
    ``state_dir/online-{route}-w{id}-of-{num_workers}.npz`` (``w0-of-1`` without
    workers) when its iteration starts, if present (the loaded state replaces
    ``self.dedup``), and saves its state there when the iteration ends (an abandoned
    iteration saves nothing). A resumed run needs the same
    route and number of workers, else ``ValueError``; with ids it admits no duplicate
    of the earlier run, without ids the new epoch forgets it anyway.
    """

    def __init__(self, source: Dataset | Iterable, dedup: OnlineDedup, *,
                 tensor_fn: Callable[[Any], Any] = default_tensor,
                 id_fn: Callable[[Any, int], Any] | None = None, chunk: int = 1024,
                 route: str | None = None, state_dir: str | os.PathLike | None = None,
                 batched: bool = False) -> None:
        route = route or ("digest" if dedup.near is None else "replicate")
        if route not in ROUTES:
            raise ValueError(f"route must be one of {', '.join(ROUTES)}, got {route!r}")
        if route == "digest" and dedup.near is not None:
            raise ValueError("route='digest' sends each value to one worker by its exact "
                             "digest, but near copies have different digests: use "
                             "route='replicate' in near mode")
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        self.source = source
        self.dedup = dedup
        self.tensor_fn = tensor_fn
        self.map_style = hasattr(source, "__getitem__") and hasattr(source, "__len__") and \
            not isinstance(source, IterableDataset)
        self.id_fn = id_fn
        self.index_ids = id_fn is None and self.map_style  # default: the index is the id
        self.chunk = chunk
        self.route = route
        self.state_dir = None if state_dir is None else Path(state_dir)
        self.batched = batched

    def _items(self) -> Iterator[Any]:
        if self.map_style:
            return (self.source[i] for i in range(len(self.source)))
        return iter(self.source)

    # --- state across processes and runs ---

    def _state_path(self, worker: int, workers: int) -> Path:
        return self.state_dir / f"online-{self.route}-w{worker}-of-{workers}.npz"

    def _load_state(self, worker: int, workers: int) -> None:
        path = self._state_path(worker, workers)
        if path.is_file():
            loaded = OnlineDedup.load(path)
            # the backend is how digests are computed, not what they are: this run's applies
            saved, wanted = loaded.settings(), self.dedup.settings()
            saved.pop("backend", None)
            wanted.pop("backend", None)
            if saved != wanted:
                raise ValueError(f"{path} was saved with {saved}, not this filter's {wanted}")
            loaded.backend = self.dedup.backend
            self.dedup = loaded
            return
        others = [p.name for p in self.state_dir.glob("online-*.npz")
                  if not p.name.startswith(f"online-{self.route}-")
                  or not p.name.endswith(f"-of-{workers}.npz")]
        if others:
            raise ValueError(f"{self.state_dir} holds states of another route or number of "
                             f"workers ({', '.join(sorted(others)[:3])}); this run is "
                             f"route={self.route!r} with {workers} worker(s): starting empty "
                             "would re-admit what the earlier run kept")

    # --- the decision ---

    def _decide(self, batch: Any, ids: Sequence | None, positions: np.ndarray, worker: int,
                workers: int) -> np.ndarray:
        """Keep mask of the rows of ``batch`` that this worker yields (``positions``: each
        row's stream position, or batch number when batched); rows another worker owns
        (digest route) are not decided here at all."""
        if workers == 1:
            return self.dedup.keep_mask(batch, ids)
        if self.route == "replicate":
            return self.dedup.keep_mask(batch, ids) & (positions % workers == worker)
        digests = self.dedup.digests(batch)
        mine = np.flatnonzero(_owner_workers(digests, workers) == worker)
        keep = np.zeros(len(digests), dtype=bool)
        if len(mine):
            keep[mine] = self.dedup.keep_mask(_rows(batch, mine), _take(ids, mine), digests[mine])
        return keep

    def _chunk_ids(self, elements: list[Any], start: int) -> Sequence | None:
        if self.index_ids:
            return np.arange(start, start + len(elements))
        if self.id_fn is None:
            return None
        ids = [self.id_fn(e, start + k) for k, e in enumerate(elements)]
        missing = sum(i is None for i in ids)
        if missing == 0:
            return ids
        if missing == len(ids):
            return None
        raise ValueError(f"id_fn gave None for {missing} of {len(ids)} elements: a stream "
                         "must have ids for every record or for none")

    def _elements(self, worker: int, workers: int) -> Iterator[Any]:
        items = self._items()
        start = 0
        while elements := list(itertools.islice(items, self.chunk)):
            tensors = list(map(self.tensor_fn, elements))
            ids = self._chunk_ids(elements, start)
            positions = np.arange(start, start + len(elements))
            if self.dedup.near is not None and self.dedup.near.is_sets:  # texts, sequences
                keep = self._decide(tensors, ids, positions, worker, workers)
            elif _same_kind(tensors):
                keep = self._decide(_stack(tensors), ids, positions, worker, workers)
            else:
                tensors = [t if isinstance(t, torch.Tensor | np.ndarray) else np.asarray(t)
                           for t in tensors]  # plain values (lists, numbers) as arrays
                keep = np.zeros(len(elements), dtype=bool)
                kinds: dict[tuple, list[int]] = {}
                for k, t in enumerate(tensors):
                    kinds.setdefault(_kind(t), []).append(k)
                for rows in map(np.array, kinds.values()):
                    keep[rows] = self._decide(_stack([tensors[k] for k in rows]),
                                              _take(ids, rows), positions[rows], worker,
                                              workers)
            yield from itertools.compress(elements, keep.tolist())
            start += len(elements)

    def _batches(self, worker: int, workers: int) -> Iterator[Any]:
        start = 0
        for number, item in enumerate(self._items()):
            batch = self.tensor_fn(item)
            n = len(batch)
            ids = (np.arange(start, start + n) if self.index_ids
                   else None if self.id_fn is None else _plain_ids(self.id_fn(item, start)))
            keep = self._decide(batch, ids, np.full(n, number), worker, workers)
            if keep.any():
                yield _select(item, keep)
            start += n

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if self.state_dir is not None:
            self._load_state(worker, workers)
        self.dedup.new_epoch()
        yield from (self._batches if self.batched else self._elements)(worker, workers)
        if self.state_dir is not None:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            self.dedup.save(self._state_path(worker, workers))


# --- device batches ----------------------------------------------------------------------

def keep_mask_on_device(batch: torch.Tensor, dedup: OnlineDedup | None = None,
                        ids: Any = None, backend: str = "auto") -> torch.Tensor:
    """Bool keep mask (on ``batch.device``) of the rows of a batch, hashed on that device.

    Why: a batch already on a GPU should not travel to the host to be deduplicated; only
    its 16-byte digests do. ``dedup=None``: within this batch only, the first copy of
    each value is kept. With ``dedup``: its state decides and is updated (``ids`` as in
    ``OnlineDedup.keep_mask``; its own ``backend`` applies). ``backend``: as in
    ``fingerprint_batch`` (``"torch"`` runs the device kernel on CPU tensors)."""
    if dedup is None:  # a fresh state: the first copy of each value in this batch
        if ids is not None:
            raise ValueError("ids identify records across batches: pass a dedup state too")
        dedup = OnlineDedup(backend=backend)
    elif backend not in ("auto", dedup.backend):
        raise ValueError(f"backend={backend!r} differs from the dedup state's "
                         f"{dedup.backend!r}: set it on the OnlineDedup")
    return torch.from_numpy(dedup.keep_mask(batch, ids)).to(batch.device)

