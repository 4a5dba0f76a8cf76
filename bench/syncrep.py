"""pgrecv as a synchronous standby, against pg_receivewal --synchronous, on one throwaway server.

    python bench/syncrep.py [--version 15] [--commits 300] [--seconds 5] [--writers 8]

Each receiver in turn is named in ``synchronous_standby_names`` (by its application_name), so
every commit waits until the receiver reports it flushed. Measured for each, in the same run:
the median latency of single-row commits from one connection, the commit rate of ``--writers``
concurrent connections, and the receiver's CPU while nothing is written. pg_receivewal receives
physical WAL (it ships with the server): the reference for what a synchronous receiver costs.
Targets (issue 16): latency <= 2x, 8-writer rate >= 0.5x, idle CPU <= 1%.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psycopg

from pgrecv.pg.server import TempServer, find_installation


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)


def sync_state(dsn: str, app: str) -> str | None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT sync_state FROM pg_stat_replication WHERE application_name = %s", (app,)).fetchone()
    return row[0] if row else None


def measure(dsn: str, app: str, receiver: subprocess.Popen[bytes], args: argparse.Namespace) -> dict[str, float]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{app}'")
        conn.execute("SELECT pg_reload_conf()")
    wait_for(lambda: sync_state(dsn, app) == "sync", f"{app} to be the synchronous standby")
    latencies = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(args.commits):
            t0 = time.perf_counter()
            conn.execute("INSERT INTO t (v) VALUES (%s)", (i,))
            latencies.append(time.perf_counter() - t0)
    count = [0] * args.writers
    stop = time.monotonic() + args.seconds

    def writer(k: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            while time.monotonic() < stop:
                c.execute("INSERT INTO t (v) VALUES (%s)", (k,))
                count[k] += 1

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(args.writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    time.sleep(0.5)
    before = cpu_seconds(receiver.pid)
    time.sleep(args.seconds)
    idle = (cpu_seconds(receiver.pid) - before) / args.seconds
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM RESET synchronous_standby_names")
        conn.execute("SELECT pg_reload_conf()")
    return {"latency": statistics.median(latencies), "rate": sum(count) / args.seconds, "idle": idle}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--version", type=int, default=15)
    ap.add_argument("--commits", type=int, default=300)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--writers", type=int, default=8)
    args = ap.parse_args()
    install = find_installation(args.version)
    if install is None:
        raise SystemExit(f"no PostgreSQL {args.version} binaries")
    receivewal = install.bin_dir / "pg_receivewal"
    with TempServer(install, fsync=True) as server, tempfile.TemporaryDirectory() as work:
        dsn = server.dsn()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (id bigserial PRIMARY KEY, v int)")
            conn.execute("CREATE PUBLICATION p FOR ALL TABLES")
            conn.execute("SELECT pg_create_logical_replication_slot('bench', 'pgoutput')")
        results: dict[str, dict[str, float]] = {}
        wal_dir = Path(work, "wal")
        wal_dir.mkdir()
        ref = subprocess.Popen(
            [str(receivewal), "-d", f"{dsn} application_name=receivewal", "-D", str(wal_dir), "--synchronous", "-n"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            results["pg_receivewal --synchronous"] = measure(dsn, "receivewal", ref, args)
        finally:
            ref.terminate()
            ref.wait(30)
        out = Path(work, "out.jsonl")
        ours = subprocess.Popen(
            [sys.executable, "-m", "pgrecv", "start", "-d", f"{dsn} application_name=pgrecv_sync", "--slot", "bench",
             "-f", str(out), "--synchronous", "-q"],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            results["pgrecv start --synchronous"] = measure(dsn, "pgrecv_sync", ours, args)
        finally:
            ours.terminate()
            ours.wait(30)
    what = f"{args.commits} single commits, {args.writers} writers for {args.seconds:g} s"
    print(f"PostgreSQL {args.version}, fsync on, {what}")
    for name, r in results.items():
        print(
            f"{name:30} median commit {r['latency'] * 1000:7.2f} ms   {args.writers} writers {r['rate']:8.0f} commits/s"
            f"   idle CPU {r['idle'] * 100:5.1f}%"
        )
    ref_r, our_r = results["pg_receivewal --synchronous"], results["pgrecv start --synchronous"]
    print(
        f"ratios: latency {our_r['latency'] / ref_r['latency']:.2f}x (target <= 2), "
        f"{args.writers}-writer rate {our_r['rate'] / ref_r['rate']:.2f}x (target >= 0.5), "
        f"pgrecv idle CPU {our_r['idle'] * 100:.1f}% (target <= 1%)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
