"""Small typed settings the steps take as keyword arguments (besides ``TensorSpec`` from
``transforms.formats.base`` and ``NearSpec`` from ``transforms.near``).

Why objects and not flags: a step's signature then says what each setting means,
and the job builds them once from its config.
"""

from __future__ import annotations

from dataclasses import dataclass

from transforms.exact import KEEP_POLICIES
from transforms.formats.base import rows_within


@dataclass(frozen=True)
class Keep:
    """Which record of a duplicate group survives: the ``first`` or ``last`` in input
    order, or the one with the largest (``max``) or smallest (``min``) value of
    ``column`` (ties: input order). ``Keep.first()``, ``Keep.max("quality")``..."""

    rule: str = "first"
    column: str | None = None

    def __post_init__(self) -> None:
        if self.rule not in KEEP_POLICIES:
            raise ValueError(f"keep must be one of {', '.join(KEEP_POLICIES)}, got {self.rule!r}")
        if (self.column is None) != (self.rule in ("first", "last")):
            raise ValueError(f"keep {self.rule!r} {'needs' if self.column is None else 'takes no'}"
                             " column")

    @classmethod
    def first(cls) -> Keep:
        return cls("first")

    @classmethod
    def last(cls) -> Keep:
        return cls("last")

    @classmethod
    def max(cls, column: str) -> Keep:
        return cls("max", column)

    @classmethod
    def min(cls, column: str) -> Keep:
        return cls("min", column)

    @classmethod
    def of(cls, keep: Keep | str) -> Keep:
        """A ``Keep`` from itself or a rule name ("first" | "last")."""
        return keep if isinstance(keep, Keep) else cls(keep)


@dataclass(frozen=True)
class Chunking:
    """How input is cut into Beam elements: ``unit_rows`` records per read task (spread
    over workers), ``chunk_rows`` records per chunk (one element: a Beam element costs
    ~30 us, a row must cost far less), and at most ``chunk_bytes`` of tensor values per
    chunk: a row count alone makes 4 GB chunks of 16 Ki-value float32 images. Units
    shrink with the chunks (``unit_rows_for``), so wide records still spread over
    workers."""

    unit_rows: int = 262_144
    chunk_rows: int = 65_536
    chunk_bytes: int = 64 << 20

    def __post_init__(self) -> None:
        if self.unit_rows < 1 or self.chunk_rows < 1 or self.chunk_bytes < 1:
            raise ValueError("unit_rows, chunk_rows and chunk_bytes must be at least 1, got "
                             f"{self}")

    def unit_rows_for(self, record_bytes: int | None) -> int:
        """Records per read unit for records of ``record_bytes`` (None: unknown): as many
        chunks per unit as ``unit_rows / chunk_rows`` allows (4 by default), each chunk
        cut to ``chunk_bytes``."""
        chunk = rows_within(self.chunk_rows, self.chunk_bytes, record_bytes)
        return min(self.unit_rows, chunk * max(1, -(-self.unit_rows // self.chunk_rows)))
