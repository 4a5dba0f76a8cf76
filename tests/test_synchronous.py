"""`pgrecv start --synchronous` as a synchronous standby, and no busy loop at intervals of 0."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from pgrecv.server import TempServer
from tests.util import err, pgrecv, sql

APP = "pgrecv_sync"


@pytest.fixture
def server(pg_server: TempServer) -> Iterator[TempServer]:
    """A server of its own: naming a synchronous standby makes every commit on it wait."""
    with TempServer(pg_server.install) as srv:
        yield srv


def _spawn(*args: str, stderr: Path) -> subprocess.Popen[bytes]:
    with stderr.open("ab") as err_file:
        return subprocess.Popen([sys.executable, "-m", "pgrecv", *args], stdout=subprocess.DEVNULL, stderr=err_file)


def _wait(predicate: object, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _setup(dsn: str) -> None:
    sql(dsn, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    proc = pgrecv("create", "-d", dsn, "--slot", "s", "--publication", "p")
    assert proc.returncode == 0, err(proc)


def _active(dsn: str) -> bool:
    return bool(sql(dsn, "SELECT active FROM pg_replication_slots WHERE slot_name = 's'")[0][0])


@pytest.mark.parametrize("flags", [["-F", "0", "-s", "0"], ["--synchronous"]])
def test_idle_with_zero_intervals_sleeps(server: TempServer, tmp_path: Path, flags: list[str]) -> None:
    dsn = server.dsn()
    _setup(dsn)
    proc = _spawn("start", "-d", dsn, "--slot", "s", "-f", str(tmp_path / "o.jsonl"), *flags, stderr=tmp_path / "e")
    try:
        _wait(lambda: _active(dsn), "streaming")
        time.sleep(0.5)
        before = _cpu_seconds(proc.pid)
        time.sleep(4)
        used = _cpu_seconds(proc.pid) - before
    finally:
        proc.terminate()
        proc.wait(30)
    assert used < 0.12, f"{used:.2f} s of CPU in 4 s idle: a busy loop"  # 3%: 1% plus a tick of rounding


@pytest.mark.parametrize("where", ["file", "dir"])
def test_every_commit_is_in_the_output_when_it_returns(server: TempServer, tmp_path: Path, where: str) -> None:
    """pgrecv named in synchronous_standby_names: each commit returns once pgrecv reported it
    flushed, so its row must be in the output at that moment, and quickly (no timer in between:
    -F and -s stay at their 10 s defaults)."""
    dsn = server.dsn()
    _setup(dsn)
    out = tmp_path / ("o.jsonl" if where == "file" else "dir")
    target = ["-f", str(out)] if where == "file" else ["--output-dir", str(out)]
    proc = _spawn("start", "-d", f"{dsn} application_name={APP}", "--slot", "s", "--synchronous", *target,
                  stderr=tmp_path / "e")  # fmt: skip
    try:
        _wait(lambda: _active(dsn), "streaming")
        sql(dsn, f"ALTER SYSTEM SET synchronous_standby_names = '{APP}'")
        sql(dsn, "SELECT pg_reload_conf()")
        _wait(lambda: sql(dsn, "SELECT sync_state FROM pg_stat_replication")[0][0] == "sync", "sync_state sync")
        latencies = []
        with psycopg.connect(dsn, autocommit=True) as conn:
            for i in range(1, 41):
                t0 = time.perf_counter()
                conn.execute("INSERT INTO t VALUES (%s, 'x')", (i,))
                latencies.append(time.perf_counter() - t0)
                assert i in _ids(out), f"row {i} committed but not in the output"
        sql(dsn, "ALTER SYSTEM RESET synchronous_standby_names")
        sql(dsn, "SELECT pg_reload_conf()")
    finally:
        proc.terminate()
        code = proc.wait(30)
    assert code == 0, (tmp_path / "e").read_text()
    assert statistics.median(latencies) < 0.2, f"median commit latency {statistics.median(latencies):.3f} s"


def _ids(out: Path) -> set[int]:
    files = [out] if out.is_file() else sorted(out.glob("*.jsonl")) if out.is_dir() else []
    ids = set()
    for f in files:
        for line in f.read_bytes().splitlines():
            rec = json.loads(line)
            if rec["op"] == "insert":
                ids.add(rec["new"]["id"])
    return ids
