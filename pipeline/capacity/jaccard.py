"""The jaccard stage as the capacity plan needs it: shingles and key lines per record,
and what the candidate groups hold (records grouped, their lines, pairs verified,
removals, the largest group and component), from the job's own kernels run on a sample
of the input; and each step's work in its units for the plan's rates.

Why the kernels on a sample: the cost of the stage is set by the data, not the config:
how many shingles a record has, how many of its keys it shares (copies, crowds,
boilerplate) and how many pairs a decision verifies. The sample (drawn across the
input, as many as the job's own plan samples: ``workload.sample_records``) is shingled,
keyed and decided in keep order exactly as the job does (``transforms.near.sets``), so
``mode: auto`` is chosen by the job's rule and the counts are the job's counts on those records.

Why a fit over nested parts of the sample: a sample of a fraction f of the records
holds a fraction f of a crowd's members (grouped records grow as the sample does) but
only f^2 of the pairs of copies (both must be drawn). Each count is measured on a
quarter, a half and all of the sample and fitted as a s + b s^2 (non-negative), which
is exact for both kinds, and evaluated at the input's distinct records. Past the input
(``--plan-records``) the per-record figures are taken as the input's (a named
assumption: the full set is duplicated like its sample).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from pipeline.steps.near_sets import KEY_SHARDS, PLAN_SAMPLE
from transforms.io.layout import FILE_ROWS
from transforms.near.components import component_labels
from transforms.near.sets import (
    Sets,
    auto_choice,
    band_keys,
    check_groups,
    decide,
    frequent_tokens,
    groups,
    join_work,
    lsh_params,
    prefix_tokens,
    record_sets,
    signatures,
)
from transforms.near.spec import NearSpec

SAMPLE = PLAN_SAMPLE  # records the dry run shingles, keys and decides (the job's plan's)
PARTS = (4, 2, 1)  # the nested parts of the sample the group counts are fitted over
LINE_BYTES = 52  # a key line through the shuffle: key, digest, keep order, spill row, file
MEMBER_BYTES = LINE_BYTES + 8  # a grouped line with its group, spilled for the components' worker
SET_ROW_BYTES = 64  # a spilled row's keys beside its set: digest, order keys, offsets
REMOVAL_BYTES = 100  # a removal's line to the merge (as for vectors)
SHUFFLE_RECORD_BYTES = 33  # the digest group-by: digest, file, position, tier (plus its id)


@dataclass(frozen=True)
class SetsCost:
    """Per record of the input: what the jaccard stage does (``sets_cost``)."""

    mode: str
    why: str  # the mode's reason, as the job prints it
    bands: int  # bounded: LSH bands and rows; exact: 0, 0
    rows: int
    shingles: float  # shingles per record (its set's size)
    lines: float  # group keys per record: bands, or prefix tokens
    valid: float  # share of records with a unit to compare (the rest are invalid)
    distinct: float  # share of records that are the first of their digest
    grouped: float  # share of records in a candidate group (decided by comparison)
    members: float  # grouped key lines per record (what the components' worker holds)
    paired: float  # exact: pairs verified per record where the groups are found
    compared: float  # pairs verified per record (those too)
    removed: float  # share of records removed as near duplicates
    groups: float  # candidate groups per record
    largest_group: int  # records
    largest_component: int  # records: what one decision worker holds at once
    sampled: int
    source: str  # how the figures were found, in words
    stored: float = 0.0  # a store's sets the stage reads and searches, per input record

    @property
    def permutations(self) -> int:
        return self.bands * self.rows

    @property
    def auto(self) -> bool:
        """Whether ``mode: auto`` chose the mode (on the plan's sample, as the job does)."""
        return self.why.startswith("auto")

    @property
    def entering(self) -> float:
        """Sets the stage keys and groups per input record: its valid ones and the
        store's."""
        return self.valid + self.stored

    def with_stored(self, stored: int, records: int) -> SetsCost:
        """The figures with ``stored`` sets of a fingerprint store searched with the
        ``records`` input records: keyed like the input's distinct records, and grouped,
        paired and verified in proportion to the distinct sets the stage holds (a named
        assumption: the store's sets are like the input's, its earlier removals apart);
        the removals stay the input's (stored records are never removed)."""
        if not stored or not records:
            return self
        m = 1 + stored / max(records * self.valid * self.distinct, 1)
        return replace(self, stored=stored / records, grouped=self.grouped * m,
                       members=self.members * m, paired=self.paired * m,
                       compared=self.compared * m, groups=self.groups * m,
                       largest_group=math.ceil(self.largest_group * m),
                       largest_component=math.ceil(self.largest_component * m))


def _stats(sets, rank: np.ndarray, rec: np.ndarray, keys: np.ndarray, sig, take: np.ndarray,
           spec: NearSpec) -> dict[str, float]:
    """The job's groups and decisions over the records ``take`` of the sample: in exact
    mode (no ``sig``) the groups of at most PAIR_GROUP records verified pair by pair and
    only their near pairs going on, as the job's Groups step does."""
    mine = np.isin(rec, take)
    gid, member = groups(keys[mine], rec[mine])
    if not len(gid):
        return dict.fromkeys(("grouped", "members", "paired", "compared", "removed", "groups",
                              "largest_group", "largest_component"), 0.0)
    sizes = np.bincount(gid)
    paired = 0
    if sig is None:  # as the job's Groups step (``near_sets._checked_groups``)
        ordered = Sets(np.r_[0, np.cumsum(np.bincount(rec, minlength=len(sets)))], keys)
        k, m = keys[mine], rec[mine]
        o = np.lexsort((m, k))
        k, m = k[o], m[o]
        k = k[np.r_[True, (k[1:] != k[:-1]) | (m[1:] != m[:-1])]]  # a (key, record) once
        uk, n_k = np.unique(k, return_counts=True)
        a, b, j, goes, found = check_groups(gid, member, uk[n_k > 1][gid], sets, ordered,
                                            rank, spec.threshold)  # groups() numbers keys
        paired = len(found)
        near = j >= spec.threshold
        gid = np.concatenate([len(sizes) + np.repeat(np.arange(int(near.sum())), 2),
                              gid[goes]])
        member = np.concatenate([np.stack([a[near], b[near]], 1).reshape(-1), member[goes]])
    if not len(gid):
        return {"grouped": 0.0, "members": 0.0, "paired": float(paired),
                "compared": float(paired), "removed": 0.0, "groups": float(len(sizes)),
                "largest_group": float(sizes.max()), "largest_component": 0.0}
    dec = decide(gid, member, sets, rank, spec.threshold, spec.grouping, None, sig)
    nodes, node = np.unique(member, return_inverse=True)
    o = np.lexsort((node, gid))  # each group's members linked to its first one
    first = np.r_[True, gid[o][1:] != gid[o][:-1]]
    head = np.maximum.accumulate(np.where(first, np.arange(len(o)), 0))
    label = component_labels(len(nodes), node[o], node[o][head])
    return {"grouped": float(len(nodes)), "members": float(len(member)),
            "paired": float(paired), "compared": float(paired + dec.compared),
            "removed": float(len(dec.removed)), "groups": float(len(sizes)),
            "largest_group": float(sizes.max()),
            "largest_component": float(np.bincount(label).max())}


def _at(sizes: list[int], ys: list[float], n: float) -> float:
    """``ys`` measured on nested samples of ``sizes`` records, fitted as a s + b s^2
    (a, b >= 0: a crowd's members grow as s, pairs of copies as s^2), at ``n``."""
    from scipy.optimize import nnls

    x = np.asarray(sizes, float) / sizes[-1]
    (a, b), _ = nnls(np.stack([x, x * x], axis=1), np.asarray(ys, float))
    x_n = n / sizes[-1]
    return float(a * x_n + b * x_n * x_n)


def _growth(sizes: list[int], ys: list[float], n: float) -> float:
    """The largest group or component at ``n`` records: grown from the sample as it grew
    from half the sample to all of it (a crowd in proportion, a pair not at all)."""
    full = max(ys[-1], 1.0)
    if len(sizes) < 2:
        return full
    half = max(ys[-2], 1.0)
    e = min(max(math.log(full / half) / math.log(sizes[-1] / sizes[-2]), 0.0), 1.0)
    return full * (n / sizes[-1]) ** e


def sets_cost(spec: NearSpec, values: list, local: int, records: int,
              drawn: str = "drawn uniformly from every record",
              shares: tuple[float, float] | None = None) -> SetsCost | None:
    """The stage's figures for ``records`` records of an input of ``local`` records
    sampled as ``values`` (texts or integer sequences as the job reads them, in read
    order; ``drawn``: how, in words); None when no sampled record holds a unit.
    ``shares``: the input's shares of records with a unit and of distinct ones among
    them, counted over every record (``values`` then holds distinct records only)."""
    sh = spec.shingles
    sets = record_sets(values, sh)
    ok = np.flatnonzero(~sets.empty)
    if not len(ok):
        return None
    seen: dict = {}
    for i in ok.tolist():  # one record per digest (its content), as exact dedup keeps
        v = values[i]
        seen.setdefault(v if isinstance(v, str) else np.asarray(v).tobytes(), i)
    distinct = np.sort(np.fromiter(seen.values(), np.int64, len(seen)))
    sets = sets.take(distinct)
    s = len(distinct)
    valid, unique = shares if shares is not None else (len(ok) / len(values), s / len(ok))
    entering = records * valid  # the records the stage sees (exact copies too)
    mode, why = spec.mode, f"near.mode: {spec.mode}"
    prefix = None
    if mode != "bounded":  # the exact join's keys: each record's prefix, rarest first
        prefix = prefix_tokens(sets, spec.threshold, frequent_tokens(sets))
    if mode == "auto":  # the job's rule (PlanSets) on this sample
        _, counts = np.unique(prefix[1], return_counts=True)
        f = s / max(entering, 1)
        mode, why = auto_choice(join_work(counts[counts > 1] / f), round(entering),
                                f", estimated from {s:,} sampled records")
    bands = rows = 0
    sig = None
    if mode == "exact":
        rec, keys = prefix
    else:
        bands, rows = lsh_params(spec.threshold, sh.permutations, sh.bands)
        sig = signatures(sets, bands * rows)
        rec, keys = (np.repeat(np.arange(s), bands),
                     band_keys(sig, bands, rows).reshape(-1))
    rank = np.arange(s)  # the sample in keep order (keep: first)
    order = np.random.default_rng(0).permutation(s)
    sizes = sorted({max(1, s // p) for p in PARTS})
    measured = [_stats(sets, rank, rec, keys, sig, np.sort(order[:m]), spec) for m in sizes]
    target = local * valid * unique  # the input's distinct records
    if s >= round(target):  # the whole input was sampled
        at = dict(measured[-1])
        how = f"the job's kernels on all {s:,} distinct records"
    else:
        at = {k: _at(sizes, [m[k] for m in measured], target) for k in measured[-1]}
        for k in ("grouped", "removed"):  # records, not pairs: the fit's s^2 may pass n
            at[k] = min(at[k], target)
        how = (f"the job's kernels on {s:,} sampled records ({drawn}), "
               "fitted over a quarter, a half and all of them")
    largest = {k: math.ceil(_growth(sizes, [m[k] for m in measured],
                                    records * valid * unique))
               for k in ("largest_group", "largest_component")}
    return SetsCost(mode, why, bands, rows, float(sets.sizes.mean()), len(keys) / s, valid,
                    unique, *(at[k] / local for k in ("grouped", "members", "paired",
                                                      "compared", "removed", "groups")),
                    largest["largest_group"], largest["largest_component"], s, how)


def set_units(n: int, file_bytes: float, text_bytes: float, c: SetsCost, recall: int,
              chunks: int, out_bytes: float | None = None) -> dict[str, dict[str, float]]:
    """Each step's work in its units (``Rates.steps``), for ``n`` records of
    ``text_bytes`` each in ``chunks`` chunks; the output taken as large as the input
    unless ``out_bytes`` is given."""
    v = n * c.entering  # records the stage sees (a store's sets too)
    sh = v * c.shingles
    exact = c.mode == "exact"
    lines = v * c.lines
    grouped = n * c.grouped
    probes = chunks * min(recall, v)
    # A verified pair and a recall probe look up one set's hashes in another's: their
    # cost grows with the sets' size, so each is counted per pair and per shingle.
    return {
        "read": {"record": n, "byte": file_bytes},
        "fingerprint": {"record": n, "byte": n * text_bytes, "shingle": n * c.valid * c.shingles},
        "exact": {"record": n},
        "plan": {"record": v, "shingle": sh,  # mode auto: the exact join's bound, sampled
                 "sampled_shingle": min(v, SAMPLE) * c.shingles if c.auto else 0.0},
        "recall": {"record": v, "shingle": 0 if exact else sh, "ordered": sh if exact else 0,
                   "probe": probes, "probe_shingle": probes * c.shingles},
        "keys": {"minhash": sh * c.permutations, "ordered": sh if exact else 0,
                 "line": lines},
        "groups": {"line": lines, "pair": n * c.paired,
                   "pair_shingle": n * c.paired * c.shingles},
        "components": {"member": n * c.members},
        "decide": {"record": grouped, "pair": n * (c.compared - c.paired),
                   "pair_shingle": n * (c.compared - c.paired) * c.shingles,
                   "minhash": grouped * c.shingles * c.permutations},
        "merge": {"removed": n * c.removed},
        "write": {"record": n, "byte": file_bytes if out_bytes is None else out_bytes},
        "parts": {"record": n},
        "report": {"run": 1, "record": min(n, FILE_ROWS / max(c.removed, 1e-9))},
        "framework": {"run": 1, "record": n, "byte": n * text_bytes,
                      "line": lines + n * c.members},
    }


SET_ONE_WORKER = ("components", "merge", "report", "store")  # the rest: every core
SET_SHARDED = {"groups": KEY_SHARDS, "decide": KEY_SHARDS}  # at most this many bundles at once


def set_shuffled(n: int, id_bytes: int, c: SetsCost) -> dict[str, float]:
    """Bytes through each of the stage's shuffles (and the exact digest group-by)."""
    return {"digests": n * (SHUFFLE_RECORD_BYTES + id_bytes),
            "keys": n * c.entering * c.lines * LINE_BYTES,
            "groups": n * c.members * MEMBER_BYTES}


def set_spilled(n: int, id_bytes: int, c: SetsCost) -> float:
    """Bytes of the spill files: each record's set and its keys, once; the candidate
    groups' lines twice (by Groups for Components, by Components for Decide)."""
    return n * c.entering * (c.shingles * 8 + SET_ROW_BYTES + id_bytes) + 2 * n * c.members * (
        MEMBER_BYTES)


def working_sets(n: int, text_bytes: float, c: SetsCost, chunk_rows: int, recall: int,
                 plan_sample: int) -> dict[str, float]:
    """Bytes a step holds at once on one core: a chunk's text and sets (and their sort's
    copies), its signatures and lines; a key shard; a batch of components (at least the
    largest); the plan's sample; and, alone on one worker, every grouped line (the
    components) and every removal (the merge)."""
    rows = min(chunk_rows, n)
    chunk_sets = rows * c.valid * c.shingles * 8
    recall, plan_sample = min(recall, n), min(plan_sample, n)
    grouped = n * c.grouped
    batch = max(grouped / KEY_SHARDS, c.largest_component)
    return {
        "fingerprint": 3 * rows * text_bytes + 4 * chunk_sets,
        "keys": 3 * chunk_sets + rows * (c.permutations * 4 + c.lines * LINE_BYTES * 2),
        "recall": 4 * chunk_sets + recall * c.shingles * 8 * 3,
        "plan": 3 * plan_sample * c.shingles * 8,
        "groups": 3 * n * c.entering * c.lines * LINE_BYTES / KEY_SHARDS,
        "decide": batch * (3 * c.shingles * 8 + c.permutations * 4 + MEMBER_BYTES
                           * c.members / max(c.grouped, 1e-12)),
        "components": 4 * n * c.members * MEMBER_BYTES,
        "merge": n * c.removed * REMOVAL_BYTES,
    }


def plan_sample(spec: NearSpec) -> int:
    """Records the job's plan holds with their sets: the mode's sample, the recall's."""
    return max(PLAN_SAMPLE if spec.mode != "bounded" else 0, spec.recall_sample)
