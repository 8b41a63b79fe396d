"""Small typed settings the steps take as keyword arguments (besides ``TensorSpec`` from
``transforms.formats.base`` and ``NearSpec`` from ``transforms.near``).

Why objects and not flags: a step's signature then says what each setting means,
and the job builds them once from its config.
"""

from __future__ import annotations

from dataclasses import dataclass

from transforms.exact import KEEP_POLICIES


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
    ~30 us, a row must cost far less)."""

    unit_rows: int = 262_144
    chunk_rows: int = 65_536

    def __post_init__(self) -> None:
        if self.unit_rows < 1 or self.chunk_rows < 1:
            raise ValueError(f"unit_rows and chunk_rows must be at least 1, got {self}")
