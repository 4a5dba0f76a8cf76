"""JsonlEncoder: record shapes, transaction context, test_decoding hold-back, schema conformance."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import jsonschema
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgrecv import events as ev
from pgrecv.errors import DecodeError
from pgrecv.events import UNCHANGED, pg_time_iso
from pgrecv.output.jsonl import JsonlEncoder

SCHEMA = json.loads(resources.files("pgrecv").joinpath("schema/event-v1.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)

T0 = 817_000_000_123_456  # some time in 2025, PostgreSQL epoch microseconds


def col(name: str, oid: int, type_name: str, key: bool = False) -> ev.Column:
    return ev.Column(name, oid, -1, type_name, key)


ACCOUNTS = ev.Relation(
    16385,
    "public",
    "accounts",
    "d",
    (
        col("id", 23, "integer", key=True),
        col("owner", 25, "text"),
        col("balance", 1700, "numeric"),
        col("active", 16, "boolean"),
        col("doc", 3802, "jsonb"),
    ),
)


class Sink:
    """Collects written bytes and checks the line framing as it goes."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def __call__(self, data: bytes) -> None:
        assert isinstance(data, bytes)
        assert data.endswith(b"\n") and data.count(b"\n") == 1, data
        self.chunks.append(data)

    def records(self) -> list[dict[str, Any]]:
        out = []
        for chunk in self.chunks:
            rec = json.loads(chunk)
            VALIDATOR.validate(rec)
            out.append(rec)
        return out


def encode(events: list[ev.Event], *, close: bool = True) -> list[dict[str, Any]]:
    sink = Sink()
    enc = JsonlEncoder(sink)
    for e in events:
        enc.feed(e)
    if close:
        enc.close()
    return sink.records()


def rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r["op"] in ("insert", "update", "delete", "truncate", "message")]


def txn(*changes: ev.Event, xid: int = 750, commit_lsn: int = 0x1A2B3C0) -> list[ev.Event]:
    return [ev.Begin(commit_lsn, T0, xid), *changes, ev.Commit(0, commit_lsn, commit_lsn + 0x30, T0)]


# --- record shapes -------------------------------------------------------------------------------


def test_pgoutput_transaction_records() -> None:
    recs = encode(
        txn(
            ACCOUNTS,
            ev.Insert(ACCOUNTS, ("1", "ann", "12.50", "t", '{"a": 1}'), lsn=0x1A2B1D8),
            ev.Update(ACCOUNTS, ("2", "ann", "0", "f", None), old=("1", None, None, None, None), old_kind="K"),
            ev.Delete(ACCOUNTS, ("2", None, None, None, None), old_kind="K", lsn=0x1A2B2A0),
        )
    )
    assert [r["op"] for r in recs] == ["begin", "relation", "insert", "update", "delete", "commit"]
    begin, relation, ins, upd, dele, commit = recs
    assert begin == {"v": 1, "op": "begin", "xid": 750, "commit_lsn": "0/1A2B3C0", "commit_time": pg_time_iso(T0)}
    assert commit["commit_lsn"] == "0/1A2B3C0" and commit["end_lsn"] == "0/1A2B3F0" and commit["xid"] == 750
    assert relation["replica_identity"] == "default" and relation["key"] == ["id"]
    assert relation["columns"][2] == {
        "name": "balance",
        "type": "numeric",
        "type_oid": 1700,
        "typmod": -1,
        "key": False,
    }
    for r in (ins, upd, dele):
        assert (r["xid"], r["commit_lsn"], r["commit_time"]) == (750, "0/1A2B3C0", pg_time_iso(T0))
        assert r["schema"] == "public" and r["table"] == "accounts" and r["key"] == ["id"]
        assert "gid" not in r
    assert ins["lsn"] == "0/1A2B1D8"
    assert upd["lsn"] is None  # 0 means unknown
    # typed values: integer, text kept, numeric exact as a string, boolean, embedded JSON
    assert ins["new"] == {"id": 1, "owner": "ann", "balance": "12.50", "active": True, "doc": {"a": 1}}
    assert ins["unchanged_toast"] == [] and "json_nulls" not in ins and "old" not in ins
    # a key image keeps only the key columns (the others are the server's NULL placeholders)
    assert upd["old"] == {"id": 1} and upd["old_kind"] == "key" and upd["new"]["active"] is False
    assert dele["old"] == {"id": 2} and dele["old_kind"] == "key" and "new" not in dele


def test_full_old_image_and_no_old_image() -> None:
    full = ev.Relation(1, "s", "t", "f", (col("id", 23, "integer", key=True), col("v", 25, "text")))
    nothing = ev.Relation(2, "s", "n", "n", (col("v", 25, "text"),))
    recs = rows(
        encode(
            txn(
                full,
                nothing,
                ev.Update(full, ("1", "b"), old=("1", "a"), old_kind="O"),
                ev.Update(full, ("1", "c")),
                ev.Delete(full, ("1", "c"), old_kind="O"),
                ev.Delete(nothing, None),
            )
        )
    )
    assert recs[0]["old"] == {"id": 1, "v": "a"} and recs[0]["old_kind"] == "full"
    assert recs[1]["old"] is None and recs[1]["old_kind"] is None
    assert recs[2]["old"] == {"id": 1, "v": "c"} and recs[2]["old_kind"] == "full"
    assert recs[3]["old"] is None and recs[3]["old_kind"] is None and recs[3]["key"] == []


def test_unchanged_toast_is_omitted_and_listed() -> None:
    upd = rows(encode(txn(ACCOUNTS, ev.Update(ACCOUNTS, ("7", UNCHANGED, "1", "t", UNCHANGED)))))[0]
    assert upd["new"] == {"id": 7, "balance": "1", "active": True}
    assert upd["unchanged_toast"] == ["owner", "doc"]
    assert "owner" not in upd["new"] and "doc" not in upd["new"]


def test_json_null_is_distinguishable_from_sql_null() -> None:
    recs = rows(
        encode(
            txn(
                ACCOUNTS,
                ev.Insert(ACCOUNTS, ("1", None, None, None, "null")),
                ev.Insert(ACCOUNTS, ("2", None, None, None, None)),
                ev.Insert(ACCOUNTS, ("3", None, None, None, '{"a": null}')),
                ev.Update(
                    ACCOUNTS, ("3", None, None, None, "null"), old=("3", None, None, None, " null "), old_kind="O"
                ),
                ev.Delete(ACCOUNTS, ("3", None, None, None, "null"), old_kind="O"),
            )
        )
    )
    json_null, sql_null, nested, upd, dele = recs
    assert json_null["new"]["doc"] is None and json_null["json_nulls"] == ["doc"]
    assert sql_null["new"]["doc"] is None and "json_nulls" not in sql_null
    assert nested["new"]["doc"] == {"a": None} and "json_nulls" not in nested
    assert upd["json_nulls"] == ["doc"] and upd["old_json_nulls"] == ["doc"] and upd["old"]["doc"] is None
    assert dele["old_json_nulls"] == ["doc"] and "json_nulls" not in dele


def test_json_with_newlines_stays_one_line() -> None:
    recs = rows(encode(txn(ACCOUNTS, ev.Insert(ACCOUNTS, ("1", "a\nb", None, None, '{\n"k":\r\n[1,\n2]}')))))
    assert recs[0]["new"]["doc"] == {"k": [1, 2]} and recs[0]["new"]["owner"] == "a\nb"


def test_binary_values_use_the_binary_converters() -> None:
    rel = ev.Relation(3, "s", "b", "d", (col("id", 23, "integer", key=True), col("flag", 16, "boolean")))
    recs = rows(
        encode(txn(rel, ev.Insert(rel, (b"\x00\x00\x01\x00", b"\x01")), ev.Insert(rel, (b"\xff\xff\xff\xff", None))))
    )
    assert recs[0]["new"] == {"id": 256, "flag": True}
    assert recs[1]["new"] == {"id": -1, "flag": None}


def test_truncate_and_messages() -> None:
    other = ev.Relation(9, "app", "log", "d", (col("id", 23, "integer", key=True),))
    recs = encode(
        [
            ev.Message(False, 0x10, "ping", b"\xff\x00"),
            *txn(
                ev.Truncate((ACCOUNTS, other), cascade=True, restart_identity=False, lsn=0x20),
                ev.Message(True, 0x30, "audit", "héllo".encode()),
            ),
        ]
    )
    ping, trunc, audit = rows(recs)
    assert ping["content_encoding"] == "base64" and ping["content"] == "/wA=" and ping["transactional"] is False
    assert "commit_lsn" not in ping and ping["lsn"] == "0/10"
    assert trunc["tables"] == [{"schema": "public", "table": "accounts"}, {"schema": "app", "table": "log"}]
    assert trunc["cascade"] is True and trunc["restart_identity"] is False and trunc["commit_lsn"] == "0/1A2B3C0"
    assert audit["content"] == "héllo" and audit["content_encoding"] == "utf8"
    assert audit["xid"] == 750 and audit["commit_lsn"] == "0/1A2B3C0"


def test_origin_and_type_records() -> None:
    recs = encode(txn(ev.TypeInfo(50000, "public", "mood"), ev.Origin(0x99, "node_a")))
    assert recs[1] == {"v": 1, "op": "type", "oid": 50000, "schema": "public", "name": "mood"}
    assert recs[2] == {"v": 1, "op": "origin", "name": "node_a", "commit_lsn": "0/99"}


# --- relations --------------------------------------------------------------------------------------


def test_synthesised_relation_is_written_once_before_its_first_row() -> None:
    synth = ev.Relation(0, "public", "t", "?", (col("a", 23, "integer"), col("b", 0, "public.mood")))
    recs = encode(txn(ev.Insert(synth, ("1", "happy")), ev.Insert(synth, ("2", "sad"))))
    assert [r["op"] for r in recs] == ["begin", "relation", "insert", "insert", "commit"]
    assert recs[1]["oid"] == 0 and recs[1]["replica_identity"] == "unknown"
    assert recs[1]["columns"][1]["type"] == "public.mood" and recs[1]["columns"][1]["type_oid"] == 0
    assert recs[3]["new"] == {"a": 2, "b": "sad"}


def test_relation_replaced_by_a_new_relation_message() -> None:
    v1 = ev.Relation(5, "public", "t", "d", (col("a", 23, "integer", key=True),))
    v2 = ev.Relation(5, "public", "t", "d", (col("a", 23, "integer", key=True), col("b", 25, "text")))
    recs = encode(txn(v1, ev.Insert(v1, ("1",)), v2, ev.Insert(v2, ("2", "x"))))
    assert [r["op"] for r in recs] == ["begin", "relation", "insert", "relation", "insert", "commit"]
    assert recs[2]["new"] == {"a": 1} and recs[4]["new"] == {"a": 2, "b": "x"}
    assert [c["name"] for c in recs[3]["columns"]] == ["a", "b"]


def test_row_with_wrong_column_count_is_a_decode_error() -> None:
    enc = JsonlEncoder(Sink())
    enc.feed(ACCOUNTS)
    with pytest.raises(DecodeError, match=r"public\.accounts has 2 values but its relation has 5"):
        enc.feed(ev.Insert(ACCOUNTS, ("1", "x")))


def test_unconvertible_value_names_the_column() -> None:
    enc = JsonlEncoder(Sink())
    with pytest.raises(DecodeError, match=r"column id \(integer\) of public\.accounts"):
        enc.feed(ev.Insert(ACCOUNTS, ("one", None, None, None, None)))


def test_not_an_event_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        JsonlEncoder(Sink()).feed("BEGIN 1")  # type: ignore[arg-type]


# --- test_decoding: transactions held until COMMIT ---------------------------------------------------


def td_relation() -> ev.Relation:
    return ev.Relation(0, "public", "t", "?", (col("id", 23, "integer"), col("v", 25, "text")))


def test_test_decoding_transaction_is_held_until_commit() -> None:
    rel = td_relation()
    sink = Sink()
    enc = JsonlEncoder(sink)
    enc.feed(ev.Begin(0, None, 900))
    enc.feed(ev.Insert(rel, ("1", "a"), lsn=0x100))
    enc.feed(ev.Message(True, 0x110, "p", b"x"))
    enc.feed(ev.Update(rel, ("1", "b"), lsn=0x120))
    assert sink.chunks == [] and enc.pending == 4
    enc.feed(ev.Message(False, 0x130, "nontx", b"now"))  # not part of the transaction: written at once
    assert [r["op"] for r in sink.records()] == ["message"]
    enc.feed(ev.Commit(0, 0x200, 0, T0, xid=900))
    assert enc.pending == 0
    recs = sink.records()[1:]
    assert [r["op"] for r in recs] == ["begin", "relation", "insert", "message", "update", "commit"]
    assert recs[0] == {"v": 1, "op": "begin", "xid": 900, "commit_lsn": "0/200", "commit_time": pg_time_iso(T0)}
    for r in (recs[2], recs[3], recs[4]):
        assert (r["xid"], r["commit_lsn"], r["commit_time"]) == (900, "0/200", pg_time_iso(T0))
    assert recs[2]["lsn"] == "0/100" and recs[4]["new"] == {"id": 1, "v": "b"}
    assert recs[5]["end_lsn"] is None and recs[5]["commit_time"] == pg_time_iso(T0)


def test_incomplete_tail_is_dropped_not_passed_off_as_complete() -> None:
    rel = td_relation()
    sink = Sink()
    enc = JsonlEncoder(sink)
    for e in txn(ev.Insert(rel, ("1", "a")), commit_lsn=0x50):
        enc.feed(e)
    written = len(sink.chunks)
    enc.feed(ev.Begin(0, None, 901))
    enc.feed(ev.Insert(rel, ("2", "b")))
    enc.feed(ev.Insert(rel, ("3", "c")))
    assert enc.pending == 3
    assert enc.close() == 3
    assert enc.pending == 0 and enc.dropped == 3
    assert len(sink.chunks) == written
    assert all(r.get("xid") != 901 for r in sink.records())


def test_begin_while_held_drops_the_unfinished_transaction() -> None:
    rel = td_relation()
    sink = Sink()
    enc = JsonlEncoder(sink)
    enc.feed(ev.Begin(0, None, 901))
    enc.feed(ev.Insert(rel, ("2", "b")))
    enc.feed(ev.Begin(0, None, 902))
    enc.feed(ev.Insert(rel, ("3", "c")))
    enc.feed(ev.Commit(0, 0x300, 0, None, xid=902))
    recs = sink.records()
    assert enc.dropped == 2
    assert [r["op"] for r in recs] == ["begin", "relation", "insert", "commit"]
    assert recs[2]["new"] == {"id": 3, "v": "c"} and recs[2]["xid"] == 902 and recs[2]["commit_time"] is None


def test_test_decoding_prepared_transaction() -> None:
    rel = td_relation()
    recs = encode(
        [
            ev.Begin(0, None, 903),
            ev.Insert(rel, ("1", "a")),
            ev.Prepare(0, 0x400, 0, None, 903, "gx"),
            ev.CommitPrepared(0, 0x500, 0, None, 903, "gx"),
        ]
    )
    assert [r["op"] for r in recs] == ["begin_prepare", "relation", "insert", "prepare", "commit_prepared"]
    assert recs[0]["gid"] == "gx" and recs[0]["prepare_lsn"] == "0/400"
    assert recs[2]["gid"] == "gx" and recs[2]["prepare_lsn"] == "0/400" and recs[2]["commit_lsn"] is None
    assert recs[4]["commit_lsn"] == "0/500"


# --- two-phase and streaming (pgoutput) ---------------------------------------------------------------


def test_two_phase_records_and_row_context() -> None:
    recs = encode(
        [
            ev.BeginPrepare(0x700, 0x730, T0, 910, "tx1"),
            ACCOUNTS,
            ev.Insert(ACCOUNTS, ("1", "a", "1", "t", None), lsn=0x6F0),
            ev.Prepare(0, 0x700, 0x730, T0, 910, "tx1"),
            ev.RollbackPrepared(0, 0x730, 0x800, T0, T0 + 1, 910, "tx1"),
            ev.CommitPrepared(0, 0x900, 0x930, T0 + 2, 911, "tx2"),
            ev.StreamPrepare(0, 0xA00, 0xA30, T0, 912, "tx3"),
            *txn(ev.Insert(ACCOUNTS, ("2", "b", "2", "f", None))),
        ]
    )
    ops = [r["op"] for r in recs]
    assert ops[:8] == [
        "begin_prepare",
        "relation",
        "insert",
        "prepare",
        "rollback_prepared",
        "commit_prepared",
        "stream_prepare",
        "begin",
    ]
    bp, _, row, prep, rb, cp, sp = recs[:7]
    assert bp == {
        "v": 1,
        "op": "begin_prepare",
        "xid": 910,
        "gid": "tx1",
        "prepare_lsn": "0/700",
        "end_lsn": "0/730",
        "prepare_time": pg_time_iso(T0),
    }
    assert row["gid"] == "tx1" and row["prepare_lsn"] == "0/700" and row["commit_lsn"] is None
    assert row["xid"] == 910 and row["commit_time"] is None
    assert prep["gid"] == "tx1"
    assert rb["prepare_end_lsn"] == "0/730" and rb["rollback_end_lsn"] == "0/800"
    assert rb["rollback_time"] == pg_time_iso(T0 + 1)
    assert cp["commit_lsn"] == "0/900" and cp["xid"] == 911
    assert sp["gid"] == "tx3" and sp["prepare_lsn"] == "0/A00"
    # after the prepared transaction, an ordinary one carries no gid
    assert "gid" not in recs[8] and recs[8]["commit_lsn"] == "0/1A2B3C0"


def test_stream_chunks() -> None:
    rel = ev.Relation(6, "public", "big", "d", (col("id", 23, "integer", key=True),), xid=920)
    recs = encode(
        [
            ev.StreamStart(920, True),
            rel,
            ev.Insert(rel, ("1",), xid=920, lsn=0x10),
            ev.Insert(rel, ("2",), xid=921, lsn=0x20),
            ev.StreamStop(),
            *txn(ev.Insert(rel, ("3",)), xid=930, commit_lsn=0x40),
            ev.StreamStart(920, False),
            ev.Insert(rel, ("4",), xid=920),
            ev.StreamStop(),
            ev.StreamAbort(920, 921),
            ev.StreamCommit(920, 0, 0x90, 0x98, T0),
            ev.StreamAbort(940, 940, 0xA0, T0),
        ]
    )
    assert [r["op"] for r in recs] == [
        "stream_start",
        "relation",
        "insert",
        "insert",
        "stream_stop",
        "begin",
        "insert",
        "commit",
        "stream_start",
        "insert",
        "stream_stop",
        "stream_abort",
        "stream_commit",
        "stream_abort",
    ]
    assert recs[0] == {"v": 1, "op": "stream_start", "xid": 920, "first": True}
    assert recs[2]["xid"] == 920 and recs[2]["commit_lsn"] is None and recs[2]["commit_time"] is None
    assert recs[3]["xid"] == 921
    assert recs[4]["xid"] == 920
    assert recs[6]["xid"] == 930 and recs[6]["commit_lsn"] == "0/40"
    assert recs[9]["xid"] == 920 and recs[9]["commit_lsn"] is None
    assert recs[11] == {"v": 1, "op": "stream_abort", "xid": 920, "subxid": 921, "abort_lsn": None, "abort_time": None}
    assert recs[12]["commit_lsn"] == "0/90" and recs[12]["end_lsn"] == "0/98"
    assert recs[13]["abort_lsn"] == "0/A0" and recs[13]["abort_time"] == pg_time_iso(T0)


# --- the schema itself ------------------------------------------------------------------------------------


def _valid(rec: dict[str, Any]) -> bool:
    return bool(VALIDATOR.is_valid(rec))


def test_schema_rejects_what_the_format_forbids() -> None:
    good = rows(encode(txn(ACCOUNTS, ev.Insert(ACCOUNTS, ("1", "a", "1", "t", None)))))[0]
    assert _valid(good)
    assert not _valid({**good, "v": 2})
    assert not _valid({**good, "op": "upsert"})
    assert not _valid({**good, "commit_lsn": 123})  # LSNs are strings
    assert not _valid({**good, "commit_lsn": "0/1a"})  # upper-case hex
    assert not _valid({**good, "commit_time": "2026-01-01 00:00:00"})
    assert not _valid({**good, "unchanged_toast": None})  # explicit, never null
    assert not _valid({**good, "json_nulls": []})  # present only when non-empty
    assert not _valid({**good, "gid": "g", "prepare_lsn": "0/1"})  # prepared rows have no commit LSN
    assert _valid({**good, "gid": "g", "prepare_lsn": "0/1", "commit_lsn": None})
    assert not _valid({**good, "gid": "g", "commit_lsn": None})  # gid needs prepare_lsn
    assert not _valid({**good, "extra": 1})
    missing = dict(good)
    del missing["xid"]
    assert not _valid(missing)
    delete = {k: v for k, v in good.items() if k not in ("new", "unchanged_toast")}
    assert _valid({**delete, "op": "delete", "old": {"id": 1}, "old_kind": "key"})
    assert not _valid({**delete, "op": "delete", "old": {"id": 1}, "old_kind": None})
    assert not _valid({**delete, "op": "delete", "old": None, "old_kind": "full"})
    msg = {"v": 1, "op": "message", "transactional": False, "prefix": "p", "content": "c"}
    msg |= {"content_encoding": "utf8", "lsn": None, "xid": None}
    assert _valid(msg)
    assert not _valid({**msg, "commit_lsn": "0/1"})  # non-transactional: no commit context
    assert not _valid({**msg, "transactional": True})  # transactional: commit context required


# --- properties -----------------------------------------------------------------------------------------

PROP_REL = ev.Relation(
    77,
    "public",
    "p",
    "d",
    (col("k", 20, "bigint", key=True), col("t", 25, "text"), col("j", 114, "json"), col("a", 1007, "integer[]")),
)
values_t = st.one_of(st.none(), st.just(UNCHANGED), st.text(max_size=20))
values_j = st.one_of(st.none(), st.just(UNCHANGED), st.just("null"), st.just('{"x": [1, null]}'), st.just("3"))
values_a = st.one_of(st.none(), st.just(UNCHANGED), st.just("{1,2,NULL}"), st.just("{}"))


@settings(max_examples=200, deadline=None)
@given(k=st.integers(-(2**63), 2**63 - 1), t=values_t, j=values_j, a=values_a)
def test_update_images_property(k: int, t: ev.Value, j: ev.Value, a: ev.Value) -> None:
    tup = (str(k), t, j, a)
    rec = rows(encode(txn(PROP_REL, ev.Update(PROP_REL, tup))))[0]
    names = ["k", "t", "j", "a"]
    assert rec["unchanged_toast"] == [n for n, v in zip(names, tup, strict=True) if v is UNCHANGED]
    assert list(rec["new"]) == [n for n, v in zip(names, tup, strict=True) if v is not UNCHANGED]
    assert rec["new"]["k"] == k
    if t is not UNCHANGED:
        assert rec["new"]["t"] == t
    if j is UNCHANGED:
        assert "json_nulls" not in rec
    elif j == "null":
        assert rec["new"]["j"] is None and rec["json_nulls"] == ["j"]
    else:
        assert rec["new"]["j"] == (None if j is None else orjson.loads(j))  # type: ignore[arg-type]
        assert "json_nulls" not in rec
    if a is not UNCHANGED:
        assert rec["new"]["a"] == {None: None, "{1,2,NULL}": [1, 2, None], "{}": []}[a]  # type: ignore[index]
