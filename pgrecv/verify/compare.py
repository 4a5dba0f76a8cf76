"""The comparison of one table's two sides, by key ranges: pure, over two :class:`Side` objects.

Each side sums, per bucket of its keys' hashes, the rows' count and the sum of their hashes.
Equal buckets are done; an unequal bucket is split by ``BITS`` more bits of the key hash, and
only those rows are summed again, until a bucket holds at most ``LEAF_ROWS`` rows on either
side: then its rows' keys and hashes (nothing else) are fetched and compared one by one. An equal
table costs one scan of each side, and what crosses to the driver is bounded by the number of
differences (``ROW_BUDGET`` caps it; past it, the counts are lower bounds).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol, TypeVar

T = TypeVar("T")

BITS = 10  # each level splits a bucket into 1024
MAX_DEPTH = 6  # 60 bits: the whole key hash
LEAF_ROWS = 64
ROW_BUDGET = 200_000  # rows fetched per side and table, at most
SAMPLES = 10  # keys shown per kind of difference


@dataclass(frozen=True)
class Leaf:
    """One row of a side, as fetched from a differing bucket: its key's canonical values, the
    hash of the whole row and one short hash per compared column."""

    key: tuple[str | None, ...]
    row: int
    columns: tuple[str, ...]


class Side(Protocol):
    """One side of a table (PostgreSQL at the snapshot, or the lake)."""

    def buckets(self, depth: int, within: Sequence[int] | None) -> dict[int, tuple[int, int]]:
        """Per bucket of ``BITS * depth`` low bits of the key hash: (rows, sum of row hashes), for
        the rows whose bucket one level up is in ``within`` (None: every row)."""
        ...

    def leaves(self, depth: int, buckets: Sequence[int]) -> list[Leaf]:
        """The rows of these buckets (of ``BITS * depth`` bits)."""
        ...


@dataclass(frozen=True)
class Changed:
    key: tuple[str | None, ...]
    columns: tuple[str, ...]


@dataclass
class TableDiff:
    """What differs in one table; ``exact`` is False when the row budget cut the search short
    (the counts are then lower bounds)."""

    rows_pg: int = 0
    rows_lake: int = 0
    missing: int = 0  # in PostgreSQL, not in the lake
    extra: int = 0  # in the lake, not in PostgreSQL
    changed: int = 0
    missing_keys: list[tuple[str | None, ...]] = field(default_factory=list)
    extra_keys: list[tuple[str | None, ...]] = field(default_factory=list)
    changed_rows: list[Changed] = field(default_factory=list)
    exact: bool = True
    scans: int = 0  # levels summed (each one scan of each side)

    @property
    def equal(self) -> bool:
        return self.exact and not (self.missing or self.extra or self.changed)


def compare(pg: Side, lake: Side, column_names: Sequence[str]) -> TableDiff:
    """Compares the two sides of a table (``column_names``: the compared columns, in the order of
    :attr:`Leaf.columns`)."""
    diff = TableDiff()
    budget = ROW_BUDGET
    within: list[int] | None = None
    for depth in range(1, MAX_DEPTH + 1):
        a, b = _both(partial(pg.buckets, depth, within), partial(lake.buckets, depth, within))
        diff.scans += 1
        if depth == 1:
            diff.rows_pg = sum(n for n, _ in a.values())
            diff.rows_lake = sum(n for n, _ in b.values())
        unequal = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        if not unequal:
            break
        sizes = {k: max(a.get(k, (0, 0))[0], b.get(k, (0, 0))[0]) for k in unequal}
        last = depth == MAX_DEPTH
        leaves = [k for k in unequal if last or sizes[k] <= LEAF_ROWS]
        deeper = [k for k in unequal if not (last or sizes[k] <= LEAF_ROWS)]
        take: list[int] = []
        for k in leaves:
            if sizes[k] > budget:
                diff.exact = False
                break
            budget -= sizes[k]
            take.append(k)
        if take:
            ours, theirs = _both(partial(pg.leaves, depth, take), partial(lake.leaves, depth, take))
            _diff_rows(diff, ours, theirs, column_names)
        if not diff.exact or not deeper:
            break
        within = deeper
    return diff


def _both(first: Callable[[], T], second: Callable[[], T]) -> tuple[T, T]:
    """Both sides at once: PostgreSQL's scan in a thread while Spark's job runs (two processes)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(first)
        other = second()
        return future.result(), other


def _diff_rows(diff: TableDiff, pg: list[Leaf], lake: list[Leaf], names: Sequence[str]) -> None:
    """Row by row, within the fetched buckets; a key held twice (a table without a key holding
    one row twice, or a lake with a duplicate key) counts each copy."""
    ours: dict[tuple[str | None, ...], list[Leaf]] = {}
    theirs: dict[tuple[str | None, ...], list[Leaf]] = {}
    for leaf in pg:
        ours.setdefault(leaf.key, []).append(leaf)
    for leaf in lake:
        theirs.setdefault(leaf.key, []).append(leaf)
    for key in sorted(ours.keys() | theirs.keys(), key=_order):
        p, q = ours.get(key, []), theirs.get(key, [])
        if len(p) > len(q):
            diff.missing += len(p) - len(q)
            if len(diff.missing_keys) < SAMPLES:
                diff.missing_keys.append(key)
        elif len(q) > len(p):
            diff.extra += len(q) - len(p)
            if len(diff.extra_keys) < SAMPLES:
                diff.extra_keys.append(key)
        if p and q and p[0].row != q[0].row:
            diff.changed += 1
            if len(diff.changed_rows) < SAMPLES:
                cols = tuple(n for n, x, y in zip(names, p[0].columns, q[0].columns, strict=True) if x != y)
                diff.changed_rows.append(Changed(key, cols))


def _order(key: tuple[str | None, ...]) -> tuple[tuple[int, int, str], ...]:
    """Keys in a stable order for the report: numbers by value where they are numbers."""

    def part(v: str | None) -> tuple[int, int, str]:
        if v is None:
            return (2, 0, "")
        try:
            return (0, int(v), "")
        except ValueError:
            return (1, 0, v)

    return tuple(part(v) for v in key)
