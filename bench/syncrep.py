"""pgrecv as a synchronous standby, against pg_receivewal --synchronous, on one throwaway server.

    python bench/syncrep.py [--version 15] [--commits 500] [--seconds 5] [--writers 8] [--rounds 5]

Each receiver in turn is named in ``synchronous_standby_names`` (by its application_name), so
every commit waits until the receiver reports it flushed. Measured for each, in the same run:
the median latency of single-row commits from one connection, the commit rate of ``--writers``
concurrent connections, and the receiver's CPU while nothing is written. The measures are split
into ``--rounds`` that alternate between the receivers, so both meet the same disk. pg_receivewal
receives physical WAL (it ships with the server): the reference for what a synchronous receiver costs.
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
from dataclasses import dataclass, field
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


@dataclass
class Sample:
    latencies: list[float] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)
    idle: float = 0.0

    def add(self, other: Sample) -> None:
        self.latencies += other.latencies
        self.rates += other.rates
        self.idle = max(self.idle, other.idle)


def measure(dsn: str, app: str, receiver: subprocess.Popen[bytes], args: argparse.Namespace, idle: bool) -> Sample:
    """One round with ``receiver`` as the synchronous standby: single commits, then the writers."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{app}'")
        conn.execute("SELECT pg_reload_conf()")
    wait_for(lambda: sync_state(dsn, app) == "sync", f"{app} to be the synchronous standby")
    sample = Sample()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(args.commits // args.rounds):
            t0 = time.perf_counter()
            conn.execute("INSERT INTO t (v) VALUES (%s)", (i,))
            sample.latencies.append(time.perf_counter() - t0)
    count = [0] * args.writers
    seconds = args.seconds / args.rounds
    stop = time.monotonic() + seconds

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
    sample.rates.append(sum(count) / seconds)
    if idle:
        time.sleep(0.5)
        before = cpu_seconds(receiver.pid)
        time.sleep(args.seconds)
        sample.idle = (cpu_seconds(receiver.pid) - before) / args.seconds
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM RESET synchronous_standby_names")
        conn.execute("SELECT pg_reload_conf()")
    return sample


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--version", type=int, default=15)
    ap.add_argument("--commits", type=int, default=500)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--writers", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
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
        wal_dir = Path(work, "wal")
        wal_dir.mkdir()
        out = Path(work, "out.jsonl")
        receivers: dict[str, tuple[str, list[str]]] = {
            "pg_receivewal --synchronous": (
                "receivewal",
                [str(receivewal), "-d", f"{dsn} application_name=receivewal", "-D", str(wal_dir),
                 "--synchronous", "-n"],
            ),
            "pgrecv start --synchronous": (
                "pgrecv_sync",
                [sys.executable, "-m", "pgrecv", "start", "-d", f"{dsn} application_name=pgrecv_sync",
                 "--slot", "bench", "-f", str(out), "--synchronous", "-q"],
            ),
        }  # fmt: skip
        results = {name: Sample() for name in receivers}
        # Rounds alternate between the receivers (each restarted per round, resuming where it
        # stopped): the disk's fsync latency drifts over minutes on a shared machine, and a
        # ratio of two runs made minutes apart measured the drift as much as the receivers.
        for r in range(args.rounds):
            order = list(receivers) if r % 2 == 0 else list(reversed(receivers))
            for name in order:
                app, argv = receivers[name]
                proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                try:
                    results[name].add(measure(dsn, app, proc, args, idle=r == args.rounds - 1))
                finally:
                    proc.terminate()
                    proc.wait(30)
    what = f"{args.commits} single commits, {args.writers} writers for {args.seconds:g} s, {args.rounds} rounds"
    print(f"PostgreSQL {args.version}, fsync on, {what}")
    summary = {
        name: (statistics.median(s.latencies), statistics.median(s.rates), s.idle) for name, s in results.items()
    }
    for name, (latency, rate, idle) in summary.items():
        print(
            f"{name:30} median commit {latency * 1000:7.2f} ms   {args.writers} writers {rate:8.0f} commits/s"
            f"   idle CPU {idle * 100:5.1f}%"
        )
    ref_r, our_r = summary["pg_receivewal --synchronous"], summary["pgrecv start --synchronous"]
    print(
        f"ratios: latency {our_r[0] / ref_r[0]:.2f}x (target <= 2), "
        f"{args.writers}-writer rate {our_r[1] / ref_r[1]:.2f}x (target >= 0.5), "
        f"pgrecv idle CPU {our_r[2] * 100:.1f}% (target <= 1%)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
