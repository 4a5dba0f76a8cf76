"""spark-apply's vocabulary: what a run is asked (:class:`ApplyConfig`, :class:`Tuning`), what it
reports (:class:`Summary`, :class:`TableResult`), its progress hooks, and where tables go."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Literal

from pgrecv.spark.stores import TargetPath

Format = Literal["delta", "parquet", "iceberg"]
Mode = Literal["latest", "history"]
DeltaEngine = Literal["auto", "delta-rs", "spark"]
BadValues = Literal["fail", "null", "text"]
Name = tuple[str, str]  # (schema, table)


STATE_DIR = "_pgrecv"


def app_id(table: str) -> str:
    """The id under which a table records its applied position (Delta's app transaction):
    ``pgrecv:<schema>.<table>``, ``table`` as a :class:`TableResult` names it."""
    return f"pgrecv:{table}"


@dataclass
class ApplyConfig:
    sources: tuple[str, ...]
    target: TargetPath  # a local directory, or a prefix of a bucket (Delta only)
    fmt: Format = "delta"
    tables: tuple[str, ...] = ()
    mode: Mode = "latest"
    engine: DeltaEngine = "auto"
    master: str | None = None
    remote: str | None = None  # a Spark Connect server (sc://HOST:PORT): no JVM in this process
    conf: dict[str, str] = field(default_factory=dict)
    append_only: bool = False
    # values the target type cannot hold: fail (hold the table back), null, text
    bad_values: BadValues = "fail"
    # --key: key columns for tables whose input names none (pgrecv/spark/keys.py)
    keys: dict[Name, tuple[str, ...]] = field(default_factory=dict)
    # --iceberg-catalog: the session's Iceberg catalog the tables are in (None: a Hadoop catalog
    # under the target)
    catalog: str | None = None


@dataclass(frozen=True)
class Tuning:
    """Switches of the replay's faster paths, each on by default; off, the run takes the general
    path it would otherwise skip (for comparing the two: tests and bench/). Built once per run,
    from the environment by :meth:`from_env`, or by a test."""

    direct: bool = True  # plain inputs read from their JSON, without the staged copy (read/direct.py)
    lean: bool = True  # a large input of one table without the first pass (read/lean.py, read_lean)
    one_pass: bool = True  # batches that touch much of a table in one Spark job (engine/batch.py)
    single_task: bool = True  # small batches onto small tables in one task (engine/facts.py)
    together: bool = True  # many small tables' batches in one set of Spark jobs (engine/together.py)

    @classmethod
    def from_env(cls) -> Tuning:
        """``PGRECV_SPARK_DIRECT``, ``_LEAN``, ``_ONE_PASS``, ``_SINGLE_TASK``, ``_TOGETHER``: ``0`` turns one off."""

        def on(name: str) -> bool:
            return os.environ.get(f"PGRECV_SPARK_{name}", "1") != "0"

        return cls(
            direct=on("DIRECT"),
            lean=on("LEAN"),
            one_pass=on("ONE_PASS"),
            single_task=on("SINGLE_TASK"),
            together=on("TOGETHER"),
        )


@dataclass
class TableResult:
    table: str
    path: str
    status: str  # applied, up to date
    inserts: int = 0
    updates: int = 0
    deletes: int = 0
    truncates: int = 0
    version: int | None = None
    applied_lsn: str | None = None
    bytes_written: int | None = None
    error: str | None = None  # why the table was held back (status "held back")
    values_changed: int = 0  # values the target type cannot hold, stored by --bad-values null or text
    changed_columns: list[str] = field(default_factory=list)  # ... in these columns


@dataclass
class Summary:
    engine: str
    files: int = 0
    lines: int = 0
    transactions: int = 0
    incomplete: int = 0
    rolled_back: int = 0
    pending_prepared: int = 0
    tables: list[TableResult] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    # how the Spark replay read the input: "direct" (plain input, from its JSON), "lean" (the
    # same without the first pass over its changes: pgrecv/spark/direct.py) or "staged"
    input_read: str = ""
    # files of SOURCE not read: every table had applied them (pgrecv/spark/ledger.py)
    files_skipped: int = 0
    # tables applied in groups, by one set of Spark jobs (pgrecv/spark/engine/together.py)
    tables_grouped: int = 0


class Progress:
    """Hooks for the command's progress bar; the default does nothing."""

    def files(self, total: int) -> None: ...
    def file_done(self) -> None: ...
    def tables(self, total: int) -> None: ...
    def table_done(self, name: str) -> None: ...


MAX_DIR_NAME = 200  # below every file system's 255-byte name limit, with room for temp suffixes


def table_dir_name(schema: str, table: str) -> str:
    """``schema.table``, each byte outside ``[A-Za-z0-9_-]`` (dots inside names too) as ``~XX``.

    Not ``%XX``: delta-rs takes table paths for URLs and decodes them, so a directory named with
    ``%`` is not found. Two names of 63 bytes can encode to 379 characters: past MAX_DIR_NAME the
    name is cut and a hash of the whole keeps it unique.
    """

    def enc(s: str) -> str:
        return "".join(
            chr(b) if chr(b).isascii() and (chr(b).isalnum() or chr(b) in "_-") else f"~{b:02X}" for b in s.encode()
        )

    name = f"{enc(schema)}.{enc(table)}"
    if len(name) > MAX_DIR_NAME:
        digest = hashlib.sha256(f"{schema}\0{table}".encode()).hexdigest()[:16]
        name = f"{name[: MAX_DIR_NAME - 18]}~~{digest}"
    return name


def table_of_dir_name(name: str) -> Name | None:
    """The (schema, table) a directory of :func:`table_dir_name` holds; None for another name, or a
    name cut to MAX_DIR_NAME (its hash cannot be read back)."""
    schema, dot, table = name.partition(".")
    if not dot or not schema or not table or "." in table or "~~" in name:
        return None
    try:
        return _dec(schema), _dec(table)
    except ValueError:
        return None


def _dec(text: str) -> str:
    out = bytearray()
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "~":
            digits = text[i + 1 : i + 3]
            if len(digits) != 2 or not all(c in "0123456789ABCDEF" for c in digits):
                raise ValueError(text)
            out.append(int(digits, 16))
            i += 3
        elif ch.isascii() and (ch.isalnum() or ch in "_-"):
            out.append(ord(ch))
            i += 1
        else:
            raise ValueError(text)
    return out.decode()
