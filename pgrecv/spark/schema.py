"""The tables' schema: PostgreSQL column types → Arrow/Spark types, the history columns, and the
one plan of a table's columns and key that every batch is built from.

The mapping follows Spark's PostgreSQL JDBC dialect (see docs/spark-apply.md for the table): it is
decided from the relation records alone, never inferred from values; a column keeps the type it
has in the target, and a change of type is refused rather than rewritten.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from pgrecv.errors import InputError
from pgrecv.spark.keys import identity

UNCONSTRAINED_NUMERIC = (38, 18)  # Spark's DecimalType.SYSTEM_DEFAULT, as its JDBC dialect uses


@dataclass(frozen=True)
class ColumnType:
    """How one PostgreSQL column is stored: its type's name and the Arrow type."""

    pg_type: str
    arrow: pa.DataType
    is_json: bool = False


_SCALARS: dict[str, pa.DataType] = {
    "smallint": pa.int16(),
    "integer": pa.int32(),
    "bigint": pa.int64(),
    "oid": pa.int64(),
    "xid": pa.int64(),
    "cid": pa.int64(),
    "xid8": pa.decimal128(20, 0),
    "real": pa.float32(),
    "double precision": pa.float64(),
    "boolean": pa.bool_(),
    "bytea": pa.binary(),
    "date": pa.date32(),
    "timestamp without time zone": pa.timestamp("us"),
    "timestamp with time zone": pa.timestamp("us", tz="UTC"),
}
_JSON_TYPES = {"json", "jsonb"}


def quoted(name: str) -> str:
    """A column name as Spark SQL reads it: any name PostgreSQL allows, backticks doubled."""
    return "`" + name.replace("`", "``") + "`"


def numeric_precision(typmod: int) -> tuple[int, int] | None:
    """(precision, scale) of ``numeric(p,s)`` from its typmod; None when unconstrained."""
    if typmod < 4:
        return None
    raw = typmod - 4
    precision = (raw >> 16) & 0xFFFF
    scale = raw & 0x7FF
    if scale & 0x400:  # PostgreSQL 15+: negative scales are stored as 11-bit two's complement
        scale -= 0x800
    return precision, scale


def column_type(pg_type: str | None, typmod: int) -> ColumnType:
    """The storage type of a column, from the relation record's ``type`` and ``typmod``."""
    name = pg_type or "unknown"
    if name.endswith("[]"):
        element = column_type(name[:-2], typmod)
        if element.is_json or pa.types.is_list(element.arrow):
            return ColumnType(name, pa.list_(pa.string()))
        return ColumnType(name, pa.list_(element.arrow))
    if name == "numeric":
        ps = numeric_precision(typmod)
        precision, scale = ps if ps is not None else UNCONSTRAINED_NUMERIC
        if scale < 0:  # numeric(3,-2) holds integers up to 99900
            precision, scale = precision - scale, 0
        if precision > 38:
            return ColumnType(name, pa.string())  # wider than Spark's decimal: keep the exact text
        return ColumnType(name, pa.decimal128(precision, scale))
    if name in _JSON_TYPES:
        return ColumnType(name, pa.string(), is_json=True)
    return ColumnType(name, _SCALARS.get(name, pa.string()))  # text, varchar, uuid, interval, money, enums, …


_SPARK_NAMES = {
    pa.int16(): "smallint",
    pa.int32(): "int",
    pa.int64(): "bigint",
    pa.float32(): "float",
    pa.float64(): "double",
    pa.bool_(): "boolean",
    pa.binary(): "binary",
    pa.date32(): "date",
}


def spark_ddl(arrow: pa.DataType) -> str:
    """The Spark SQL type for an Arrow type we produce (Spark's JDBC-dialect types)."""
    if arrow in _SPARK_NAMES:
        return _SPARK_NAMES[arrow]
    if pa.types.is_timestamp(arrow):
        return "timestamp" if arrow.tz is not None else "timestamp_ntz"
    if pa.types.is_decimal(arrow):
        return f"decimal({arrow.precision},{arrow.scale})"
    if pa.types.is_list(arrow):
        return f"array<{spark_ddl(arrow.value_type)}>"
    return "string"


def same_type(a: pa.DataType, b: pa.DataType) -> bool:
    """Type equality that ignores what storage layers change on the way (ns/us, tz spelling)."""
    if pa.types.is_timestamp(a) and pa.types.is_timestamp(b):
        return (a.tz is None) == (b.tz is None)
    if pa.types.is_list(a) and pa.types.is_list(b):
        return same_type(a.value_type, b.value_type)
    if (pa.types.is_string(a) or pa.types.is_large_string(a)) and (
        pa.types.is_string(b) or pa.types.is_large_string(b)
    ):
        return True
    if (pa.types.is_binary(a) or pa.types.is_large_binary(a)) and (
        pa.types.is_binary(b) or pa.types.is_large_binary(b)
    ):
        return True
    return bool(a.equals(b))


def holds(target: pa.DataType, sent: pa.DataType) -> bool:
    """The target column's type stores every value of the sent type unchanged: the same type, or
    a wider integer (element-wise for arrays). Iceberg has no 16-bit integer: its tables keep a
    smallint column as int, and the next batch's smallint values go into it."""
    if pa.types.is_list(target) and pa.types.is_list(sent):
        return holds(target.value_type, sent.value_type)
    if pa.types.is_integer(target) and pa.types.is_integer(sent) and target.bit_width > sent.bit_width:
        return bool(pa.types.is_signed_integer(target) and pa.types.is_signed_integer(sent))
    return same_type(target, sent)


# history mode's columns, after the table's own (SCD type 2: one row per version of a key)
HISTORY_COLS: list[tuple[str, pa.DataType]] = [
    ("_start_lsn", pa.int64()),
    ("_start_change_lsn", pa.int64()),
    ("_end_lsn", pa.int64()),
    ("_end_change_lsn", pa.int64()),
    ("_start_time", pa.timestamp("us", tz="UTC")),
    ("_end_time", pa.timestamp("us", tz="UTC")),
    ("_current", pa.bool_()),
    ("_deleted", pa.bool_()),
]
HISTORY_NAMES = [n for n, _ in HISTORY_COLS]


@dataclass
class TablePlan:
    schema: str
    table: str
    columns: dict[str, ColumnType]  # every column of the target after this batch
    key_cols: list[str]
    full: bool  # REPLICA IDENTITY FULL without a key: rows are identified by all columns (NULL-safe)
    append_only: bool
    pg_columns: list[str]  # the columns PostgreSQL sends (the latest relation's)

    @property
    def name(self) -> str:
        return f"{self.schema}.{self.table}"


def plan(
    schema: str,
    table: str,
    relations: list[dict[str, Any]],
    existing: pa.Schema | None,
    append_only: bool,
    history: bool = False,
    named: tuple[str, ...] | None = None,
) -> TablePlan:
    """The table's columns after this batch (the target's, then those its relation records add,
    each keeping the type it has) and its key (:func:`pgrecv.spark.keys.identity`)."""
    name = f"{schema}.{table}"
    cols: dict[str, ColumnType] = {}
    if existing is not None:
        for f in existing:
            if not (history and f.name in HISTORY_NAMES):
                cols[f.name] = ColumnType("(target)", f.type)
    pg_columns: list[str] = []
    sent: dict[str, ColumnType] = {}  # each column's type by this input's relation records
    for rel in relations:
        pg_columns = [c["name"] for c in rel["columns"]]
        taken = [n for n in pg_columns if history and n in HISTORY_NAMES]
        if taken:
            raise InputError(
                f"table {name}: column {taken[0]} is one that --mode history adds itself ({', '.join(HISTORY_NAMES)}): "
                "rename it in PostgreSQL, or apply this table with --mode latest"
            )
        for c in rel["columns"]:
            ct = column_type(c.get("type"), int(c.get("typmod") if c.get("typmod") is not None else -1))
            before = sent.setdefault(c["name"], ct)
            if not same_type(before.arrow, ct.arrow):
                # within the input: a type change, whatever the target column (issue 54, L5)
                raise InputError(
                    f"table {name}: column {c['name']} changed type from {before.pg_type} ({before.arrow}) to "
                    f"{ct.pg_type} ({ct.arrow}): spark-apply does not rewrite tables; re-create the target table "
                    "from a snapshot"
                )
            have = cols.get(c["name"])
            if have is not None and pa.types.is_string(have.arrow) and not pa.types.is_string(ct.arrow):
                # a string column in the target (--bad-values text made it) keeps the values' text
                ct = ColumnType(ct.pg_type, pa.string(), ct.is_json)
            if have is not None and holds(have.arrow, ct.arrow):
                ct = ColumnType(ct.pg_type, have.arrow, ct.is_json)  # (stored in the target's type)
            elif have is not None:
                raise InputError(
                    f"table {name}: column {c['name']} changed type from {have.arrow} to {ct.arrow} ({ct.pg_type}): "
                    "spark-apply does not rewrite tables; re-create the target table from a snapshot"
                )
            if have is None or have.pg_type == "(target)":
                cols[c["name"]] = ColumnType(ct.pg_type, have.arrow if have else ct.arrow, ct.is_json)
    for n, ct in list(cols.items()):
        if ct.pg_type == "(target)":  # a column PostgreSQL no longer sends: keep its type, store NULL
            cols[n] = ColumnType("text" if pa.types.is_string(ct.arrow) else "(target)", ct.arrow)
    key, full, append = identity(schema, table, relations, append_only, named)
    for k in key:
        if k not in cols:
            raise InputError(f"table {name}: key column {k} is not among its columns")
    return TablePlan(schema, table, cols, key, full, append, pg_columns)


def delta_names(plan: TablePlan) -> None:
    """Delta takes column names case-insensitively: a table with columns that differ only in case
    (``"a"`` and ``"A"``, two columns to PostgreSQL) cannot be a Delta table."""
    seen: dict[str, str] = {}
    for n in plan.columns:
        other = seen.setdefault(n.lower(), n)
        if other != n:
            raise InputError(
                f"table {plan.name}: columns {other!r} and {n!r} differ only in case, and Delta takes column names "
                "case-insensitively: apply this table with --format parquet"
            )
