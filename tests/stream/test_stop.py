"""A stop signal in the middle of a large transaction (issue 11, item 10), against real PostgreSQL.

The stop must take effect within ``--fsync-interval`` whatever the transaction's size: with
streaming on, pgrecv replays the reassembled transaction from its buffer; with streaming off, the
server sends it after its commit, and after CopyDone would go on sending the rest of it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from pgrecv import failpoints
from tests.stream.test_start import commit_ends, committed, records, slot_info, spawn
from tests.util import err, pgrecv, sql, wait_for

ROWS = int(os.environ.get("PGRECV_TEST_STOP_ROWS", "1000000"))
FSYNC = 2.0  # -F: the stop must be complete within this (plus process teardown)
SLACK = 0.8


@pytest.fixture
def table(db_dsn: str) -> str:
    sql(db_dsn, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    sql(db_dsn, "CREATE PUBLICATION pub FOR ALL TABLES")
    return db_dsn


@pytest.mark.parametrize(
    ("streaming", "drain_delay"),
    [("on", None), ("off", None), ("off", "0.5")],
    ids=["on", "off", "off-slow-drain"],
)
def test_sigterm_in_a_large_transaction_stops_within_fsync_interval(
    table: str, tmp_path: Path, streaming: str, drain_delay: str | None
) -> None:
    """``off-slow-drain``: pgrecv pauses after its CopyDone (a failpoint), as a loaded machine
    makes it, so that the walsender answers CopyDone before the rest of its transaction; the stop
    must not then read all of that transaction before it leaves."""
    from psycopg.conninfo import make_conninfo

    assert pgrecv("create", "-d", table, "--slot", "s").returncode == 0
    assert pgrecv("create", "-d", table, "--slot", "probe", "-P", "test_decoding").returncode == 0
    sql(table, "INSERT INTO t VALUES (1, 'small before')")
    sql(table, f"INSERT INTO t SELECT g, 'big' FROM generate_series(10, {ROWS + 9}) g")
    sql(table, "INSERT INTO t VALUES (2, 'small after')")
    first_end = commit_ends(table, "probe", upto=1)[0]  # (the large one is not decoded for it)
    dsn = make_conninfo(table, options="-c logical_decoding_work_mem=64kB")
    out, log = tmp_path / "out.jsonl", tmp_path / "log"
    args = ["start", "-d", dsn, "--slot", "s", "-f", str(out), "-F", f"{FSYNC}s", "-s", "1h", "-v"]
    env = {**os.environ, failpoints.STOP_DRAIN_DELAY: drain_delay} if drain_delay else None
    proc = spawn(*args, "--streaming", streaming, stderr_path=log, env=env)
    try:
        # the big transaction is being written: well past the first one's few hundred bytes
        wait_for(lambda: out.exists() and out.stat().st_size > 4 << 20, timeout=120, what="the big transaction")
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            code: int | None = proc.wait(FSYNC + 30)
        except subprocess.TimeoutExpired:
            code = None
        took = time.monotonic() - signalled
    finally:
        proc.kill()
    print(f"streaming {streaming}: {ROWS} rows, stopped {took:.2f} s after SIGTERM")
    assert code is not None, f"still running {took:.0f} s after SIGTERM"
    assert code == 0, log.read_text()
    assert took < FSYNC + SLACK, f"the stop took {took:.2f} s (--fsync-interval {FSYNC} s)"
    txns = committed(records(out.read_bytes()))
    assert [[r["new"]["id"] for r in t] for t in txns] == [[1]], "cut back to the last whole transaction"
    assert slot_info(table, "s")["confirmed"] <= first_end, "nothing unconfirmed confirmed"
    # the next run delivers the rest, each transaction once
    proc2 = pgrecv("start", "-d", dsn, "--slot", "s", "-f", str(out), "--until-caught-up", "--streaming", streaming)
    assert proc2.returncode == 0, err(proc2)
    txns = committed(records(out.read_bytes()))
    assert [len(t) for t in txns] == [1, ROWS, 1]
    assert [t[0]["new"]["id"] for t in txns] == [1, 10, 2]
