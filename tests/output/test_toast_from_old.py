"""Unchanged TOAST values taken from the update's old image (issue 60), end to end on a real server.

Under REPLICA IDENTITY FULL the server sends an update's whole old row, TOASTed values inline,
while the new row marks a TOASTed value the update left alone as "unchanged, not sent". pgrecv puts
the old row's value in the new row: JSONL lists the column in ``toast_from_old`` (not in
``unchanged_toast``), Debezium's ``after`` carries the value instead of its placeholder. Under the
default identity nobody sent the value: JSONL lists it in ``unchanged_toast``, Debezium writes the
placeholder, as before. The native (C) and reference (PGRECV_NO_NATIVE=1) JSONL encoders write the
same bytes, and test_decoding's old key (every column, for a FULL table) fills the same way.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from pgrecv.output.debezium_values import UNAVAILABLE
from tests.util import err, pgrecv

SETUP = """
CREATE TABLE tf (id int PRIMARY KEY, n int, big text, bb bytea, j jsonb);
ALTER TABLE tf ALTER COLUMN big SET STORAGE EXTERNAL;
ALTER TABLE tf ALTER COLUMN bb SET STORAGE EXTERNAL;
ALTER TABLE tf ALTER COLUMN j SET STORAGE EXTERNAL;
ALTER TABLE tf REPLICA IDENTITY FULL;
CREATE TABLE td (id int PRIMARY KEY, n int, big text);
ALTER TABLE td ALTER COLUMN big SET STORAGE EXTERNAL;
CREATE PUBLICATION pub FOR ALL TABLES;
"""
BIG = "(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 200))"  # 6400 bytes, out of line
WORKLOAD = [
    f"""INSERT INTO tf SELECT i, 0, {BIG}, convert_to({BIG}, 'UTF8'),
            jsonb_build_object('doc', {BIG}, 'nothing', null) FROM generate_series(1, 3) i""",
    f"INSERT INTO td SELECT i, 0, {BIG} FROM generate_series(1, 2) i",
    "UPDATE tf SET n = n + 1",  # every TOASTed value unchanged
    "UPDATE td SET n = n + 1",
    "UPDATE tf SET n = n + 1, big = 'short now' WHERE id = 2",  # bb and j unchanged, big sent
    "UPDATE tf SET id = 30 WHERE id = 3",  # a key change (one update under FULL identity)
    "UPDATE tf SET j = 'null' WHERE id = 1; UPDATE tf SET n = 9 WHERE id = 1",  # a JSON null filled
    "DELETE FROM tf WHERE id = 2",
]
# the columns each update of tf takes from its old image: all three; all but the big text set; all
# three (a key change); the two left when j becomes 'null' (small: sent), and those two again
FROM_OLD = [["big", "bb", "j"]] * 3 + [["bb", "j"], ["big", "bb", "j"], ["big", "bb"], ["big", "bb"]]
SLOTS = ("s_native", "s_python", "s_debezium", "s_debezium_py", "s_testdec")


@pytest.fixture
def changes(db_conn: psycopg.Connection[Any]) -> Iterator[psycopg.Connection[Any]]:
    db_conn.execute(SETUP)
    for slot in SLOTS:
        plugin = "test_decoding" if slot == "s_testdec" else "pgoutput"
        db_conn.execute("SELECT pg_create_logical_replication_slot(%s, %s)", [slot, plugin])
    try:
        for statement in WORKLOAD:
            with db_conn.transaction():
                db_conn.execute(statement)
        yield db_conn
    finally:
        for slot in SLOTS:
            db_conn.execute("SELECT pg_drop_replication_slot(%s)", [slot])


def _start(dsn: str, slot: str, out: Path, *args: str, env: dict[str, str] | None = None) -> bytes:
    proc = pgrecv("start", "-d", dsn, "-S", slot, "-f", str(out), "--until-caught-up", *args, env=env)
    assert proc.returncode == 0, err(proc)
    return out.read_bytes()


def _expected(conn: psycopg.Connection[Any]) -> dict[str, dict[int, dict[str, Any]]]:
    """The tables as PostgreSQL has them, in JSONL's values."""
    out: dict[str, dict[int, dict[str, Any]]] = {"tf": {}, "td": {}}
    for rid, n, big, bb, j in conn.execute("SELECT id, n, big, bb, j::text FROM tf"):
        out["tf"][rid] = {"id": rid, "n": n, "big": big, "bb": base64.b64encode(bb).decode(), "j": orjson.loads(j)}
    for rid, n, big in conn.execute("SELECT id, n, big FROM td"):
        out["td"][rid] = {"id": rid, "n": n, "big": big}
    return out


def _replay(records: list[dict[str, Any]], key: str = "id") -> dict[str, dict[int, dict[str, Any]]]:
    """Apply the row records by key, each update's new image over the row (columns absent from it,
    its unchanged_toast, keep the row's value)."""
    state: dict[str, dict[int, dict[str, Any]]] = {"tf": {}, "td": {}}
    for r in records:
        rows = state.get(r.get("table", ""))
        if rows is None:
            continue
        if r["op"] == "insert":
            rows[r["new"][key]] = dict(r["new"])
        elif r["op"] == "update":
            old_key = r["new"][key] if r["old"] is None else r["old"][key]
            row = rows.pop(old_key)
            row.update(r["new"])
            rows[r["new"][key]] = row
        elif r["op"] == "delete":
            del rows[r["old"][key]]
    return state


def _unwritten(event: dict[str, Any]) -> dict[str, Any]:
    """A Debezium envelope without the times it was written at (``ts_ms`` and friends) and the slot's
    name (``source.name``)."""
    out = {k: v for k, v in event.items() if k not in ("ts_ms", "ts_us", "ts_ns")}
    out["source"] = {k: v for k, v in event["source"].items() if k != "name"}
    return out


def test_jsonl_native_and_reference_take_the_old_images_values(
    changes: psycopg.Connection[Any], db_dsn: str, tmp_path: Path
) -> None:
    native = _start(db_dsn, "s_native", tmp_path / "native.jsonl")
    python = _start(db_dsn, "s_python", tmp_path / "python.jsonl", env={"PGRECV_NO_NATIVE": "1"})
    assert native == python
    records = [orjson.loads(line) for line in native.splitlines()]
    updates = {t: [r for r in records if r["op"] == "update" and r["table"] == t] for t in ("tf", "td")}
    assert len(updates["tf"]) == 7 and len(updates["td"]) == 2
    # FULL identity: nothing left out, the unchanged TOAST columns named in toast_from_old
    for r in updates["tf"]:
        assert r["unchanged_toast"] == [] and set(r["new"]) == {"id", "n", "big", "bb", "j"}, r
        assert r["old_kind"] == "full"
        assert all(r["new"][c] == r["old"][c] for c in r["toast_from_old"]), r
    from_old = [r["toast_from_old"] for r in updates["tf"]]
    assert from_old == FROM_OLD, from_old
    # a JSON null document in the new image (sent) and the old image alike
    assert updates["tf"][-1]["new"]["j"] is None and updates["tf"][-1]["json_nulls"] == ["j"]
    # default identity: nobody sent the value
    for r in updates["td"]:
        assert r["unchanged_toast"] == ["big"] and "big" not in r["new"] and "toast_from_old" not in r, r
    assert _replay(records) == _expected(changes)
    assert len(_expected(changes)["tf"][1]["big"]) == 6400


def test_test_decoding_takes_the_old_keys_values(changes: psycopg.Connection[Any], db_dsn: str, tmp_path: Path) -> None:
    """test_decoding prints a FULL table's whole old row as its "old-key": the same values are taken."""
    out = _start(db_dsn, "s_testdec", tmp_path / "td.jsonl")
    records = [orjson.loads(line) for line in out.splitlines()]
    tf = [r for r in records if r["op"] == "update" and r["table"] == "tf"]
    td = [r for r in records if r["op"] == "update" and r["table"] == "td"]
    assert [r["unchanged_toast"] for r in tf] == [[]] * 7
    assert [r["toast_from_old"] for r in tf] == FROM_OLD
    assert [r["unchanged_toast"] for r in td] == [["big"]] * 2
    # test_decoding leaves types it does not know as text; compare the columns it types alike
    state = _replay(records)
    expected = _expected(changes)
    for rid, row in expected["tf"].items():
        got = state["tf"][rid]
        assert (got["id"], got["n"], got["big"], got["j"]) == (rid, row["n"], row["big"], row["j"])
    assert state["td"] == expected["td"]


def test_debezium_after_carries_the_value_not_the_placeholder(
    changes: psycopg.Connection[Any], db_dsn: str, tmp_path: Path
) -> None:
    out = _start(db_dsn, "s_debezium", tmp_path / "dbz.jsonl", "--format", "debezium")
    events = [orjson.loads(line) for line in out.splitlines()]
    py = _start(db_dsn, "s_debezium_py", tmp_path / "py.jsonl", "--format", "debezium", env={"PGRECV_NO_NATIVE": "1"})
    # the same envelopes without the C extension, but for when each was written
    assert [_unwritten(e) for e in events] == [_unwritten(orjson.loads(line)) for line in py.splitlines()]
    tf = [e for e in events if e["source"]["table"] == "tf"]
    td = [e for e in events if e["source"]["table"] == "td"]
    assert UNAVAILABLE.encode() not in b"".join(orjson.dumps(e) for e in tf)
    assert [e["after"]["big"] for e in td if e["op"] == "u"] == [UNAVAILABLE] * 2
    # replacing whole rows by key, as Flink does, gives PostgreSQL's rows
    rows: dict[int, dict[str, Any]] = {}
    for e in tf:
        if e["before"] is not None:
            assert rows.pop(e["before"]["id"]) == e["before"]  # the retraction is the row held
        if e["after"] is not None:
            rows[e["after"]["id"]] = e["after"]
    expected = _expected(changes)["tf"]
    assert {k: (v["n"], v["big"], v["bb"]) for k, v in rows.items()} == {
        k: (v["n"], v["big"], v["bb"]) for k, v in expected.items()
    }
