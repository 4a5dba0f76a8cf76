"""``--table``/``--exclude-table`` globs as a predicate on (schema, table), shared by the stream,
the snapshot and spark-apply."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Sequence


def table_filter(include: Sequence[str], exclude: Sequence[str]) -> Callable[[str, str], bool] | None:
    """A predicate on (schema, table) from ``--table``/``--exclude-table`` globs (schema-qualified;
    a pattern without a dot matches the table name in any schema); None when both are empty."""
    if not include and not exclude:
        return None

    def matches(patterns: Sequence[str], schema: str, table: str) -> bool:
        qualified = f"{schema}.{table}"
        return any(fnmatch.fnmatchcase(qualified if "." in p else table, p) for p in patterns)

    cache: dict[tuple[str, str], bool] = {}

    def keep(schema: str, table: str) -> bool:
        key = (schema, table)
        hit = cache.get(key)
        if hit is None:
            hit = (not include or matches(include, schema, table)) and not matches(exclude, schema, table)
            cache[key] = hit
        return hit

    return keep
