"""`pgrecv start --synchronous` as a synchronous standby, and no busy loop at intervals of 0."""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from pgrecv.pg.server import TempServer
from tests.util import err, pgrecv, sql

APP = "pgrecv_sync"


@pytest.fixture
def server(pg_server: TempServer) -> Iterator[TempServer]:
    """A server of its own: naming a synchronous standby makes every commit on it wait."""
    with TempServer(pg_server.install) as srv:
        yield srv


def _spawn(*args: str, stderr: Path, stdout: Path | None = None) -> subprocess.Popen[bytes]:
    with stderr.open("ab") as err_file, (stdout or Path(os.devnull)).open("ab") as out_file:
        return subprocess.Popen([sys.executable, "-m", "pgrecv", *args], stdout=out_file, stderr=err_file)


def _name_as_synchronous_standby(dsn: str) -> None:
    sql(dsn, f"ALTER SYSTEM SET synchronous_standby_names = '{APP}'")
    sql(dsn, "SELECT pg_reload_conf()")
    _wait(lambda: sql(dsn, "SELECT sync_state FROM pg_stat_replication")[0][0] == "sync", "sync_state sync")


def _reset_synchronous_standby(dsn: str) -> None:
    sql(dsn, "ALTER SYSTEM RESET synchronous_standby_names")
    sql(dsn, "SELECT pg_reload_conf()")


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


@pytest.mark.parametrize("flags", [["-F", "0", "-s", "0"], ["--synchronous"], ["-F", "0.001", "-s", "0.001"]])
def test_idle_sleeps_whatever_the_intervals(server: TempServer, tmp_path: Path, flags: list[str]) -> None:
    dsn = server.dsn()
    _setup(dsn)
    proc = _spawn("start", "-d", dsn, "--slot", "s", "-f", str(tmp_path / "o.jsonl"), *flags, stderr=tmp_path / "e")
    try:
        _wait(lambda: _active(dsn), "streaming")
        time.sleep(0.5)
        before = _cpu_seconds(proc.pid)
        time.sleep(5)
        used = _cpu_seconds(proc.pid) - before
    finally:
        proc.terminate()
        proc.wait(30)
    # the target is 1% (0.05 s in 5 s); two clock ticks more for the counters' rounding
    assert used <= 0.05 + 2 / os.sysconf("SC_CLK_TCK"), f"{used:.2f} s of CPU in 5 s idle: a busy loop"


@pytest.mark.parametrize("where", ["file", "dir", "stdout"])
def test_every_commit_is_in_the_output_when_it_returns(server: TempServer, tmp_path: Path, where: str) -> None:
    """pgrecv named in synchronous_standby_names: each commit returns once pgrecv reported it
    flushed, so its row must be in the output at that moment, and quickly (no timer in between:
    -F and -s stay at their 10 s defaults). Standard output: written when reported (here a file
    the test reads; a pipe promises no more than its reader does)."""
    dsn = server.dsn()
    _setup(dsn)
    out = tmp_path / ("dir" if where == "dir" else "o.jsonl")
    target = {"file": ["-f", str(out)], "dir": ["--output-dir", str(out)], "stdout": ["--format", "jsonl"]}[where]
    proc = _spawn("start", "-d", f"{dsn} application_name={APP}", "--slot", "s", "--synchronous", *target,
                  stderr=tmp_path / "e", stdout=out if where == "stdout" else None)  # fmt: skip
    try:
        _wait(lambda: _active(dsn), "streaming")
        _name_as_synchronous_standby(dsn)
        latencies = []
        with psycopg.connect(dsn, autocommit=True) as conn:
            for i in range(1, 41):
                t0 = time.perf_counter()
                conn.execute("INSERT INTO t VALUES (%s, 'x')", (i,))
                latencies.append(time.perf_counter() - t0)
                assert i in _ids(out), f"row {i} committed but not in the output"
        # `pgrecv slots` shows what the server sees of its synchronous standby
        listed = pgrecv("slots", "-d", dsn, "--format", "jsonl")
        assert listed.returncode == 0, err(listed)
        (row,) = [json.loads(line) for line in listed.stdout.splitlines() if json.loads(line)["slot_name"] == "s"]
        assert row["sync_state"] == "sync", row
        for lag in ("write_lag_seconds", "flush_lag_seconds"):
            assert lag in row and (row[lag] is None or 0 <= row[lag] < 5), row
        table = pgrecv("slots", "-d", dsn, "--format", "table")
        assert table.returncode == 0 and "sync" in table.stdout.decode(), table.stdout.decode()
        _reset_synchronous_standby(dsn)
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


def test_commits_that_send_no_transaction_do_not_wait(server: TempServer, tmp_path: Path) -> None:
    """synchronous_standby_names is server-wide: commits in another database or on a table outside
    the publication wait for pgrecv too, and reach it only as a keepalive (no transaction is sent
    for them). pgrecv answers such a keepalive at once instead of on its 10 s status timer."""
    dsn = server.dsn()
    sql(dsn, "CREATE TABLE t (id int PRIMARY KEY, v text); CREATE TABLE unpublished (id int)")
    sql(dsn, "CREATE PUBLICATION p FOR TABLE t")
    assert pgrecv("create", "-d", dsn, "--slot", "s").returncode == 0
    other = server.create_database("other")
    sql(other, "CREATE TABLE w (id int)")
    proc = _spawn("start", "-d", f"{dsn} application_name={APP}", "--slot", "s", "--synchronous",
                  "-f", str(tmp_path / "o.jsonl"), stderr=tmp_path / "e")  # fmt: skip
    try:
        _wait(lambda: _active(dsn), "streaming")
        _name_as_synchronous_standby(dsn)
        for where, statement in ((dsn, "INSERT INTO unpublished VALUES (%s)"), (other, "INSERT INTO w VALUES (%s)")):
            latencies = []
            with psycopg.connect(where, autocommit=True) as conn:
                for i in range(5):
                    t0 = time.perf_counter()
                    conn.execute(statement, (i,))
                    latencies.append(time.perf_counter() - t0)
            assert statistics.median(latencies) < 1.0, f"{statement}: commits waited {latencies}"
        _reset_synchronous_standby(dsn)
    finally:
        proc.terminate()
        code = proc.wait(30)
    assert code == 0, (tmp_path / "e").read_text()


def test_commits_that_arrive_together_share_a_sync_point(server: TempServer, tmp_path: Path) -> None:
    """Group commit: concurrent writers' commits are made durable and reported together, one
    fsync and one status update for several transactions (-vvv logs each sync point)."""
    dsn = server.dsn()
    _setup(dsn)
    out, log = tmp_path / "o.jsonl", tmp_path / "e"
    proc = _spawn("start", "-d", f"{dsn} application_name={APP}", "--slot", "s", "--synchronous", "-f", str(out),
                  "-vvv", stderr=log)  # fmt: skip
    writers, each = 8, 25
    try:
        _wait(lambda: _active(dsn), "streaming")
        _name_as_synchronous_standby(dsn)

        def write(k: int) -> None:
            with psycopg.connect(dsn, autocommit=True) as conn:
                for i in range(each):
                    conn.execute("INSERT INTO t VALUES (%s, 'x')", (k * 1000 + i,))

        threads = [threading.Thread(target=write, args=(k,)) for k in range(writers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        _reset_synchronous_standby(dsn)
    finally:
        proc.terminate()
        code = proc.wait(30)
    assert code == 0, log.read_text()
    assert len(_ids(out)) == writers * each
    groups = [int(m) for m in re.findall(r"sync point: (\d+) transaction", log.read_text())]
    assert sum(groups) == writers * each, groups
    assert len(groups) < writers * each and max(groups) >= 2, f"no commits shared a sync point: {groups}"


@pytest.mark.parametrize("plugin", ["pgoutput", "test_decoding"])
def test_a_state_record_lagging_after_a_crash_loses_nothing(server: TempServer, tmp_path: Path, plugin: str) -> None:
    """--synchronous into JSONL syncs the data only; the state record goes to the disk later. A
    machine crash can then leave a record of the first transaction only, while the slot was told
    of all ten and the disk holds them and half of an eleventh. The restart must keep the ten
    (the server will not send them again) and cut the half one; each row exactly once.
    test_decoding's commit records carry no end LSN: the commit LSN stands for it."""
    dsn = server.dsn()
    if plugin == "pgoutput":
        _setup(dsn)
    else:
        sql(dsn, "CREATE TABLE t (id int PRIMARY KEY, v text)")
        proc = pgrecv("create", "-d", dsn, "--slot", "s", "--plugin", "test_decoding")
        assert proc.returncode == 0, err(proc)
    out, log = tmp_path / "o.jsonl", tmp_path / "e"
    args = ("start", "-d", dsn, "--slot", "s", "--synchronous", "-f", str(out))
    _stream_while_inserting(dsn, args, log, range(1, 11))
    lines = out.read_bytes().splitlines(keepends=True)
    first_commit = next(n for n, line in enumerate(lines) if json.loads(line)["op"] == "commit")
    rec = json.loads(lines[first_commit])
    stale = {"version": 1, "offset": len(b"".join(lines[: first_commit + 1])), "commit_lsn": rec["commit_lsn"],
             "end_lsn": rec["end_lsn"], "tail": "jsonl"}  # fmt: skip
    data = json.dumps(stale).encode()
    (tmp_path / ".o.jsonl.pgrecv-state").write_bytes(data + b" " * (511 - len(data)) + b"\n")
    with out.open("ab") as f:
        f.write(b'{"v":1,"op":"begin","xid":999,"commit_lsn":"F/0"}\n{"v":1,"op":"insert","xid":999,"new":{"id":')
    _stream_while_inserting(dsn, args, log, range(11, 16))
    inserted = [json.loads(line)["new"]["id"] for line in out.read_bytes().splitlines() if b'"op":"insert"' in line]
    assert inserted == list(range(1, 16))


def _stream_while_inserting(dsn: str, args: tuple[str, ...], log: Path, ids: range) -> None:
    """Run pgrecv, insert ``ids`` one commit each, stop it cleanly once the slot confirms them all."""
    proc = _spawn(*args, stderr=log)
    try:
        _wait(lambda: _active(dsn), "streaming")
        with psycopg.connect(dsn, autocommit=True) as conn:
            for i in ids:
                conn.execute("INSERT INTO t VALUES (%s, 'x')", (i,))
            last = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]  # type: ignore[index]
        confirmed = f"SELECT confirmed_flush_lsn >= '{last}' FROM pg_replication_slots WHERE slot_name = 's'"
        _wait(lambda: sql(dsn, confirmed)[0][0], f"the slot to confirm rows {ids.start} to {ids.stop - 1}")
    finally:
        proc.terminate()
        code = proc.wait(30)
    assert code == 0, log.read_text()


def test_docs_cover_the_synchronous_standby() -> None:
    """README and man page: how to name pgrecv, what it promises, the logical decoding chapter's
    caveats (one database, a server-wide setting; a catalog lock can deadlock)."""
    root = Path(__file__).resolve().parents[2]
    for doc in (root / "README.md", root / "man" / "pgrecv.1"):
        text = " ".join(doc.read_text().replace("\\-", "-").split())
        for words in ("--synchronous", "synchronous_standby_names", "application_name", "server-wide",
                      "exclusive lock on a catalog table", "deadlock", "sync_state"):  # fmt: skip
            assert words in text, f"{doc.name} does not say {words!r}"
