"""Reduce a table's ordered changes to what the target must do (pure: no Spark, no I/O).

``latest`` mode keeps the final change per key: a set of keys to delete and a set of full rows
to upsert (a primary-key update deletes the old key and upserts the new one), plus a TRUNCATE
flag (changes before a TRUNCATE are discarded; the table is emptied first). ``history`` mode
keeps every version with its start position, for SCD type 2.

Unchanged-TOAST columns are never written as values: a later change in the batch supplies them
from an earlier one; what is still missing names the *source key* whose current target row
holds the value (the old key for a primary-key update), for the writer to look up.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from pgrecv.errors import InputError
from pgrecv.spark.read import Change

Key = bytes  # canonical JSON of the key values: hashable whatever the column types


@dataclass(slots=True)
class Row:
    """A row image being built: ``values`` lacks the ``missing`` (unchanged-TOAST) columns."""

    values: dict[str, Any]
    missing: set[str]
    source: Key | None  # target key whose values fill ``missing``
    json_nulls: set[str]
    deleted: bool = False
    start: tuple[int, int, str | None] = (0, 0, None)  # commit LSN, change LSN, commit time
    where: str = ""


@dataclass
class Reduced:
    truncated: bool = False
    deletes: dict[Key, list[Any]] = field(default_factory=dict)  # key → key values
    upserts: dict[Key, Row] = field(default_factory=dict)
    versions: list[tuple[Key, list[Any], Row]] = field(default_factory=list)  # history mode
    truncated_target: bool = False  # history: target's live keys got tombstones
    inserts: int = 0
    updates: int = 0
    deletes_n: int = 0
    truncates: int = 0


def _keyer(key_cols: Sequence[str]) -> Callable[[dict[str, Any], str], tuple[Key, list[Any]]]:
    cols = list(key_cols)

    def key(image: dict[str, Any], where: str) -> tuple[Key, list[Any]]:
        try:
            vals = [image[c] for c in cols]
        except KeyError as exc:
            raise InputError(f"{where}: the row image lacks key column {exc}: cannot identify the row") from None
        return orjson.dumps(vals, option=orjson.OPT_SORT_KEYS), vals

    return key


def _new_image(rec: dict[str, Any], full: bool, where: str) -> tuple[dict[str, Any], set[str]]:
    new = rec.get("new")
    if not isinstance(new, dict):
        raise InputError(f"{where}: {rec['op']} without a new row image")
    toast = set(rec.get("unchanged_toast") or ())
    if toast and full and isinstance(rec.get("old"), dict):
        # REPLICA IDENTITY FULL: the old image has the unchanged values (unless TOASTed there too)
        old = rec["old"]
        old_toast = set(rec.get("old_unchanged_toast") or ())
        filled = {c: old[c] for c in toast if c in old and c not in old_toast}
        if filled:
            new = {**new, **filled}
            toast -= filled.keys()
    return new, toast


def reduce_changes(
    changes: Sequence[Change],
    key_cols: Sequence[str],
    *,
    full: bool,
    history: bool,
    target_live_keys: Callable[[], list[list[Any]]] | None = None,
) -> Reduced:
    """Replay ``changes`` (sorted, already past the applied position) over per-key state."""
    key = _keyer(key_cols)
    out = Reduced()
    state: dict[Key, Row] = {}  # latest image per key in this batch (deleted ones flagged)
    key_vals: dict[Key, list[Any]] = {}

    def put(k: Key, kv: list[Any], row: Row) -> None:
        state[k] = row
        key_vals[k] = kv
        if history:
            out.versions.append((k, kv, row))

    for ch in changes:
        op, rec, where = ch.op, ch.rec, ch.where
        start = (ch.commit_lsn, ch.lsn, ch.commit_time)
        if op == "truncate":
            out.truncates += 1
            if history:
                live = [(k, key_vals[k]) for k, r in state.items() if not r.deleted]
                if not out.truncated and not out.truncated_target and target_live_keys is not None:
                    out.truncated_target = True
                    for kv in target_live_keys():
                        k = orjson.dumps(kv, option=orjson.OPT_SORT_KEYS)
                        if k not in state:
                            live.append((k, kv))
                for k, kv in live:
                    put(k, kv, Row(dict(zip(key_cols, kv, strict=True)), set(), None, set(), True, start, where))
            else:
                state.clear()
                key_vals.clear()
                out.truncated = True
            continue
        if op == "insert":
            out.inserts += 1
            new, toast = _new_image(rec, full, where)
            k, kv = key(new, where)
            put(k, kv, Row(new, toast, None, set(rec.get("json_nulls") or ()), False, start, where))
        elif op == "update":
            out.updates += 1
            new, toast = _new_image(rec, full, where)
            old = rec.get("old")
            k, kv = key(new, where)
            ok = k
            if isinstance(old, dict):
                ok, okv = key(old, where)
            prev = state.get(ok)  # the row as it was before this change (under its old key)
            if ok != k and isinstance(old, dict):
                put(ok, okv, Row(dict(old), set(), None, set(rec.get("old_json_nulls") or ()), True, start, where))
            jn = set(rec.get("json_nulls") or ())
            if prev is not None and not prev.deleted:
                values = {**prev.values, **new}
                missing = {c for c in toast if c not in prev.values}
                jn |= {c for c in prev.json_nulls if c not in new}
                put(k, kv, Row(values, missing, prev.source, jn, False, start, where))
            else:
                put(k, kv, Row(new, toast, ok if toast else None, jn, False, start, where))
        elif op == "delete":
            out.deletes_n += 1
            old = rec.get("old")
            if not isinstance(old, dict):
                raise InputError(
                    f"{where}: delete without an old row image (REPLICA IDENTITY NOTHING?): cannot identify the "
                    "row; give the table a primary key or REPLICA IDENTITY FULL"
                )
            k, kv = key(old, where)
            put(k, kv, Row(dict(old), set(), None, set(rec.get("old_json_nulls") or ()), True, start, where))
        else:
            raise InputError(f"{where}: unexpected change {op!r}")
    if not history:
        for k, row in state.items():
            if row.deleted:
                out.deletes[k] = key_vals[k]
            else:
                out.upserts[k] = row
    return out


def append_only(changes: Sequence[Change]) -> Reduced:
    """Tables without any identity, with --append-only: inserts after the last TRUNCATE."""
    out = Reduced()
    rows: list[Row] = []
    for ch in changes:
        if ch.op == "truncate":
            rows.clear()
            out.truncated = True
            out.truncates += 1
        elif ch.op == "insert":
            out.inserts += 1
            new, toast = _new_image(ch.rec, False, ch.where)
            rows.append(
                Row(
                    new,
                    toast,
                    None,
                    set(ch.rec.get("json_nulls") or ()),
                    False,
                    (ch.commit_lsn, ch.lsn, ch.commit_time),
                    ch.where,
                )
            )
        else:
            raise InputError(
                f"{ch.where}: {ch.op} on a table without a key in --append-only mode: only inserts can be appended"
            )
    out.upserts = {str(i).encode(): r for i, r in enumerate(rows)}
    return out
