"""`pgrecv start --heartbeat` against real servers: a quiet slot while another database writes."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from pgrecv.lsn import LSN
from pgrecv.stream.heartbeat import PREFIX
from tests.stream.test_start import spawn
from tests.util import err, pgrecv, sql, wait_for

MB = 1 << 20


def retained(dsn: str, slot: str) -> int:
    """WAL the slot keeps: the server's write position minus the slot's restart_lsn."""
    rows = sql(
        dsn,
        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint FROM pg_replication_slots "
        "WHERE slot_name = %s",
        (slot,),
    )
    return int(rows[0][0])


def confirmed(dsn: str, slot: str) -> LSN:
    rows = sql(dsn, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,))
    return LSN.parse(rows[0][0])


def write_elsewhere(other: str, pub: str, slot: str, total: int = 200 * MB, chunk: int = 10 * MB) -> int:
    """~``total`` bytes of WAL in another database, a CHECKPOINT after each chunk (a checkpoint logs
    the running transactions, which is what lets a slot's restart_lsn move); the most WAL the slot
    retained after a chunk."""
    rows = chunk // 1000  # ~1 kB of WAL per row
    start = LSN.parse(sql(other, "SELECT pg_current_wal_lsn()::text")[0][0])
    peak = 0
    while LSN.parse(sql(other, "SELECT pg_current_wal_lsn()::text")[0][0]) - start < total:
        sql(other, f"INSERT INTO big SELECT g, repeat('x', 900) FROM generate_series(1, {rows}) g")
        sql(pub, "CHECKPOINT")
        peak = max(peak, retained(pub, slot))
    return peak


@pytest.fixture
def quiet_setup(pg_server: Any, db_dsn: str, request: pytest.FixtureRequest) -> tuple[str, str]:
    sql(db_dsn, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    assert pgrecv("create", "-d", db_dsn, "--slot", "s", "--publication", "pub").returncode == 0
    name = f"other_{abs(hash(request.node.name)) % 10**8}"
    other = pg_server.create_database(name)
    request.addfinalizer(lambda: pg_server.drop_database(name))
    sql(other, "CREATE TABLE big (id int, v text)")
    return db_dsn, other


def measure(dsn: str, other: str, out: Path, *extra: str) -> tuple[int, int]:
    """(largest retained WAL seen after each chunk, retained WAL once settled) while pgrecv streams."""
    proc = spawn("start", "-d", dsn, "--slot", "s", "-f", str(out), "-s", "1", "-F", "1", *extra)
    try:
        wait_for(lambda: sql(dsn, "SELECT active FROM pg_replication_slots WHERE slot_name = 's'")[0][0], what="start")
        before = time.monotonic()
        peak = write_elsewhere(other, dsn, "s")
        # the writer is done: a checkpoint each second (it logs the running transactions, which
        # lets restart_lsn move) until the slot has let go of the WAL, within a bound
        deadline = time.monotonic() + 60
        while True:
            sql(dsn, "CHECKPOINT")
            settled = retained(dsn, "s")
            if settled < 64 * MB or time.monotonic() > deadline:
                break
            time.sleep(1)
        took = time.monotonic() - before
        print(f"{extra or 'no heartbeat'}: {took:.1f} s, peak {peak / MB:.1f} MB, settled {settled / MB:.1f} MB")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        proc.kill()
    return peak, settled


def test_quiet_slot_stays_small_with_and_without_heartbeats(quiet_setup: tuple[str, str], tmp_path: Path) -> None:
    """200 MB of WAL written in another database while the published table is idle. With
    heartbeats the slot keeps under 64 MB. Without them it does too: pgrecv confirms the
    keepalive positions the walsender sends whenever it catches up (as PostgreSQL's own
    subscriber does), so on this path heartbeats are a second way, not the only one; the
    measurement guards both."""
    dsn, other = quiet_setup
    peak_without, without = measure(dsn, other, tmp_path / "a.jsonl")
    peak_with, with_hb = measure(dsn, other, tmp_path / "b.jsonl", "--heartbeat", "1s")
    print(
        f"retained WAL without heartbeats: peak {peak_without / MB:.1f} MB, settled {without / MB:.1f} MB; "
        f"with: peak {peak_with / MB:.1f} MB, settled {with_hb / MB:.1f} MB"
    )
    assert with_hb < 64 * MB
    assert without < 64 * MB
    assert (tmp_path / "b.jsonl").read_bytes() == b""  # heartbeats are confirmed, not written


def heartbeats_in(dsn: str, probe: str) -> list[str]:
    rows = sql(dsn, "SELECT data FROM pg_logical_slot_peek_changes(%s, NULL, NULL)", (probe,))
    return [d for (d,) in rows if f"prefix: {PREFIX}" in d]


@pytest.mark.parametrize("fmt", ["jsonl", "raw", "debezium"])
def test_heartbeats_confirmed_not_written(db_dsn: str, tmp_path: Path, fmt: str) -> None:
    sql(db_dsn, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    assert pgrecv("create", "-d", db_dsn, "--slot", "s", "--publication", "pub").returncode == 0
    assert pgrecv("create", "-d", db_dsn, "--slot", "probe", "-P", "test_decoding").returncode == 0
    out = tmp_path / "out"
    args = ("start", "-d", db_dsn, "--slot", "s", "--output-dir", str(out), "-s", "0.2", "-F", "0.2")
    proc = spawn(*args, "--format", fmt, "--heartbeat", "0.5s", "-v", stderr_path=tmp_path / "err")
    try:
        wait_for(lambda: len(heartbeats_in(db_dsn, "probe")) >= 2, what="heartbeats")
        first = confirmed(db_dsn, "s")
        sql(db_dsn, "INSERT INTO t VALUES (1, 'a')")  # a real change between heartbeats is written
        wait_for(lambda: len(heartbeats_in(db_dsn, "probe")) >= 4, what="more heartbeats")
        wait_for(lambda: confirmed(db_dsn, "s") > first, what="the slot to move")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        proc.kill()
    files = sorted(p for p in out.iterdir() if not p.name.startswith("."))
    data = b"".join(p.read_bytes() for p in files)
    assert PREFIX.encode() not in data, data
    assert len(files) == 1 and data.count(b"\n") >= 1  # the insert's file only; no empty ones
    if fmt == "jsonl":
        assert [orjson.loads(x)["op"] for x in data.splitlines()] == ["begin", "relation", "insert", "commit"]
    # the slot is past the last heartbeat the stream delivered (the probe's last heartbeat commit)
    ends = [
        LSN.parse(lsn)
        for lsn, d in sql(db_dsn, "SELECT lsn::text, data FROM pg_logical_slot_peek_changes('probe', NULL, NULL)")
        if d.startswith("COMMIT")
    ]
    assert confirmed(db_dsn, "s") >= ends[-2]


def test_keep_heartbeats_and_usage(db_dsn: str, tmp_path: Path) -> None:
    sql(db_dsn, "CREATE TABLE t (id int PRIMARY KEY)")
    assert pgrecv("create", "-d", db_dsn, "--slot", "s", "--publication", "pub").returncode == 0
    out = tmp_path / "out.jsonl"
    proc = spawn(
        "start", "-d", db_dsn, "--slot", "s", "-f", str(out), "-F", "0.2", "--heartbeat", "0.3s", "--keep-heartbeats"
    )
    try:
        wait_for(lambda: out.exists() and out.read_bytes().count(b'"op":"commit"') >= 2, what="kept heartbeats")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        proc.kill()
    recs = [orjson.loads(x) for x in out.read_bytes().splitlines()]
    assert any(r["op"] == "message" and r.get("prefix") == PREFIX for r in recs), recs[:5]
    for bad, words in [
        (("--keep-heartbeats",), "--keep-heartbeats goes with --heartbeat"),
        (("--heartbeat", "1s", "--no-messages"), "--no-messages"),
    ]:
        proc2 = pgrecv("start", "-d", db_dsn, "--slot", "s", "-f", str(out), *bad)
        assert proc2.returncode == 2 and words in err(proc2) and err(proc2).count("\n") == 1, err(proc2)
