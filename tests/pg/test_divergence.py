"""Warnings where a mirror can silently diverge, at create, start and snapshot, on real servers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg

from pgrecv.pg.server import TempServer
from tests.util import err, pgrecv, sql


def warnings(proc: Any) -> list[str]:
    return [line for line in err(proc).splitlines() if line.startswith("pgrecv: warning: ")]


def test_filters_columns_and_partitions_warned_everywhere(db_dsn: str, tmp_path: Path) -> None:
    sql(db_dsn, "CREATE TABLE f (id int PRIMARY KEY, v int, secret text)")
    sql(db_dsn, "CREATE TABLE m (id int, at date, PRIMARY KEY (id, at)) PARTITION BY RANGE (at)")
    sql(db_dsn, "CREATE TABLE m_2025 PARTITION OF m FOR VALUES FROM ('2025-01-01') TO ('2026-01-01')")
    sql(db_dsn, "CREATE PUBLICATION pub FOR TABLE f (id, v) WHERE (v > 0), m")
    for args in (
        ("create", "-d", db_dsn, "--slot", "s", "--publication", "pub"),
        ("start", "-d", db_dsn, "--slot", "s", "--until-caught-up", "-f", str(tmp_path / "o.jsonl")),
        ("snapshot", "-d", db_dsn, "--slot", "s2", "--output-dir", str(tmp_path / "snap")),
    ):
        proc = pgrecv(*args)
        assert proc.returncode == 0, err(proc)
        lines = warnings(proc)
        assert any("row filter on public.f" in ln and "subset" in ln for ln in lines), (args[0], lines)
        assert any("column list of public.f" in ln for ln in lines), (args[0], lines)
        assert any("partitions of public.m" in ln and "publish_via_partition_root" in ln for ln in lines), lines
        assert any("max_slot_wal_keep_size is -1" in ln for ln in lines), lines  # the test server's default
        assert len(lines) == 4 and "Traceback" not in err(proc), lines
        assert not warnings(pgrecv(*args[:1], "-q", *args[1:])) or args[0] != "create"
    # via the root: no partition warning; -q silences the rest
    sql(db_dsn, "ALTER PUBLICATION pub SET (publish_via_partition_root = true)")
    proc = pgrecv("start", "-d", db_dsn, "--slot", "s", "--until-caught-up", "-f", str(tmp_path / "o.jsonl"))
    assert proc.returncode == 0 and not any("partitions of" in ln for ln in warnings(proc)), err(proc)
    proc = pgrecv("start", "-q", "-d", db_dsn, "--slot", "s", "--until-caught-up", "-f", str(tmp_path / "o.jsonl"))
    assert proc.returncode == 0 and proc.stderr == b"", err(proc)


def test_plain_publication_only_the_wal_keep_note(db_dsn: str) -> None:
    sql(db_dsn, "CREATE TABLE t (id int PRIMARY KEY)")
    proc = pgrecv("create", "-d", db_dsn, "--slot", "s", "--publication", "pub")
    assert proc.returncode == 0, err(proc)
    assert [ln.split(":")[2].strip()[:30] for ln in warnings(proc)] == ["max_slot_wal_keep_size is -1"]


def test_unreserved_slot_warned(pg_server: Any, tmp_path: Path) -> None:
    settings = {"max_slot_wal_keep_size": "1MB", "max_wal_size": "1GB", "checkpoint_timeout": "1h"}
    with TempServer(pg_server.install, settings=settings) as server:
        dsn = server.create_database("d")
        sql(dsn, "CREATE TABLE big (v text)")
        proc = pgrecv("create", "-d", dsn, "--slot", "s", "--publication", "pub")
        assert proc.returncode == 0, err(proc)
        assert not any("-1" in ln for ln in warnings(proc))  # a limit is set
        with psycopg.connect(dsn, autocommit=True) as conn:  # WAL past the limit, no checkpoint yet
            conn.execute("INSERT INTO big SELECT repeat('x', 900) FROM generate_series(1, 20000)")
            status = conn.execute("SELECT wal_status FROM pg_replication_slots").fetchone()
        assert status == ("unreserved",)
        proc = pgrecv("start", "-d", dsn, "--slot", "s", "--until-caught-up", "-f", str(tmp_path / "o.jsonl"))
        assert proc.returncode == 0, err(proc)
        assert [ln for ln in warnings(proc) if 'slot "s" is unreserved' in ln and "consume it now" in ln], err(proc)
