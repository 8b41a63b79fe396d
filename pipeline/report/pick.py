"""What the report's page shows: the largest duplicate groups, the pairs nearest the
threshold, the records they name, and those records' tensors (at most ``MAX_ROWS``).

The selection is plain functions over the duplicates and borderline tables, so the
clean copy can take the same records' tensors from its own pass over the inputs before
the page is made (``pipeline.report.tables.rows_to_show``) instead of the page reading them
back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

MAX_GROUPS = 10  # largest groups shown
MAX_MEMBERS = 8  # records shown per group, the kept one included
MAX_PAIRS = 8  # borderline pairs shown on each side of the tolerance
MAX_ROWS = 160  # tensors read back at most (groups first, then pairs)
MAX_LISTED = 100  # removed records per group listed by id after its cards (no tensors)
READ_ROWS = Callable[[int, list[int]], dict[int, np.ndarray]]


@dataclass
class Rec:
    """One record on the page: who it is and where it lives (file None: an earlier run)."""

    id: str
    file: int | None
    row: int | None
    note: str = ""  # kind and distance, or "kept", or "earlier run <run>"
    tensor: np.ndarray | None = None
    duplicate_of: str | None = None  # the record it duplicates (removed records)

    @property
    def where(self) -> tuple[int, int] | None:
        return None if self.file is None or self.row is None else (self.file, self.row)


@dataclass
class Group:
    group: str
    size: int  # removed records + the kept one
    kept: Rec
    members: list[Rec] = field(default_factory=list)
    listed: list[Rec] = field(default_factory=list)  # the next members: ids, no tensors


@dataclass
class Pick:
    """The rows of duplicates.parquet the page can show: the largest groups' (``sizes``:
    group id -> removed records, at most ``MAX_GROUPS``), trimmed to what a group shows,
    and for each row whether it names the record its group keeps."""

    rows: pa.Table
    names_root: np.ndarray  # (rows,) bool
    sizes: dict[str, int]

    @staticmethod
    def of(dups: pa.Table, k: int = MAX_GROUPS) -> Pick:
        """From a whole duplicates table: a row names the kept record when the record it
        names is no member of the table."""
        if dups.num_rows == 0 or k <= 0:
            return Pick(dups, np.zeros(dups.num_rows, bool), {})
        vc = pc.value_counts(dups.column("group"))
        top = pc.select_k_unstable(pa.table({"id": vc.field("values"),
                                             "n": vc.field("counts")}), k,
                                   sort_keys=[("n", "descending"), ("id", "ascending")])
        ids = vc.field("values").take(top).to_pylist()  # C++ top-k: a run can have 1e6+ groups
        sizes = dict(zip(ids, vc.field("counts").take(top).to_pylist(), strict=True))
        mine = dups.filter(pc.is_in(dups.column("group"), pa.array(ids, pa.string())))
        at, dup_at = (_where(mine, f"{p}file", f"{p}row") for p in ("", "duplicate_of_"))
        group = mine.column("group").to_numpy(zero_copy_only=False)
        names_root = np.zeros(len(at), bool)
        for gid in ids:  # a crowd's group has 1e5+ members: none becomes a dict
            rows = np.flatnonzero(group == gid)
            names_root[rows] = ~np.isin(dup_at[rows], at[rows])
        return Pick(mine, names_root, sizes)


@dataclass
class Pair:
    record: Rec  # the later record in keep order
    neighbour: Rec
    distance: float
    within: bool


# ---------------------------------------------------------------------------- selection


def largest_groups(pick: Pick | pa.Table, k: int = MAX_GROUPS, members: int = MAX_MEMBERS,
                   listed: int = MAX_LISTED) -> list[Group]:
    """The ``k`` largest groups (ties by group id); per group the kept record, up to
    ``members - 1`` removed ones, the farthest from their survivor first, and the next
    ``listed`` in that order (a group's "+N more": by id, where and kind on the page).
    ``pick``: the job's (``pipeline.report.parts``), or a whole duplicates table."""
    if isinstance(pick, pa.Table):
        pick = Pick.of(pick, k)
    ids = sorted(pick.sizes, key=lambda g: (-pick.sizes[g], g))[:max(k, 0)]
    if not ids:
        return []
    dups = pick.rows
    which = pc.index_in(dups.column("group"), pa.array(ids, pa.string())).to_numpy(
        zero_copy_only=False)
    at = _where(dups, "file", "row")
    dist = dups.column("distance").to_numpy(zero_copy_only=False)
    out = []
    for g, gid in enumerate(ids):
        rows = np.flatnonzero(which == g)
        # the record the group keeps: the one a member names that is not a member itself
        root = dups.slice(int(rows[np.argmax(pick.names_root[rows])]), 1).to_pylist()[0]
        note = ("kept" if root["duplicate_of_run"] is None
                else f"kept by earlier run {root['duplicate_of_run']}")
        kept = Rec(root["duplicate_of"], root["duplicate_of_file"], root["duplicate_of_row"],
                   note)
        order = np.lexsort((at[rows], -dist[rows]))  # farthest first
        cards = max(members - 1, 0)
        shown, more = (
            [Rec(r["record_id"], r["file"], r["row"], _removal_note(r),
                 duplicate_of=r["duplicate_of"])
             for r in dups.take(rows[part]).to_pylist()]
            for part in (order[:cards], order[cards:cards + max(listed, 0)]))
        out.append(Group(gid, pick.sizes[gid] + 1, kept, shown, more))
    return out


def _where(t: pa.Table, file: str, row: str) -> np.ndarray:
    """(file, row) of each row as one sortable int64 (file above bit 40; -1: none, a
    record of an earlier run)."""
    f = pc.fill_null(t.column(file), -1).to_numpy().astype(np.int64)
    r = pc.fill_null(t.column(row), -1).to_numpy().astype(np.int64)
    return np.where((f < 0) | (r < 0), -1, (f << 40) | r)


def _removal_note(r: dict) -> str:
    if r["kind"].endswith("exact"):
        return r["kind"]
    return f"{r['kind']} {r['distance']:.4g}"


def nearest_pairs(table: pa.Table | None, k: int = MAX_PAIRS) -> tuple[list[Pair], list[Pair]]:
    """Up to ``k`` pairs just inside the tolerance (largest distances) and ``k`` just
    outside (smallest)."""
    if table is None or table.num_rows == 0:
        return [], []
    rows = table.to_pylist()

    def pair(r: dict) -> Pair:
        def rec(pre: str, fid: str) -> Rec:
            f, row = r[f"{pre}_file"], r[f"{pre}_row"]
            ok = f is not None and f >= 0
            return Rec(r[fid], f if ok else None, row if ok else None,
                       "" if ok else "earlier run")
        return Pair(rec("record", "record_id"), rec("neighbour", "neighbour_id"),
                    r["distance"], r["within"])

    inside = sorted((r for r in rows if r["within"]),
                    key=lambda r: (-r["distance"], r["record_id"], r["neighbour_id"]))[:k]
    outside = sorted((r for r in rows if not r["within"]),
                     key=lambda r: (r["distance"], r["record_id"], r["neighbour_id"]))[:k]
    return [pair(r) for r in inside], [pair(r) for r in outside]


def page_records(duplicates: Pick | pa.Table, borderline: pa.Table | None
                 ) -> tuple[list[Group], list[Pair], list[Pair], list[Rec]]:
    """What the page shows: the largest groups, the pairs nearest the threshold on each
    side, and every record they name (in the order the page fetches them)."""
    groups = largest_groups(duplicates)
    inside, outside = nearest_pairs(borderline)
    recs = [r for g in groups for r in (g.kept, *g.members)]
    recs += [r for p in inside + outside for r in (p.record, p.neighbour)]
    return groups, inside, outside, recs


def wanted_rows(recs: list[Rec], cap: int = MAX_ROWS) -> list[tuple[int, int]]:
    """The first ``cap`` distinct (file, row)s the records name: the tensors a page shows."""
    wanted: list[tuple[int, int]] = []
    for r in recs:
        if r.where is not None and r.where not in wanted and len(wanted) < cap:
            wanted.append(r.where)
    return wanted


def fetch(recs: list[Rec], read_rows: READ_ROWS | None, cap: int = MAX_ROWS) -> int:
    """Fill ``Rec.tensor`` for the first ``cap`` distinct (file, row)s, one read per file.
    A file that cannot be read back leaves its records without a tensor (the page
    still shows their ids). Returns how many tensors were read."""
    wanted = wanted_rows(recs, cap)
    if read_rows is None or not wanted:
        return 0
    got: dict[tuple[int, int], np.ndarray] = {}
    for f in sorted({w[0] for w in wanted}):
        rows = sorted(w[1] for w in wanted if w[0] == f)
        try:
            tensors = read_rows(f, rows)
        except Exception:  # noqa: BLE001  (a view of the data: never fail the run for it)
            tensors = {}
        got.update({(f, r): t for r, t in tensors.items()})
    for r in recs:
        if r.where in got:
            r.tensor = np.asarray(got[r.where])
    return len(got)
