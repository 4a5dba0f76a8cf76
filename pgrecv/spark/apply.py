"""spark-apply: read → per table: skip what is applied, reduce, resolve TOAST, write atomically.

Prepared transactions whose outcome is not in the input are carried over in
``TARGET/_pgrecv/prepared/`` (their lines, with the relation records of their tables) and read
before the input next time; see docs/spark-apply.md.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from pgrecv.errors import InputError, UsageError
from pgrecv.spark import reduce as rd
from pgrecv.spark.keys import identity
from pgrecv.spark.read import (
    Reader,
    ReadResult,
    TableInput,
    check_snapshots,
    expand_sources,
    ignored_in_directories,
)
from pgrecv.spark.types import ColumnType, column_type, convert_value, fast_column, same_type
from pgrecv.spark.writers import (
    HISTORY_COLS,
    HISTORY_NAMES,
    OP_COL,
    Batch,
    DeltaRsTarget,
    DeltaSparkTarget,
    ParquetTarget,
    Target,
    hashable,
)
from pgrecv.stream.pipeline import table_filter

STATE_DIR = "_pgrecv"


@dataclass
class ApplyConfig:
    sources: tuple[str, ...]
    target: Path
    fmt: str = "delta"  # delta | parquet
    tables: tuple[str, ...] = ()
    mode: str = "latest"  # latest | history
    engine: str = "auto"  # auto | spark | delta-rs
    master: str | None = None
    conf: dict[str, str] = field(default_factory=dict)
    append_only: bool = False
    # where the replay runs: "spark" (Spark tasks, pgrecv/spark/engine.py: the driver's memory does
    # not grow with the input) or "driver" (the older replay in this process; Delta's Spark
    # connector is reached through it)
    replay: str = "spark"
    # values the target type cannot hold (--replay spark): fail (hold the table back), null, text
    bad_values: str = "fail"
    # --key: key columns for tables whose input names none (pgrecv/spark/keys.py)
    keys: dict[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)


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


class Progress:
    """Hooks for the command's progress bar; the default does nothing."""

    def files(self, total: int) -> None: ...
    def file_done(self) -> None: ...
    def tables(self, total: int) -> None: ...
    def table_done(self, name: str) -> None: ...


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """The cyclic GC off while millions of (acyclic) records are built, and what was built
    frozen afterwards (:func:`gc.freeze`, O(1)): every collection walks the objects of its
    generations, which made reading and reducing cost 15 instead of 6 µs/event, and the first
    collections after re-enabling would walk them all once more. :func:`run_apply` unfreezes
    at its end (then ordinary reference counting frees the records)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was:
            gc.enable()


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


def _lsn_text(v: int) -> str:
    return f"{v >> 32:X}/{v & 0xFFFFFFFF:X}"


def run_apply(
    config: ApplyConfig,
    spark: Any = None,
    progress: Progress | None = None,
    after_table: Callable[[str], None] | None = None,
) -> Summary:
    try:
        with target_lock(config.target):
            summary = _run_apply(config, spark, progress, after_table)
        summary.warnings[:0] = ignored_in_directories(config.sources)
        return summary
    finally:
        gc.unfreeze()  # what no_gc() froze: back under the collector (its records are freed by now)


@contextlib.contextmanager
def target_lock(target: Path) -> Iterator[None]:
    """One run per target at a time: two overlapping runs would both apply the same changes
    (``--append-only`` would append them twice, Parquet versions would race). An advisory lock on
    ``TARGET/_pgrecv/lock``, held for the whole run; the kernel lets it go when the process dies.
    Holding it, the run also removes the staging directories of runs that were killed."""
    import shutil

    from pgrecv.output.files import open_lock, output_error

    work = target / STATE_DIR
    try:
        work.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(work, 0o700)  # change data goes in here: this user only
    except OSError as exc:  # a target where nothing can be made: say so before Spark starts
        raise output_error(exc, work, "create the target's state directory") from None
    fd = open_lock(
        work / "lock",
        busy=f"{target}: another spark-apply run is applying to this target: "
        "wait for it to finish (runs on one target must not overlap)",
    )
    try:
        for stale in work.glob("stage-*"):
            shutil.rmtree(stale, ignore_errors=True)
        yield
    finally:
        os.close(fd)


def _run_apply(
    config: ApplyConfig,
    spark: Any,
    progress: Progress | None,
    after_table: Callable[[str], None] | None,
) -> Summary:
    started = time.monotonic()
    progress = progress or Progress()
    if config.fmt not in ("delta", "parquet") or config.mode not in ("latest", "history"):
        raise UsageError("--format is delta or parquet, --mode latest or history")
    files = expand_sources(config.sources)
    manifests = check_snapshots(files)
    state = config.target / STATE_DIR / "prepared"
    if config.bad_values not in ("fail", "null", "text"):
        raise UsageError("--bad-values is fail, null or text")
    if config.bad_values != "fail" and config.replay != "spark":
        raise UsageError("--bad-values null or text needs --replay spark")
    if config.replay == "spark":
        if config.fmt == "delta" and config.engine == "spark":
            raise UsageError(
                "--delta-engine spark (Delta's Spark connector) goes with --replay driver; "
                "the Spark replay writes Delta through delta-rs (--delta-engine auto or delta-rs)"
            )
        # nothing to read (a cron run before the stream's first file): no JVM started for it
        has_input = bool(files) or (state.is_dir() and any(state.glob("*.jsonl")))
        if spark is None and has_input:
            from pgrecv.spark.sparkops import start_session

            spark = start_session(config.master, config.conf)
        from pgrecv.spark.engine import run_frames

        summary: Summary = run_frames(config, spark, files, manifests, state, progress or Progress(), after_table)
        return summary
    carried = sorted(state.glob("*.jsonl")) if state.is_dir() else []

    with no_gc():
        reader = Reader(table_filter(config.tables, ()))
        progress.files(len(files) + len(carried))
        for path in carried:
            reader.feed_file(path)
            progress.file_done()
        for mpath, manifest in manifests.items():
            reader.feed_manifest(manifest, str(mpath))
        for path in files:
            reader.feed_file(path)
            progress.file_done()
        res = reader.result()

    engine = config.engine
    todo = [t for t in res.tables.values() if t.changes]
    # no table to write (nothing read, or only prepared transactions carried over): no JVM started
    if (config.fmt == "parquet" or engine in ("auto", "spark")) and spark is None and todo:
        from pgrecv.spark.sparkops import start_session

        spark = start_session(config.master, config.conf)
    if config.fmt == "delta":
        if engine == "auto":
            from pgrecv.spark.sparkops import has_delta_connector

            engine = "spark" if spark is not None and has_delta_connector(spark) else "delta-rs"
        elif engine == "spark" and spark is not None:
            from pgrecv.spark.sparkops import has_delta_connector

            if not has_delta_connector(spark):
                raise UsageError(
                    "--delta-engine spark: Delta Lake's Spark connector (io.delta) is not on the classpath; "
                    "add it (e.g. --conf spark.jars.packages=io.delta:delta-spark_2.13:4.0.0) or use delta-rs"
                )
    else:
        engine = "spark"
    summary = Summary(
        engine=f"{config.fmt}/{engine}",
        files=res.files,
        lines=res.lines,
        transactions=res.transactions,
        incomplete=res.incomplete,
        rolled_back=res.rolled_back,
        pending_prepared=len(res.pending),
    )
    _carry_pending(state, res)
    progress.tables(len(todo))
    for t in sorted(todo, key=lambda t: (t.schema, t.table)):
        path = config.target / table_dir_name(t.schema, t.table)
        app_id = f"pgrecv:{t.schema}.{t.table}"
        target: Target
        if config.fmt == "parquet":
            target = ParquetTarget(path, app_id, spark)
        elif engine == "spark":
            target = DeltaSparkTarget(path, app_id, spark)
        else:
            target = DeltaRsTarget(path, app_id)
        summary.tables.append(apply_table(t, target, config))
        progress.table_done(t.name)
        if after_table is not None:
            after_table(t.name)
    _finish_carried(state, res)
    applied = {r.table: r for r in summary.tables}
    for gid, commit_lsn in res.missing_prepared:
        summary.warnings.append(
            f"COMMIT PREPARED '{gid}' at {_lsn_text(commit_lsn)}: its PREPARE is neither in the input nor carried "
            "over (fine if an earlier run applied it; otherwise give the file holding its PREPARE)"
        )
    del applied
    summary.seconds = time.monotonic() - started
    return summary


def _gid_file(state: Path, gid: str) -> Path:
    return state / (hashlib.sha256(gid.encode()).hexdigest()[:32] + ".jsonl")


def _carry_pending(state: Path, res: ReadResult) -> None:
    """Prepared, outcome unknown: keep its lines for the next run (before applying anything)."""
    from pgrecv.spark.writers import _atomic_write

    if not res.pending:
        return
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(state, 0o700)  # raw change data: this user only (also for a directory an older run made)
    for p in res.pending:
        _atomic_write(_gid_file(state, p.gid), b"".join(p.lines), mode=0o600)


def _finish_carried(state: Path, res: ReadResult) -> None:
    pending = {p.gid for p in res.pending}
    for gid in res.finished_gids - pending:
        _gid_file(state, gid).unlink(missing_ok=True)


# --- one table -------------------------------------------------------------------------------


def _plan_columns(t: TableInput, existing: pa.Schema | None, history: bool) -> dict[str, ColumnType]:
    cols: dict[str, ColumnType] = {}
    if existing is not None:
        for f in existing:
            if f.name not in HISTORY_NAMES or not history:
                cols[f.name] = ColumnType("(target)", f.type, None)
    for rel in t.relations:
        for c in rel["columns"]:
            name = c["name"]
            ct = column_type(c.get("type"), int(c.get("typmod", -1)))
            have = cols.get(name)
            if have is not None and not same_type(have.arrow, ct.arrow):
                raise InputError(
                    f"table {t.name}: column {name} changed type from {have.arrow} to {ct.arrow} ({ct.pg_type}): "
                    "spark-apply does not rewrite tables; re-create the target table from a snapshot"
                )
            if have is None or have.pg_type == "(target)":
                cols[name] = ColumnType(ct.pg_type, have.arrow if have else ct.arrow, ct.convert, ct.is_json, ct.vector)
    return cols


def apply_table(t: TableInput, target: Target, config: ApplyConfig) -> TableResult:
    target.open()
    result = TableResult(t.name, str(target.path), "up to date", version=target.version)
    applied = target.applied
    if applied is not None:
        result.applied_lsn = _lsn_text(applied)
    with no_gc():
        batch = _plan_batch(t, target, config, result)
    if batch is None:
        return result
    target.write(batch)
    result.status = "applied"
    result.version = target.version
    result.applied_lsn = _lsn_text(batch.position)
    return result


def _plan_batch(t: TableInput, target: Target, config: ApplyConfig, result: TableResult) -> Batch | None:
    """Skip what is applied, reduce, resolve TOAST, build the Arrow source (None: nothing to do)."""
    history = config.mode == "history"
    applied = target.applied
    # checked even when nothing is left to apply: a wrong --mode fails on the first run
    if target.schema is not None and ("_current" in target.schema.names) != history:
        raise UsageError(
            f"{target.path} is a {'history' if not history else 'latest'}-mode table: use the same --mode as before"
        )
    changes = t.changes if applied is None else [c for c in t.changes if c.commit_lsn > applied]
    if not changes:
        return None
    position = max(c.commit_lsn for c in changes)
    cols = _plan_columns(t, target.schema, history)
    key_cols, full, append = identity(
        t.schema, t.table, t.relations, config.append_only, config.keys.get((t.schema, t.table))
    )
    for k in key_cols:
        if k not in cols:
            raise InputError(f"table {t.name}: key column {k} is not among its columns")

    def live_keys() -> list[list[Any]]:
        if target.schema is None:
            return []
        tab = target.scan([*key_cols, "_deleted"], key_cols, None, True)
        return [[r[c] for c in key_cols] for r in tab.to_pylist() if not r["_deleted"]]

    if append:
        red = rd.append_only(changes)
    else:
        red = rd.reduce_changes(changes, key_cols, full=full, history=history, target_live_keys=live_keys)
    result.inserts, result.updates, result.deletes, result.truncates = (
        red.inserts,
        red.updates,
        red.deletes_n,
        red.truncates,
    )
    rows = [r for _k, _kv, r in red.versions] if history else list(red.upserts.values())
    fills = _resolve_toast(rows, red, target, key_cols, cols, history, t.name)

    names = list(cols)
    schema = pa.schema([(n, cols[n].arrow) for n in names] + (HISTORY_COLS if history else []))
    batch = Batch(
        schema=schema,
        key_cols=key_cols,
        null_safe=full,
        truncate=red.truncated,
        source=_source(red, rows, fills, cols, names, key_cols, history, schema, t.name),
        history=history,
        append_only=append,
        position=position,
    )
    return batch


def _resolve_toast(
    rows: list[rd.Row],
    red: rd.Reduced,
    target: Target,
    key_cols: list[str],
    cols: dict[str, ColumnType],
    history: bool,
    name: str,
) -> dict[int, dict[str, Any]]:
    """Unchanged-TOAST columns the batch cannot supply: the target's current row of the source key."""
    need = [r for r in rows if r.missing and not r.deleted]
    if not need:
        return {}

    def tkey(kv: list[Any]) -> tuple[Any, ...]:
        return tuple(hashable(convert_value(cols[c], v, c, f"table {name}")) for c, v in zip(key_cols, kv, strict=True))

    wanted = {id(r): tkey(r.source) for r in need if r.source is not None}
    missing_cols = sorted({c for r in need for c in r.missing})
    found = {} if red.truncated else target.lookup(key_cols, list(set(wanted.values())), missing_cols, history)
    fills: dict[int, dict[str, Any]] = {}
    for r in need:
        row = found.get(wanted.get(id(r), ()))
        if row is None:
            raise InputError(
                f"{r.where}: unchanged TOAST column(s) {', '.join(sorted(r.missing))} of table {name}, but the target "
                "has no row to keep them from: apply the earlier changes or a snapshot (pgrecv snapshot) first"
            )
        fills[id(r)] = {c: row.get(c) for c in r.missing}
    return fills


def _column(
    rows: list[rd.Row], fills: dict[int, dict[str, Any]], c: str, ct: ColumnType, name: str
) -> list[Any] | pa.Array:
    if not ct.is_json and not any(c in f for f in fills.values()):  # a TOAST fill of c: per value
        fast = fast_column(ct, [r.values.get(c) for r in rows])
        if fast is not None:
            return fast
    out = []
    conv = convert_value
    for r in rows:
        f = fills.get(id(r)) if fills else None
        if f is not None and c in f:
            out.append(f[c])
        elif ct.is_json and c in r.json_nulls:
            out.append("null")
        else:
            out.append(conv(ct, r.values.get(c), c, r.where or f"table {name}"))
    return out


def _source(
    red: rd.Reduced,
    rows: list[rd.Row],
    fills: dict[int, dict[str, Any]],
    cols: dict[str, ColumnType],
    names: list[str],
    key_cols: list[str],
    history: bool,
    schema: pa.Schema,
    tname: str,
) -> pa.Table:
    if not history:
        deleted = [rd.Row(dict(zip(key_cols, kv, strict=True)), set(), None, set()) for kv in red.deletes.values()]
        every = rows + deleted
        ops = ["U"] * len(rows) + ["D"] * len(deleted)
        arrays = {c: _column(every, fills, c, cols[c], tname) for c in names}
        arrays[OP_COL] = ops
        return _table(arrays, schema)
    # history: each version ends where the next version of its key starts; the first closes the target's
    nxt: dict[int, tuple[int, int, str | None]] = {}
    last: dict[rd.Key, int] = {}
    first: dict[rd.Key, tuple[list[Any], tuple[int, int, str | None]]] = {}
    for i, (k, kv, r) in enumerate(red.versions):
        if k in last:
            nxt[last[k]] = r.start
        else:
            first[k] = (kv, r.start)
        last[k] = i
    closes = [rd.Row(dict(zip(key_cols, kv, strict=True)), set(), None, set(), start=s) for kv, s in first.values()]
    every = closes + rows
    arrays = {c: _column(every, fills, c, cols[c], tname) for c in names}
    from pgrecv.spark.types import _timestamptz

    def ts(v: str | None) -> Any:
        return None if v is None else _timestamptz(v.replace("Z", "+00:00"))

    n_c = len(closes)
    ends = [c.start for c in closes] + [nxt.get(i) for i in range(len(rows))]
    arrays["_start_lsn"] = [None] * n_c + [r.start[0] for r in rows]
    arrays["_start_change_lsn"] = [None] * n_c + [r.start[1] for r in rows]
    arrays["_end_lsn"] = [e[0] if e else None for e in ends]
    arrays["_end_change_lsn"] = [e[1] if e else None for e in ends]
    arrays["_start_time"] = [None] * n_c + [ts(r.start[2]) for r in rows]
    arrays["_end_time"] = [ts(e[2]) if e else None for e in ends]
    arrays["_current"] = [None] * n_c + [i not in nxt for i in range(len(rows))]
    arrays["_deleted"] = [None] * n_c + [r.deleted for r in rows]
    arrays[OP_COL] = ["C"] * n_c + ["N"] * len(rows)
    return _table(arrays, schema)


def _table(arrays: dict[str, list[Any] | pa.Array], schema: pa.Schema) -> pa.Table:
    out = []
    for f in schema:
        values = arrays[f.name]
        if isinstance(values, pa.Array):
            out.append(values)
            continue
        try:
            out.append(pa.array(values, type=f.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
            raise InputError(f"column {f.name}: a value does not fit {f.type}: {exc}") from None
    out.append(pa.array(arrays[OP_COL], type=pa.string()))
    return pa.Table.from_arrays(out, schema=schema.append(pa.field(OP_COL, pa.string())))
