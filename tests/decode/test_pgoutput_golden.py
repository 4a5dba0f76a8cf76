"""PgOutputDecoder on bytes captured from real servers (tests/golden/pg<MAJOR>/<case>.pgoutput.jsonl).

Every file is decoded completely with the protocol version and options it was captured with, and
the event sequence is checked against what the protocol guarantees: transaction framing, LSN
agreement between Begin and Commit, streamed chunks and their xids, prepared transactions and their
outcome, replica identities and their old images. Where a ``<case>.tables.json`` holds the tables'
final contents, replaying the committed changes must reproduce them value for value.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pgrecv.decode.pgoutput import PgOutputDecoder
from pgrecv.events import (
    UNCHANGED,
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    Delete,
    Event,
    Insert,
    Message,
    Origin,
    Prepare,
    Relation,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    Tuple,
    TypeInfo,
    Update,
    Value,
)
from pgrecv.lsn import LSN

GOLDEN = Path(os.environ.get("PGRECV_GOLDEN_DIR", Path(__file__).resolve().parent.parent / "golden"))
FILES = sorted(GOLDEN.glob("pg*/*.pgoutput.jsonl"))


@dataclass
class Capture:
    path: Path
    meta: dict[str, Any]
    rows: list[tuple[int, int | None, bytes]]  # lsn, xid, data

    @property
    def case(self) -> str:
        return self.path.name.removesuffix(".pgoutput.jsonl")

    @property
    def options(self) -> dict[str, str]:
        return {k: str(v) for k, v in self.meta.get("options", {}).items()}

    @property
    def proto(self) -> int:
        return int(self.meta["proto_version"])

    @property
    def streaming(self) -> str:
        return self.options.get("streaming", "off").lower()

    def decoder(self) -> PgOutputDecoder:
        # strict Stream Abort layout: the abort LSN and time come with streaming=parallel only
        return PgOutputDecoder(self.proto, streaming_parallel=self.streaming == "parallel")

    def events(self) -> list[tuple[int, Event]]:
        dec = self.decoder()
        return [(lsn, dec.decode(data, lsn)) for lsn, _, data in self.rows]


def load(path: Path) -> Capture:
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    meta = lines[0]["meta"]
    rows = [(int(LSN(r["lsn"])), r.get("xid"), bytes.fromhex(r["data"])) for r in lines[1:]]
    return Capture(path, meta, rows)


def ids(path: Path) -> str:
    return f"{path.parent.name}/{path.name.removesuffix('.pgoutput.jsonl')}"


# --- the protocol's guarantees, checked on every file -----------------------------------------

Change = Insert | Update | Delete | Truncate


@dataclass
class Walk:
    """Follows the event sequence as a client would and collects what was committed."""

    streaming: str
    relations: dict[int, Relation] = field(default_factory=dict)
    txn: Begin | BeginPrepare | None = None
    txn_changes: list[Change] = field(default_factory=list)
    chunk: int | None = None  # xid of the open streamed chunk
    streamed: dict[int, list[Change]] = field(default_factory=dict)  # top xid -> changes so far
    prepared: dict[str, list[Change]] = field(default_factory=dict)  # gid -> changes
    committed: list[list[Change]] = field(default_factory=list)  # in commit order
    seen: dict[str, int] = field(default_factory=dict)  # event type name -> count
    messages: list[Message] = field(default_factory=list)
    gids: dict[str, str] = field(default_factory=dict)  # gid -> "committed" | "rolled back"

    def feed(self, ev: Event) -> None:
        name = type(ev).__name__
        self.seen[name] = self.seen.get(name, 0) + 1
        getattr(self, "_" + name)(ev)

    def finish(self) -> None:
        assert self.txn is None, "the capture ends inside a transaction"
        assert self.chunk is None, "the capture ends inside a streamed chunk"

    # transactions
    def _outside(self) -> None:
        assert self.txn is None and self.chunk is None, "a transaction boundary inside a transaction or chunk"

    def _Begin(self, ev: Begin) -> None:
        self._outside()
        assert ev.final_lsn > 0 and ev.xid is not None
        self.txn, self.txn_changes = ev, []

    def _Commit(self, ev: Commit) -> None:
        assert isinstance(self.txn, Begin), "Commit without Begin"
        assert ev.commit_lsn == self.txn.final_lsn, "Begin.final_lsn differs from Commit.commit_lsn"
        assert ev.commit_time == self.txn.commit_time
        assert ev.end_lsn > ev.commit_lsn and ev.flags == 0
        self.committed.append(self.txn_changes)
        self.txn = None

    def _Origin(self, ev: Origin) -> None:
        assert self.txn is not None or self.chunk is not None

    def _BeginPrepare(self, ev: BeginPrepare) -> None:
        self._outside()
        assert 0 < ev.prepare_lsn < ev.end_lsn and ev.gid
        self.txn, self.txn_changes = ev, []

    def _Prepare(self, ev: Prepare) -> None:
        bp = self.txn
        assert isinstance(bp, BeginPrepare), "Prepare without Begin Prepare"
        assert (ev.prepare_lsn, ev.end_lsn, ev.prepare_time, ev.xid, ev.gid) == (
            bp.prepare_lsn,
            bp.end_lsn,
            bp.prepare_time,
            bp.xid,
            bp.gid,
        )
        self.prepared[ev.gid] = self.txn_changes
        self.txn = None

    def _CommitPrepared(self, ev: CommitPrepared) -> None:
        self._outside()
        assert ev.gid in self.prepared, f"Commit Prepared of unknown gid {ev.gid}"
        self.committed.append(self.prepared.pop(ev.gid))
        self.gids[ev.gid] = "committed"

    def _RollbackPrepared(self, ev: RollbackPrepared) -> None:
        self._outside()
        assert ev.gid in self.prepared, f"Rollback Prepared of unknown gid {ev.gid}"
        assert ev.rollback_end_lsn > ev.prepare_end_lsn
        del self.prepared[ev.gid]
        self.gids[ev.gid] = "rolled back"

    # streaming
    def _StreamStart(self, ev: StreamStart) -> None:
        self._outside()
        assert self.streaming in ("on", "parallel"), "a streamed chunk without the streaming option"
        if ev.first:
            assert ev.xid not in self.streamed, "first=1 for an xid already streaming"
            self.streamed[ev.xid] = []
        else:
            assert ev.xid in self.streamed, "first=0 for an xid never started"
        self.chunk = ev.xid

    def _StreamStop(self, ev: StreamStop) -> None:
        assert self.chunk is not None and self.txn is None, "Stream Stop outside a chunk"
        self.chunk = None

    def _StreamCommit(self, ev: StreamCommit) -> None:
        self._outside()
        assert ev.xid in self.streamed and ev.end_lsn > ev.commit_lsn
        self.committed.append(self.streamed.pop(ev.xid))

    def _StreamAbort(self, ev: StreamAbort) -> None:
        self._outside()
        assert ev.xid in self.streamed, "Stream Abort of an xid never streamed"
        assert (ev.abort_lsn is not None) == (self.streaming == "parallel")
        assert (ev.abort_time is not None) == (self.streaming == "parallel")
        if ev.subxid == ev.xid:
            del self.streamed[ev.xid]
        else:  # a rolled-back subtransaction: its changes carry its own xid
            self.streamed[ev.xid] = [c for c in self.streamed[ev.xid] if c.xid != ev.subxid]

    def _StreamPrepare(self, ev: StreamPrepare) -> None:
        self._outside()
        assert ev.xid in self.streamed and ev.gid
        self.prepared[ev.gid] = self.streamed.pop(ev.xid)

    # catalog and changes
    def _in_txn(self, xid: int | None) -> None:
        if self.chunk is not None:
            assert xid is not None, "no xid inside a streamed chunk"
        else:
            assert self.txn is not None, "a change outside any transaction"
            assert xid is None, "an xid outside a streamed chunk"

    def _Relation(self, ev: Relation) -> None:
        self._in_txn(ev.xid)
        assert ev.name and ev.namespace and len({c.name for c in ev.columns}) == len(ev.columns)
        if ev.replica_identity == "f":
            assert all(c.key for c in ev.columns), "REPLICA IDENTITY FULL: every column is part of the key"
        for c in ev.columns:
            assert c.type_oid > 0 and c.type_name, f"column {c.name} has no type name"
        self.relations[ev.oid] = ev

    def _TypeInfo(self, ev: TypeInfo) -> None:
        self._in_txn(ev.xid)
        assert ev.oid >= 16384 and ev.name  # sent for user-defined types only

    def _change(self, ev: Change) -> None:
        self._in_txn(ev.xid)
        if self.chunk is not None:
            self.streamed[self.chunk].append(ev)
        else:
            self.txn_changes.append(ev)

    def _check_tuple(self, rel: Relation, tup: Tuple | None) -> None:
        assert tup is not None and len(tup) == len(rel.columns)
        assert all(v is None or v is UNCHANGED or isinstance(v, str | bytes) for v in tup)

    def _check_key_image(self, rel: Relation, old: Tuple | None) -> None:
        """'K': the replica identity columns, NULL elsewhere."""
        assert old is not None and rel.replica_identity in ("d", "i")
        for col, v in zip(rel.columns, old, strict=True):
            if not col.key:
                assert v is None, f"key image of {rel.name} carries non-key column {col.name}"

    def _Insert(self, ev: Insert) -> None:
        assert ev.relation is self.relations[ev.relation.oid], "Insert does not use the latest Relation"
        self._check_tuple(ev.relation, ev.new)
        assert UNCHANGED not in ev.new, "an Insert cannot have unchanged TOAST values"
        self._change(ev)

    def _Update(self, ev: Update) -> None:
        rel = ev.relation
        assert rel is self.relations[rel.oid], "Update does not use the latest Relation"
        self._check_tuple(rel, ev.new)
        if rel.replica_identity == "f":
            assert ev.old_kind == "O", "REPLICA IDENTITY FULL updates carry the old row"
            self._check_tuple(rel, ev.old)
        elif ev.old_kind == "K":
            self._check_key_image(rel, ev.old)
        else:
            assert ev.old_kind is None and ev.old is None
        self._change(ev)

    def _Delete(self, ev: Delete) -> None:
        rel = ev.relation
        assert rel is self.relations[rel.oid], "Delete does not use the latest Relation"
        self._check_tuple(rel, ev.old)
        if rel.replica_identity == "f":
            assert ev.old_kind == "O"
        else:
            assert ev.old_kind == "K"
            self._check_key_image(rel, ev.old)
        self._change(ev)

    def _Truncate(self, ev: Truncate) -> None:
        assert ev.relations and all(r is self.relations[r.oid] for r in ev.relations)
        self._change(ev)

    def _Message(self, ev: Message) -> None:
        if ev.transactional:
            self._in_txn(ev.xid)
        else:
            self._outside()
            assert ev.xid is None
        self.messages.append(ev)


def walk(cap: Capture) -> Walk:
    w = Walk(cap.streaming)
    for _, ev in cap.events():
        w.feed(ev)
    w.finish()
    return w


# --- replay -----------------------------------------------------------------------------------

Row = dict[str, Value]


def replay(committed: list[list[Change]]) -> dict[str, list[Row]]:
    """Apply committed changes to empty tables ("schema.table" -> rows), matching old images on
    their non-NULL, non-UNCHANGED values (the key columns for 'K', the whole row for 'O')."""
    tables: dict[str, list[Row]] = {}

    def find(rows: list[Row], image: Row) -> int:
        for i, row in enumerate(rows):
            if all(row.get(k) == v for k, v in image.items()):
                return i
        raise AssertionError(f"no row matches {image}")

    def key_image(rel: Relation, old: Tuple | None, kind: str | None, new: Tuple | None) -> Row:
        if old is not None:
            pairs = zip(rel.columns, old, strict=True)
            return {c.name: v for c, v in pairs if v is not UNCHANGED and (kind == "O" or c.key)}
        assert new is not None
        return {c.name: v for c, v in zip(rel.columns, new, strict=True) if c.key}

    for txn in committed:
        for ch in txn:
            if isinstance(ch, Truncate):
                for rel in ch.relations:
                    tables[f"{rel.namespace}.{rel.name}"] = []
                continue
            rel = ch.relation
            rows = tables.setdefault(f"{rel.namespace}.{rel.name}", [])
            if isinstance(ch, Insert):
                rows.append({c.name: v for c, v in zip(rel.columns, ch.new, strict=True)})
            elif isinstance(ch, Update):
                i = find(rows, key_image(rel, ch.old, ch.old_kind, ch.new))
                before = rows[i]
                rows[i] = {
                    c.name: before[c.name] if v is UNCHANGED else v for c, v in zip(rel.columns, ch.new, strict=True)
                }
            else:
                del rows[find(rows, key_image(rel, ch.old, ch.old_kind, None))]
    return tables


def canonical(rows: list[Row]) -> list[tuple[tuple[str, Any], ...]]:
    return sorted((tuple(sorted((k, v) for k, v in row.items())) for row in rows), key=repr)


def tables_json(cap: Capture) -> Path:
    """Final contents are per workload (meta "case"), shared by its capture variants."""
    return cap.path.with_name(f"{cap.meta.get('case', cap.case)}.tables.json")


def text_twin(cap: Capture) -> Capture | None:
    """For a capture with binary values: the text-mode capture of the same changes."""
    for p in sorted(cap.path.parent.glob("*.pgoutput.jsonl")):
        other = load(p)
        if other.meta.get("changes") == cap.meta.get("changes") and "binary" not in other.options:
            return other
    return None


# Binary (send) forms simple enough to check here against the text form; the values module
# converts all of them and has its own tests.
_BINARY_AS_TEXT: dict[int, Callable[[bytes], str]] = {
    16: lambda b: {b"\x01": "t", b"\x00": "f"}[b],
    21: lambda b: str(int.from_bytes(b, "big", signed=True)),
    23: lambda b: str(int.from_bytes(b, "big", signed=True)),
    20: lambda b: str(int.from_bytes(b, "big", signed=True)),
    26: lambda b: str(int.from_bytes(b, "big")),
    25: bytes.decode,
    1043: bytes.decode,
    1042: bytes.decode,
    19: bytes.decode,
}


# --- tests ------------------------------------------------------------------------------------


def test_golden_files_exist() -> None:
    """The captures are part of the repository; without them the tests below test nothing."""
    majors = {p.parent.name for p in FILES}
    assert FILES, f"no golden pgoutput files under {GOLDEN}: run tools/capture_golden.py"
    assert len(majors) >= 2, f"golden files for one major version only: {majors}"


@pytest.mark.parametrize("path", FILES, ids=ids)
def test_golden_decodes_completely(path: Path) -> None:
    cap = load(path)
    events = cap.events()
    assert len(events) == len(cap.rows) > 0
    for (lsn, ev), (_, xid, _) in zip(events, cap.rows, strict=True):
        if isinstance(ev, Begin | BeginPrepare) and xid is not None:
            assert ev.xid == xid, "the SQL interface's xid column differs from the Begin's xid"
        if isinstance(ev, Insert | Update | Delete | Truncate):
            assert ev.lsn == lsn
    if "binary" in cap.options:
        assert any(isinstance(ev, Insert) and any(isinstance(v, bytes) for v in ev.new) for _, ev in events)
    else:
        assert not any(isinstance(ev, Insert) and any(isinstance(v, bytes) for v in ev.new) for _, ev in events)


@pytest.mark.parametrize("path", FILES, ids=ids)
def test_golden_protocol_structure(path: Path) -> None:
    w = walk(load(path))
    assert w.seen.get("Begin", 0) + w.seen.get("BeginPrepare", 0) + w.seen.get("StreamStart", 0) > 0


def replayable(cap: Capture) -> bool:
    """Text values, and every change of the workload in the capture (origin=none leaves some out)."""
    return tables_json(cap).exists() and "binary" not in cap.options and cap.options.get("origin") != "none"


REPLAYABLE = [p for p in FILES if replayable(load(p))]


@pytest.mark.parametrize("path", REPLAYABLE, ids=ids)
def test_golden_replay_reproduces_tables(path: Path) -> None:
    """Committed changes replayed by key give the server's final tables, text value for text value."""
    cap = load(path)
    expected: dict[str, list[Row]] = json.loads(tables_json(cap).read_text())
    got = replay(walk(cap).committed)
    unpublished = set(cap.meta.get("not_published", {}))
    for name, rows in expected.items():
        if name not in unpublished:
            assert canonical(got.get(name, [])) == canonical(rows), f"{name} differs after replay"


BINARY = [p for p in FILES if "binary" in load(p).options]


@pytest.mark.parametrize("path", BINARY, ids=ids)
def test_golden_binary_values(path: Path) -> None:
    """Binary mode: the same rows as the text capture of the same changes, NULLs in the same
    places, and the simple send() forms equal to the text values."""
    cap = load(path)
    twin = text_twin(cap)
    assert twin is not None, "no text capture of the same changes"
    w = walk(cap)
    got, text = replay(w.committed), replay(walk(twin).committed)
    assert got.keys() == text.keys()
    types = {f"{r.namespace}.{r.name}": {c.name: c.type_oid for c in r.columns} for r in w.relations.values()}
    checked = 0
    for name, rows in got.items():
        by_id = {row["id"]: row for row in text[name]}  # every table of the workload has an int4 id
        assert len(rows) == len(by_id)
        for row in rows:
            assert isinstance(row["id"], bytes)
            twin_row = by_id[str(int.from_bytes(row["id"], "big", signed=True))]
            for col, v in row.items():
                assert (v is None) == (twin_row[col] is None), f"{name}.{col}: NULL in one mode only"
                if v is None:
                    continue
                assert isinstance(v, bytes)
                as_text = _BINARY_AS_TEXT.get(types[name][col])
                if as_text is not None:
                    assert as_text(v) == twin_row[col], f"{name}.{col}"
                    checked += 1
    assert checked > 20


def by_case(case: str) -> list[Capture]:
    caps = [load(p) for p in FILES if p.name == f"{case}.pgoutput.jsonl"]
    assert caps, f"no golden capture {case}"
    return caps


# --- per workload (tests/golden/cases.sql) ----------------------------------------------------


def changes_of(w: Walk, table: str) -> list[Change]:
    out = []
    for txn in w.committed:
        for ch in txn:
            rels = ch.relations if isinstance(ch, Truncate) else (ch.relation,)
            if any(r.name == table for r in rels):
                out.append(ch)
    return out


@pytest.mark.parametrize("cap", by_case("toast"), ids=lambda c: c.path.parent.name)
def test_golden_toast_unchanged(cap: Capture) -> None:
    """Default identity: the big value left unchanged is not sent and stays UNCHANGED. FULL identity:
    the server sends it in the old image, and the decoder puts it in the new image (issue 60)."""
    w = walk(cap)
    for table in ("toast_d", "toast_f"):
        updates = [c for c in changes_of(w, table) if isinstance(c, Update)]
        big = [c.relation.columns.index(next(col for col in c.relation.columns if col.name == "big")) for c in updates]
        unchanged = [u for u, i in zip(updates, big, strict=True) if u.new[i] is UNCHANGED]
        filled = [u for u in updates if u.toast_from_old]
        if table == "toast_d":
            assert unchanged, f"{table}: no unchanged TOAST value in an Update"
            assert not filled
        else:
            assert not unchanged, f"{table}: an unchanged TOAST value left out although the old image holds it"
            assert filled
            for u, i in zip(updates, big, strict=True):
                if u.toast_from_old:
                    assert u.toast_from_old == ("big",)
                    assert u.old is not None and u.old_kind == "O"
                    assert isinstance(u.new[i], str) and u.new[i] == u.old[i] and len(u.new[i]) > 2000
        for u in updates:  # only the big value is ever left out
            assert all(
                v is not UNCHANGED for col, v in zip(u.relation.columns, u.new, strict=True) if col.name != "big"
            )


@pytest.mark.parametrize("cap", by_case("replica_identity"), ids=lambda c: c.path.parent.name)
def test_golden_replica_identity_old_images(cap: Capture) -> None:
    w = walk(cap)

    def kinds(table: str, cls: type) -> list[str | None]:
        return [c.old_kind for c in changes_of(w, table) if isinstance(c, cls)]  # type: ignore[union-attr]

    idents = {r.name: r.replica_identity for r in w.relations.values()}
    assert idents == {"ri_default": "d", "ri_full": "f", "ri_index": "i", "ri_nothing": "n"}
    # key unchanged, key changed, key and value changed
    assert kinds("ri_default", Update) == [None, "K", "K"]
    assert kinds("ri_default", Delete) == ["K"]
    assert kinds("ri_full", Update) == ["O", "O", "O"]
    assert kinds("ri_full", Delete) == ["O", "O", "O"]
    assert kinds("ri_index", Update) == [None, "K"]
    assert kinds("ri_index", Delete) == ["K", "K"]
    assert [type(c).__name__ for c in changes_of(w, "ri_nothing")] == ["Insert", "Insert"]
    ri_index = next(r for r in w.relations.values() if r.name == "ri_index")
    assert ri_index.key_names == ("a", "b")


@pytest.mark.parametrize("cap", by_case("truncate"), ids=lambda c: c.path.parent.name)
def test_golden_truncate_flags(cap: Capture) -> None:
    w = walk(cap)
    seen = [
        (sorted(r.name for r in c.relations), c.cascade, c.restart_identity)
        for txn in w.committed
        for c in txn
        if isinstance(c, Truncate)
    ]
    assert seen == [
        (["child", "parent"], True, False),
        (["seq_t"], False, True),
        (["plain_a", "plain_b"], False, False),
        (["plain_a"], False, False),
        (["plain_b"], True, True),
    ]


@pytest.mark.parametrize("cap", by_case("messages"), ids=lambda c: c.path.parent.name)
def test_golden_messages(cap: Capture) -> None:
    w = walk(cap)
    got = sorted((m.transactional, m.prefix, m.content) for m in w.messages)
    assert got == sorted(
        [
            (True, "txn", b"transactional text"),
            (False, "nontxn", b"non-transactional text"),
            (True, "bin", b"\x00\xc3\xa9\x01\x7f"),
            (True, "nonutf8", b"\xff\xfe\x00"),
            (True, "", b"empty prefix"),
            (False, "empty", b""),
            (True, "in-txn", b"with a row"),
            (False, "nt-in-txn", b"sent at once"),
            (False, "nt-rolled-back", b"decoded anyway"),
            (True, "unicode é😀", 'multi\nline é😀 "quoted" \\ back'.encode()),
        ]
    )
    assert all(m.lsn > 0 for m in w.messages)


def _streaming_captures() -> list[Capture]:
    return [load(p) for p in FILES if load(p).meta.get("case") == "streaming"]


@pytest.mark.parametrize("cap", _streaming_captures(), ids=lambda c: f"{c.path.parent.name}/{c.case}")
def test_golden_streaming_sequence(cap: Capture) -> None:
    events = [ev for _, ev in cap.events()]
    starts = [ev for ev in events if isinstance(ev, StreamStart)]
    aborts = [ev for ev in events if isinstance(ev, StreamAbort)]
    commits = [ev for ev in events if isinstance(ev, StreamCommit)]
    big_xid = commits[0].xid
    assert [c.xid for c in commits] == [big_xid]
    first = [s.xid for s in starts if s.first]
    assert len(starts) > len(first) and sum(isinstance(ev, StreamStop) for ev in events) == len(starts)
    sub = [a for a in aborts if a.subxid != a.xid]
    whole = [a for a in aborts if a.subxid == a.xid]
    assert [a.xid for a in sub] == [big_xid]  # ROLLBACK TO SAVEPOINT s1
    # The second big transaction is rolled back: streamed then aborted as a whole, or (PostgreSQL
    # 17+, which notices the abort before streaming) not sent at all.
    assert [a.xid for a in whole] == [x for x in first if x != big_xid]
    assert len(first) in (1, 2) and big_xid in first
    parallel = cap.streaming == "parallel"
    assert all((a.abort_lsn is not None and a.abort_time is not None) == parallel for a in aborts)
    if parallel:
        assert all(a.abort_lsn and a.abort_lsn < commits[0].commit_lsn for a in sub)
    w = walk(cap)
    big = changes_of(w, "big")
    assert sum(isinstance(c, Insert) for c in big) == 1500 and sum(isinstance(c, Update) for c in big) == 5
    assert all(c.xid is not None for c in big)  # all came in chunks
    small = changes_of(w, "small")
    assert [c.new[1] for c in small if isinstance(c, Insert)] == [
        "committed while A is open",
        "second small",
        "after",
    ]
    assert all(c.xid is None for c in small)  # plain transactions, between the chunks


def _twophase_captures() -> list[Capture]:
    return [load(p) for p in FILES if load(p).meta.get("case") == "twophase"]


@pytest.mark.parametrize("cap", _twophase_captures(), ids=lambda c: f"{c.path.parent.name}/{c.case}")
def test_golden_twophase_outcomes(cap: Capture) -> None:
    w = walk(cap)
    assert w.gids == {
        "gx_commit": "committed",
        "gx 'quoted' rollback": "rolled back",
        "gx_big": "committed",
        "gx_big_rb": "rolled back",
    }
    assert list(w.prepared) == ["gx_pending"]  # captured before the teardown rolled it back
    assert w.seen.get("Prepare", 0) + w.seen.get("StreamPrepare", 0) == 5
    tp = changes_of(w, "tp")
    assert sum(isinstance(c, Insert) for c in tp) == 2 + 800 + 1


@pytest.mark.parametrize("path", [p for p in FILES if "origin" in p.name], ids=ids)
def test_golden_origin(path: Path) -> None:
    cap = load(path)
    w = walk(cap)
    values = [c.new[1] for txn in w.committed for c in txn if isinstance(c, Insert)]
    if cap.options.get("origin") == "none":
        assert w.seen.get("Origin", 0) == 0
        assert values == ["local", "local again"]
    else:
        assert values == ["local", "from origin", "origin, no xact setup", "local again"]
        origins = [ev for _, ev in cap.events() if isinstance(ev, Origin)]
        assert [(o.name, o.commit_lsn) for o in origins] == [("myorigin", int(LSN("0/ABCDEF0")))] * 2


@pytest.mark.parametrize("cap", by_case("types"), ids=lambda c: c.path.parent.name)
def test_golden_type_names(cap: Capture) -> None:
    w = walk(cap)
    rel = next(r for r in w.relations.values() if r.name == "all_types")
    names = {c.name: c.type_name for c in rel.columns}
    assert names["c_int4"] == "integer" and names["c_varchar"] == "character varying"
    assert names["c_tstz"] == "timestamp with time zone" and names["c_int_arr"] == "integer[]"
    assert names["c_enum"] == "public.mood" and names["c_other"] == "My Schema.color"
    assert names["c_comp"] == "public.pair"
    assert names["c_domain"] == "int4"  # pgoutput names a domain by its base type
    odd = next(r for r in w.relations.values() if r.name == "odd.table")
    assert (odd.namespace, [c.name for c in odd.columns]) == ("My Schema", ["a b", 'x"y', "Δ"])
