"""What every read parses of a line: the envelope fields (docs/event-format.md), LSNs as 64-bit
integers, and the JSON parser's limits."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Final

from pgrecv.output.format import REPLAY_FIELDS, FieldKind
from pgrecv.spark.files import literal_read

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrameReader, SparkSession


# Each kind of field (pgrecv.output.format, the record format's one owner) as Spark reads it: a row
# image as its raw JSON text, to be parsed per table once its columns are known.
_SPARK_TYPES: Final = {
    FieldKind.INT: "long",
    FieldKind.TEXT: "string",
    FieldKind.LSN: "string",
    FieldKind.IMAGE: "string",
    FieldKind.NAMES: "array<string>",
    FieldKind.TABLES: "array<struct<schema: string, `table`: string>>",
    FieldKind.COLUMNS: "array<struct<name: string, type: string, typmod: long, key: boolean>>",
}
# the replay's fields, then the line of a record Spark could not parse (PERMISSIVE reads)
ENVELOPE_FIELDS: Final = (*(f"{name} {_SPARK_TYPES[kind]}" for name, kind in REPLAY_FIELDS), "_corrupt string")
ENVELOPE: Final = ", ".join(ENVELOPE_FIELDS)
LSN_FIELDS: Final = tuple(name for name, kind in REPLAY_FIELDS if kind is FieldKind.LSN)


# A PostgreSQL LSN as pg_lsn prints it (upper-case hex; zero-padded halves accepted). The high half
# stops at 7FFFFFFF so that every LSN fits a signed 64-bit integer (16 EiB of WAL: never reached).
LSN_PATTERN = r"^[0-7]?[0-9A-Fa-f]{1,7}/[0-9A-Fa-f]{1,8}$"


def named_last(path: str) -> int | None:
    """The last commit LSN that a change file's name claims (``FIRST-LAST.jsonl``, as ``pgrecv
    start --output-dir`` names them), None for a file of another name or a snapshot file. A commit
    record past it is forged or misplaced: applied, it would move the table's position past every
    later transaction (issue 54, L5)."""
    from pgrecv.output import files
    from pgrecv.spark.files import local_path

    name = os.path.basename(local_path(path))
    return None if files.SNAPSHOT_FILE_RE.fullmatch(name) else files.named_last(name)


def lsn_expr(col: Column, checked: bool = False) -> Column:
    """``X/Y`` text → bigint, in Spark (NULL for NULL and for what is not an LSN, which
    check_input names). ``checked``: the texts were matched against the pattern already."""
    from pyspark.sql import functions as F

    hi = F.conv(F.substring_index(col, "/", 1), 16, 10).cast("bigint")
    lo = F.conv(F.substring_index(col, "/", -1), 16, 10).cast("bigint")
    value = hi * F.lit(4294967296) + lo
    return value if checked else F.when(col.rlike(LSN_PATTERN), value)


# Jackson's default limits under Spark's JSON reader and ``from_json``: a string of 20,000,000
# characters, a number of 1,000 digits, 1,000 levels of nesting. PostgreSQL's values go far past
# them (a text or bytea of up to 1 GB, jsonb numbers of 131,072 digits, jsonb nested thousands
# deep), and Spark's permissive parsing then nulls the whole record, which dropped the row (issue
# 54, H1). Every JSON parse of change data takes these options (:func:`json_read`, and
# ``from_json(..., JSON_LIMITS)``), so that every pass reads the same lines whole.
JSON_LIMITS = {name: str(2**31 - 1) for name in ("maxStringLen", "maxNumLen", "maxNestingDepth")}


def json_read(spark: SparkSession) -> DataFrameReader:
    """:func:`literal_read` for JSON lines, without Jackson's limits (:data:`JSON_LIMITS`)."""
    return literal_read(spark).options(**JSON_LIMITS)
