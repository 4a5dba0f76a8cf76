"""The oracle's reader: JSONL change files into committed changes per table, in replay order.

This pass is sequential by nature (transaction boundaries, prepared transactions, streamed
chunks), so it runs on the driver; it keeps only committed rows. Rules (docs/event-format.md):

* a transaction counts only when its ``commit`` is in the input; a ``begin`` inside an open
  transaction discards the open one (it was cut and is sent again in full);
* rows between ``begin_prepare`` and ``prepare`` wait for ``commit_prepared`` of the same gid
  (then they take its commit LSN) and are dropped by ``rollback_prepared``; a prepared
  transaction whose outcome is not in the input is *pending*: the caller carries it over;
* streamed chunks wait for ``stream_commit`` / ``stream_prepare`` and honour ``stream_abort``;
* snapshot files (``pgrecv snapshot``) are the base: a manifest makes each table a TRUNCATE
  barrier at the snapshot's position followed by its rows, ordered before every change.

Every change is a :class:`Change` with the sort key (commit LSN, change LSN, sequence), all
integers: LSNs are parsed from ``X/X`` to 64-bit ints and never compared as text.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from pgrecv.errors import InputError
from pgrecv.spark.inputs import _half, parse_lsn
from pgrecv.spark.read.envelope import named_last

ROW_OPS = frozenset({"insert", "update", "delete"})
TableId = tuple[str, str]


class Change(NamedTuple):
    commit_lsn: int
    lsn: int
    seq: int
    op: str  # insert, update, delete, truncate, snapshot
    rec: dict[str, Any]
    commit_time: str | None
    where: str  # file:line, for error messages


_new_change: Any = tuple.__new__  # builds a Change from a tuple without NamedTuple's Python-level __new__


@dataclass
class _Txn:
    kind: str  # "tx", "prep", "stream"
    commit_lsn: int = 0
    commit_time: str | None = None
    gid: str | None = None
    rows: list[tuple[int, str, dict[str, Any], str, Any]] = field(default_factory=list)  # lsn, op, rec, where, xid
    raw: list[bytes] | None = None  # the lines of a prepared transaction, to carry it over


@dataclass
class TableInput:
    schema: str
    table: str
    relations: list[dict[str, Any]] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.schema}.{self.table}"


@dataclass
class PendingPrepared:
    gid: str
    lines: list[bytes]  # relation records of its tables, then begin_prepare … prepare


@dataclass
class ReadResult:
    tables: dict[TableId, TableInput]
    files: int = 0
    lines: int = 0
    transactions: int = 0
    incomplete: int = 0  # transactions cut (begin without commit) and dropped
    rolled_back: int = 0
    pending: list[PendingPrepared] = field(default_factory=list)
    finished_gids: set[str] = field(default_factory=set)  # committed or rolled back in this input
    missing_prepared: list[tuple[str, int]] = field(default_factory=list)  # commit_prepared without rows


# --- the reader --------------------------------------------------------------------------------


class Reader:
    """Feed files in replay order; :meth:`result` gives committed changes per table."""

    def __init__(self, table_filter: Any = None) -> None:
        self.match = table_filter or (lambda schema, table: True)
        self.tables: dict[TableId, TableInput] = {}
        self.open: _Txn | None = None
        self.prepared: dict[str, _Txn] = {}
        self.streams: dict[int, _Txn] = {}
        self.chunk: _Txn | None = None
        self.relation_raw: dict[TableId, bytes] = {}
        self.seq = 0
        self.res = ReadResult(self.tables)
        self.claimed: int | None = None

    def _table(self, schema: str, table: str) -> TableInput | None:
        if not self.match(schema, table):
            return None
        key = (schema, table)
        t = self.tables.get(key)
        if t is None:
            t = self.tables[key] = TableInput(schema, table)
        return t

    def feed_manifest(self, manifest: dict[str, Any], where: str) -> None:
        """A snapshot: every table it covers is emptied at its position, before its rows."""
        try:
            pos = parse_lsn(manifest["snapshot_lsn"]) - 1
            tables = manifest.get("tables") or manifest["files"]
            for entry in tables:
                if isinstance(entry, dict):
                    schema, table = entry["schema"], entry["table"]
                else:
                    schema, _, table = str(entry).partition(".")
                t = self._table(schema, table)
                if t is not None:
                    self.seq += 1
                    t.changes.append(Change(pos, 0, self.seq, "truncate", {}, None, where))
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"{where}: bad snapshot manifest ({exc!r}): re-run `pgrecv snapshot`") from None

    def feed_file(self, path: Path, label: str | None = None) -> None:
        name = label or str(path)
        self.res.files += 1
        self.claimed = named_last(str(path))  # the file name's last commit LSN (issue 54, L5)
        try:
            with open(path, "rb") as f:
                self.feed_lines(f, name)
        except OSError as exc:
            raise InputError(f"{name}: cannot read: {exc.strerror or exc}") from None

    def feed_lines(self, lines: Iterable[bytes], name: str) -> None:
        lineno = 0
        handle = self._handle
        loads = orjson.loads
        row_ops = ROW_OPS
        half = _half
        last_hi, last_base = None, 0  # no half matches: the first LSN is checked whole
        for line in lines:
            lineno += 1
            if line[-1:] != b"\n":
                raise InputError(f"{name}:{lineno}: truncated line (no newline at the end): the file is incomplete")
            try:
                rec = loads(line)
                op = rec["op"]
                if rec.get("v") != 1:
                    raise ValueError(f"unsupported format version v={rec.get('v')!r}")
                txn = self.chunk if self.chunk is not None else self.open
                if op in row_ops and (type(rec.get("schema")) is not str or type(rec.get("table")) is not str):
                    raise ValueError(f"{op} without its schema or table")
                if op in row_ops and txn is not None and txn.raw is None:
                    # the hot path: a row of an open transaction (what _handle does, inlined)
                    lsn = rec.get("lsn")
                    if lsn is None:
                        n = 0
                    elif type(lsn) is str:  # parse_lsn, with the high half cached (it rarely changes)
                        hi, sep, lo = lsn.partition("/")
                        if not sep or not half(lo):
                            raise ValueError(f"invalid LSN {lsn!r}")
                        if hi != last_hi:
                            if not half(hi):
                                raise ValueError(f"invalid LSN {lsn!r}")
                            last_base, last_hi = int(hi, 16) << 32, hi
                        n = last_base | int(lo, 16)
                    else:
                        n = parse_lsn(lsn)
                    txn.rows.append((n, op, rec, f"{name}:{lineno}", rec.get("xid")))
                else:
                    handle(op, rec, line, f"{name}:{lineno}")
            except InputError:
                raise
            except orjson.JSONDecodeError as exc:
                raise InputError(f"{name}:{lineno}: not valid JSON ({exc}): the file is corrupt") from None
            except KeyError as exc:
                raise InputError(f"{name}:{lineno}: record lacks the field {exc}: the file is corrupt") from None
            except (TypeError, ValueError, AttributeError) as exc:
                raise InputError(f"{name}:{lineno}: bad record ({exc}): the file is corrupt") from None
        self.res.lines += lineno

    def _handle(self, op: str, rec: dict[str, Any], line: bytes, where: str) -> None:
        if op in ROW_OPS or op == "truncate":
            txn = self.chunk if self.chunk is not None else self.open
            if txn is None:
                raise ValueError(f"{op} outside a transaction (no begin before it)")
            lsn = rec.get("lsn")
            txn.rows.append((parse_lsn(lsn) if lsn is not None else 0, op, rec, where, rec.get("xid")))
            if txn.raw is not None:
                txn.raw.append(line)
            return
        if op == "begin":
            if self.open is not None:
                self.res.incomplete += 1  # cut: it comes again in full
            self.open = _Txn("tx", parse_lsn(rec["commit_lsn"]), rec.get("commit_time"))
        elif op == "commit":
            txn = self.open
            if txn is None or txn.kind != "tx":
                raise ValueError("commit without its begin")
            if parse_lsn(rec["commit_lsn"]) != txn.commit_lsn:
                raise ValueError(f"commit_lsn {rec['commit_lsn']} does not match its begin")
            if self.claimed is not None and txn.commit_lsn > self.claimed:
                raise ValueError(f"commit LSN {rec['commit_lsn']} is past the last one the file's name claims")
            self.open = None
            self._commit(txn, txn.commit_lsn, rec.get("commit_time") or txn.commit_time)
        elif op == "relation":
            key = (rec["schema"], rec["table"])
            t = self._table(*key)
            if not isinstance(rec["columns"], list):
                raise ValueError("relation columns is not a list")
            if t is not None:
                t.relations.append(rec)
            self.relation_raw[key] = line
        elif op == "snapshot":
            t = self._table(rec["schema"], rec["table"])
            if t is not None:
                if not isinstance(rec["new"], dict):
                    raise ValueError("snapshot row without a new image")
                self.seq += 1
                pos = parse_lsn(rec["snapshot_lsn"]) - 1
                t.changes.append(Change(pos, 0, self.seq, "insert", rec, None, where))
        elif op == "begin_prepare":
            if self.open is not None:
                self.res.incomplete += 1
            self.open = _Txn("prep", gid=str(rec["gid"]), raw=[line])
        elif op == "prepare":
            txn = self.open
            if txn is None or txn.kind != "prep" or txn.gid != rec["gid"]:
                raise ValueError("prepare without its begin_prepare")
            assert txn.raw is not None
            txn.raw.append(line)
            self.open = None
            self.prepared[str(rec["gid"])] = txn
        elif op == "commit_prepared":
            gid = str(rec["gid"])
            commit_lsn = parse_lsn(rec["commit_lsn"])
            self.res.finished_gids.add(gid)
            txn = self.prepared.pop(gid, None)
            if txn is None:
                self.res.missing_prepared.append((gid, commit_lsn))
            else:
                self._commit(txn, commit_lsn, rec.get("commit_time"))
        elif op == "rollback_prepared":
            gid = str(rec["gid"])
            self.res.finished_gids.add(gid)
            if self.prepared.pop(gid, None) is not None:
                self.res.rolled_back += 1
        elif op == "stream_start":
            xid = int(rec["xid"])
            self.chunk = self.streams.setdefault(xid, _Txn("stream"))
        elif op == "stream_stop":
            self.chunk = None
        elif op == "stream_commit":
            txn = self.streams.pop(int(rec["xid"]), None)
            if txn is not None:
                self._commit(txn, parse_lsn(rec["commit_lsn"]), rec.get("commit_time"))
        elif op == "stream_abort":
            xid, subxid = int(rec["xid"]), int(rec["subxid"])
            if subxid == xid:
                if self.streams.pop(xid, None) is not None:
                    self.res.rolled_back += 1
            elif xid in self.streams:
                txn = self.streams[xid]
                txn.rows = [r for r in txn.rows if r[4] != subxid]
        elif op == "stream_prepare":
            txn = self.streams.pop(int(rec["xid"]), None)
            if txn is not None:
                txn.gid = str(rec["gid"])
                txn.raw = [orjson.dumps({**rec, "op": "begin_prepare"}) + b"\n"]
                txn.raw += [orjson.dumps(r[2]) + b"\n" for r in txn.rows]
                txn.raw.append(orjson.dumps({**rec, "op": "prepare"}) + b"\n")
                self.prepared[txn.gid] = txn
        elif op not in ("message", "origin", "type"):
            raise ValueError(f"unknown op {op!r}")

    def _commit(self, txn: _Txn, commit_lsn: int, commit_time: str | None) -> None:
        self.res.transactions += 1
        seq = self.seq
        make = _new_change
        last: tuple[Any, Any] = (None, None)
        append: Any = None  # the change list of the last row's table (rows come in runs of a table)
        for lsn, op, rec, where, _xid in txn.rows:
            seq += 1
            if op == "truncate":
                for entry in rec["tables"]:
                    t = self._table(entry["schema"], entry["table"])
                    if t is not None:
                        t.changes.append(make(Change, (commit_lsn, lsn, seq, op, rec, commit_time, where)))
                continue
            schema, table = rec["schema"], rec["table"]
            if schema != last[0] or table != last[1]:
                last = (schema, table)
                t = self._table(schema, table)
                append = None if t is None else t.changes.append
            if append is not None:
                append(make(Change, (commit_lsn, lsn, seq, op, rec, commit_time, where)))
        self.seq = seq

    def result(self) -> ReadResult:
        """Finish: open transactions are incomplete; prepared ones without outcome are pending."""
        if self.open is not None:
            self.res.incomplete += 1
            self.open = None
        self.res.incomplete += len(self.streams)
        for gid, txn in self.prepared.items():
            tables = {(r[2]["schema"], r[2]["table"]) for r in txn.rows if r[1] in ROW_OPS}
            tables |= {(e["schema"], e["table"]) for r in txn.rows if r[1] == "truncate" for e in r[2]["tables"]}
            rels = [self.relation_raw[k] for k in sorted(tables) if k in self.relation_raw]
            self.res.pending.append(PendingPrepared(gid, rels + list(txn.raw or [])))
        for t in self.tables.values():
            t.changes.sort()
            t.changes[:] = _once(t.changes)
        return self.res


def _once(changes: list[Change]) -> list[Change]:
    """Sorted changes without the copies of an at-least-once delivery (a transaction sent again
    after a restart, a prepared one both carried over and in the input again): the same commit
    LSN, change LSN, op and row images (a COPY's rows share their LSNs: one WAL record). A copy
    left in breaks a key change that keeps an unchanged TOAST value: the second copy of the move
    finds the first one's delete. test_decoding's changes have no LSN (0); their copies replay
    identically in input order and stay. Sorted, a change's copies are in one run of the same
    commit and change LSN: only the first of each op and images in that run is kept."""
    out: list[Change] = []
    run: tuple[int, int] | None = None
    seen: set[tuple[str, bytes, bytes]] = set()
    for ch in changes:
        if ch[1] > 0:
            if (ch[0], ch[1]) != run:
                run, seen = (ch[0], ch[1]), set()
            rec = ch[4]
            what = (ch[3], orjson.dumps(rec.get("new")), orjson.dumps(rec.get("old")))
            if what in seen:
                continue
            seen.add(what)
        out.append(ch)
    return out
