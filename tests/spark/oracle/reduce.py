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

from collections.abc import Callable, Hashable, Sequence, Set
from dataclasses import dataclass, field
from typing import Any

import orjson

from pgrecv.errors import InputError
from tests.spark.oracle.read import Change

Key = Hashable  # the key value (int/str), a tuple of them, or the canonical JSON of the key values
_EMPTY: frozenset[str] = frozenset()


@dataclass(slots=True)
class Row:
    """A row image being built: ``values`` lacks the ``missing`` (unchanged-TOAST) columns."""

    values: dict[str, Any]
    missing: Set[str]
    source: list[Any] | None  # values of the target key whose row fills ``missing``
    json_nulls: Set[str]
    deleted: bool = False
    start: tuple[int, int, str | None] = (0, 0, None)  # commit LSN, change LSN, commit time
    where: str = ""


@dataclass
class Reduced:
    truncated: bool = False
    deletes: dict[Key, list[Any]] = field(default_factory=dict)  # key → key values (JSON)
    upserts: dict[Key, Row] = field(default_factory=dict)
    versions: list[tuple[Key, list[Any], Row]] = field(default_factory=list)  # history mode
    truncated_target: bool = False  # history: target's live keys got tombstones
    inserts: int = 0
    updates: int = 0
    deletes_n: int = 0
    truncates: int = 0


def _keyer(key_cols: Sequence[str], nullable: bool = True) -> Callable[[dict[str, Any], str], tuple[Key, list[Any]]]:
    """``nullable``: whether a key value may be NULL (REPLICA IDENTITY FULL's all-column identity;
    a key PostgreSQL enforces is never NULL: a NULL there is a corrupt image, issue 54 L5)."""
    cols = list(key_cols)

    def key(image: dict[str, Any], where: str) -> tuple[Key, list[Any]]:
        try:
            vals = [image[c] for c in cols]
        except KeyError as exc:
            raise InputError(f"{where}: the row image lacks key column {exc}: cannot identify the row") from None
        if not nullable and any(v is None for v in vals):
            raise InputError(f"{where}: the row image has NULL in a key column: the file is corrupt")
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
    if not history:
        return _reduce_latest(changes, key_cols, full)
    return _replay(changes, key_cols, full=full, history=history, target_live_keys=target_live_keys)


def _replay(
    changes: Sequence[Change],
    key_cols: Sequence[str],
    *,
    full: bool,
    history: bool,
    target_live_keys: Callable[[], list[list[Any]]] | None = None,
) -> Reduced:
    """The general replay (every version kept for history); :func:`_reduce_latest` is its fast
    equivalent for ``latest`` mode (the tests check they agree)."""
    key = _keyer(key_cols, nullable=full)
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
                live: list[tuple[Key, list[Any]]] = [(k, key_vals[k]) for k, r in state.items() if not r.deleted]
                if not out.truncated and not out.truncated_target and target_live_keys is not None:
                    out.truncated_target = True
                    for tkv in target_live_keys():
                        tk = orjson.dumps(tkv, option=orjson.OPT_SORT_KEYS)
                        if tk not in state:
                            live.append((tk, tkv))
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
            ok, okv = k, kv
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
                put(k, kv, Row(new, toast, okv if toast else None, jn, False, start, where))
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


def _fast_keyer(
    key_cols: Sequence[str], nullable: bool = True
) -> Callable[[dict[str, Any], str], tuple[Key, list[Any]]]:
    """Like :func:`_keyer`, but int and str key values are their own key (no JSON encoding).

    An int/str key never equals a bytes key, and a column's values keep one JSON type, so two
    images get the same key exactly when their key values are equal JSON values.
    """
    cols = list(key_cols)
    slow = _keyer(cols, nullable)
    if len(cols) == 1:
        c0 = cols[0]

        def key1(image: dict[str, Any], where: str) -> tuple[Key, list[Any]]:
            v = image.get(c0, image)  # the image itself: "missing"
            t = type(v)
            if t is int or t is str:
                return v, [v]
            return slow(image, where)

        return key1

    def key(image: dict[str, Any], where: str) -> tuple[Key, list[Any]]:
        vals = [image.get(c, image) for c in cols]
        for v in vals:
            t = type(v)
            if t is not int and t is not str:
                return slow(image, where)
        return tuple(vals), vals

    return key


def _reduce_latest(changes: Sequence[Change], key_cols: Sequence[str], full: bool) -> Reduced:
    """``latest`` mode in one pass, O(changes): per key only its latest state, as a tuple
    (values, missing, source key values, json_nulls, deleted, change, key values); Row objects
    are built for the surviving rows only."""
    key = _fast_keyer(key_cols, nullable=full)
    single = len(key_cols) == 1
    c0 = key_cols[0] if key_cols else ""
    out = Reduced()
    state: dict[Key, tuple[Any, ...]] = {}
    k: Key
    ok: Key
    inserts = updates = deletes = truncates = 0
    empty = _EMPTY
    for ch in changes:
        op = ch[3]
        rec = ch[4]
        if op == "update" or op == "insert":
            new = rec.get("new")
            toast = rec.get("unchanged_toast")
            tset: Set[str] = empty
            if toast or not isinstance(new, dict):
                new, tset = _new_image(rec, full, ch[6])
            v = new.get(c0, new)  # inlined _fast_keyer for the usual one-column int/str key
            if single and (type(v) is int or type(v) is str):
                k, kv = v, [v]
            else:
                k, kv = key(new, ch[6])
            jn = rec.get("json_nulls")
            if op == "insert":
                inserts += 1
                state[k] = (new, tset, None, set(jn) if jn else empty, False, ch, kv)
                continue
            updates += 1
            old = rec.get("old")
            ok, okv = k, kv
            if isinstance(old, dict):
                ok, okv = key(old, ch[6])
            prev = state.get(ok)  # the row as it was before this change (under its old key)
            if ok != k and isinstance(old, dict):
                ojn = rec.get("old_json_nulls")
                state[ok] = (old, empty, None, set(ojn) if ojn else empty, True, ch, okv)
            if prev is not None and not prev[4]:
                pv = prev[0]
                values = new if pv.keys() <= new.keys() else {**pv, **new}
                missing = {c for c in tset if c not in pv} if tset else empty
                pjn = prev[3]
                jset = set(jn or ()) | {c for c in pjn if c not in new} if pjn else (set(jn) if jn else empty)
                state[k] = (values, missing, prev[2], jset, False, ch, kv)
            else:
                state[k] = (new, tset, okv if tset else None, set(jn) if jn else empty, False, ch, kv)
        elif op == "delete":
            deletes += 1
            old = rec.get("old")
            if not isinstance(old, dict):
                raise InputError(
                    f"{ch[6]}: delete without an old row image (REPLICA IDENTITY NOTHING?): cannot identify the "
                    "row; give the table a primary key or REPLICA IDENTITY FULL"
                )
            k, kv = key(old, ch[6])
            ojn = rec.get("old_json_nulls")
            state[k] = (old, empty, None, set(ojn) if ojn else empty, True, ch, kv)
        elif op == "truncate":
            truncates += 1
            state.clear()
            out.truncated = True
        else:
            raise InputError(f"{ch[6]}: unexpected change {op!r}")
    out.inserts, out.updates, out.deletes_n, out.truncates = inserts, updates, deletes, truncates
    for k, e in state.items():
        if e[4]:
            out.deletes[k] = e[6]
        else:
            ch = e[5]
            out.upserts[k] = Row(e[0], e[1], e[2], e[3], False, (ch[0], ch[1], ch[5]), ch[6])
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
