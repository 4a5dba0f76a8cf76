"""The oracle's run: every line read by the driver, each table replayed in Python and written
through Arrow; prepared transactions whose outcome is not in the input are carried over as
their raw lines."""

from __future__ import annotations

import contextlib
import gc
import hashlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from pgrecv.errors import InputError, UsageError
from pgrecv.filters import table_filter
from pgrecv.lsn import lsn_str
from pgrecv.spark.inputs import check_snapshots, expand_sources, ignored_in_directories
from pgrecv.spark.model import STATE_DIR, ApplyConfig, Progress, Summary, TableResult, table_dir_name
from pgrecv.spark.schema import HISTORY_COLS, ColumnType, plan
from pgrecv.spark.tables.parquet import atomic_write
from pgrecv.spark.targets import LocalTarget
from tests.spark.oracle import reduce as rd
from tests.spark.oracle.convert import _timestamptz, convert_value, fast_column
from tests.spark.oracle.read import Reader, ReadResult, TableInput
from tests.spark.oracle.writers import OP_COL, Batch, OracleDelta, OracleParquet, hashable

Oracle = OracleDelta | OracleParquet


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


def run(
    config: ApplyConfig,
    spark: Any = None,
    progress: Progress | None = None,
    after_table: Callable[[str], None] | None = None,
) -> Summary:
    """The whole run in this process: read every line, replay per table, write through Arrow."""
    with LocalTarget(config.target).lock():
        summary = _run(config, spark, progress or Progress(), after_table)
    summary.warnings[:0] = ignored_in_directories(config.sources)
    return summary


def _run(
    config: ApplyConfig,
    spark: Any,
    progress: Progress,
    after_table: Callable[[str], None] | None,
) -> Summary:
    started = time.monotonic()
    if config.bad_values != "fail":
        raise UsageError("the oracle stores no bad value: --bad-values fail only")
    files = expand_sources(config.sources)
    manifests = check_snapshots(files)
    state = config.target / STATE_DIR / "prepared"
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

    todo = [t for t in res.tables.values() if t.changes]
    # no table to write (nothing read, or only prepared transactions carried over): no JVM started
    if config.fmt == "parquet" and spark is None and todo:
        from pgrecv.spark.sparkops import start_session

        spark = start_session(config.master, config.conf)
    engine = "spark" if config.fmt == "parquet" else "delta-rs"
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
        target: Oracle = (
            OracleParquet(path, app_id, spark) if config.fmt == "parquet" else OracleDelta(path, app_id, spark)
        )
        summary.tables.append(apply_table(t, target, config))
        progress.table_done(t.name)
        if after_table is not None:
            after_table(t.name)
    _finish_carried(state, res)
    applied = {r.table: r for r in summary.tables}
    for gid, commit_lsn in res.missing_prepared:
        summary.warnings.append(
            f"COMMIT PREPARED '{gid}' at {lsn_str(commit_lsn)}: its PREPARE is neither in the input nor carried "
            "over (fine if an earlier run applied it; otherwise give the file holding its PREPARE)"
        )
    del applied
    summary.seconds = time.monotonic() - started
    return summary


def _gid_file(state: Path, gid: str) -> Path:
    return state / (hashlib.sha256(gid.encode()).hexdigest()[:32] + ".jsonl")


def _carry_pending(state: Path, res: ReadResult) -> None:
    """Prepared, outcome unknown: keep its lines for the next run (before applying anything)."""
    if not res.pending:
        return
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(state, 0o700)  # raw change data: this user only (also for a directory an older run made)
    for p in res.pending:
        atomic_write(_gid_file(state, p.gid), b"".join(p.lines), mode=0o600)


def _finish_carried(state: Path, res: ReadResult) -> None:
    pending = {p.gid for p in res.pending}
    for gid in res.finished_gids - pending:
        _gid_file(state, gid).unlink(missing_ok=True)


def apply_table(t: TableInput, target: Oracle, config: ApplyConfig) -> TableResult:
    target.open()
    result = TableResult(t.name, str(target.path), "up to date", version=target.version)
    applied = target.applied
    if applied is not None:
        result.applied_lsn = lsn_str(applied)
    with no_gc():
        batch = _plan_batch(t, target, config, result)
    if batch is None:
        return result
    target.write(batch)
    result.status = "applied"
    result.version = target.version
    result.applied_lsn = lsn_str(batch.position)
    return result


def _plan_batch(t: TableInput, target: Oracle, config: ApplyConfig, result: TableResult) -> Batch | None:
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
    p = plan(
        t.schema, t.table, t.relations, target.schema, config.append_only, history, config.keys.get((t.schema, t.table))
    )
    cols, key_cols, full, append = p.columns, p.key_cols, p.full, p.append_only

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
    target: Oracle,
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
