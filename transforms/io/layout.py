"""Where every file of a run lives: the one place that names them.

Why one module: a run writes into its outputs, hides its work in siblings of them and
clears what killed runs left, so the same names are built by the checks, the graph, the
Publish step and the clean-up. Named here once, a reader finds every file of a run in
one table, and a change of name cannot leave one of its users behind.

For an output directory ``<out>`` and a report directory ``<report>`` (local paths or
URLs), and ``<attempt>`` unique per attempt (``Job.attempt``)::

    <out>/<input path below the inputs' common directory>   clean shards (output_shard)
    <report>/duplicates.parquet, files.parquet, invalid.parquet, reference_invalid.parquet
    <report>/duplicates.parquet/part-NNNNN.parquet          above FILE_ROWS rows (the same
    <report>/invalid.parquet/part-NNNNN.parquet             for invalid): one per input file
    <report>/index.html, near_distances.png|json|csv, borderline_pairs.parquet
    <report>/embeddings/                                    embed.write: the model's vectors
    <report>/summary.json                                   written last: marks a complete run
    .<name>.staging-<attempt>                               staging: the files before Publish
    .<name>.staging-<attempt>.publishing                    Publish's journal (journal)
    .<name>.old-<ns>                                        the replaced output while swapped
    .<name>.lease.json                                      one-writer lease (dir_lease)
    .<out>.staging-<attempt>.near/values|cells              near spill (spill, spill_values...)
    .<out>.staging-<attempt>.near/cells-recall|cells-plan   recall sample, agreed plan
    .<out>.staging-<attempt>.near-recall/                   the recall sample's values
    .<out>.staging-<attempt>.removed/                       large removal lists (removals)
    $TMPDIR/tensordedup-<hex>/                              a Dedup step's spill in your own
                                                            pipeline, given no spill= path
    .<name>.probe-<hex>, .tensordedup-probe-*               the checks' write probe (deleted)
    .<file>.tmp|new|cas-<pid>-<start>-<host>-<hex>          temporaries beside a file on its
                                                            way in (transforms.io.fs.temp_path)
    <store>/LEASE.json                                      the store's lease (store_lease)
    <store>/STORE.json, commits/, runs/, compactions/, compacted/
                                                            the store (transforms/store/store.py)

``.<name>`` is ``fs.sibling``: a hidden name in the same parent directory. Everything but
the outputs, the report and the store is deleted by the run that made it, or, if it was
killed, by the next run holding the same lease (``publish.clear_leftovers``).
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable

from transforms.io import fs

DUPLICATES = "duplicates.parquet"
FILES = "files.parquet"
INVALID = "invalid.parquet"
REFERENCE_INVALID = "reference_invalid.parquet"
SUMMARY = "summary.json"
# summary.json while it waits in the staged, then the published, report: Publish writes it
# before replacing anything and renames it into place last (pipeline/publish.py)
PENDING_SUMMARY = SUMMARY + ".pending"
INDEX = "index.html"
NEAR_DISTANCES = "near_distances"  # .png, .json, .csv
BORDERLINE = "borderline_pairs.parquet"
EMBEDDINGS = "embeddings"
FILE_ROWS = 1_000_000  # tuning.report_file_rows: a report table is one file up to this many rows
# report files a later run's input glob must not match (checked before any work)
REPORT_TABLES = (DUPLICATES, INVALID, SUMMARY)
# every name a run writes at the top of a report directory (``ours``)
REPORT_NAMES = (DUPLICATES, FILES, INVALID, REFERENCE_INVALID, SUMMARY, PENDING_SUMMARY,
                INDEX, BORDERLINE,
                *(NEAR_DISTANCES + ext for ext in (".png", ".json", ".csv")))
PART = re.compile(r"part-\d+\.parquet")  # a report table's part file (report.parts.part_name)

STAGING, OLD, JOURNAL, LEASE = "staging", "old", ".publishing", "lease.json"
SPILL, RECALL, PLAN, VALUES, CELLS = ".near", "-recall", "-plan", "values", "cells"
REMOVALS = ".removed"
STORE_LEASE = "LEASE.json"
STORE_META = "STORE.json"  # a fingerprint store's settings: marks a directory as a store


def output_shard(path: str, root: str | None) -> str:
    """Where an input file's clean copy goes, relative to the output directory: its path
    below ``root`` (the inputs' common directory), or its name when ``root`` is None."""
    if root is None:
        return path.rstrip("/").rsplit("/", 1)[-1] if not fs.is_local(path) \
            else os.path.basename(path)
    if fs.is_local(path):
        return os.path.relpath(path, root)
    return path[len(root):].lstrip("/")


def ours(report: bool, shards: list[str]) -> Callable[[str], bool]:
    """Whether a file at a path ('/'-separated, below an output or report directory) is
    one a run writes there, so an overwrite may replace it: a report's tables (or their
    part files), page, plot, summary and embeddings; in an output, a clean shard: one of
    ``shards`` (this run's) or a file with one of their extensions (an earlier run's
    inputs); in either, a killed writer's temporary (``fs.temp_path``). One test for
    every file found (made per file, 2,000 inputs took 6.6 s of the checks)."""
    names = set(shards)
    suffixes = {os.path.splitext(s)[1] for s in names} - {""}

    def test(rel: str) -> bool:
        name = rel.rsplit("/", 1)[-1]
        if fs.is_temp(name):
            return True
        if report:
            head, _, rest = rel.partition("/")
            return (head in REPORT_NAMES and not rest) or head == EMBEDDINGS or (
                head in (DUPLICATES, INVALID) and PART.fullmatch(rest) is not None)
        return rel in names or os.path.splitext(name)[1] in suffixes

    return test


def staging(final: str, attempt: str) -> str:
    """The hidden sibling an attempt writes ``final``'s files into before publishing."""
    return fs.sibling(final, f"{STAGING}-{attempt}")


def journal(stage: str) -> str:
    """Publish's journal for a staging directory: written before its first destructive
    step, so a repeated Publish completes the swap."""
    return stage + JOURNAL


def old(final: str, stage: str) -> str:
    """Where ``final``'s previous contents wait while ``stage`` is moved in (local)."""
    return fs.sibling(final, f"{OLD}-{stage.rsplit('-', 1)[-1]}")


def spill(output: str, attempt: str) -> str:
    """The near stage's working files, beside the output's staging directory: cleared
    with it, and by the next run if this one is killed."""
    return staging(output, attempt) + SPILL


def removals(output: str, attempt: str) -> str:
    """Large removal lists between the duplicate steps and the report (``Removed.spill``),
    beside the output's staging directory: deleted by Publish, cleared with the staging
    directories, and by the next run if this one is killed."""
    return staging(output, attempt) + REMOVALS


def library_spill() -> str:
    """The near spill of a ``Dedup`` step in a user's own pipeline, given no ``spill=``:
    a fresh directory in the system's temporary directory, deleted by the step once the
    search is done, and when this process exits whatever became of the pipeline (one
    that failed left its vectors there)."""
    path = os.path.join(tempfile.gettempdir(), f"tensordedup-{uuid.uuid4().hex}")
    atexit.register(shutil.rmtree, path, True)
    return path


def spill_values(spill_dir: str) -> str:
    """Each chunk's vectors, written once by Fingerprint; deleted by Publish."""
    return fs.join(spill_dir, VALUES)


def spill_cells(spill_dir: str) -> str:
    """The rows each cell holds; deleted once every cell was searched."""
    return fs.join(spill_dir, CELLS)


def recall_spill(spill_dir: str) -> str:
    """The recall sample's values until the report is made (a sibling of the spill)."""
    return spill_dir.rstrip("/") + RECALL


def plan_spill(spill_dir: str) -> str:
    """The near plan every task uses, written once (create-if-absent: a runner that
    recomputes the plan's step gets the first plan back); a sibling of the spill."""
    return spill_dir.rstrip("/") + PLAN


def embeddings(report_stage: str) -> str:
    """``embed.write``: the model's vectors, staged with the report."""
    return fs.join(report_stage, EMBEDDINGS)


def dir_lease(final: str) -> str:
    """The lease of an output or report directory: a hidden sibling, next to its staging
    directories."""
    return fs.sibling(os.path.abspath(final) if fs.is_local(final) else final, LEASE)


def store_lease(store: str) -> str:
    """The store's lease, inside it (the store is one directory that outlives runs)."""
    return fs.join(store, STORE_LEASE)


LOCAL_PROBE = ".tensordedup-probe-"  # prefix of the probe file in a local directory


def probe(target: str, token: str) -> str:
    """A probe file beside a remote ``target`` (created and deleted by the checks)."""
    return fs.sibling(target, f"probe-{token}")
