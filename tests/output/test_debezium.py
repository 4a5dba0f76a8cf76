"""The Debezium encoder on the golden event streams, and its value encodings.

The reference for *which* rows are written and in what order is the JSONL encoder's output, read
back the way a consumer applies it: rows of a plain transaction as they come, streamed chunks at
their Stream Commit (minus aborted subtransactions), prepared rows at COMMIT PREPARED (none at
ROLLBACK PREPARED). The Debezium encoder must write exactly those rows, in that order, with the
same transaction ids, commit LSNs, row LSNs and keys.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgrecv import events as ev
from pgrecv.decode.pgoutput import PgOutputDecoder
from pgrecv.errors import DecodeError
from pgrecv.lsn import LSN
from pgrecv.output.debezium import DebeziumEncoder
from pgrecv.output.debezium_values import (
    DATE_INFINITY,
    TIMESTAMP_INFINITY,
    UNAVAILABLE,
    column_codec,
    epoch_days,
    epoch_micros,
    iso_interval,
    zoned_time,
    zoned_timestamp,
)
from pgrecv.output.jsonl import JsonlEncoder
from tests.decode.test_crosscheck import Golden, _load, _pgoutput_events, _test_decoding_events

GOLDEN = Path(__file__).parent.parent / "golden"
FILES = sorted(GOLDEN.glob("pg*/*.jsonl"))
OPS = {"insert": "c", "update": "u", "delete": "d"}


def _raw_events(g: Golden) -> Iterator[ev.Event]:
    """Decoded as they were captured: streamed chunks are not made whole first."""
    if g.meta["plugin"] == "pgoutput":
        parallel = g.meta["options"].get("streaming") == "parallel"
        decoder = PgOutputDecoder(int(g.meta["proto_version"]), streaming_parallel=True if parallel else None)
        for line in g.lines:
            yield decoder.decode(bytes.fromhex(line["data"]), int(LSN.parse(line["lsn"])))
        return
    yield from _test_decoding_events(g)


def _encode(events: Iterator[ev.Event], **kw: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int, int]:
    """(JSONL records, Debezium envelopes, JSONL's and Debezium's held-back count at the end)."""
    jout: list[bytes] = []
    dout: list[bytes] = []
    jenc = JsonlEncoder(jout.append)
    denc = DebeziumEncoder(dout.append, database="db", server="srv", clock=lambda: 1.5, **kw)
    for e in events:
        jenc.feed(e)
        denc.feed(e)
    jpending, dpending = jenc.close(), denc.close()
    for line in dout:
        assert line.endswith(b"\n") and line.count(b"\n") == 1
    return [orjson.loads(x) for x in jout], [orjson.loads(x) for x in dout], jpending, dpending


def _committed(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """JSONL records → the committed row changes in commit order, each with its commit LSN."""
    out: list[dict[str, Any]] = []
    streams: dict[int, list[dict[str, Any]]] = {}
    prepared: dict[str, list[dict[str, Any]]] = {}
    current: list[dict[str, Any]] | None = None
    stream_xid: int | None = None
    for r in records:
        op = r["op"]
        if op in ("insert", "update", "delete", "truncate", "message"):
            if op == "message" and (not r["transactional"] or (current is None and stream_xid is None)):
                # test_decoding with skip-empty-xacts prints a transaction holding only a message
                # without BEGIN/COMMIT: written as it comes, like a non-transactional one
                out.append({**r, "_commit": None, "_xid": None})
            elif stream_xid is not None:
                streams.setdefault(stream_xid, []).append(r)
            elif current is not None:
                current.append(r)
        elif op in ("begin", "begin_prepare"):
            current = []
        elif op == "commit":
            out += [{**x, "_commit": r["commit_lsn"], "_xid": r["xid"]} for x in current or []]
            current = None
        elif op == "prepare":
            prepared[r["gid"]] = current or []
            current = None
        elif op == "stream_start":
            stream_xid = r["xid"]
        elif op == "stream_stop":
            stream_xid = None
        elif op == "stream_commit":
            out += [{**x, "_commit": r["commit_lsn"], "_xid": r["xid"]} for x in streams.pop(r["xid"], [])]
        elif op == "stream_abort":
            if r["subxid"] == r["xid"]:
                streams.pop(r["xid"], None)
            else:
                streams[r["xid"]] = [x for x in streams.get(r["xid"], []) if x.get("xid") != r["subxid"]]
        elif op == "stream_prepare":
            prepared[r["gid"]] = streams.pop(r["xid"], [])
        elif op == "commit_prepared":
            out += [{**x, "_commit": r["commit_lsn"], "_xid": r["xid"]} for x in prepared.pop(r["gid"])]
        elif op == "rollback_prepared":
            prepared.pop(r["gid"], None)
    return out


def _lsn(text: str | None) -> int | None:
    return None if text is None else int(LSN.parse(text))


def _check_against_jsonl(records: list[dict[str, Any]], envelopes: list[dict[str, Any]]) -> None:
    expected = []
    for r in _committed(records):
        if r["op"] == "truncate":
            expected += [("t", t["schema"], t["table"], _lsn(r["_commit"]), r["_xid"], None) for t in r["tables"]]
        elif r["op"] == "message":
            content = r["content"].encode() if r["content_encoding"] == "utf8" else base64.b64decode(r["content"])
            b64 = base64.b64encode(content).decode()
            expected.append(("m", r["prefix"], b64, _lsn(r["_commit"]), None, None, None))
        else:
            image = r["new"] if r["op"] != "delete" else r["old"]
            key = None if image is None else {k: image.get(k) for k in r["key"] if k in image}
            where = (r["schema"], r["table"], _lsn(r["_commit"]), _lsn(r["lsn"]), r["_xid"])
            if r["op"] == "update" and r.get("old_kind") == "key":  # a key change: delete + create
                old_key = {k: r["old"].get(k) for k in r["key"] if k in r["old"]}
                expected += [("d", *where, old_key), ("c", *where, key)]
            else:
                expected.append((OPS[r["op"]], *where, key))
    got = []
    for e in envelopes:
        seq = orjson.loads(e["source"]["sequence"])
        commit = None if seq[0] is None else int(seq[0])
        if e["op"] == "m":
            got.append(("m", e["message"]["prefix"], e["message"]["content"], commit, None, None, None))
        elif e["op"] == "t":
            got.append(("t", e["source"]["schema"], e["source"]["table"], commit, e["source"]["txId"], None))
        else:
            image = e["after"] if e["op"] != "d" else e["before"]
            src = e["source"]
            got.append((e["op"], src["schema"], src["table"], commit, src["lsn"], src["txId"], image))
    assert [g[:6] for g in got] == [x[:6] for x in expected]
    # keys: integer and text keys are written the same way in both formats
    for g, x in zip(got, expected, strict=True):
        if x[0] in OPS.values() and x[6] is not None and all(isinstance(v, int | str) for v in x[6].values()):
            assert g[6] is not None and {k: g[6].get(k) for k in x[6]} == x[6], (g, x)


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_golden_streams_write_committed_rows_in_jsonl_order(path: Path) -> None:
    g = _load(path)
    records, envelopes, jpending, dpending = _encode(_raw_events(g))
    _check_against_jsonl(records, envelopes)
    for e in envelopes:
        src = e["source"]
        assert src["connector"] == "postgresql" and src["db"] == "db" and src["name"] == "srv"
        assert src["snapshot"] == "false" and src["xmin"] is None and e["ts_ms"] == 1500
        if e["op"] in ("c", "u", "d", "t") and src["txId"] is not None:
            assert e["transaction"]["id"] == f"{src['txId']}:{orjson.loads(src['sequence'])[0]}"
        if e["op"] == "c":
            assert e["before"] is None and isinstance(e["after"], dict)
        if e["op"] == "d":
            assert e["after"] is None
    # what JSONL holds back (an unfinished test_decoding transaction), Debezium holds back too; it
    # also holds prepared transactions whose outcome the capture does not show
    assert dpending >= jpending
    if "streaming" in g.meta["options"] and g.meta["plugin"] == "pgoutput":
        # made whole first (as `pgrecv start` does), the same rows come out
        _, whole, _, _ = _encode(_pgoutput_events(g))
        strip = [{**e, "source": {**e["source"], "lsn": None, "sequence": None}} for e in envelopes]
        assert [{**e, "source": {**e["source"], "lsn": None, "sequence": None}} for e in whole] == strip


def test_golden_every_op_kind_appears() -> None:
    ops: set[str] = set()
    for path in FILES:
        ops |= {e["op"] for e in _encode(_raw_events(_load(path)))[1]}
    assert ops == {"c", "u", "d", "t", "m"}


# --- hand-made streams: what is held back and what is dropped ---------------------------------

COLS = (
    ev.Column("id", 23, -1, "integer", True),
    ev.Column("v", 25, -1, "text", False),
    ev.Column("b", 17, -1, "bytea", False),
    ev.Column("a", 1007, -1, "integer[]", False),
)
REL = ev.Relation(16384, "public", "t", "d", COLS)


def _run(events: list[ev.Event], **kw: Any) -> list[dict[str, Any]]:
    out: list[bytes] = []
    enc = DebeziumEncoder(out.append, database="db", server="srv", clock=lambda: 2.0, **kw)
    for e in events:
        enc.feed(e)
    return [orjson.loads(x) for x in out]


def test_unchanged_toast_gets_debeziums_placeholder_per_type() -> None:
    envs = _run(
        [
            REL,
            ev.Begin(0x100, 0, 7),
            ev.Update(REL, ("1", ev.UNCHANGED, ev.UNCHANGED, ev.UNCHANGED), None, None, None, 0xF0),
            ev.Commit(0, 0x100, 0x108, 0),
        ]
    )
    (e,) = envs
    assert e["op"] == "u" and e["before"] is None
    assert e["after"] == {
        "id": 1,
        "v": UNAVAILABLE,
        "b": base64.b64encode(UNAVAILABLE.encode()).decode(),
        "a": [UNAVAILABLE],
    }
    assert e["source"]["lsn"] == 0xF0 and e["source"]["txId"] == 7
    assert e["transaction"] == {"id": f"7:{0x100}", "total_order": 1, "data_collection_order": 1}


def test_key_change_is_a_delete_and_a_create() -> None:
    d, c = _run(
        [
            REL,
            ev.Begin(0x100, 0, 7),
            ev.Update(REL, ("2", "x", None, "{1,NULL}"), ("1", None, None, None), "K"),
            ev.Commit(0, 0x100, 0x108, 0),
        ]
    )
    assert (d["op"], d["before"], d["after"]) == ("d", {"id": 1, "v": None, "b": None, "a": None}, None)
    assert (c["op"], c["before"], c["after"]) == ("c", None, {"id": 2, "v": "x", "b": None, "a": [1, None]})
    assert [d["transaction"]["total_order"], c["transaction"]["total_order"]] == [1, 2]


def test_streamed_chunks_wait_for_commit_and_aborts_drop_them() -> None:
    ins = [ev.Insert(REL, (str(i), "v", None, None), xid=x, lsn=i) for i, x in ((1, 10), (2, 11), (3, 10))]
    envs = _run(
        [
            ev.StreamStart(10, True),
            REL,
            ins[0],
            ins[1],
            ev.StreamStop(),
            ev.StreamAbort(10, 11),  # a rolled-back subtransaction: row 2 only
            ev.StreamStart(10, False),
            ins[2],
            ev.StreamStop(),
        ]
    )
    assert envs == []  # not committed yet
    events: list[ev.Event] = [
        ev.StreamStart(10, True),
        REL,
        ins[0],
        ins[1],
        ev.StreamStop(),
        ev.StreamAbort(10, 11),
        ev.StreamStart(10, False),
        ins[2],
        ev.StreamStop(),
        ev.StreamCommit(10, 0, 0x500, 0x508, 0),
        ev.StreamStart(12, True),
        ins[0],
        ev.StreamStop(),
        ev.StreamAbort(12, 12),
    ]
    envs = _run(events)
    assert [e["after"]["id"] for e in envs] == [1, 3]
    assert {e["source"]["txId"] for e in envs} == {10}
    assert [e["transaction"]["total_order"] for e in envs] == [1, 2]


def test_prepared_rows_wait_for_commit_prepared() -> None:
    row = ev.Insert(REL, ("1", "p", None, None), lsn=5)
    events: list[ev.Event] = [
        REL,
        ev.BeginPrepare(0x200, 0x208, 0, 20, "g1"),
        row,
        ev.Prepare(0, 0x200, 0x208, 0, 20, "g1"),
        ev.BeginPrepare(0x300, 0x308, 0, 21, "g2"),
        row,
        ev.Prepare(0, 0x300, 0x308, 0, 21, "g2"),
    ]
    assert _run(events) == []
    rollback = ev.RollbackPrepared(0, 0x308, 0x400, 0, 0, 21, "g2")
    envs = _run([*events, rollback, ev.CommitPrepared(0, 0x500, 0x508, 0, 20, "g1")])
    (e,) = envs
    assert e["source"]["txId"] == 20 and orjson.loads(e["source"]["sequence"]) == [str(0x500), "5"]


def test_commit_prepared_without_its_rows_is_an_error() -> None:
    with pytest.raises(DecodeError, match="prepared before this run"):
        _run([ev.CommitPrepared(0, 0x500, 0x508, 0, 20, "g1")])


def test_schema_block_wraps_the_payload() -> None:
    out: list[bytes] = []
    enc = DebeziumEncoder(out.append, database="db", server="srv", schemas=True, clock=lambda: 2.0)
    for e in [REL, ev.Begin(0x100, 0, 7), ev.Insert(REL, ("1", "x", "\\x00ff", "{1}")), ev.Commit(0, 0x100, 0x108, 0)]:
        enc.feed(e)
    (line,) = out
    doc = orjson.loads(line)
    assert set(doc) == {"schema", "payload"}
    assert doc["payload"]["after"] == {"id": 1, "v": "x", "b": "AP8=", "a": [1]}
    schema = doc["schema"]
    assert schema["name"] == "srv.public.t.Envelope"
    after = next(f for f in schema["fields"] if f["field"] == "after")
    assert [(f["field"], f["type"], f["optional"]) for f in after["fields"]] == [
        ("id", "int32", False),
        ("v", "string", True),
        ("b", "bytes", True),
        ("a", "array", True),
    ]


def test_snapshot_rows_are_op_r() -> None:
    out: list[bytes] = []
    enc = DebeziumEncoder(out.append, database="db", server="srv", clock=lambda: 3.0)
    assert enc.snapshot_rows(REL, [("1", "x", None, None), ("2", None, None, "{}")], 0x900) == 2
    envs = [orjson.loads(x) for x in out]
    assert [e["op"] for e in envs] == ["r", "r"]
    assert envs[1]["after"] == {"id": 2, "v": None, "b": None, "a": []}
    assert envs[0]["source"]["snapshot"] == "true" and envs[0]["source"]["lsn"] == 0x900
    assert envs[0]["source"]["ts_ms"] == 3000 and envs[0]["transaction"] is None


# --- values -------------------------------------------------------------------------------------


def _col(oid: int, name: str, typmod: int = -1) -> ev.Column:
    return ev.Column("c", oid, typmod, name, False)


def test_value_encodings_of_the_golden_types_row() -> None:
    g = _load(GOLDEN / "pg18" / "types.pgoutput.jsonl")
    envs = _encode(_raw_events(g))[1]
    after = next(e["after"] for e in envs if e["op"] == "c" and e["after"].get("id") == 1)
    assert after["c_numeric"] == "3.14159" and after["c_numeric_p"] == "12345.6789000000"
    assert after["c_date"] == (date(2026, 1, 2) - date(1970, 1, 1)).days
    assert after["c_ts"] == int(datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC).timestamp()) * 10**6 + 123_000
    assert after["c_ts3"] == int(datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC).timestamp()) * 10**3 + 123  # .123456
    assert after["c_tstz"] == "2026-01-01T21:34:05.123Z" and after["c_timetz"] == "01:04:05Z"
    assert after["c_time"] == ((3 * 60 + 4) * 60 + 5) * 10**6 + 123456
    assert after["c_interval"] == "P1Y2M3DT4H5M6.789S"
    assert after["c_bytea"] == base64.b64encode(b"\xde\xad\xbe\xef").decode()
    assert after["c_json"] == '{"a": [1, 2.5, "x"], "b": {"c": null}}'
    assert after["c_jsonb_arr"] == ['{"k": 1}', "null"]
    assert after["c_bit"] == base64.b64encode(bytes([0b1010])).decode() and after["c_money"] == "1234.56"
    assert after["c_point"]["x"] == 1.5 and after["c_point"]["y"] == -2.0
    row3 = next(e["after"] for e in envs if e["op"] == "c" and e["after"].get("id") == 3)
    assert row3["c_numeric"] == "NaN" and row3["c_date"] == -DATE_INFINITY - 1
    assert row3["c_ts"] == -9223372036832400000
    row4 = next(e["after"] for e in envs if e["op"] == "c" and e["after"].get("id") == 4)
    assert row4["c_ts"] == TIMESTAMP_INFINITY and row4["c_tstz"] == "infinity"
    # binary values give the same envelopes as text ones
    text_rows = [e["after"] for e in envs if e["op"] == "c"]
    gb = _load(GOLDEN / "pg18" / "binary.pgoutput.jsonl")
    assert gb.meta["options"].get("binary") == "true"
    gt = _load(GOLDEN / "pg18" / "binary_text.pgoutput.jsonl")
    binary = [e["after"] for e in _encode(_raw_events(gb))[1] if e["op"] == "c"]
    text = [e["after"] for e in _encode(_raw_events(gt))[1] if e["op"] == "c"]
    # except a user-defined type (the enum "e"): pgrecv knows no binary form for it and, as in
    # JSONL, writes the base64 of its send() bytes (for an enum, the label)
    enums = [(r.get("e"), t.get("e")) for r, t in zip(binary, text, strict=True)]
    assert ("c2Fk", "sad") in enums
    assert all(b is None or b == base64.b64encode(t.encode()).decode() for b, t in enums)
    assert [{**r, "e": None} for r in binary] == [{**r, "e": None} for r in text] and text_rows


def _pg_stamp(value: datetime, offset: timedelta | None) -> str:
    text = value.strftime("%Y-%m-%d %H:%M:%S")
    text = ("0" * (4 - len(text.split("-")[0]))) + text if not text[:4].isdigit() else text
    if value.microsecond:
        text += f".{value.microsecond:06d}".rstrip("0")
    if offset is not None:
        total = int(offset.total_seconds())
        sign = "+" if total >= 0 else "-"
        hh, rest = divmod(abs(total), 3600)
        text += f"{sign}{hh:02d}" + (f":{rest // 60:02d}" if rest else "")
    return text


@settings(max_examples=300, deadline=None)
@given(
    st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)),
    st.integers(-15 * 60, 15 * 60).map(lambda m: timedelta(minutes=m)),
)
def test_timestamps_match_pythons_calendar(value: datetime, offset: timedelta) -> None:
    naive = _pg_stamp(value, None)
    expected = (value - datetime(1970, 1, 1)) // timedelta(microseconds=1)
    assert epoch_micros(naive) == expected
    aware = value.replace(tzinfo=timezone(offset))
    us = epoch_micros(_pg_stamp(value, offset))
    assert us == (aware - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    assert epoch_days(naive[:10]) == (value.date() - date(1970, 1, 1)).days
    utc = aware.astimezone(UTC)
    if 1 <= utc.year <= 9999:
        stamp = zoned_timestamp(_pg_stamp(value, offset))
        assert datetime.fromisoformat(stamp.replace("Z", "+00:00")) == utc


@given(st.integers(1, 9999), st.integers(1, 12), st.integers(1, 28))
def test_bc_dates_continue_the_proleptic_calendar(year: int, month: int, day: int) -> None:
    # year N BC is astronomical year 1 - N: 0001-01-01 BC is 366 days (a leap year 0) before 0001-01-01
    ad = epoch_days(f"{year:04d}-{month:02d}-{day:02d}")
    bc = epoch_days(f"{year:04d}-{month:02d}-{day:02d} BC")
    assert bc < epoch_days("0001-01-01") <= ad
    if year == 1:
        assert epoch_days("0001-01-01") - epoch_days("0001-01-01 BC") == 366


@given(
    st.integers(-10**6, 10**6), st.integers(-11, 11), st.integers(-10**4, 10**4),
    st.integers(0, 10**6), st.integers(0, 59), st.integers(0, 59), st.integers(0, 999999), st.booleans(),
)  # fmt: skip
def test_intervals_keep_every_field(y: int, mo: int, d: int, h: int, mi: int, s: int, us: int, neg: bool) -> None:
    parts = []
    if y:
        parts.append(f"{y} year{'s' if abs(y) != 1 else ''}")
    if mo:
        parts.append(f"{mo} mon{'s' if abs(mo) != 1 else ''}")
    if d:
        parts.append(f"{d} day{'s' if abs(d) != 1 else ''}")
    clock = f"{'-' if neg else ''}{h:02d}:{mi:02d}:{s:02d}" + (f".{us:06d}".rstrip("0") if us else "")
    parts.append(clock)
    text = iso_interval(" ".join(parts))
    sign = -1 if neg else 1
    secs = s * 10**6 + us
    frac = f".{secs % 10**6:06d}".rstrip("0") if secs % 10**6 else ""
    want_s = ("-" if neg and secs else "") + str(secs // 10**6) + frac
    assert text == f"P{y}Y{mo}M{d}DT{sign * h}H{sign * mi}M{want_s}S"


@given(st.text())
def test_any_text_is_written_as_is(value: str) -> None:
    codec = column_codec(_col(25, "text"))
    assert orjson.loads(orjson.dumps(codec.text(value))) == value


@given(st.decimals(allow_nan=False, allow_infinity=False))
def test_numeric_is_exact_text(value: Any) -> None:
    text = format(value, "f")
    assert column_codec(_col(1700, "numeric")).text(text) == text


def test_times_and_precisions() -> None:
    assert column_codec(_col(1083, "time without time zone")).text("24:00:00") == 86_400_000_000
    assert column_codec(_col(1083, "time without time zone", 3)).text("00:00:01.5") == 1500
    assert column_codec(_col(1114, "timestamp without time zone", 0)).text("1970-01-01 00:00:01") == 1000
    assert zoned_time("23:59:59.999999-12") == "11:59:59.999999Z"
    assert column_codec(_col(1560, "bit", 1)).text("1") is True
    assert column_codec(_col(1186, "interval")).text("-178000000 years") == "P-178000000Y0M0DT0H0M0S"
    # test_decoding prints no typmod: µs, which loses nothing
    assert (
        column_codec(ev.Column("c", 0, -1, "timestamp without time zone", False)).text("1970-01-01 00:00:00.001")
        == 1000
    )
