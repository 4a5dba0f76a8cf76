"""`pgrecv start --metrics-file`: the stream's progress as node_exporter's textfile collector reads it."""

from __future__ import annotations

import signal
import stat
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from pgrecv.lsn import LSN
from tests.stream.test_start import spawn
from tests.util import err, pgrecv, sql, wait_for


def test_metrics_file_after_a_bounded_run(db_dsn: str, tmp_path: Path) -> None:
    sql(db_dsn, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    assert pgrecv("create", "-d", db_dsn, "--slot", "m", "--publication", "p").returncode == 0
    for k in range(3):
        sql(db_dsn, "INSERT INTO t SELECT g, 'x' FROM generate_series(%s::int, %s::int) g", (k * 5 + 1, k * 5 + 5))
    out, metrics = tmp_path / "o.jsonl", tmp_path / "pgrecv.prom"
    proc = pgrecv(
        "start", "-d", db_dsn, "--slot", "m", "-f", str(out), "--until-caught-up", "--metrics-file", str(metrics)
    )
    assert proc.returncode == 0, err(proc)

    values = {
        s.name: s.value
        for f in text_string_to_metric_families(metrics.read_text())
        for s in f.samples
        if s.labels == {"slot": "m"}
    }
    confirmed = LSN.parse(
        sql(db_dsn, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'm'")[0][0]
    )
    assert values["pgrecv_stream_rows"] == 15
    assert values["pgrecv_stream_transactions"] == 3
    assert values["pgrecv_stream_confirmed_lsn"] == int(confirmed)
    assert values["pgrecv_stream_received_lsn"] >= int(confirmed)
    assert values["pgrecv_stream_written_bytes"] == out.stat().st_size
    assert values["pgrecv_stream_reconnects"] == 0
    assert abs(values["pgrecv_stream_last_commit_timestamp_seconds"] - time.time()) < 120
    assert stat.S_IMODE(metrics.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_a_failing_metrics_file_is_one_warning_and_the_stream_goes_on(db_dsn: str, tmp_path: Path) -> None:
    """A metrics file that cannot be written used to stop the stream (exit 8), and the slot then
    held WAL (issue 54, L4). Now: one warning line per distinct failure, however many status
    intervals fail, and the changes keep coming and being confirmed; a write that works again
    says so once."""
    sql(db_dsn, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    assert pgrecv("create", "-d", db_dsn, "--slot", "m", "--publication", "p").returncode == 0
    out, log = tmp_path / "o.jsonl", tmp_path / "stderr"
    metrics = tmp_path / "missing" / "pgrecv.prom"  # its directory does not exist (yet)
    proc = spawn("start", "-d", db_dsn, "--slot", "m", "-f", str(out), "-s", "100ms", "-F", "100ms",
                 "--metrics-file", str(metrics), stderr_path=log)  # fmt: skip
    try:
        sql(db_dsn, "INSERT INTO t VALUES (1, 'a')")
        wait_for(lambda: out.exists() and out.read_bytes().count(b'"op":"commit"') == 1, what="the first row")
        time.sleep(1.0)  # about ten status intervals, each with a failing write
        sql(db_dsn, "INSERT INTO t VALUES (2, 'b')")
        wait_for(lambda: out.read_bytes().count(b'"op":"commit"') == 2, what="the second row")
        ((before,),) = sql(db_dsn, "SELECT pg_current_wal_lsn()::text")
        wait_for(lambda: confirmed(db_dsn) >= LSN.parse(before), what="the slot to advance")
        lines = about_metrics(log)
        assert len(lines) == 1, lines
        assert lines[0].startswith("pgrecv: warning: cannot write the metrics file ") and str(metrics) in lines[0]
        assert "streaming goes on" in lines[0]
        metrics.parent.mkdir()
        wait_for(metrics.exists, what="the metrics file once it can be written")
        wait_for(lambda: len(about_metrics(log)) == 2, what="the line saying so")
        assert about_metrics(log)[1] == f"pgrecv: the metrics file {metrics} is written again"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()
    finally:
        proc.kill()
    assert proc.returncode == 0


def about_metrics(log: Path) -> list[str]:
    """The stderr lines about the metrics file (the run may warn about the server's settings too)."""
    return [line for line in log.read_text().splitlines() if "metrics" in line]


def confirmed(dsn: str) -> LSN:
    return LSN.parse(sql(dsn, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'm'")[0][0])
