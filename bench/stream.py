#!/usr/bin/env python3
"""Streaming throughput: `pgrecv start` (pgoutput -> typed JSONL file, durable) against
`pg_recvlogical` (pgoutput, raw to a file) and against the server's own decoding, on the same
slot backlog, in the same run.

Each reads the backlog from its own slot, created before the workload, up to the same end
position; the server's decoding is ``count(*)`` over ``pg_logical_slot_peek_binary_changes`` on a
slot of its own (the limit a client could reach: the server decodes, nobody writes). Prints the
wall times, the ratios, pgrecv's CPU (user + system) per row change, and each client's walsender's
CPU (how a client reads changes the server's work: see pgrecv/stream/pacing.py). With ``--repeat N`` each
is measured N times, interleaved, and the best of each is kept (the machine may be shared).

Workloads:
  inserts  ROWS rows into a 6-column table (bigint, int, numeric, text, timestamptz, boolean)
  mixed    ROWS rows into a table of numeric(12,2), jsonb, int[], timestamptz, uuid, bytea,
           text, float8, boolean with REPLICA IDENTITY FULL; half of them updated (old and new
           images), a fifth deleted

Both clients connect over TCP to 127.0.0.1, or with ``--transport unix`` over the server's
Unix-domain socket (where a send costs the walsender much less, so the client's own CPU decides).

    python bench/stream.py [--workload inserts|mixed] [--rows N] [--txns 10] [--version 15] [--repeat 1] [--python]
                           [--transport tcp|unix]
"""

from __future__ import annotations

import argparse
import compileall
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pgrecv.pg.server import TempServer, find_installation, find_installations  # noqa: E402

TABLE = """CREATE TABLE bench (
    id bigint PRIMARY KEY, account int NOT NULL, amount numeric(12,2), note text,
    created timestamptz NOT NULL DEFAULT now(), flag boolean)"""
INSERTS = (
    "INSERT INTO bench (id, account, amount, note, flag) "
    "SELECT g, g %% 1000, (g %% 100000) / 100.0, 'note ' || g, g %% 2 = 0 "
    "FROM generate_series(%s::bigint, %s::bigint) g"
)
MIXED_TABLE = """CREATE TABLE bench (
    id bigint PRIMARY KEY, amount numeric(12,2), doc jsonb, ids int[], at timestamptz, uid uuid,
    blob bytea, note text, score float8, ok boolean);
ALTER TABLE bench REPLICA IDENTITY FULL"""
MIXED = (
    "INSERT INTO bench SELECT g, (g %% 100000) / 100.0, "
    "jsonb_build_object('id', g, 'tags', jsonb_build_array('a', g %% 7), 'ok', g %% 2 = 0), "
    "ARRAY[g, g %% 100, -g]::int[], '2026-01-01'::timestamptz + g * interval '1 s', md5(g::text)::uuid, "
    "decode(md5(g::text), 'hex'), 'note ' || g, g / 7.0, g %% 3 = 0 "
    "FROM generate_series(%s::bigint, %s::bigint) g"
)
MIXED_UPDATE = (
    "UPDATE bench SET amount = amount + 1, note = note || ' updated', score = score * 2 "
    "WHERE id %% 2 = 0 AND id BETWEEN %s AND %s"
)
MIXED_DELETE = "DELETE FROM bench WHERE id %% 5 = 0 AND id BETWEEN %s AND %s"


def run(cmd: list[str], **kw: object) -> float:
    """Wall time of the command; its CPU time goes to CPU[-1]."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(cmd, check=True, **kw)  # type: ignore[call-overload]
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return wall


CPU: list[float] = []


def server_cpu(server: TempServer) -> float:
    """CPU seconds of the server's ended processes (the postmaster's reaped children: a client's
    walsender once the client has gone)."""
    time.sleep(0.3)  # the postmaster reaps the walsender just after the client disconnects
    pid = int((server.data_dir / "postmaster.pid").read_text().split()[0])
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")  # cutime + cstime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--workload", choices=("inserts", "mixed"), default="inserts")
    ap.add_argument("--rows", type=int, default=None, help="rows inserted (default 1M inserts, 300k mixed)")
    ap.add_argument("--txns", type=int, default=10)
    ap.add_argument("--version", type=int, default=15, help="PostgreSQL major version to run")
    ap.add_argument("--repeat", type=int, default=1, help="measure each side this many times, keep the best")
    ap.add_argument(
        "--python", action="store_true", help="also run pgrecv with PGRECV_NO_NATIVE=1 (its pure-Python encoders)"
    )
    ap.add_argument(
        "--transport",
        choices=("tcp", "unix"),
        default="tcp",
        help="how both clients connect: TCP on 127.0.0.1 (default) or the server's Unix-domain socket",
    )
    ap.add_argument("--streaming", default="off", help="pgrecv --streaming (off: like pg_recvlogical here)")
    args = ap.parse_args()
    # pgrecv's bytecode, as an installed wheel has it (pip compiles it): an editable install where
    # PYTHONDONTWRITEBYTECODE=1 (this machine's image sets it) compiles 39 modules at every start,
    # 35-40 ms that no user of an installed pgrecv pays
    compileall.compile_dir(ROOT / "pgrecv", quiet=1)
    mixed = args.workload == "mixed"
    rows = args.rows or (300_000 if mixed else 1_000_000)
    install = find_installation(args.version) or max(find_installations(), key=lambda i: i.version)
    server = TempServer(install, settings={"max_wal_size": "4GB"}, tcp=args.transport == "tcp")
    with server, tempfile.TemporaryDirectory() as tmp:
        dsn = server.dsn()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(MIXED_TABLE if mixed else TABLE)
            conn.execute("CREATE PUBLICATION pub FOR TABLE bench")
            conn.execute("SELECT pg_create_logical_replication_slot('server', 'pgoutput')")
            for r in range(args.repeat):
                for name in (f"ref{r}", f"pgrecv{r}", f"py{r}"):
                    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (name,))
            per = rows // args.txns
            print(
                f"PostgreSQL {install.version}, {args.workload}: writing {rows:,} rows in {args.txns} transactions"
                + (" (then updating half, deleting a fifth)" if mixed else "")
                + " ...",
                flush=True,
            )
            for t in range(args.txns):
                conn.execute(MIXED if mixed else INSERTS, (t * per + 1, (t + 1) * per))
            if mixed:
                for statement in (MIXED_UPDATE, MIXED_DELETE):
                    for t in range(args.txns):
                        conn.execute(statement, (t * per + 1, (t + 1) * per))
            changes = per * args.txns
            if mixed:
                changes += conn.execute(
                    "SELECT count(*) FILTER (WHERE g %% 2 = 0) + count(*) FILTER (WHERE g %% 5 = 0) "
                    "FROM generate_series(1, %s) g",
                    (changes,),
                ).fetchone()[0]  # type: ignore[index]
            endpos = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]  # type: ignore[index]
        ref_times, our_times, our_cpu, server_times, py_times = [], [], [], [], []
        for r in range(args.repeat):
            with psycopg.connect(dsn, autocommit=True) as conn:
                started = time.perf_counter()
                decoded = conn.execute(
                    "SELECT count(*) FROM pg_logical_slot_peek_binary_changes('server', %s, NULL, "
                    "'proto_version', '1', 'publication_names', 'pub')",
                    (endpos,),
                ).fetchone()[0]  # type: ignore[index]
                server_times.append(time.perf_counter() - started)
            raw = Path(tmp) / f"ref{r}.raw"
            cpu0 = server_cpu(server)
            ref_times.append(
                run([
                    str(install.bin_dir / "pg_recvlogical"), "-d", dsn, "--slot", f"ref{r}", "--start",
                    "-E", endpos, "-f", str(raw), "--no-loop",
                    "-o", "proto_version=1", "-o", "publication_names=pub",
                ])
            )  # fmt: skip
            cpu1 = server_cpu(server)
            out = Path(tmp) / f"pgrecv{r}.jsonl"
            our_times.append(
                run([
                    sys.executable, "-m", "pgrecv", "start", "-d", dsn, "--slot", f"pgrecv{r}",
                    "-E", endpos, "-f", str(out), "--no-loop", "--streaming", args.streaming, "-q",
                ])
            )  # fmt: skip
            our_cpu.append(CPU[-1])
            cpu2 = server_cpu(server)
            lines = sum(1 for _ in out.open("rb"))
            print(
                f"run {r + 1}: server decoding {server_times[-1]:.2f} s ({decoded:,} messages), "
                f"pg_recvlogical {ref_times[-1]:.2f} s (CPU {CPU[-2]:.2f} s, walsender {cpu1 - cpu0:.2f} s, "
                f"{raw.stat().st_size / 1e6:.0f} MB raw), pgrecv {our_times[-1]:.2f} s (CPU {CPU[-1]:.2f} s, "
                f"walsender {cpu2 - cpu1:.2f} s, {out.stat().st_size / 1e6:.0f} MB, "
                f"{lines:,} JSONL lines)",
                flush=True,
            )
            os.unlink(raw)
            os.unlink(out)
            if args.python:
                out = Path(tmp) / f"py{r}.jsonl"  # a file of its own: pgrecv resumes a file it wrote before
                py_times.append(
                    run([
                        sys.executable, "-m", "pgrecv", "start", "-d", dsn, "--slot", f"py{r}",
                        "-E", endpos, "-f", str(out), "--no-loop", "--streaming", args.streaming, "-q",
                    ], env={**os.environ, "PGRECV_NO_NATIVE": "1"})
                )  # fmt: skip
                print(f"       pgrecv with PGRECV_NO_NATIVE=1 {py_times[-1]:.2f} s (CPU {CPU[-1]:.2f} s)", flush=True)
                os.unlink(out)
        startup = min(run([sys.executable, "-m", "pgrecv", "--version"], stdout=subprocess.DEVNULL) for _ in range(3))
        ref, ours, server = min(ref_times), min(our_times), min(server_times)
        print(
            f"{args.workload}, PostgreSQL {install.version}, {args.transport}, best of {args.repeat}: "
            f"server decoding {server:.2f} s  "
            f"pg_recvlogical {ref:.2f} s  pgrecv {ours:.2f} s  ratio to pg_recvlogical {ours / ref:.2f}  "
            f"ratio to the server's decoding {ours / server:.2f}  ({changes:,} row changes, {changes / ours:,.0f}/s; "
            f"pgrecv CPU {min(our_cpu) / changes * 1e6:.2f} µs per row change)"
        )
        if py_times:
            print(
                f"pgrecv with PGRECV_NO_NATIVE=1: {min(py_times):.2f} s, "
                f"ratio to pg_recvlogical {min(py_times) / ref:.2f}"
            )
        print(f"(pgrecv's interpreter start and imports alone, before it connects: {startup:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
