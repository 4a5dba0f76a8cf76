"""`pgrecv slots --check` and `--format prometheus`: the pure rules, then real servers."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pgrecv.errors import ExitCode
from pgrecv.pg.server import TempServer
from pgrecv.pg.slot_health import Limits, failover_ready, problems, prometheus
from tests.util import err, pgrecv, sql

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def row(**kw: Any) -> dict[str, Any]:
    base = {
        "slot_name": "s",
        "database": "db",
        "plugin": "pgoutput",
        "active": True,
        "wal_status": "reserved",
        "lag_bytes": 100,
        "retained_bytes": 1000,
        "invalidation_reason": None,
        "failover": False,
    }
    return {**base, **kw}


def test_a_healthy_slot_has_no_problem() -> None:
    assert problems([row()], Limits(max_lag=1000, max_retained=10_000, max_inactive=60), now=NOW) == []


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"invalidation_reason": "wal_removed", "wal_status": "lost"}, "invalidated (wal_removed)"),
        ({"wal_status": "lost"}, "lost WAL"),
        ({"wal_status": "unreserved"}, "unreserved"),
        ({"lag_bytes": 5000}, "lags 4.9 kB"),
        ({"retained_bytes": 20_000}, "retains 19.5 kB"),
        ({"active": False, "inactive_since": (NOW - timedelta(hours=2)).isoformat()}, "no consumer for 7200 s"),
    ],
)
def test_each_problem_is_one_line_naming_the_slot(changes: dict[str, Any], words: str) -> None:
    found = problems([row(**changes)], Limits(max_lag=1000, max_retained=10_000, max_inactive=3600), now=NOW)
    assert len(found) == 1 and found[0].startswith("slot s ") and words in found[0], found
    assert "\n" not in found[0]


def test_limits_not_given_are_not_checked() -> None:
    assert problems([row(lag_bytes=10**12, retained_bytes=10**12, active=False)], Limits(), now=NOW) == []


def test_failover_readiness_on_a_standby() -> None:
    primary = [row(slot_name="fs", failover=True), row(slot_name="plain")]
    persisted = {"slot_name": "fs", "synced": True, "temporary": False, "invalidation_reason": None}
    temporary = {**persisted, "temporary": True}
    assert failover_ready(persisted) and not failover_ready(temporary)
    assert problems(primary, Limits(), standby=[persisted]) == []
    (line,) = problems(primary, Limits(), standby=[temporary])
    assert "fs" in line and "would not survive a promotion" in line and "still temporary" in line
    (line,) = problems(primary, Limits(), standby=[])
    assert "no copy on the standby" in line


def test_prometheus_text_parses_with_the_official_parser() -> None:
    text = prometheus([row(), row(slot_name="t", wal_status="unreserved", active=False, lag_bytes=None)]).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    retained = {s.labels["slot"]: s.value for s in families["pgrecv_slot_retained_bytes"].samples}
    assert retained == {"s": 1000.0, "t": 1000.0}
    status = {(s.labels["slot"], s.labels["status"]): s.value for s in families["pgrecv_slot_wal_status"].samples}
    assert status[("t", "unreserved")] == 1.0 and status[("t", "reserved")] == 0.0
    lag = {s.labels["slot"] for s in families["pgrecv_slot_confirmed_lag_bytes"].samples}
    assert lag == {"s"}


# --- real servers --------------------------------------------------------------------------------


def test_check_and_prometheus_on_a_real_slot(db_dsn: str) -> None:
    sql(db_dsn, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    proc = pgrecv("create", "-d", db_dsn, "--slot", "h1", "--publication", "p")
    assert proc.returncode == 0, err(proc)
    proc = pgrecv("slots", "-d", db_dsn, "--check", "--slot", "h1", "--max-lag", "1GB")
    assert proc.returncode == 0, err(proc)
    sql(db_dsn, "INSERT INTO t SELECT g, repeat('x', 200) FROM generate_series(1, 5000) g")
    proc = pgrecv("slots", "-d", db_dsn, "--check", "--slot", "h1", "--max-lag", "64kB")
    assert proc.returncode == ExitCode.UNHEALTHY, err(proc)
    lines = proc.stdout.decode().splitlines()
    # 64kB is 64000 bytes, shown in units of 1024
    assert len(lines) == 1 and lines[0].startswith("slot h1 lags ") and "(limit 62.5 kB)" in lines[0]
    proc = pgrecv("slots", "-d", db_dsn, "--check", "--slot", "nope")
    assert proc.returncode == ExitCode.UNHEALTHY and "slot nope does not exist" in proc.stdout.decode()
    proc = pgrecv("slots", "-d", db_dsn, "--max-lag", "1MB")
    assert proc.returncode == ExitCode.USAGE and "--check" in err(proc)

    proc = pgrecv("slots", "-d", db_dsn, "--slot", "h1", "--format", "prometheus")
    assert proc.returncode == 0, err(proc)
    families = {f.name: f for f in text_string_to_metric_families(proc.stdout.decode())}
    (jsonl,) = pgrecv("slots", "-d", db_dsn, "--slot", "h1", "--format", "jsonl").stdout.splitlines()
    listed = json.loads(jsonl)
    (sample,) = families["pgrecv_slot_retained_bytes"].samples
    assert sample.labels["slot"] == "h1" and sample.value > 0
    assert abs(sample.value - listed["retained_bytes"]) < 1 << 20  # two reads of a moving server
    (active,) = families["pgrecv_slot_active"].samples
    assert active.value == 0.0


def test_check_fails_for_a_slot_that_lost_its_wal(pg_server: TempServer) -> None:
    """A server that keeps at most 1 MB of WAL for slots: a slot nobody consumes is invalidated
    after enough WAL and a checkpoint, and the check says so."""
    with TempServer(pg_server.install, settings={"max_slot_wal_keep_size": "1MB", "max_wal_size": "32MB"}) as small:
        dsn = small.dsn()
        sql(dsn, "SELECT pg_create_logical_replication_slot('lost1', 'test_decoding')")
        sql(dsn, "CREATE TABLE filler (v text)")
        for _ in range(4):
            sql(dsn, "INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 3000)")
            sql(dsn, "SELECT pg_switch_wal()")
        sql(dsn, "CHECKPOINT")
        proc = pgrecv("slots", "-d", dsn, "--check")
        assert proc.returncode == ExitCode.UNHEALTHY, err(proc)
        out = proc.stdout.decode()
        assert "slot lost1 " in out and ("invalidated" in out or "lost WAL" in out), out


def test_max_inactive_is_refused_where_the_server_cannot_tell_and_checked_where_it_can(
    db_dsn: str, pg_server: TempServer
) -> None:
    """PostgreSQL 15 and 16 have no pg_replication_slots.inactive_since: --max-inactive used to
    pass there without checking anything (issue 54, L3). It is refused up front: one line, exit 2,
    what to use instead. From 17 on an idle slot past the limit is reported."""
    sql(db_dsn, "SELECT pg_create_logical_replication_slot('idle1', 'test_decoding')")
    proc = pgrecv("slots", "-d", db_dsn, "--check", "--slot", "idle1", "--max-inactive", "1ms")
    text = err(proc)
    if pg_server.version < 17:
        assert proc.returncode == ExitCode.USAGE, text
        assert text.count("\n") == 1 and text.startswith("pgrecv: error: --max-inactive needs PostgreSQL 17"), text
        assert f"this server is {pg_server.version}" in text and "--max-lag or --max-retained" in text, text
        assert proc.stdout == b""
    else:
        assert proc.returncode == ExitCode.UNHEALTHY, text
        assert proc.stdout.decode().startswith("slot idle1 has had no consumer for "), proc.stdout


def test_standby_errors_name_the_standby_option(db_dsn: str, tmp_path: Path) -> None:
    """--standby's connection string is not -d's: a message about it names --standby (issue 54, L8)."""
    proc = pgrecv("slots", "-d", db_dsn, "--check", "--standby", "host=x port")
    assert proc.returncode == ExitCode.USAGE, err(proc)
    assert err(proc).startswith("pgrecv: error: invalid connection string in --standby: "), err(proc)
    assert "--dbname" not in err(proc) and err(proc).count("\n") == 1
    proc = pgrecv("slots", "-d", db_dsn, "--check", "--standby", "postgresql://u:p@ss@host/db")
    assert proc.returncode == ExitCode.USAGE and "the --standby URI has more than one '@'" in err(proc), err(proc)
    proc = pgrecv("slots", "-d", db_dsn, "--check", "--standby", f"host={tmp_path} dbname=postgres")
    text = err(proc)
    assert proc.returncode == ExitCode.CONNECTION, text
    assert text.startswith("pgrecv: error: cannot connect to the --standby server: ") and text.count("\n") == 1, text
    assert text.endswith("check the connection string given with --standby and that its server is running\n"), text
    assert " -d" not in text and "-h and -p" not in text, text
