"""`pgrecv peek` through the SQL interface, against real servers, end to end."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import orjson
import psycopg
import pytest

from pgrecv.errors import ExitCode
from tests.util import err, pgrecv, sql


def setup_pgoutput(dsn: str, slot: str = "s") -> None:
    sql(dsn, "CREATE TABLE t (id int PRIMARY KEY, name text, amount numeric(10,2), doc jsonb)")
    assert pgrecv("create", "-d", dsn, "--slot", slot, "--publication", "pub").returncode == 0


def workload(dsn: str) -> None:
    sql(dsn, """INSERT INTO t VALUES (1, 'a', 1.50, '{"k": [1, 2]}'), (2, 'b''q', NULL, 'null')""")
    sql(dsn, "UPDATE t SET name = 'c' WHERE id = 1")
    sql(dsn, "DELETE FROM t WHERE id = 2")


def records(stdout: bytes) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in stdout.splitlines()]


def rows(recs: list[dict[str, object]]) -> list[dict[str, object]]:
    return [r for r in recs if r["op"] in ("insert", "update", "delete", "truncate")]


def test_pgoutput_jsonl_peek_then_consume(db_dsn: str) -> None:
    setup_pgoutput(db_dsn)
    workload(db_dsn)
    first = pgrecv("peek", "-d", db_dsn, "--slot", "s", "--format", "jsonl")
    assert first.returncode == 0, err(first)
    changes = rows(records(first.stdout))
    assert [c["op"] for c in changes] == ["insert", "insert", "update", "delete"]
    assert changes[0]["new"] == {"id": 1, "name": "a", "amount": "1.50", "doc": {"k": [1, 2]}}
    assert changes[1]["new"]["name"] == "b'q" and changes[1]["new"]["amount"] is None  # type: ignore[index]
    assert changes[1]["json_nulls"] == ["doc"]
    assert changes[3]["old"] == {"id": 2} or changes[3]["old"]["id"] == 2  # type: ignore[index]
    assert all(c["table"] == "t" and c["schema"] == "public" for c in changes)
    # peeking does not consume; the same records come again
    again = pgrecv("peek", "-d", db_dsn, "--slot", "s", "--format", "jsonl")
    assert again.stdout == first.stdout
    consumed = pgrecv("peek", "-d", db_dsn, "--slot", "s", "--format", "jsonl", "--consume")
    assert consumed.stdout == first.stdout
    empty = pgrecv("peek", "-d", db_dsn, "--slot", "s", "--format", "jsonl")
    assert empty.returncode == 0 and empty.stdout == b""


def test_test_decoding_jsonl(db_dsn: str) -> None:
    sql(db_dsn, "CREATE TABLE t (id int PRIMARY KEY, name text, amount numeric(10,2), doc jsonb)")
    assert pgrecv("create", "-d", db_dsn, "--slot", "td", "-P", "test_decoding").returncode == 0
    workload(db_dsn)
    proc = pgrecv("peek", "-d", db_dsn, "--slot", "td", "--format", "jsonl")
    assert proc.returncode == 0, err(proc)
    changes = rows(records(proc.stdout))
    assert [c["op"] for c in changes] == ["insert", "insert", "update", "delete"]
    assert changes[0]["new"] == {"id": 1, "name": "a", "amount": "1.50", "doc": {"k": [1, 2]}}
    assert all(isinstance(c["commit_lsn"], str) for c in changes)


def test_raw_is_what_the_plugin_wrote(db_dsn: str) -> None:
    sql(db_dsn, "CREATE TABLE t (id int PRIMARY KEY, name text)")
    assert pgrecv("create", "-d", db_dsn, "--slot", "td", "-P", "test_decoding").returncode == 0
    sql(db_dsn, "INSERT INTO t VALUES (1, 'x')")
    proc = pgrecv("peek", "-d", db_dsn, "--slot", "td", "--format", "raw")
    assert proc.returncode == 0, err(proc)
    expected = [r[0] for r in sql(db_dsn, "SELECT data FROM pg_logical_slot_peek_changes('td', NULL, NULL)")]
    assert proc.stdout.decode().splitlines() == expected
    assert expected[1] == "table public.t: INSERT: id[integer]:1 name[text]:'x'"


def test_raw_pgoutput_bytes(db_dsn: str) -> None:
    setup_pgoutput(db_dsn)
    sql(db_dsn, "INSERT INTO t (id) VALUES (1)")
    proc = pgrecv("peek", "-d", db_dsn, "--slot", "s", "--format", "raw", "-o", "proto_version=1")
    assert proc.returncode == 0, err(proc)
    expected = sql(
        db_dsn,
        "SELECT data FROM pg_logical_slot_peek_binary_changes('s', NULL, NULL, 'proto_version', '1', "
        "'publication_names', 'pub', 'messages', 'true')",
    )
    assert proc.stdout == b"".join(bytes(r[0]) + b"\n" for r in expected)
    assert proc.stdout[:1] == b"B"


def test_pretty_to_file_and_file_mode(db_dsn: str, tmp_path: Path) -> None:
    setup_pgoutput(db_dsn)
    workload(db_dsn)
    target = tmp_path / "out.txt"
    proc = pgrecv("peek", "-d", db_dsn, "--slot", "s", "--format", "pretty", "-f", str(target))
    assert proc.returncode == 0, err(proc)
    text = target.read_text()
    for word in ("insert", "update", "delete", "public.t"):
        assert word in text
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert os.listdir(tmp_path) == ["out.txt"]


def test_consume_does_not_advance_when_output_fails(db_dsn: str, tmp_path: Path) -> None:
    setup_pgoutput(db_dsn)
    workload(db_dsn)
    proc = pgrecv("peek", "-d", db_dsn, "--slot", "s", "--consume", "-f", str(tmp_path / "missing" / "out.jsonl"))
    assert proc.returncode == ExitCode.OUTPUT, err(proc)
    assert err(proc).count("\n") == 1
    still = pgrecv("peek", "-d", db_dsn, "--slot", "s", "--format", "jsonl")
    assert len(rows(records(still.stdout))) == 4


def test_consume_waits_for_complete_file(db_dsn: str, tmp_path: Path) -> None:
    setup_pgoutput(db_dsn)
    workload(db_dsn)
    target = tmp_path / "c.jsonl"
    proc = pgrecv("peek", "-d", db_dsn, "--slot", "s", "--consume", "-f", str(target))
    assert proc.returncode == 0, err(proc)
    assert len(rows(records(target.read_bytes()))) == 4
    assert pgrecv("peek", "-d", db_dsn, "--slot", "s").stdout == b""


def test_upto_nchanges_stops_at_transaction_boundary(db_dsn: str) -> None:
    setup_pgoutput(db_dsn)
    for i in range(5):
        sql(db_dsn, f"INSERT INTO t (id) SELECT g FROM generate_series({i * 3 + 1}, {i * 3 + 3}) g")
    # the limit counts messages and is checked after each transaction: never a cut transaction
    proc = pgrecv("peek", "-d", db_dsn, "--slot", "s", "--format", "jsonl", "--upto-nchanges", "2")
    recs = records(proc.stdout)
    ops = [r["op"] for r in recs]
    assert ops[-1] == "commit"
    assert ops.count("begin") == ops.count("commit") == 1
    assert [r["new"]["id"] for r in rows(recs)] == [1, 2, 3]
    proc = pgrecv("peek", "-d", db_dsn, "--slot", "s", "--format", "jsonl", "--upto-nchanges", "7")
    assert [r["op"] for r in records(proc.stdout)].count("commit") == 2


def test_upto_lsn(db_dsn: str) -> None:
    setup_pgoutput(db_dsn)
    sql(db_dsn, "INSERT INTO t (id) VALUES (1)")
    (mid,) = sql(db_dsn, "SELECT pg_current_wal_insert_lsn()::text")[0]
    sql(db_dsn, "INSERT INTO t (id) VALUES (2)")
    proc = pgrecv("peek", "-d", db_dsn, "--slot", "s", "--format", "jsonl", "--upto-lsn", mid)
    assert [r["new"] for r in rows(records(proc.stdout))] == [{"id": 1, "name": None, "amount": None, "doc": None}]


def test_publication_rules(db_dsn: str) -> None:
    sql(db_dsn, "CREATE TABLE t (id int PRIMARY KEY)")
    assert pgrecv("create", "-d", db_dsn, "--slot", "s").returncode == 0
    proc = pgrecv("peek", "-d", db_dsn, "--slot", "s")
    assert proc.returncode == ExitCode.PUBLICATION and "has none" in err(proc)
    sql(db_dsn, "CREATE PUBLICATION one FOR ALL TABLES")
    assert pgrecv("peek", "-d", db_dsn, "--slot", "s").returncode == 0
    sql(db_dsn, "CREATE PUBLICATION two FOR TABLE t")
    proc = pgrecv("peek", "-d", db_dsn, "--slot", "s")
    assert proc.returncode == ExitCode.PUBLICATION
    assert "one, two" in err(proc) and "--publication" in err(proc) and err(proc).count("\n") == 1
    assert pgrecv("peek", "-d", db_dsn, "--slot", "s", "--publication", "two").returncode == 0
    proc = pgrecv("peek", "-d", db_dsn, "--slot", "s", "--publication", "three")
    assert proc.returncode == ExitCode.PUBLICATION and "three" in err(proc)


def test_missing_slot(db_dsn: str) -> None:
    proc = pgrecv("peek", "-d", db_dsn, "--slot", "nope")
    assert proc.returncode == ExitCode.SLOT
    assert "does not exist" in err(proc) and "pgrecv create" in err(proc)


def test_binary_option(db_dsn: str) -> None:
    setup_pgoutput(db_dsn)
    workload(db_dsn)
    text = pgrecv("peek", "-d", db_dsn, "--slot", "s", "--format", "jsonl")
    binary = pgrecv("peek", "-d", db_dsn, "--slot", "s", "--format", "jsonl", "-o", "binary=true")
    assert binary.returncode == 0, err(binary)
    assert [r.get("new") for r in rows(records(binary.stdout))] == [r.get("new") for r in rows(records(text.stdout))]


def test_test_decoding_message_that_is_not_utf8(db_dsn: str) -> None:
    assert pgrecv("create", "-d", db_dsn, "--slot", "td", "-P", "test_decoding").returncode == 0
    sql(db_dsn, "SELECT pg_logical_emit_message(false, 'bin', '\\xff00fe'::bytea)")
    sql(db_dsn, "CREATE TABLE flush_wal ()")  # a commit flushes the WAL: the SQL interface reads up to the flush
    proc = pgrecv("peek", "-d", db_dsn, "--slot", "td", "--format", "jsonl")
    assert proc.returncode == 0, err(proc)
    (msg,) = [r for r in records(proc.stdout) if r["op"] == "message"]
    assert msg["content_encoding"] == "base64" and msg["content"] == "/wD+"
    raw = pgrecv("peek", "-d", db_dsn, "--slot", "td", "--format", "raw")
    assert b"content:\xff\x00\xfe\n" in raw.stdout


@pytest.mark.parametrize("fmt", ["jsonl", "pretty"])
def test_reader_going_away_consumes_nothing(db_dsn: str, fmt: str) -> None:
    """Pretty output too: rich's own answer to a broken pipe would be a silent exit 1. Fifty
    transactions of 100 rows: pretty output shows up to 200 rows of each, and all of it must be
    more than a pipe holds (64 KiB) for the writer to see the reader go."""
    import subprocess
    import sys

    setup_pgoutput(db_dsn)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        for g in range(0, 5000, 100):
            conn.execute(
                "INSERT INTO t (id, name) SELECT g, repeat('x', 100) FROM generate_series(%s::int, %s::int) g",
                (g + 1, g + 100),
            )
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgrecv", "peek", "-d", db_dsn, "--slot", "s", "--consume", "--format", fmt],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.read(1000)
    proc.stdout.close()  # like `| head -c 1000`
    code = proc.wait(60)
    stderr = proc.stderr.read().decode()
    assert code == ExitCode.OUTPUT, stderr
    assert stderr.count("\n") == 1 and "went away" in stderr
    still = pgrecv("peek", "-d", db_dsn, "--slot", "s", "--format", "jsonl")
    assert len(rows(records(still.stdout))) == 5000


FULL = "pgrecv: error: cannot write {}: No space left on device; the file system is full: free space, then run again"


@pytest.mark.parametrize("to_file", [False, True], ids=["stdout", "-f"])
@pytest.mark.parametrize("fmt", ["jsonl", "pretty", "raw", "debezium"])
def test_a_full_disk_is_one_line_and_consumes_nothing(db_dsn: str, fmt: str, to_file: bool) -> None:
    """Output onto a full file system (/dev/full): exit 8 and one line naming it, the slot not
    advanced. Standard output went through rich or a buffered write that let ENOSPC through as a
    traceback (exit 1) for every format."""
    import subprocess
    import sys

    setup_pgoutput(db_dsn)
    workload(db_dsn)
    args = ["peek", "-d", db_dsn, "--slot", "s", "--consume", "--format", fmt]
    with open("/dev/full", "wb") as full:
        proc = subprocess.run(
            [sys.executable, "-m", "pgrecv", *args, *(["-f", "/dev/full"] if to_file else [])],
            stdout=subprocess.DEVNULL if to_file else full,
            stderr=subprocess.PIPE,
            timeout=60,
        )
    stderr = proc.stderr.decode()
    assert proc.returncode == ExitCode.OUTPUT, stderr
    assert stderr.count("\n") == 1 and stderr.startswith(FULL.format("/dev/full" if to_file else "standard output"))
    still = pgrecv("peek", "-d", db_dsn, "--slot", "s", "--format", "jsonl")
    assert len(rows(records(still.stdout))) == 4


@pytest.mark.parametrize("args", [[], ["--format", "jsonl"], ["--format", "prometheus"], ["--check", "--max-lag", "1"]])
def test_slots_onto_a_full_disk_is_one_line(db_dsn: str, args: list[str]) -> None:
    import subprocess
    import sys

    setup_pgoutput(db_dsn)
    workload(db_dsn)  # the slot lags: --check has a line to print
    with open("/dev/full", "wb") as full:
        proc = subprocess.run(
            [sys.executable, "-m", "pgrecv", "slots", "-d", db_dsn, *args],
            stdout=full,
            stderr=subprocess.PIPE,
            timeout=60,
        )
    stderr = proc.stderr.decode()
    assert proc.returncode == ExitCode.OUTPUT, stderr
    assert stderr.count("\n") == 1 and stderr.startswith(FULL.format("standard output"))


def test_file_that_is_a_device_is_written_in_place(db_dsn: str, tmp_path: Path) -> None:
    """-f /dev/null or a FIFO: never replaced by a renamed temporary file."""
    import threading

    setup_pgoutput(db_dsn)
    workload(db_dsn)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    proc = pgrecv("peek", "-d", db_dsn, "--slot", "s", "--format", "jsonl", "-f", str(fifo))
    reader.join(30)
    assert proc.returncode == 0, err(proc)
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert len(rows(records(got[0]))) == 4
    assert sorted(os.listdir(tmp_path)) == ["pipe"]
    proc = pgrecv("peek", "-d", db_dsn, "--slot", "s", "-f", "/dev/null", "--consume")
    assert proc.returncode == 0, err(proc)
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_table_and_op_filters_are_the_stream_pipelines(db_dsn: str) -> None:
    """--table/--exclude-table/--op as `start` has them (pgrecv.stream.pipeline), for both plugins and raw output."""
    sql(db_dsn, "CREATE TABLE t (id int PRIMARY KEY, name text, amount numeric(10,2), doc jsonb)")
    sql(db_dsn, "CREATE TABLE other (id int PRIMARY KEY)")
    assert pgrecv("create", "-d", db_dsn, "--slot", "s", "--publication", "pub").returncode == 0
    assert pgrecv("create", "-d", db_dsn, "--slot", "td", "-P", "test_decoding").returncode == 0
    workload(db_dsn)
    sql(db_dsn, "INSERT INTO other VALUES (7)")
    sql(db_dsn, "TRUNCATE t, other")
    for slot in ("s", "td"):
        everything = rows(records(pgrecv("peek", "-d", db_dsn, "--slot", slot, "--format", "jsonl").stdout))
        assert {c["table"] for c in everything if "table" in c} == {"t", "other"}
        only_t = pgrecv("peek", "-d", db_dsn, "--slot", slot, "--format", "jsonl", "--table", "public.t")
        assert only_t.returncode == 0, err(only_t)
        changes = rows(records(only_t.stdout))
        assert [c["op"] for c in changes] == ["insert", "insert", "update", "delete", "truncate"]
        assert [(r["schema"], r["table"]) for r in changes[-1]["tables"]] == [("public", "t")]  # type: ignore[union-attr]
        proc = pgrecv("peek", "-d", db_dsn, "--slot", slot, "--format", "jsonl", "--exclude-table", "t", "--op=insert")
        assert proc.returncode == 0, err(proc)
        assert [(c["op"], c["table"]) for c in rows(records(proc.stdout))] == [("insert", "other")]
    raw = pgrecv("peek", "-d", db_dsn, "--slot", "td", "--format", "raw", "--op", "delete")
    assert raw.returncode == 0, err(raw)
    assert [line for line in raw.stdout.splitlines() if line.startswith(b"table ")] == [
        b"table public.t: DELETE: id[integer]:2"
    ]
    bad = pgrecv("peek", "-d", db_dsn, "--slot", "s", "--op", "upsert")
    assert bad.returncode == ExitCode.USAGE and b"unknown --op upsert" in bad.stderr
