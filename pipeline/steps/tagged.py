"""Steps with several outputs, run the same way on every runner.

Why: Beam 2.77's DaskRunner merges a multi-output ParDo's outputs (``with_outputs`` /
``TaggedOutput``) into one collection, so every consumer would get every output. Here a
step's outputs travel as ``Tagged`` pairs in one collection and one single-output ParDo
per tag takes its own: the graph is made of plain ParDos, which the local runner,
Dask and Dataflow all run alike. On the local runner and Dataflow the per-tag steps
fuse with the producer; elements are chunks of rows, so the extra calls are a few per
chunk (measured in docs/pipeline.md#runners).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import apache_beam as beam


@dataclass(slots=True)
class Tagged:
    """One output of a multi-output step: which output, and the element."""

    tag: str
    value: Any


class TaggedCoder(beam.coders.Coder):
    """Pickle, with the size estimate of the value's own coder: Beam samples element
    sizes, and a pickled 64 Ki-row chunk is a costly way to measure one (read.ChunkCoder)."""

    def __init__(self) -> None:
        self._coders: dict[type, beam.coders.Coder] = {}

    def encode(self, t: Tagged) -> bytes:
        return pickle.dumps((t.tag, t.value), protocol=5)

    def decode(self, data: bytes) -> Tagged:
        return Tagged(*pickle.loads(data))

    def estimate_size(self, t: Tagged) -> int:
        kind = type(t.value)
        if kind not in self._coders:
            self._coders[kind] = beam.coders.registry.get_coder(kind)
        return self._coders[kind].estimate_size(t.value)

    def is_deterministic(self) -> bool:
        return False


beam.coders.registry.register_coder(Tagged, TaggedCoder)


class _Tagging(beam.DoFn):
    """Runs ``fn`` (a DoFn or a function of the element and extra arguments) and wraps each
    output: ``TaggedOutput(tag, v)`` as ``Tagged(tag, v)``, anything else as the main tag."""

    def __init__(self, fn: beam.DoFn | Callable[..., Any], main: str):
        self.fn, self.main = fn, main
        self.is_dofn = isinstance(fn, beam.DoFn)

    def setup(self) -> None:
        if self.is_dofn:
            self.fn.setup()

    def process(self, element, *args, **kwargs) -> Iterator[Tagged]:  # Beam checks hints
        call = self.fn.process if self.is_dofn else self.fn
        for out in call(element, *args, **kwargs) or ():
            if isinstance(out, beam.pvalue.TaggedOutput):
                yield Tagged(out.tag, out.value)
            else:
                yield Tagged(self.main, out)

    def teardown(self) -> None:
        if self.is_dofn:
            self.fn.teardown()


def _take(t: Tagged, tag: str) -> Iterator[Any]:
    if t.tag == tag:
        yield t.value


class SplitOutputs(beam.PTransform):
    """``fn`` over each element -> {main: ..., tag: ... for tags}. ``fn`` yields its main
    output plainly and the others as ``beam.pvalue.TaggedOutput``, as for ``with_outputs``;
    ``args`` may hold side inputs. ``types`` gives an output's element type (for its coder)."""

    def __init__(self, fn: beam.DoFn | Callable[..., Any], *args: Any, main: str,
                 tags: tuple[str, ...], types: dict[str, type] | None = None):
        super().__init__()
        self.fn, self.args, self.main, self.tags = fn, args, main, tags
        self.types = types or {}

    def expand(self, pcoll: beam.PCollection) -> dict[str, beam.PCollection]:
        tagged = pcoll | "Run" >> beam.ParDo(_Tagging(self.fn, self.main),
                                             *self.args).with_output_types(Tagged)
        out = {}
        for tag in (self.main, *self.tags):
            take = beam.FlatMap(_take, tag)
            if tag in self.types:
                take = take.with_output_types(self.types[tag])
            out[tag] = tagged | f"Take_{tag}" >> take
        return out
