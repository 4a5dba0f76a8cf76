"""The C receive loop for runs of row changes (``copyfast.pump``) against a real server: it must write
exactly what the per-message loop writes, take the bulk of the rows, and hand everything else back
(Begin, Commit, Relation, keepalives, streamed chunks, rows at the end position)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from pgrecv.cli.main import main
from pgrecv.native import copyfast
from pgrecv.output import sinks
from pgrecv.stream import streamer
from tests.util import spy_fdatasync, sql

pytestmark = pytest.mark.skipif(copyfast is None, reason="the C extension is not built or PGRECV_NO_NATIVE is set")

SCHEMA = """
CREATE TABLE a (id int PRIMARY KEY, v text, n numeric(12, 2), j jsonb, arr int[], big text);
ALTER TABLE a ALTER big SET STORAGE EXTERNAL;
CREATE TABLE b (k bigint, t timestamptz, f float8, p point);
ALTER TABLE b REPLICA IDENTITY FULL;
CREATE PUBLICATION pub FOR ALL TABLES;
"""


class Counting:
    """copyfast with its pump counted: the rows it took, and the messages it handed back."""

    def __init__(self) -> None:
        self.rows = 0
        self.handed = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(copyfast, name)

    def pump(self, *args: Any) -> tuple[int, bytes | None, int, int]:
        n, msg, rows, wal_end = copyfast.pump(*args)  # type: ignore[union-attr]
        self.rows += rows
        self.handed += n > 0
        return n, msg, rows, wal_end


def stream(dsn: str, slot: str, out: Path, *extra: str) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["start", "-d", dsn, "--slot", slot, "-f", str(out), "--no-loop", "-q", *extra])
    assert exited.value.code == 0


def both(dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *extra: str) -> tuple[bytes, Counting]:
    """The same backlog streamed from slot ``bulk`` through the pump and from slot ``loop``
    without it (the same encoder, one message per turn of the Python loop)."""
    counting = Counting()
    with monkeypatch.context() as m:
        m.setattr(streamer, "copyfast", counting)
        stream(dsn, "bulk", tmp_path / "bulk.jsonl", *extra)
    with monkeypatch.context() as m:
        m.setattr(streamer, "copyfast", None)
        stream(dsn, "loop", tmp_path / "loop.jsonl", *extra)
    bulk, loop = (tmp_path / "bulk.jsonl").read_bytes(), (tmp_path / "loop.jsonl").read_bytes()
    assert bulk == loop
    return bulk, counting


def workload(dsn: str) -> str:
    """Transactions that interleave tables, change a relation mid-stream, leave TOAST values
    unchanged, carry old images and a type the C encoder leaves to Python; returns the end LSN."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        with conn.transaction():  # rows of two tables in turn
            conn.execute(
                "DO $$ BEGIN FOR g IN 1..1500 LOOP "
                "INSERT INTO a VALUES (g, 'v' || g, g / 3.0, jsonb_build_object('g', g), ARRAY[g, -g], "
                "CASE WHEN g % 100 = 0 THEN repeat('x', 5000) END); "
                "INSERT INTO b VALUES (g, '2026-01-01'::timestamptz + g * interval '1 s', g / 7.0, point(g, -g)); "
                "END LOOP; END $$"
            )
        with conn.transaction():
            conn.execute("UPDATE a SET v = v || '!' WHERE id % 2 = 0")  # big unchanged: TOAST markers
            conn.execute("UPDATE b SET f = -f WHERE k % 3 = 0")  # full old images
            conn.execute("DELETE FROM a WHERE id % 5 = 0")
        conn.execute("ALTER TABLE a ADD COLUMN extra int DEFAULT 7")  # a new Relation message
        conn.execute("UPDATE a SET extra = id WHERE id < 400")
        for i in range(30):  # one-row transactions
            conn.execute("INSERT INTO a (id, v) VALUES (%s, 'small')", (10_000 + i,))
        conn.execute("TRUNCATE b")
        conn.execute("INSERT INTO b (k) SELECT g FROM generate_series(1, 300) g")
        return str(conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0])  # type: ignore[index]


def test_pump_writes_what_the_loop_writes(db_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sql(db_dsn, SCHEMA)
    for slot in ("bulk", "loop"):
        sql(db_dsn, "SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    end = workload(db_dsn)
    # the output's background syncs run during both streams (every 64 KiB here, 4 MiB by default)
    calls = spy_fdatasync(monkeypatch)
    monkeypatch.setattr(sinks, "WRITEBACK_BYTES", 64 << 10)
    out, counting = both(db_dsn, tmp_path, monkeypatch, "-E", end)
    assert sum(name == "pgrecv-sync" for name, _ in calls) >= 2, calls
    rows = sum(1 for line in out.splitlines() if line.startswith((b'{"v":1,"op":"insert"', b'{"v":1,"op":"update"')))
    rows += out.count(b'"op":"delete"')
    assert rows > 5000
    assert b'"unchanged_toast":["big"]' in out and b'"old_kind":"full"' in out and b'"extra":7' in out
    # the first row of each table in each transaction goes through the Python loop (it fills the
    # plans); every other row of the big transactions is the pump's
    assert counting.rows > rows - 200, (counting.rows, rows)
    assert counting.handed >= 30  # at least the one-row transactions' commits came back


def test_pump_stops_at_the_end_position_inside_a_transaction(
    db_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sql(db_dsn, SCHEMA)
    for slot in ("bulk", "loop", "peek"):
        sql(db_dsn, "SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    sql(db_dsn, "INSERT INTO b (k) SELECT g FROM generate_series(1, 3000) g")
    rows = [
        str(lsn)
        for lsn, data in sql(
            db_dsn,
            "SELECT lsn, data FROM pg_logical_slot_peek_binary_changes('peek', NULL, NULL, "
            "'proto_version', '1', 'publication_names', 'pub')",
        )
        if bytes(data)[:1] == b"I"
    ]
    middle = len(rows) // 2
    out, counting = both(db_dsn, tmp_path, monkeypatch, "-E", rows[middle])
    # the pump took rows, and none at or past the end position: the Python loop stops there
    assert 1000 < counting.rows <= middle, (counting.rows, middle)
    assert b'"op":"insert"' not in out  # the transaction was cut at the end: none of its rows stay


def test_pump_between_the_chunks_of_a_streamed_transaction(
    db_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plain transactions committed between the chunks of a large one, and rows after its
    reassembled replay: the plans the replay filled must not outlive it."""
    sql(db_dsn, SCHEMA)
    for slot in ("bulk", "loop"):
        sql(db_dsn, "SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    small_mem = make_conninfo(db_dsn, options="-c logical_decoding_work_mem=64kB")
    with psycopg.connect(small_mem, autocommit=True) as big:
        big.execute("BEGIN")
        for part in range(4):
            big.execute(
                "INSERT INTO a (id, v, j) SELECT g, 'streamed', '{\"k\": 1}' FROM generate_series(%s::int, %s::int) g",
                (part * 2000 + 1, part * 2000 + 2000),
            )

            def plain(part: int = part) -> None:
                with psycopg.connect(db_dsn, autocommit=True) as conn:
                    conn.execute(
                        "INSERT INTO b (k, f) SELECT g, g * 1.5 FROM generate_series(%s::int, %s::int) g",
                        (part * 100 + 1, part * 100 + 100),  # small enough not to be streamed
                    )

            t = threading.Thread(target=plain)
            t.start()
            t.join()
        big.execute("COMMIT")
        big.execute("INSERT INTO b (k) SELECT g FROM generate_series(90001, 90200) g")
        end = str(big.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0])  # type: ignore[index]
    out, counting = both(small_mem, tmp_path, monkeypatch, "-E", end, "--streaming", "on")
    assert out.count(b'"op":"insert"') == 8000 + 400 + 200
    assert b'"op":"stream_start"' not in out  # reassembled: the chunks became one transaction
    assert counting.rows >= 400  # the plain transactions' rows (the reassembled one is replayed in Python)
