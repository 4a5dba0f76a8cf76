"""`pgrecv start --metrics-file`: the stream's progress as node_exporter's textfile collector reads it."""

from __future__ import annotations

import stat
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from pgrecv.lsn import LSN
from tests.util import err, pgrecv, sql


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
