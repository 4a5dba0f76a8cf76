"""Slots and publications against real servers."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import orjson
import pytest

from pgrecv.errors import ExitCode, ServerError
from pgrecv.pg.conn import ConnOptions
from pgrecv.pg.slots import create_slot
from tests.util import err, pgrecv, sql


def slot_rows(dsn: str) -> dict[str, dict[str, object]]:
    """The slots as `pgrecv slots` shows them, without ``safe_wal_size``: it shrinks as the shared
    server writes WAL for other tests (a comparison with it failed CI on 2026-12-05)."""
    proc = pgrecv("slots", "-d", dsn, "--format", "jsonl")
    assert proc.returncode == 0, err(proc)
    rows = [orjson.loads(line) for line in proc.stdout.splitlines()]
    return {r["slot_name"]: {k: v for k, v in r.items() if k != "safe_wal_size"} for r in rows}


def test_create_pgoutput_with_publication_for_all_tables(db_dsn: str) -> None:
    sql(db_dsn, "CREATE TABLE t (id int PRIMARY KEY)")
    proc = pgrecv("create", "-d", db_dsn, "--slot", "s1", "--publication", "p1")
    assert proc.returncode == 0, err(proc)
    assert 'created slot "s1" (pgoutput) at ' in err(proc)
    assert sql(db_dsn, "SELECT puballtables FROM pg_publication WHERE pubname = 'p1'") == [(True,)]
    row = slot_rows(db_dsn)["s1"]
    assert row["plugin"] == "pgoutput" and row["slot_type"] == "logical" and row["active"] is False
    assert isinstance(row["lag_bytes"], int) and isinstance(row["retained_bytes"], int)


def test_create_publication_for_listed_tables(db_dsn: str) -> None:
    sql(db_dsn, "CREATE SCHEMA app; CREATE TABLE app.a (id int PRIMARY KEY); CREATE TABLE b (id int PRIMARY KEY)")
    sql(db_dsn, "CREATE TABLE c (id int PRIMARY KEY)")
    proc = pgrecv("create", "-d", db_dsn, "--slot", "s1", "--publication", "p1", "--table", "app.a", "--table", "b")
    assert proc.returncode == 0, err(proc)
    tables = sql(db_dsn, "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = 'p1' ORDER BY 1, 2")
    assert tables == [("app", "a"), ("public", "b")]


def test_create_missing_table_in_publication(db_dsn: str) -> None:
    proc = pgrecv("create", "-d", db_dsn, "--slot", "s1", "--publication", "p1", "--table", "nope")
    assert proc.returncode == ExitCode.PUBLICATION, err(proc)
    assert "nope" in err(proc) and "Traceback" not in err(proc)
    assert "s1" not in slot_rows(db_dsn)


def test_create_existing_and_if_not_exists(db_dsn: str) -> None:
    assert pgrecv("create", "-d", db_dsn, "--slot", "s1", "-P", "test_decoding").returncode == 0
    proc = pgrecv("create", "-d", db_dsn, "--slot", "s1", "-P", "test_decoding")
    assert proc.returncode == ExitCode.SLOT
    assert err(proc).count("\n") == 1 and "already exists" in err(proc) and "--if-not-exists" in err(proc)
    proc = pgrecv("create", "-d", db_dsn, "--slot", "s1", "-P", "test_decoding", "--if-not-exists")
    assert proc.returncode == 0, err(proc)
    assert "already exists" in err(proc)
    proc = pgrecv("create", "-d", db_dsn, "--slot", "s1", "-P", "pgoutput", "--if-not-exists")
    assert proc.returncode == ExitCode.SLOT and "test_decoding" in err(proc)


def test_if_not_exists_takes_only_the_slot_asked_for(db_dsn: str, pg_server) -> None:  # type: ignore[no-untyped-def]
    """An existing slot that is not the one asked for would fail later or decode otherwise than
    asked: --if-not-exists refuses it, one line, exit 5, and makes nothing."""
    assert pgrecv("create", "-d", db_dsn, "--slot", "s1", "-P", "test_decoding").returncode == 0
    sql(db_dsn, "SELECT pg_create_physical_replication_slot('ph')")
    try:
        before = slot_rows(db_dsn)
        cases = [
            (["--slot", "s1", "-P", "test_decoding", "--two-phase"], "without two-phase decoding"),
            (["--slot", "ph", "-P", "test_decoding"], "physical slot"),
            (["--slot", "s1", "-P", "test_decoding", "-d", f"{db_dsn} dbname=postgres"], "exists in database"),
        ]
        if pg_server.version >= 17:
            cases.append((["--slot", "s1", "-P", "test_decoding", "--failover"], "without failover"))
        for args, says in cases:
            proc = pgrecv("create", "-d", db_dsn, "--if-not-exists", *args)
            assert proc.returncode == ExitCode.SLOT, err(proc)
            assert err(proc).count("\n") == 1 and says in err(proc) and "Traceback" not in err(proc), err(proc)
        assert slot_rows(db_dsn) == before
        # the slot asked for is taken as it is
        proc = pgrecv("create", "-d", db_dsn, "--slot", "s1", "-P", "test_decoding", "--if-not-exists")
        assert proc.returncode == 0 and "already exists" in err(proc)
    finally:  # a physical slot belongs to no database: the fixture would not drop it
        sql(db_dsn, "SELECT pg_drop_replication_slot('ph')")


@pytest.mark.parametrize("flag", ["--two-phase", "--enable-two-phase"])  # the second: pg_recvlogical 18's
def test_two_phase(db_dsn: str, flag: str) -> None:
    proc = pgrecv("create", "-d", db_dsn, "--slot", "tp", "-P", "test_decoding", flag)
    assert proc.returncode == 0, err(proc)
    assert slot_rows(db_dsn)["tp"]["two_phase"] is True


@pytest.mark.parametrize("flag", ["--failover", "--enable-failover"])
def test_failover(db_dsn: str, pg_server, flag: str) -> None:  # type: ignore[no-untyped-def]
    proc = pgrecv("create", "-d", db_dsn, "--slot", "fo", flag, "-P", "test_decoding")
    if pg_server.version >= 17:
        assert proc.returncode == 0, err(proc)
        assert slot_rows(db_dsn)["fo"]["failover"] is True
    else:
        assert proc.returncode == ExitCode.SERVER_CONFIG
        assert "PostgreSQL 17" in err(proc)


def test_missing_plugin(db_dsn: str) -> None:
    proc = pgrecv("create", "-d", db_dsn, "--slot", "s1", "-P", "no_such_plugin")
    assert proc.returncode == ExitCode.SERVER_CONFIG, err(proc)
    assert "plugin" in err(proc) and err(proc).count("\n") == 1


def test_drop(db_dsn: str) -> None:
    assert pgrecv("create", "-d", db_dsn, "--slot", "s1", "-P", "test_decoding").returncode == 0
    proc = pgrecv("drop", "-d", db_dsn, "--slot", "s1")
    assert proc.returncode == 0, err(proc)
    assert "s1" not in slot_rows(db_dsn)
    proc = pgrecv("drop", "-d", db_dsn, "--slot", "s1")
    assert proc.returncode == ExitCode.SLOT and "does not exist" in err(proc)
    assert pgrecv("drop", "-d", db_dsn, "--slot", "s1", "--if-exists").returncode == 0


def test_drop_active_slot(db_dsn: str, pg_server) -> None:  # type: ignore[no-untyped-def]
    assert pgrecv("create", "-d", db_dsn, "--slot", "busy", "-P", "test_decoding").returncode == 0
    consumer = subprocess.Popen(
        [str(pg_server.bin_dir / "pg_recvlogical"), "-d", db_dsn, "--slot", "busy", "--start", "-f", "/dev/null"],
    )
    try:
        deadline = time.monotonic() + 20
        while not slot_rows(db_dsn)["busy"]["active"]:
            assert time.monotonic() < deadline, "pg_recvlogical did not become active"
            time.sleep(0.1)
        proc = pgrecv("drop", "-d", db_dsn, "--slot", "busy")
        assert proc.returncode == ExitCode.SLOT, err(proc)
        assert "active" in err(proc) and err(proc).count("\n") == 1
        assert slot_rows(db_dsn)["busy"]["active_pid"]
    finally:
        consumer.terminate()
        consumer.wait(10)


def test_lag_grows_with_writes(db_dsn: str) -> None:
    assert pgrecv("create", "-d", db_dsn, "--slot", "lag", "-P", "test_decoding").returncode == 0
    before = slot_rows(db_dsn)["lag"]["lag_bytes"]
    sql(db_dsn, "CREATE TABLE w AS SELECT g FROM generate_series(1, 10000) g")
    after = slot_rows(db_dsn)["lag"]
    assert after["lag_bytes"] > before  # type: ignore[operator]
    assert after["retained_bytes"] >= after["lag_bytes"]  # type: ignore[operator]


def test_slots_table_for_people(db_dsn: str) -> None:
    assert pgrecv("create", "-d", db_dsn, "--slot", "shown", "-P", "test_decoding", "--two-phase").returncode == 0
    proc = pgrecv("slots", "-d", db_dsn)
    assert proc.returncode == 0, err(proc)
    text = proc.stdout.decode()
    assert "shown" in text and "test_decoding" in text and "two-phase" in text


def test_no_replication_privilege(db_dsn: str) -> None:
    sql(db_dsn, "DROP ROLE IF EXISTS plain_user; CREATE ROLE plain_user LOGIN")
    try:
        proc = pgrecv("create", "-d", db_dsn, "-U", "plain_user", "--slot", "s1", "-P", "test_decoding")
        assert proc.returncode == ExitCode.SERVER_CONFIG, err(proc)
        assert "REPLICATION" in err(proc) and err(proc).count("\n") == 1
    finally:
        sql(db_dsn, "DROP ROLE plain_user")


def test_wal_level_not_logical(pg_server) -> None:  # type: ignore[no-untyped-def]
    from pgrecv.pg.server import TempServer

    with TempServer(pg_server.install, settings={"wal_level": "replica"}) as server:
        proc = pgrecv("create", "-d", server.dsn(), "--slot", "s1", "-P", "test_decoding")
    assert proc.returncode == ExitCode.SERVER_CONFIG, err(proc)
    assert "wal_level" in err(proc) and "logical" in err(proc) and err(proc).count("\n") == 1


@pytest.mark.parametrize("command", [["slots"], ["drop", "--slot", "x"], ["create", "--slot", "x"]])
def test_password_never_printed(db_dsn: str, command: list[str]) -> None:
    from psycopg.conninfo import make_conninfo

    bad = make_conninfo(db_dsn, password="Pa55-w0rd-secret", dbname="no_such_db")
    proc = pgrecv(*command, "-d", bad, "-vv", env={"PGPASSWORD": "Env-secret-99"})
    out = err(proc) + proc.stdout.decode()
    assert proc.returncode == ExitCode.CONNECTION, out
    assert "Pa55-w0rd-secret" not in out and "Env-secret-99" not in out
    assert "no_such_db" in out


def _publications(dsn: str) -> list[tuple[object, ...]]:
    return sql(dsn, "SELECT pubname FROM pg_publication ORDER BY 1")


@pytest.mark.parametrize(
    "command",
    [
        ["create", "--slot", "taken", "--publication", "newpub"],
        ["create", "--slot", "taken", "--publication", "newpub", "--snapshot", "SNAPDIR"],
        ["start", "--create", "--slot", "taken", "--publication", "newpub", "--until-caught-up", "-f", "OUT"],
    ],
    ids=["create", "create-snapshot", "start-create"],
)
def test_failed_create_leaves_no_publication_slot_exists(db_dsn: str, tmp_path: Path, command: list[str]) -> None:
    sql(db_dsn, "CREATE TABLE t (id int PRIMARY KEY)")
    sql(db_dsn, "SELECT pg_create_logical_replication_slot('taken', 'pgoutput')")
    args = [str(tmp_path / "snap") if a == "SNAPDIR" else str(tmp_path / "out") if a == "OUT" else a for a in command]
    proc = pgrecv(*args, "-d", db_dsn)
    assert proc.returncode == ExitCode.SLOT, err(proc)
    assert _publications(db_dsn) == [], "the refused run left its publication behind"


def test_failed_create_leaves_no_publication_wal_level(pg_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from pgrecv.pg.server import TempServer

    with TempServer(pg_server.install, settings={"wal_level": "replica"}) as server:
        sql(server.dsn(), "CREATE TABLE t (id int PRIMARY KEY)")
        proc = pgrecv("create", "-d", server.dsn(), "--slot", "s1", "--publication", "newpub")
        assert proc.returncode == ExitCode.SERVER_CONFIG, err(proc)
        assert _publications(server.dsn()) == [], "the refused run left its publication behind"
        snapshot = ["--snapshot", str(tmp_path / "snap")]
        proc = pgrecv("create", "-d", server.dsn(), "--slot", "s1", "--publication", "newpub", *snapshot)
        assert proc.returncode == ExitCode.SERVER_CONFIG, err(proc)
        assert _publications(server.dsn()) == []


def test_create_keeps_an_existing_publication_on_failure(db_dsn: str) -> None:
    sql(db_dsn, "CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION mine FOR ALL TABLES")
    sql(db_dsn, "SELECT pg_create_logical_replication_slot('taken', 'pgoutput')")
    proc = pgrecv("create", "--slot", "taken", "--publication", "mine", "-d", db_dsn)
    assert proc.returncode == ExitCode.SLOT, err(proc)
    assert _publications(db_dsn) == [("mine",)], "a publication this run did not make is not its to drop"


def test_a_refused_name_says_what_the_server_allows(db_dsn: str) -> None:
    """The server's HINT is the "what to do" of an error pgrecv has no advice of its own for. (The
    command line refuses such a name itself, before connecting: tests/cli/test_cli_input.py.)"""
    with pytest.raises(ServerError) as caught:
        create_slot(ConnOptions(dbname=db_dsn), "Bad-Name")
    assert caught.value.exit_code == ExitCode.SERVER
    assert caught.value.message == (
        'server error: replication slot name "Bad-Name" contains invalid character: '
        "Replication slot names may only contain lower case letters, numbers, and the underscore character."
    )


@pytest.mark.parametrize(
    ("given", "named", "advice"),
    [
        ("user=nosuchrole", 'role "nosuchrole" does not exist', "connect as an existing role with -U (or PGUSER)"),
        ("dbname=nosuchdb", 'database "nosuchdb" does not exist', "name an existing database with -d (or PGDATABASE)"),
    ],
)
def test_an_unknown_role_or_database_names_the_option_to_fix(db_dsn: str, given: str, named: str, advice: str) -> None:
    proc = pgrecv("slots", "-d", f"{db_dsn} {given}")
    assert proc.returncode == ExitCode.CONNECTION, err(proc)
    assert err(proc) == f"pgrecv: error: cannot connect: {named}: {advice}\n"
