"""The near stage's settings (``NearSpec``): what a near duplicate is (metric and
tolerance), how the records are grouped, and how the search is cut into cells.

Why a module of its own: every part of the near stage (the search space, the
verification, the plan, the Beam steps, the filters, the job's config) reads these
settings, and none of them may import the driver that uses them all.
"""

from __future__ import annotations

from dataclasses import dataclass

from transforms.near.plan import MODES, partition_count
from transforms.near.search import rows_for

METRICS = ("allclose", "l2", "cosine", "correlation", "jaccard")
GROUPINGS = ("representative", "components")
INDEXES = ("auto", "flat", "ivf", "hnsw")
DEVICES = ("auto", "cpu", "cuda")
LEVELS = (1, 2)  # cells: one level of k-means, or coarse cells cut into fine ones
CELL_BYTES = 64 << 20  # float32 search vectors of one cell, about (wide records)

UNITS = ("word", "char", "token")  # jaccard: what a shingle is made of
DEFAULT_SIZE = {"word": 5, "char": 24, "token": 5}  # char: shorter n-grams match by chance


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

    def __reduce__(self):
        """``FROM_DATA`` pickles as itself (a NearSpec sent to workers or saved keeps
        taking its unit from the records); any other as its fields."""
        if self is FROM_DATA:
            return "FROM_DATA"
        return Shingles, (self.unit, self.size, self.normalize, self.permutations, self.bands)


def check_rank(n: int, rank) -> None:
    """One keep-order rank per record (a short one was an IndexError deep in the search)."""
    if len(rank) != n:
        raise ValueError(f"rank holds {len(rank)} values for {n} records: one per record")


def complex_refusal(dtype: str) -> str | None:
    """Why near search refuses ``dtype`` (None: it does not). A complex record's
    imaginary part would be dropped, conjugates merged at distance 0; the job and the
    library say it in one message."""
    if not dtype.startswith("complex"):
        return None
    return (f"near: the tensors are {dtype}; near-duplicate search needs real values: "
            "remove the near section or store real and imaginary parts")


MAX_TOLERANCE = 1e18  # above: no tolerance at all (every pair within), overflows float32 squared


SMALLEST_NORMAL = 2.2250738585072014e-308  # float64: below, distances lose their digits


def threshold_refusal(metric: str, threshold: float | None) -> str | None:
    """Why ``threshold`` (None or 0: not given) means nothing for ``metric`` (None: it
    does). One rule for the job's config and the library's ``NearSpec``: a threshold they
    accept silently removed nothing (NaN, negative) or everything (cosine above 2)."""
    if metric == "allclose":
        if threshold:
            return (f"near.threshold {threshold:g} applies to l2, cosine, correlation and "
                    "jaccard; allclose compares each value (|a - b| <= atol + rtol |b|): "
                    "remove near.threshold and set near.atol (and near.rtol)")
        return None
    if threshold is None or threshold == 0:
        if metric == "jaccard":
            return ("metric jaccard needs near.threshold: the minimum Jaccard similarity of "
                    "a near duplicate, e.g. 0.8")
        return f"metric {metric} needs a threshold > 0 (near.threshold)"
    if not 0 < threshold <= MAX_TOLERANCE:  # NaN too
        return f"near.threshold must be a number > 0, got {threshold:g}"
    if metric != "jaccard" and threshold < SMALLEST_NORMAL:
        return (f"near.threshold {threshold:g} is below the smallest normal float64 "
                f"({SMALLEST_NORMAL:.4g}): distances that small are not measured; use a "
                "larger value")
    if metric == "jaccard" and threshold > 1:
        return (f"near.threshold {threshold:g}: for jaccard it is the minimum Jaccard "
                "similarity, in (0, 1] (e.g. 0.8)")
    if metric == "correlation" and threshold >= 2:
        return (f"near.threshold {threshold:g}: correlation distance 1 - r is at most 2, so "
                "every pair with any contrast would be a duplicate: use a value in (0, 2)")
    if metric == "cosine" and threshold > 2:
        return (f"near.threshold {threshold:g}: cosine distance is at most 2, so every pair "
                "would be a duplicate: use a value in (0, 2]")
    return None


# NearSpec's shingles when none are given: this very object, so a step built with it can
# tell "not set" (the unit from the data: ``unit_for``) from an explicit Shingles("word")
FROM_DATA = Shingles()


def unit_for(text: bool) -> str:
    """The default unit, the job's and the library's: word for texts, token for integer
    sequences (the only numbers a token n-gram means anything over)."""
    return "word" if text else "token"


@dataclass(frozen=True)
class NearSpec:
    metric: str  # allclose | l2 | cosine | correlation | jaccard
    threshold: float = 0.0  # l2: Euclidean distance; cosine: 1 - cos; correlation: 1 - r;
    # jaccard: the MINIMUM Jaccard similarity of the shingle sets (a similarity, not a distance)
    atol: float = 1e-5  # allclose: |a - b| <= atol + rtol * |b| elementwise (b = kept record)
    rtol: float = 0.0
    grouping: str = "representative"
    index: str = "auto"  # inside each cell: auto = flat (exact)
    nlist: int | None = None  # ivf: lists (default 4 sqrt(n))
    nprobe: int = 16  # ivf: lists visited per query
    hnsw_m: int = 32  # hnsw: links per node
    single_index_rows: int = 20_000  # up to here: one cell (n^2 d flops stay ~2 s)
    partition_rows: int = 1_000  # above: k-means cells of about this many rows (or sqrt n)
    levels: int = 1  # cells in one level of k-means, or two (coarse cells cut into fine ones)
    mode: str = "auto"  # exact | bounded | auto (chosen from a sample before the search)
    probes: int = 3  # bounded: cells per row at most (home included)
    recall_sample: int = 2_000  # records checked by brute force for the recall estimate
    device: str = "auto"  # auto | cpu | cuda (matrix products on a GPU through torch)
    channels: int = 1  # correlation: values interleaved as (h, w, c): each c centred alone
    shingles: Shingles | None = None  # jaccard: how a record becomes a set (None: FROM_DATA)

    def __post_init__(self) -> None:
        for name, value, allowed in (("metric", self.metric, METRICS),
                                     ("grouping", self.grouping, GROUPINGS),
                                     ("index", self.index, INDEXES),
                                     ("mode", self.mode, MODES),
                                     ("device", self.device, DEVICES),
                                     ("levels", self.levels, LEVELS)):
            if value not in allowed:
                raise ValueError(f"near.{name} must be one of {', '.join(map(str, allowed))}, "
                                 f"got {value!r}")
        if self.probes < 1:
            raise ValueError(f"near.probes must be at least 1, got {self.probes}")
        if self.channels < 1:
            raise ValueError(f"channels must be at least 1, got {self.channels}")
        if self.metric in METRICS and (refused := threshold_refusal(self.metric,
                                                                    self.threshold)):
            raise ValueError(refused)
        if self.metric == "jaccard":
            if self.shingles is None:  # the unit from the data (word for texts, token for
                object.__setattr__(self, "shingles", FROM_DATA)  # integer sequences)
        elif self.shingles is not None:
            raise ValueError("near.shingles applies to metric jaccard only")

    @property
    def is_sets(self) -> bool:
        """Jaccard over shingle sets (texts, token sequences), not distances of vectors."""
        return self.metric == "jaccard"

    @property
    def marker(self) -> float:
        """The distance to mark on a histogram: the threshold (allclose: atol; jaccard:
        1 - threshold, as its report's distances are 1 - J)."""
        if self.metric == "jaccard":
            return 1.0 - self.threshold
        return self.atol if self.metric == "allclose" else self.threshold

    def cells(self, n: int, dim: int = 1) -> int:
        """Cells for n records of ``dim`` values: the row counts above, capped so that a
        cell's search vectors stay near CELL_BYTES (16k-value records: 1,024 rows)."""
        cap = rows_for(4 * dim, CELL_BYTES, max(self.single_index_rows, self.partition_rows), 2)
        return partition_count(n, min(self.single_index_rows, cap),
                               min(self.partition_rows, cap), self.levels)
