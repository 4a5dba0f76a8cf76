"""`pgrecv start` over the replication protocol, against real PostgreSQL 15 and 18."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from pgrecv.errors import ExitCode
from pgrecv.lsn import LSN
from tests.util import Terminal, err, pgrecv, sql, wait_for


def spawn(
    *args: str, stdout: Any = subprocess.DEVNULL, stderr_path: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    stderr = open(stderr_path, "ab") if stderr_path else subprocess.DEVNULL  # noqa: SIM115
    return subprocess.Popen([sys.executable, "-m", "pgrecv", *args], stdout=stdout, stderr=stderr, env=env)


def records(data: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in data.splitlines()]


def committed(recs: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Complete transactions (begin..commit) in output order; rows of incomplete ones dropped."""
    out: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] | None = None
    for r in recs:
        if r["op"] == "begin":
            current = []
        elif r["op"] == "commit":
            if current is not None:
                out.append(current)
            current = None
        elif current is not None and r["op"] in ("insert", "update", "delete", "truncate"):
            current.append(r)
    return out


def slot_info(dsn: str, slot: str) -> dict[str, Any]:
    rows = sql(
        dsn, "SELECT confirmed_flush_lsn::text, active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,)
    )
    return {"confirmed": LSN.parse(rows[0][0]), "active_pid": rows[0][1]}


def commit_ends(dsn: str, slot: str, upto: int | None = None) -> list[LSN]:
    """End LSNs of the pending transactions (test_decoding prints COMMIT at the commit's end); the
    server stops decoding after the transaction that brings its lines to ``upto``."""
    query = "SELECT lsn::text FROM pg_logical_slot_peek_changes(%s, NULL, %s) WHERE data LIKE 'COMMIT%%'"
    return [LSN.parse(lsn) for (lsn,) in sql(dsn, query, (slot, upto))]


@pytest.fixture
def table(db_dsn: str) -> str:
    sql(db_dsn, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    sql(db_dsn, "CREATE PUBLICATION pub FOR ALL TABLES")
    return db_dsn


def insert_txns(dsn: str, first: int, count: int, rows: int = 3) -> None:
    for i in range(first, first + count):
        sql(dsn, f"INSERT INTO t SELECT {i} * 1000 + g, 'v' FROM generate_series(1, {rows}) g")


def test_until_caught_up_confirms_last_durable_commit(table: str, tmp_path: Path) -> None:
    assert pgrecv("create", "-d", table, "--slot", "s").returncode == 0
    assert pgrecv("create", "-d", table, "--slot", "probe", "-P", "test_decoding").returncode == 0
    insert_txns(table, 1, 5)
    ends = commit_ends(table, "probe")
    out = tmp_path / "out.jsonl"
    proc = pgrecv("start", "-d", table, "--slot", "s", "-f", str(out), "--until-caught-up", "-v")
    assert proc.returncode == 0, err(proc)
    txns = committed(records(out.read_bytes()))
    assert [len(t) for t in txns] == [3] * 5
    assert slot_info(table, "s")["confirmed"] == ends[-1]
    assert "caught up" in err(proc)


def test_endpos_and_startpos_exact(table: str, tmp_path: Path) -> None:
    assert pgrecv("create", "-d", table, "--slot", "s", "-P", "test_decoding").returncode == 0
    insert_txns(table, 1, 3, rows=1)
    ends = commit_ends(table, "s")
    out = tmp_path / "a.txt"
    proc = pgrecv("start", "-d", table, "--slot", "s", "-f", str(out), "--format", "raw", "-E", str(ends[1]))
    assert proc.returncode == 0, err(proc)
    lines = out.read_text().splitlines()
    assert [ln.split()[0] for ln in lines] == ["BEGIN", "table", "COMMIT"] * 2
    # the slot was confirmed up to the end position, so the next run starts with transaction 3
    out2 = tmp_path / "b.txt"
    proc = pgrecv("start", "-d", table, "--slot", "s", "-f", str(out2), "--format", "raw", "-E", str(ends[2]))
    assert proc.returncode == 0, err(proc)
    assert "id[integer]:3001" in out2.read_text() and "1001" not in out2.read_text()


def test_startpos_skips_earlier_transactions(table: str, tmp_path: Path) -> None:
    assert pgrecv("create", "-d", table, "--slot", "s", "-P", "test_decoding").returncode == 0
    insert_txns(table, 1, 3, rows=1)
    ends = commit_ends(table, "s")
    out = tmp_path / "a.txt"
    proc = pgrecv(
        "start", "-d", table, "--slot", "s", "-f", str(out), "--format", "raw", "-I", str(ends[0]), "-E", str(ends[2])
    )
    assert proc.returncode == 0, err(proc)
    text = out.read_text()
    assert "1001" not in text and "2001" in text and "3001" in text


def test_sigterm_sends_final_feedback(table: str, tmp_path: Path) -> None:
    assert pgrecv("create", "-d", table, "--slot", "s").returncode == 0
    assert pgrecv("create", "-d", table, "--slot", "probe", "-P", "test_decoding").returncode == 0
    out = tmp_path / "out.jsonl"
    # long intervals: only the final status update can move the slot
    proc = spawn("start", "-d", table, "--slot", "s", "-f", str(out), "-F", "1h", "-s", "1h")
    try:
        wait_for(lambda: slot_info(table, "s")["active_pid"] is not None, what="streaming")
        insert_txns(table, 1, 4)
        wait_for(lambda: out.exists() and out.read_bytes().count(b'"op":"commit"') == 4, what="output")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        proc.kill()
    assert slot_info(table, "s")["confirmed"] == commit_ends(table, "probe")[-1]


def test_reconnects_after_walsender_terminated(table: str, tmp_path: Path) -> None:
    assert pgrecv("create", "-d", table, "--slot", "s").returncode == 0
    out, log = tmp_path / "out.jsonl", tmp_path / "log"
    proc = spawn("start", "-d", table, "--slot", "s", "-f", str(out), "-F", "100ms", "-s", "100ms", stderr_path=log)
    try:
        wait_for(lambda: slot_info(table, "s")["active_pid"] is not None, what="streaming")
        insert_txns(table, 1, 3)
        wait_for(lambda: out.exists() and out.read_bytes().count(b'"op":"commit"') == 3, what="first output")
        sql(table, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 's'")
        insert_txns(table, 4, 3)
        wait_for(lambda: out.read_bytes().count(b'"op":"commit"') >= 6, timeout=60, what="output after reconnect")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    finally:
        proc.kill()
    txns = committed(records(out.read_bytes()))
    ids = sorted(r["new"]["id"] for t in txns for r in t)
    assert ids == sorted(i * 1000 + g for i in range(1, 7) for g in range(1, 4))
    assert "reconnecting" in log.read_text()


def test_no_loop_exits_with_distinct_code(table: str, tmp_path: Path) -> None:
    assert pgrecv("create", "-d", table, "--slot", "s").returncode == 0
    log = tmp_path / "log"
    proc = spawn("start", "-d", table, "--slot", "s", "-f", str(tmp_path / "o"), "--no-loop", stderr_path=log)
    try:
        wait_for(lambda: slot_info(table, "s")["active_pid"] is not None, what="streaming")
        sql(table, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 's'")
        assert proc.wait(30) == ExitCode.STREAM_LOST
    finally:
        proc.kill()
    text = log.read_text()
    assert "--no-loop" in text and "Traceback" not in text


def test_reconnects_after_server_restart(pg_server: Any, tmp_path: Path) -> None:
    from pgrecv.pg.server import TempServer

    with TempServer(pg_server.install) as server:
        dsn = server.dsn()
        sql(dsn, "CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION pub FOR ALL TABLES")
        assert pgrecv("create", "-d", dsn, "--slot", "s").returncode == 0
        out, log = tmp_path / "out.jsonl", tmp_path / "log"
        proc = spawn("start", "-d", dsn, "--slot", "s", "-f", str(out), "-F", "100ms", "-s", "100ms", stderr_path=log)
        try:
            wait_for(lambda: slot_info(dsn, "s")["active_pid"] is not None, what="streaming")
            insert_txns(dsn, 1, 2)
            wait_for(lambda: out.exists() and out.read_bytes().count(b'"op":"commit"') == 2, what="first output")
            server.restart()
            insert_txns(dsn, 3, 2)
            wait_for(lambda: out.read_bytes().count(b'"op":"commit"') >= 4, timeout=90, what="output after restart")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
        finally:
            proc.kill()
    ids = sorted(r["new"]["id"] for t in committed(records(out.read_bytes())) for r in t)
    assert ids == sorted(i * 1000 + g for i in range(1, 5) for g in range(1, 4))


def test_sighup_reopens_file(table: str, tmp_path: Path) -> None:
    assert pgrecv("create", "-d", table, "--slot", "s").returncode == 0
    out = tmp_path / "out.jsonl"
    proc = spawn("start", "-d", table, "--slot", "s", "-f", str(out), "-F", "100ms")
    try:
        wait_for(lambda: slot_info(table, "s")["active_pid"] is not None, what="streaming")
        insert_txns(table, 1, 1)
        wait_for(lambda: out.exists() and b'"op":"commit"' in out.read_bytes(), what="first output")
        out.rename(tmp_path / "out.jsonl.1")
        proc.send_signal(signal.SIGHUP)
        wait_for(out.exists, what="reopened file")
        insert_txns(table, 2, 1)
        wait_for(lambda: b'"op":"commit"' in out.read_bytes(), what="output in the new file")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        proc.kill()
    old = committed(records((tmp_path / "out.jsonl.1").read_bytes()))
    new = committed(records(out.read_bytes()))
    assert [r["new"]["id"] for t in old for r in t] == [1001, 1002, 1003]
    assert [r["new"]["id"] for t in new for r in t] == [2001, 2002, 2003]


WRITER = """
import sys, psycopg
with psycopg.connect(sys.argv[1], autocommit=True) as c:
    for i in range(1, 301):
        c.execute(f"INSERT INTO t SELECT {i} * 1000 + g, repeat('x', 200) FROM generate_series(1, 20) g")
"""


def test_kill_9_then_restart_exactly_once(table: str, tmp_path: Path) -> None:
    """Crash at random moments while a workload runs; the output holds every transaction once."""
    assert pgrecv("create", "-d", table, "--slot", "s").returncode == 0
    out = tmp_path / "out.jsonl"
    rnd = random.Random(int(os.environ.get("PGRECV_TEST_SEED", "7")))
    writer = subprocess.Popen([sys.executable, "-c", WRITER, table])
    try:
        for _ in range(6):
            proc = spawn("start", "-d", table, "--slot", "s", "-f", str(out), "-F", "50ms", "-s", "50ms")
            time.sleep(rnd.uniform(0.3, 1.2))
            proc.kill()
            proc.wait()
        assert writer.wait(120) == 0
    finally:
        writer.kill()
    proc = subprocess.run(
        [sys.executable, "-m", "pgrecv", "start", "-d", table, "--slot", "s", "-f", str(out), "--until-caught-up"],
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    recs = records(out.read_bytes())
    txns = committed(recs)
    commit_lsns = [r["commit_lsn"] for r in recs if r["op"] == "commit"]
    assert len(commit_lsns) == len(set(commit_lsns)) == 300
    ids = [r["new"]["id"] for t in txns for r in t]
    assert len(ids) == len(set(ids)) == 300 * 20
    assert recs[-1]["op"] == "commit"


def test_large_streamed_transaction_with_rolled_back_savepoint(table: str, tmp_path: Path) -> None:
    from psycopg.conninfo import make_conninfo

    assert pgrecv("create", "-d", table, "--slot", "s").returncode == 0
    with __import__("psycopg").connect(table, autocommit=True) as conn:
        with conn.transaction():
            conn.execute("INSERT INTO t SELECT g, repeat('a', 100) FROM generate_series(1, 5000) g")
            conn.execute("SAVEPOINT sp")
            conn.execute("INSERT INTO t SELECT g, 'rolled back' FROM generate_series(100001, 103000) g")
            conn.execute("ROLLBACK TO SAVEPOINT sp")
            conn.execute("INSERT INTO t SELECT g, 'b' FROM generate_series(200001, 202000) g")
        conn.execute("INSERT INTO t VALUES (999999, 'small')")
    small_mem = make_conninfo(table, options="-c logical_decoding_work_mem=64kB")
    out = tmp_path / "out.jsonl"
    proc = pgrecv(
        "start", "-d", small_mem, "--slot", "s", "-f", str(out), "--until-caught-up", "--streaming", "on", "-vv"
    )
    assert proc.returncode == 0, err(proc)
    txns = committed(records(out.read_bytes()))
    assert [len(t) for t in txns] == [7000, 1]
    ids = [r["new"]["id"] for r in txns[0]]
    assert ids == list(range(1, 5001)) + list(range(200001, 202001))
    assert all(r["commit_lsn"] for r in txns[0])


def test_two_phase_commit_and_rollback(table: str, tmp_path: Path) -> None:
    assert pgrecv("create", "-d", table, "--slot", "s", "--two-phase").returncode == 0
    with __import__("psycopg").connect(table, autocommit=True) as conn:
        conn.execute("BEGIN; INSERT INTO t VALUES (1, 'keep'); PREPARE TRANSACTION 'g1'")
        conn.execute("BEGIN; INSERT INTO t VALUES (2, 'drop'); PREPARE TRANSACTION 'g2'")
        conn.execute("COMMIT PREPARED 'g1'")
        conn.execute("ROLLBACK PREPARED 'g2'")
    out = tmp_path / "out.jsonl"
    proc = pgrecv("start", "-d", table, "--slot", "s", "-f", str(out), "--two-phase", "--until-caught-up")
    assert proc.returncode == 0, err(proc)
    recs = records(out.read_bytes())
    ops = [r["op"] for r in recs if r["op"] != "relation"]
    assert ops == [
        "begin_prepare", "insert", "prepare",
        "begin_prepare", "insert", "prepare",
        "commit_prepared", "rollback_prepared",
    ]  # fmt: skip
    gids = [r.get("gid") for r in recs if r["op"] in ("prepare", "commit_prepared", "rollback_prepared")]
    assert gids == ["g1", "g2", "g1", "g2"]


def test_idle_slot_advances_while_another_database_writes(pg_server: Any, table: str, tmp_path: Path) -> None:
    assert pgrecv("create", "-d", table, "--slot", "idle").returncode == 0
    before = slot_info(table, "idle")["confirmed"]
    proc = spawn("start", "-d", table, "--slot", "idle", "-f", str(tmp_path / "o"), "-F", "100ms", "-s", "100ms")
    try:
        other = pg_server.dsn("postgres")
        sql(other, "CREATE TABLE IF NOT EXISTS busy_elsewhere (x int)")
        for _ in range(20):
            sql(other, "INSERT INTO busy_elsewhere SELECT generate_series(1, 100)")
            time.sleep(0.05)
        wait_for(lambda: slot_info(table, "idle")["confirmed"] > before, timeout=30, what="idle slot to advance")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def test_rotated_files_never_seen_half_written(table: str, tmp_path: Path) -> None:
    assert pgrecv("create", "-d", table, "--slot", "s").returncode == 0
    outdir = tmp_path / "out"
    proc = spawn(
        "start", "-d", table, "--slot", "s", "--output-dir", str(outdir), "--rotate-size", "20kB", "-F", "200ms"
    )
    seen: dict[str, bytes] = {}
    try:
        wait_for(lambda: slot_info(table, "s")["active_pid"] is not None, what="streaming")
        for i in range(1, 41):
            insert_txns(table, i, 1, rows=30)
            for f in sorted(outdir.glob("*.jsonl")) if outdir.exists() else []:
                data = f.read_bytes()
                seen.setdefault(f.name, data)
                assert data == seen[f.name], f"{f.name} changed after it appeared"
                recs = records(data)
                assert recs[-1]["op"] == "commit", f"{f.name} ends inside a transaction"
                assert recs[0]["op"] in ("relation", "begin")

        def all_final() -> bool:
            data = b"".join(f.read_bytes() for f in outdir.glob("*.jsonl"))
            return data.count(b'"op":"commit"') == 40

        wait_for(all_final, what="every transaction in a final file")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        proc.kill()
    files = sorted(outdir.glob("*.jsonl"))
    assert files == sorted(files, key=lambda p: int(p.name.split("-")[0], 16))
    ids = [r["new"]["id"] for f in files for t in committed(records(f.read_bytes())) for r in t]
    assert ids == [i * 1000 + g for i in range(1, 41) for g in range(1, 31)]
    leftovers = [p.name for p in outdir.iterdir() if not p.name.endswith(".jsonl")]
    assert sorted(leftovers) == [".pgrecv-state", ".pgrecv.lock"]  # no temporary file left behind
    for f in files:  # self-describing: each file has the relation record before the rows that need it
        known: set[tuple[str, str]] = set()
        for r in records(f.read_bytes()):
            if r["op"] == "relation":
                known.add((r["schema"], r["table"]))
            elif r["op"] in ("insert", "update", "delete"):
                assert (r["schema"], r["table"]) in known, f"{f.name}: row before its relation record"


def test_filters(table: str, tmp_path: Path) -> None:
    sql(table, "CREATE TABLE other (id int PRIMARY KEY)")
    assert pgrecv("create", "-d", table, "--slot", "s").returncode == 0
    sql(table, "INSERT INTO t VALUES (1, 'a'); INSERT INTO other VALUES (1)")
    sql(table, "UPDATE t SET v = 'b'; DELETE FROM other")
    out = tmp_path / "o.jsonl"
    proc = pgrecv(
        "start",
        "-d",
        table,
        "--slot",
        "s",
        "-f",
        str(out),
        "--until-caught-up",
        "--table",
        "public.t",
        "--op",
        "update",
    )
    assert proc.returncode == 0, err(proc)
    rows = [r for r in records(out.read_bytes()) if r["op"] in ("insert", "update", "delete")]
    assert [(r["op"], r["table"]) for r in rows] == [("update", "t")]
    bad = pgrecv("start", "-d", table, "--slot", "s", "--op", "upsert")
    assert bad.returncode == ExitCode.USAGE and "upsert" in err(bad)


def test_missing_slot_and_publication_errors(table: str) -> None:
    proc = pgrecv("start", "-d", table, "--slot", "nope")
    assert proc.returncode == ExitCode.SLOT and err(proc).count("\n") == 1
    sql(table, "DROP PUBLICATION pub")
    assert pgrecv("create", "-d", table, "--slot", "s").returncode == 0
    proc = pgrecv("start", "-d", table, "--slot", "s")
    assert proc.returncode == ExitCode.PUBLICATION and "has none" in err(proc)


def test_create_then_start(table: str, tmp_path: Path) -> None:
    out = tmp_path / "o.jsonl"
    proc = pgrecv("start", "-d", table, "--slot", "new", "--create", "-f", str(out), "--until-caught-up")
    assert proc.returncode == 0, err(proc)
    assert 'created slot "new" (pgoutput)' in err(proc)
    insert_txns(table, 1, 1)
    again = ("start", "-d", table, "--slot", "new", "--create", "--if-not-exists", "-f", str(out), "--until-caught-up")
    proc = pgrecv(*again)
    assert proc.returncode == 0, err(proc)
    assert [r["new"]["id"] for t in committed(records(out.read_bytes())) for r in t] == [1001, 1002, 1003]
    proc = pgrecv("start", "-d", table, "--slot", "new", "--create", "-f", str(out))
    assert proc.returncode == ExitCode.SLOT and "already exists" in err(proc)
    proc = pgrecv("start", "-d", table, "--slot", "new", "-P", "test_decoding")
    assert proc.returncode == ExitCode.USAGE and "--create" in err(proc)


def test_pretty_on_a_terminal_with_live_status(table: str) -> None:
    """On a terminal the default is tables plus a status line redrawn on stderr (a real pty here)."""
    import pty
    import select

    assert pgrecv("create", "-d", table, "--slot", "s").returncode == 0
    pid, fd = pty.fork()
    if pid == 0:  # child: stdout and stderr are the pty
        os.execv(sys.executable, [sys.executable, "-m", "pgrecv", "start", "-d", table, "--slot", "s", "-s", "200ms"])
    screen = b""
    try:
        wait_for(lambda: slot_info(table, "s")["active_pid"] is not None, what="streaming")
        sql(table, "INSERT INTO t VALUES (1, 'shown on the terminal')")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (b"shown on the terminal" in screen and b"durable" in screen):
            if select.select([fd], [], [], 0.2)[0]:
                try:
                    screen += os.read(fd, 65536)
                except OSError:
                    break
        os.kill(pid, signal.SIGINT)
        _, status = os.waitpid(pid, 0)
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    text = screen.decode(errors="replace")
    assert "shown on the terminal" in text and "public.t" in text and "insert" in text
    assert "received 0/" in text and "durable 0/" in text and "rows/s" in text
    assert os.waitstatus_to_exitcode(status) == 0


def test_no_replication_privilege_is_an_error_not_a_retry_loop(table: str, tmp_path: Path) -> None:
    from psycopg.conninfo import make_conninfo

    assert pgrecv("create", "-d", table, "--slot", "s").returncode == 0
    sql(table, "DROP ROLE IF EXISTS reader; CREATE ROLE reader LOGIN; GRANT SELECT ON t TO reader")
    try:
        proc = pgrecv("start", "-d", make_conninfo(table, user="reader"), "--slot", "s", "-f", str(tmp_path / "o"))
        assert proc.returncode == ExitCode.SERVER_CONFIG, err(proc)
        assert "reconnecting" not in err(proc) and "REPLICATION" in err(proc) and err(proc).count("\n") == 1
    finally:
        sql(table, "DROP OWNED BY reader; DROP ROLE reader")


@pytest.mark.parametrize("ask", ["-W", "when needed"])
def test_password_is_asked_once_across_reconnects(pg_server: Any, tmp_path: Path, ask: str) -> None:
    """pgrecv start opens a connection to check the slot, one to stream, and one more at each
    reconnect: the password typed at the first prompt serves them all, as with pg_recvlogical."""
    from psycopg.conninfo import make_conninfo

    from pgrecv.pg.server import TempServer

    hba = ["local all alice scram-sha-256", "local replication alice scram-sha-256"]
    with TempServer(pg_server.install, hba_lines=hba) as server:
        dsn = server.dsn()
        sql(dsn, "CREATE ROLE alice LOGIN REPLICATION PASSWORD 'Typed-s3cret'")
        sql(dsn, "CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION pub FOR ALL TABLES")
        assert pgrecv("create", "-d", dsn, "--slot", "s").returncode == 0
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["PGPASSFILE"] = str(tmp_path / "no-pgpass")
        out = tmp_path / "out.jsonl"
        args = ["start", "-d", make_conninfo(dsn, user="alice"), "--slot", "s", "-f", str(out), "-F", "100ms"]
        term = Terminal([*args, "-W"] if ask == "-W" else args, b"Typed-s3cret", env)
        try:
            wait_for(lambda: slot_info(dsn, "s")["active_pid"] is not None, what="streaming")
            insert_txns(dsn, 1, 2)
            wait_for(lambda: out.exists() and out.read_bytes().count(b'"op":"commit"') == 2, what="first output")
            sql(dsn, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 's'")
            insert_txns(dsn, 3, 2)
            wait_for(lambda: out.read_bytes().count(b'"op":"commit"') >= 4, timeout=60, what="output after reconnect")
            os.kill(term.pid, signal.SIGINT)
            assert term.wait(30) == 0, term.output.decode(errors="replace")
        finally:
            with contextlib.suppress(ProcessLookupError, ChildProcessError):
                os.kill(term.pid, signal.SIGKILL)
                term.wait(5)
    assert term.prompts == 1 and b"Typed-s3cret" not in term.output, term.output.decode(errors="replace")
    assert b"reconnecting" in term.output  # the reconnect did happen, without a prompt
    ids = sorted(r["new"]["id"] for t in committed(records(out.read_bytes())) for r in t)
    assert ids == sorted(i * 1000 + g for i in range(1, 5) for g in range(1, 4))


def _temporary(dsn: str, slot: str) -> list[tuple[Any, ...]]:
    return sql(dsn, "SELECT temporary, active_pid IS NOT NULL FROM pg_replication_slots WHERE slot_name = %s", (slot,))


def test_a_temporary_slot_streams_for_its_run_and_is_gone_after(table: str, tmp_path: Path) -> None:
    """--create --temporary: the slot is made on the streaming connection (TEMPORARY, active while
    the run streams), every change made meanwhile reaches the output, and nothing stays behind."""
    out, log = tmp_path / "out.jsonl", tmp_path / "log"
    args = ["--slot", "tmp", "--create", "--temporary", "--publication", "made", "-f", str(out), "-F", "100ms", "-v"]
    proc = spawn("start", "-d", table, *args, stderr_path=log)
    try:
        wait_for(lambda: _temporary(table, "tmp") == [(True, True)], what="the temporary slot, streaming")
        insert_txns(table, 1, 3)
        wait_for(lambda: out.exists() and out.read_bytes().count(b'"op":"commit"') == 3, what="output")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        proc.kill()
    ids = sorted(r["new"]["id"] for t in committed(records(out.read_bytes())) for r in t)
    assert ids == sorted(i * 1000 + g for i in range(1, 4) for g in range(1, 4))
    assert 'created temporary slot "tmp" (pgoutput)' in log.read_text()
    assert 'created publication "made" (FOR ALL TABLES)' in log.read_text()  # as --create makes one
    wait_for(lambda: _temporary(table, "tmp") == [], what="the slot to go with its session")


def test_a_temporary_slot_is_not_resumed_after_a_lost_connection(table: str, tmp_path: Path) -> None:
    """Its slot went with the connection: a new one would start past the changes made in between,
    so the run ends (exit 11) and says why, instead of reconnecting."""
    log = tmp_path / "log"
    proc = spawn("start", "-d", table, "--slot", "tmp", "--create", "--temporary", "-f", "-", stderr_path=log)
    try:
        wait_for(lambda: _temporary(table, "tmp") == [(True, True)], what="the temporary slot, streaming")
        sql(table, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 'tmp'")
        assert proc.wait(30) == ExitCode.STREAM_LOST
    finally:
        proc.kill()
    text = log.read_text()
    assert "the temporary slot ended with its connection, so pgrecv does not reconnect" in text, text
    assert "Traceback" not in text and "reconnecting in" not in text
    wait_for(lambda: _temporary(table, "tmp") == [], what="the slot to go with its session")


def test_a_temporary_slot_lost_before_its_stream_started_is_exit_11(
    table: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The connection lost after the temporary slot was made and before START_REPLICATION ran
    (the server ends the backend there: the test picks the moment, the server does the rest):
    the slot is gone all the same, so exit 11 and its reason, not "cannot connect" (exit 3). Until
    2026-12-05 that window gave exit 3, seen under load in the test above."""
    from pgrecv.cli.main import main
    from pgrecv.stream.connection import ReplicationConnection

    started = ReplicationConnection.start

    def start(self: ReplicationConnection, *args: Any) -> None:
        sql(table, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 'tmp'")
        wait_for(lambda: _temporary(table, "tmp") == [], what="the slot to go with its session")
        started(self, *args)

    monkeypatch.setattr(ReplicationConnection, "start", start)
    with pytest.raises(SystemExit) as exited:
        main(["start", "-d", table, "--slot", "tmp", "--create", "--temporary", "-f", str(tmp_path / "out.jsonl")])
    text = capsys.readouterr().err
    assert exited.value.code == ExitCode.STREAM_LOST, text
    assert "the temporary slot ended with its connection, so pgrecv does not reconnect" in text, text
    assert text.count("\n") <= 2 and "Traceback" not in text, text
    assert not (tmp_path / "out.jsonl").exists()  # nothing was streamed: no output made


@pytest.mark.parametrize(
    "case", ["slot exists", "no --create", "--if-not-exists", "publication of test_decoding", "output holds changes"]
)
def test_a_temporary_slot_that_cannot_serve_is_refused_before_it_is_made(table: str, tmp_path: Path, case: str) -> None:
    out = tmp_path / "out.jsonl"
    args = ["start", "-d", table, "--slot", "tmp", "--create", "--temporary", "-f", str(out), "-E", "0/1"]
    code, said = ExitCode.USAGE, "go with --create"
    if case == "slot exists":
        assert pgrecv("create", "-d", table, "--slot", "tmp").returncode == 0
        code, said = ExitCode.SLOT, 'replication slot "tmp" already exists: give the temporary slot another name'
    elif case == "no --create":
        args.remove("--create")
    elif case == "--if-not-exists":
        args.append("--if-not-exists")
        said = "--temporary makes a new slot that lives as long as this run: drop --if-not-exists"
    elif case == "publication of test_decoding":
        args += ["-P", "test_decoding", "--publication", "pub"]
        said = "--publication applies to the pgoutput plugin only, not test_decoding"
    else:  # a file a permanent slot's run wrote: a temporary slot would leave a gap after it
        assert pgrecv("create", "-d", table, "--slot", "perm").returncode == 0
        insert_txns(table, 1, 1)
        end = sql(table, "SELECT pg_current_wal_lsn()::text")[0][0]
        assert pgrecv("start", "-d", table, "--slot", "perm", "-f", str(out), "-E", end).returncode == 0
        code, said = ExitCode.POSITION, "a temporary slot starts at the server's current position"
    proc = pgrecv(*args)
    assert proc.returncode == code, err(proc)
    assert err(proc).count("\n") == 1 and said in err(proc), err(proc)
    assert [r[0] for r in sql(table, "SELECT temporary FROM pg_replication_slots WHERE slot_name = 'tmp'")] == (
        [False] if case == "slot exists" else []
    )
