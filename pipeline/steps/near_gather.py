"""DecideCells -> MergeCells: the cells' outputs gathered on one worker, joined as they come.

Why not ``ToList``: at 1M x 384 it carried 1,278 ``CellOut``s of small arrays, each
pickled and unpickled twice on its way to the merge (0.7 s a round for all of them;
the gather and merge stages took 3.0 s). Joined into one ``CellOut`` of long arrays per
bundle, they travel in milliseconds. Joining is what the merge does to them anyway
(concatenation, histograms added up, the borderline sample cut to the same pairs), so
the merge decides the same: ``merge_cells`` of the joined cell equals it of the list.

Why in a file: the runner's launcher decodes what it groups and what it hands on as a
side input (Beam's FnApiRunner: ``GroupingBuffer``, ``WindowGroupingBuffer``), so a joined
cell crossed it decoded and encoded several times over. A crowd's cell names every one
of its records (one crowd of 1.5M records: about 200 MB pickled), and the launcher
peaked at about 1 GB while it passed. Joined cells wait in a file in ``folder`` (a
scratch folder the job deletes), and only its name travels (``Spilled``). The file
holds data only (``transforms.io.spill``: JSON and raw arrays, never a pickle): the scratch
folder may be on shared storage, where a pickle would run whoever wrote it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import apache_beam as beam
import numpy as np

from pipeline.steps.borderline import merge_borderline
from pipeline.steps.elements import VecBatch
from pipeline.steps.near_cells import CellOut
from transforms.io import fs, spill


@dataclass(frozen=True)
class Spilled:
    """A joined ``CellOut`` in a scratch file of this job (``transforms.io.spill``)."""

    path: str


def spill_cell(cell: CellOut, folder: str) -> Spilled:
    path = fs.join(folder, f"{uuid.uuid4().hex}.cells")
    spill.write(path, cell)
    return Spilled(path)


def loaded(cell: CellOut | Spilled) -> CellOut:
    """The cell itself, read back when it waits in a file (SpillFormatError when the
    file is not one this job wrote: it is never unpickled)."""
    if not isinstance(cell, Spilled):
        return cell
    out = spill.load(cell.path)
    if not isinstance(out, CellOut):
        raise spill.SpillFormatError(f"{cell.path}: not a cell's output")
    return out


def _added(parts: list[tuple[dict, float]]) -> dict:
    """Histograms on one grid added up, each ``weight`` times, left unrounded (the merge
    rounds once, as it did when each cell came alone)."""
    out: dict = {}
    for hist, w in parts:
        for k, v in hist.items():
            out[k] = out.get(k, 0.0) + np.asarray(v, np.float64) * w
    return out


def join_cells(cells: list[CellOut], per_side: int) -> CellOut:
    """Several cells' outputs as one (the order of their rows is the list's)."""
    if len(cells) == 1:
        return cells[0]
    links = [c.links for c in cells if c.links is not None]
    sampled = [(c.pairs_sampled, c.weight) for c in cells if c.pairs_sampled is not None]

    def cat(name: str) -> np.ndarray:
        return np.concatenate([getattr(c, name) for c in cells])

    return CellOut(
        VecBatch.concat([c.gone for c in cells]), VecBatch.concat([c.dup for c in cells]),
        cat("dist"), VecBatch.concat([c.unsure for c in cells]), cat("role"),
        VecBatch.concat([c.best for c in cells]), cat("best_dist"),
        (VecBatch.concat([a for a, _ in links]), VecBatch.concat([b for _, b in links]))
        if links else None,
        [v for c in cells for v in c.values], _added([(c.pairs, 1.0) for c in cells]),
        _added(sampled) if sampled else None, 1.0, cat("nn"),
        merge_borderline([c.borderline for c in cells], per_side),
        *(sum(getattr(c, f) for c in cells)
          for f in ("searched", "arrived", "capped", "members", "sampled_cells",
                    "nn_sampled_cells", "compared", "protected", "sent")))


class GatherCells(beam.CombineFn):
    """CellOut -> [Spilled]: every cell's output joined into one, waiting in a file of
    ``folder`` (an empty list when there were no cells), for ``merge_cells`` (which
    reads it back: ``loaded``). A bundle's cells are held as they come and joined once,
    when the runner compacts the accumulator to send it on (joining every few cells
    would copy the joined part again each time)."""

    def __init__(self, per_side: int, folder: str):
        self.per_side, self.folder = per_side, folder

    def create_accumulator(self) -> list:
        return []

    def add_input(self, acc: list, cell: CellOut) -> list:
        acc.append(cell)
        return acc

    def merge_accumulators(self, accs) -> list:
        return self.compact([c for acc in accs for c in acc])

    def compact(self, acc: list) -> list[Spilled]:
        """[] or one ``Spilled``: the cells (and spilled joins) of ``acc`` joined."""
        if not acc or (len(acc) == 1 and isinstance(acc[0], Spilled)):
            return acc
        return [spill_cell(join_cells([loaded(c) for c in acc], self.per_side), self.folder)]

    def extract_output(self, acc: list) -> list[Spilled]:
        return self.compact(acc)
