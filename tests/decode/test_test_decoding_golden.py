"""TestDecodingParser on lines captured from real servers (tests/golden/pg<MAJOR>/*.test_decoding.jsonl).

Every file parses completely and its events agree with the capture's own columns (xid, lsn) and
options. Where ``<case>.tables.json`` holds the tables' final contents, replaying the committed
changes of each capture that shows every change (no stream-changes, no only-local) reproduces them
(key columns for UPDATEs without an old image come from the pgoutput capture of the same workload).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pgrecv.decode.pgoutput import PgOutputDecoder
from pgrecv.decode.test_decoding import TestDecodingParser
from pgrecv.events import (
    UNCHANGED,
    Begin,
    Commit,
    CommitPrepared,
    Delete,
    Event,
    Insert,
    Message,
    Prepare,
    Relation,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    Update,
    Value,
)
from pgrecv.lsn import LSN

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
FILES = sorted(GOLDEN.glob("pg*/*.test_decoding.jsonl"))


@dataclass
class Capture:
    meta: dict[str, Any]
    rows: list[tuple[int, int, str | bytes]]  # lsn, xid, line

    @property
    def options(self) -> dict[str, str]:
        return dict(self.meta["options"])

    def flag(self, name: str, default: bool) -> bool:
        value = self.options.get(name)
        return default if value is None else value.lower() in ("1", "on", "true", "yes")


def load(path: Path) -> Capture:
    lines = path.read_text().splitlines()
    meta = json.loads(lines[0])["meta"]
    rows: list[tuple[int, int, str | bytes]] = []
    for raw in lines[1:]:
        rec = json.loads(raw)
        data: str | bytes = rec["data"] if "data" in rec else bytes.fromhex(rec["data_hex"])
        rows.append((LSN.parse(rec["lsn"]), int(rec["xid"]), data))
    return Capture(meta, rows)


def decode(cap: Capture) -> list[Event | None]:
    parser = TestDecodingParser()
    return [parser.decode(data, lsn) for lsn, _, data in cap.rows]


def file_id(path: Path) -> str:
    return f"{path.parent.name}/{path.name.removesuffix('.test_decoding.jsonl')}"


def test_golden_files_exist() -> None:
    versions = {p.parent.name for p in FILES}
    assert {"pg15", "pg18"} <= versions, f"golden captures missing: have {sorted(versions)}"


def _startswith(data: str | bytes, prefixes: tuple[str, ...]) -> bool:
    text = data if isinstance(data, str) else data[:64].decode("utf-8", "replace")
    return text.startswith(prefixes)


@pytest.mark.parametrize("path", FILES, ids=file_id)
def test_parses_completely(path: Path) -> None:
    cap = load(path)
    events = decode(cap)
    assert events, "empty capture"
    with_xids = cap.flag("include-xids", True)
    with_time = cap.flag("include-timestamp", False)
    streamed = cap.flag("stream-changes", False)
    # lines that announce a streamed change carry no event, and nothing else returns None
    silent = ("streaming change for ", "streaming truncate for ", "streaming message: transactional: 1")
    for (_, _, data), e in zip(cap.rows, events, strict=True):
        assert (e is None) == _startswith(data, silent), data
    assert streamed or None not in events

    open_xid: int | None = None
    in_txn = False
    for (lsn, xid, data), e in zip(cap.rows, events, strict=True):
        if isinstance(e, Begin):
            assert not in_txn, f"BEGIN inside a transaction: {data!r}"
            in_txn, open_xid = True, xid
            assert e.final_lsn == 0 and e.commit_time is None
            assert e.xid == (xid if with_xids else None)
        elif isinstance(e, Commit | Prepare):
            assert in_txn and xid == open_xid, data
            in_txn = False
            assert e.xid == (xid if with_xids else None)
            assert e.end_lsn == lsn
            when = e.commit_time if isinstance(e, Commit) else e.prepare_time
            assert (when is not None) == with_time
        elif isinstance(e, CommitPrepared | RollbackPrepared):
            assert not in_txn
            assert e.xid == (xid if with_xids else None) and e.gid
        elif isinstance(e, Insert | Update | Delete | Truncate):
            assert in_txn or streamed, f"change outside a transaction: {data!r}"
            assert e.lsn == lsn and e.xid is None
            if isinstance(e, Insert | Update):
                assert len(e.new) == len(e.relation.columns)
            if isinstance(e, Update | Delete) and e.old is not None:
                assert len(e.old) == len(e.relation.columns) and e.old_kind == "K"
                assert e.relation.key_names, "an old image names its key columns"
        elif isinstance(e, Message):
            assert e.lsn == lsn
            if not e.transactional:
                assert not in_txn or streamed
        elif isinstance(e, StreamStart | StreamStop | StreamAbort | StreamCommit | StreamPrepare):
            assert streamed
            if isinstance(e, StreamStart | StreamCommit | StreamPrepare) and with_xids:
                assert e.xid == xid
    assert not in_txn, "capture ends inside a transaction"


# --- replay ------------------------------------------------------------------------------

Row = dict[str, Value]


def _replay_files() -> list[tuple[Path, Path]]:
    out = []
    for path in FILES:
        cap_meta = json.loads(path.read_text().split("\n", 1)[0])["meta"]
        opts = cap_meta["options"]
        tables = path.parent / f"{cap_meta['case']}.tables.json"
        if opts.get("stream-changes", "0") in ("1", "on", "true") or "only-local" in opts or not tables.exists():
            continue
        out.append((path, tables))
    return out


REPLAYS = _replay_files()


class Tables:
    """The tables as the committed changes leave them."""

    def __init__(self, keys: dict[tuple[str, str], tuple[str, ...]]) -> None:
        self.rows: dict[tuple[str, str], list[Row]] = {}
        self.keys = keys  # per table: the key columns its old images name (test_decoding prints no keys)
        self.unidentified: set[str] = set()  # tables with a change the output cannot place

    def _find(self, rel: Relation, match: dict[str, Value]) -> int:
        rows = self.rows.setdefault((rel.namespace, rel.name), [])
        hits = [i for i, r in enumerate(rows) if all(r.get(k) == v for k, v in match.items())]
        assert hits, f"no row of {rel.namespace}.{rel.name} matches {match}"
        return hits[0]

    def apply(self, e: Event) -> None:
        if isinstance(e, Truncate):
            for rel in e.relations:
                self.rows[(rel.namespace, rel.name)] = []
            return
        if not isinstance(e, Insert | Update | Delete):
            return
        rel = e.relation
        name = (rel.namespace, rel.name)
        rows = self.rows.setdefault(name, [])
        if isinstance(e, Insert):
            rows.append(dict(zip([c.name for c in rel.columns], e.new, strict=True)))
            return
        if e.old is not None:
            where = {c.name: v for c, v in zip(rel.columns, e.old, strict=True) if c.key}
        elif isinstance(e, Update) and name in self.keys:
            # key unchanged: the new tuple's key columns find the row
            new = dict(zip([c.name for c in rel.columns], e.new, strict=True))
            where = {k: new[k] for k in self.keys[name]}
        else:
            self.unidentified.add(f"{rel.namespace}.{rel.name}")
            return
        i = self._find(rel, where)
        if isinstance(e, Delete):
            del rows[i]
            return
        before = rows[i]
        rows[i] = {c.name: before[c.name] if v is UNCHANGED else v for c, v in zip(rel.columns, e.new, strict=True)}


def pgoutput_keys(directory: Path, case: str) -> dict[tuple[str, str], tuple[str, ...]]:
    """Replica identity columns per table from the pgoutput captures of the same workload: test_decoding
    never prints them, and an UPDATE that keeps its key shows no old image to learn them from."""
    keys: dict[tuple[str, str], tuple[str, ...]] = {}
    for path in sorted(directory.glob("*.pgoutput.jsonl")):
        lines = path.read_text().splitlines()
        meta = json.loads(lines[0])["meta"]
        if meta["case"] != case:
            continue
        decoder = PgOutputDecoder(proto_version=int(meta["proto_version"]))
        for raw in lines[1:]:
            rec = json.loads(raw)
            e = decoder.decode(bytes.fromhex(rec["data"]), LSN.parse(rec["lsn"]))
            if isinstance(e, Relation) and e.key_names:
                keys[(e.namespace, e.name)] = e.key_names
    return keys


def replay(events: Sequence[Event | None], known_keys: dict[tuple[str, str], tuple[str, ...]]) -> Tables:
    keys = dict(known_keys)
    for e in events:
        if isinstance(e, Update | Delete) and e.old is not None:
            keys.setdefault((e.relation.namespace, e.relation.name), e.relation.key_names)
    tables = Tables(keys)
    open_txn: list[Event] | None = None
    prepared: dict[str, list[Event]] = {}
    for e in events:
        if isinstance(e, Begin):
            open_txn = []
        elif isinstance(e, Commit):
            assert open_txn is not None
            for change in open_txn:
                tables.apply(change)
            open_txn = None
        elif isinstance(e, Prepare):
            assert open_txn is not None
            prepared[e.gid] = open_txn
            open_txn = None
        elif isinstance(e, CommitPrepared):
            for change in prepared.pop(e.gid):
                tables.apply(change)
        elif isinstance(e, RollbackPrepared):
            # PostgreSQL 17+ may skip decoding a prepared transaction it already knows is rolled back
            prepared.pop(e.gid, None)
        elif isinstance(e, Insert | Update | Delete | Truncate):
            assert open_txn is not None
            open_txn.append(e)
    assert open_txn is None
    return tables


def as_text(row: Row) -> dict[str, str | None]:
    """tables.json holds each value's output-function text (what test_decoding prints), or null."""
    for k, v in row.items():
        assert v is not UNCHANGED, f"column {k} was never sent"
        assert v is None or isinstance(v, str)
    return {k: v for k, v in row.items() if v is None or isinstance(v, str)}


def sort_key(row: dict[str, str | None]) -> list[tuple[bool, str]]:
    return [(v is None, v or "") for _, v in sorted(row.items())]


@pytest.mark.parametrize(("path", "tables_path"), REPLAYS, ids=[file_id(p) for p, _ in REPLAYS])
def test_replay_reproduces_the_tables(path: Path, tables_path: Path) -> None:
    cap = load(path)
    events = decode(cap)
    expected: dict[str, list[dict[str, str | None]]] = json.loads(tables_path.read_text())
    tables = replay(events, pgoutput_keys(path.parent, cap.meta["case"]))
    compared = 0
    for (schema, table), rows in tables.rows.items():
        key = f"{schema}.{table}"
        if key in tables.unidentified:
            continue
        assert key in expected, f"{key} is not in {tables_path.name}"
        got = sorted((as_text(r) for r in rows), key=sort_key)
        assert got == sorted(expected[key], key=sort_key), key
        compared += 1
    # tables the workload never changed stay empty; every other table was compared
    untouched = set(expected) - {f"{s}.{t}" for s, t in tables.rows} - tables.unidentified
    assert all(expected[k] == [] for k in untouched), untouched
    assert compared >= 1
    # only tables without a replica identity (REPLICA IDENTITY NOTHING: DELETE shows no row) are skipped
    no_identity = {
        f"{e.relation.namespace}.{e.relation.name}" for e in events if isinstance(e, Delete) and e.old is None
    }
    assert tables.unidentified <= no_identity
