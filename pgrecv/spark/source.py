"""The input as one Spark DataFrame of records, read by Spark tasks (never row by row in the driver).

Every line of every file becomes a row with the envelope fields of docs/event-format.md, the row
images ``new``/``old`` kept as their raw JSON text (Spark's file reader keeps the exact bytes; its
SQL JSON functions would turn ``3.14159265358979323846264`` into a double), LSNs as 64-bit
integers, and the line's place in the input: ``_rank`` (the file's index in replay order),
``_blk`` (the split it was read in) and ``_mid`` (its order within the split). Ordered by those
three, rows are in file order, which the positional rules (streamed chunks) need.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pgrecv.errors import InputError

# Only the fields the replay uses; the JSON reader skips the rest of each line.
ENVELOPE_FIELDS = (
    "v long",
    "op string",
    "schema string",
    "table string",
    "xid long",
    "subxid long",
    "commit_lsn string",
    "lsn string",
    "commit_time string",
    "gid string",
    "snapshot_lsn string",
    "new string",
    "old string",
    "unchanged_toast array<string>",
    "old_unchanged_toast array<string>",
    "json_nulls array<string>",
    "old_json_nulls array<string>",
    "tables array<struct<schema: string, `table`: string>>",
    "replica_identity string",
    "key array<string>",
    "columns array<struct<name: string, type: string, typmod: long, key: boolean>>",
    "_corrupt string",
)
ENVELOPE = ", ".join(ENVELOPE_FIELDS)
LSN_FIELDS = ("commit_lsn", "lsn", "snapshot_lsn")
# A PostgreSQL LSN as pg_lsn prints it (upper-case hex; zero-padded halves accepted). The high half
# stops at 7FFFFFFF so that every LSN fits a signed 64-bit integer (16 EiB of WAL: never reached).
LSN_PATTERN = r"^[0-7]?[0-9A-Fa-f]{1,7}/[0-9A-Fa-f]{1,8}$"


def lsn_expr(col: Any, checked: bool = False) -> Any:
    """``X/Y`` text → bigint, in Spark (NULL for NULL and for what is not an LSN, which
    check_input names). ``checked``: the texts were matched against the pattern already."""
    from pyspark.sql import functions as F

    hi = F.conv(F.substring_index(col, "/", 1), 16, 10).cast("bigint")
    lo = F.conv(F.substring_index(col, "/", -1), 16, 10).cast("bigint")
    value = hi * F.lit(4294967296) + lo
    return value if checked else F.when(col.rlike(LSN_PATTERN), value)


@dataclass
class Records:
    """The records of one run and the few facts the driver needs about them."""

    frame: Any  # the DataFrame (over the staged copy: every table's replay reads it)
    files: list[Path]


# Link -> the file it stands for, for every message that names a file (see _urls).
_REAL_NAMES: dict[str, str] = {}


def _urls(paths: list[Path], links: Path | None) -> list[str]:
    """What Spark is given to read each of ``paths``: its ``file:`` URL, or for a file whose name
    holds ':' the URL of a symbolic link to it in ``links`` (made 0700 here). Hadoop's local file
    system builds a checksum file's path from the name (``.a:b.jsonl.crc``) and cannot parse that
    back ("Relative path in absolute URI"); a ':' in a directory is no trouble."""
    urls = []
    for i, p in enumerate(paths):
        real = p.resolve()  # what file_url gives Spark: a link given to us counts by its target's name
        if ":" not in real.name:
            urls.append(file_url(p))
            continue
        if links is None:
            raise InputError(f"{p}: Spark cannot read a file whose name holds ':': rename it")
        if not links.exists():  # a fresh name in the run's private directory
            links.mkdir(mode=0o700)
        link = links.resolve() / f"{i:06d}.jsonl"  # the link itself, not resolved through it
        link.symlink_to(real)  # fails if the name exists
        _REAL_NAMES[str(link)] = str(real)
        urls.append("file://" + str(link))
    return urls


def read_records(
    spark: Any, files: list[Path], carried: list[Path], stage: Path | None = None, links: Path | None = None
) -> Records:
    """Carried-over prepared transactions first (negative ranks), then the input in name order.

    With ``stage``, the parsed records are written there once as Parquet (by Spark tasks, in one
    pass over the input) and the frame reads that copy: every later pass reads only the columns
    it needs, and each line's place in the input (``_blk``, ``_mid``) is fixed once. ``links``:
    a directory for links to files whose names Spark cannot read (the caller removes it)."""
    from pyspark.sql import functions as F

    ordered = [*carried, *files]
    if not ordered:
        return Records(None, files)
    urls = _urls(ordered, links)
    df = (
        json_read(spark)
        .schema(ENVELOPE)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", "_corrupt")
        .json(urls)  # file: paths, whatever fs.defaultFS says
        .select(
            "*",
            F.col("_metadata.file_path").alias("_path"),
            F.col("_metadata.file_block_start").alias("_blk"),
            F.monotonically_increasing_id().alias("_mid"),
        )
    )
    # Each file's rank, matched by the path as Spark spells it (Hadoop's URI form: spaces, '%'
    # and '#' percent-encoded, non-ASCII kept), which the JVM computes here for each listed file.
    # A row whose file is not matched keeps a NULL rank, which check_input reports.
    ranks = spark.createDataFrame(
        [(_spelling(spark, url), i - len(carried)) for i, url in enumerate(urls)], "_path string, _rank int"
    )
    df = df.join(F.broadcast(ranks), "_path", "left")
    lsns = [lsn_expr(F.col(n)).alias(f"{n}_i") for n in LSN_FIELDS]
    df = df.select("*", *lsns)
    bad_lsn = F.lit(False)
    for name in LSN_FIELDS:
        bad_lsn = bad_lsn | (F.col(name).isNotNull() & F.col(f"{name}_i").isNull())
    df = df.withColumn("_bad_lsn", bad_lsn)
    if stage is not None:
        df.write.mode("error").parquet(file_url(stage))
        df = literal_read(spark).parquet(file_url(stage))
    return Records(df, files)


# Jackson's default limits under Spark's JSON reader and ``from_json``: a string of 20,000,000
# characters, a number of 1,000 digits, 1,000 levels of nesting. PostgreSQL's values go far past
# them (a text or bytea of up to 1 GB, jsonb numbers of 131,072 digits, jsonb nested thousands
# deep), and Spark's permissive parsing then nulls the whole record, which dropped the row (issue
# 54, H1). Every JSON parse of change data takes these options (:func:`json_read`, and
# ``from_json(..., JSON_LIMITS)``), so that every pass reads the same lines whole.
JSON_LIMITS = {name: str(2**31 - 1) for name in ("maxStringLen", "maxNumLen", "maxNestingDepth")}


def json_read(spark: Any) -> Any:
    """:func:`literal_read` for JSON lines, without Jackson's limits (:data:`JSON_LIMITS`)."""
    return literal_read(spark).options(**JSON_LIMITS)


def literal_read(spark: Any) -> Any:
    """Spark's reader for paths pgrecv names itself (the inputs it listed, its staged copies, the
    target's files): never a Hadoop glob. Spark takes ``[``, ``{``, ``*`` and ``?`` in a path as
    one, and a target such as ``lake[1]`` is then "not found". (``__globPaths__`` is the option
    Spark's own file streams read their listed files with; pyproject pins pyspark to versions
    that have it, and tests/spark/test_engine.py's test of glob characters fails without it.)"""
    return spark.read.option("__globPaths__", "false")


def file_url(path: Path) -> str:
    """A local path for Spark: ``file://`` and the path as it is (Hadoop's Path escapes it itself;
    a percent-encoded URI would be taken literally and not found)."""
    return "file://" + str(path.resolve())


def _spelling(spark: Any, url: str) -> str:
    """How Spark's ``_metadata.file_path`` spells the file at ``url``: ``file:`` and the URI's raw path."""
    uri = spark._jvm.org.apache.hadoop.fs.Path(url).toUri()
    return "file:" + str(uri.getRawPath())


def local_path(uri: str) -> str:
    """A local file's path from the URI Spark gives (``file:/a%20b/c``)."""
    from urllib.parse import unquote

    path = uri[5:] if uri.startswith("file:") else uri
    while path.startswith("//"):
        path = path[1:]
    path = unquote(path)
    return _REAL_NAMES.get(path, path)


def find_line(path_uri: str, needle: dict[str, Any]) -> str:
    """``file:line`` of the first line holding every ``"field":value`` of ``needle`` (for error
    messages only: reads one file in the driver, line by line, without keeping it)."""
    import orjson

    path = local_path(path_uri)
    parts = [orjson.dumps({k: v})[1:-1] for k, v in needle.items() if v is not None]
    try:
        with open(path, "rb") as f:
            for lineno, line in enumerate(f, 1):
                if all(p in line for p in parts):
                    return f"{path}:{lineno}"
    except OSError:
        pass
    return path


def check_input(records: Records) -> None:
    """Lines that are not records of this format, and malformed LSNs: the input is corrupt (exit 9)."""
    from pyspark.sql import functions as F

    df = records.frame
    bad = df.where(
        F.col("_rank").isNull()
        | F.col("_corrupt").isNotNull()
        | F.col("op").isNull()
        | (F.col("v") != 1)
        | F.col("v").isNull()
        | F.col("_bad_lsn")
    )
    first = bad.orderBy("_rank", "_blk", "_mid").limit(1).collect()
    if not first:
        return
    r = first[0]
    if r["_rank"] is None:
        raise InputError(f"{local_path(r['_path'])}: Spark read a file that was not listed: report this as a bug")
    if r["_corrupt"] is not None:
        where = _line_of_text(r["_path"], r["_corrupt"])
        raise InputError(f"{where}: not a valid JSON record: the file is corrupt or truncated")
    if r["op"] is None:
        where = find_line(r["_path"], {"v": r["v"]})
        raise InputError(f"{where}: record lacks the field 'op': the file is corrupt")
    if r["v"] != 1:
        where = find_line(r["_path"], {"op": r["op"], "v": r["v"]})
        raise InputError(f"{where}: unsupported format version v={r['v']!r}: this pgrecv reads v=1")
    for name in LSN_FIELDS:
        value = r[name]
        if value is not None:
            import re

            if not re.fullmatch(LSN_PATTERN, value):
                where = find_line(r["_path"], {name: value})
                raise InputError(f"{where}: invalid LSN {value!r} in {name}: the file is corrupt")


def _line_of_text(path_uri: str, text: str) -> str:
    path = local_path(path_uri)
    want = text.encode().rstrip(b"\n")
    try:
        with open(path, "rb") as f:
            for lineno, line in enumerate(f, 1):
                if line.rstrip(b"\n") == want:
                    return f"{path}:{lineno}"
    except OSError:
        pass
    return path
