"""`start --metrics-file`: the stream's progress in the Prometheus text format, rewritten whole.

node_exporter's textfile collector reads every ``*.prom`` file of its directory; a file replaced
by rename is never seen half-written. Rendering is pure; :func:`write` replaces the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from pgrecv.events import PG_EPOCH_UNIX
from pgrecv.output.files import write_atomic


class _Stats(Protocol):
    transactions: int
    rows: int
    reconnects: int
    last_commit_time: int | None


def render(slot: str, stats: _Stats, received: int, confirmed: int, bytes_written: int) -> bytes:
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    registry = CollectorRegistry()

    def gauge(name: str, doc: str, value: float) -> None:
        Gauge(f"pgrecv_stream_{name}", doc, ["slot"], registry=registry).labels(slot).set(value)

    gauge("received_lsn", "The furthest WAL position the server said it sent (as a number)", received)
    gauge("confirmed_lsn", "The flush position confirmed to the server: durable output ends there", confirmed)
    gauge("lag_bytes", "WAL received but not yet confirmed, in bytes", max(0, received - confirmed))
    gauge("transactions", "Transactions written since pgrecv started", stats.transactions)
    gauge("rows", "Row changes written since pgrecv started", stats.rows)
    gauge("written_bytes", "Bytes written to the output since pgrecv started", bytes_written)
    gauge("reconnects", "Reconnects after a lost connection since pgrecv started", stats.reconnects)
    if stats.last_commit_time is not None:
        gauge(
            "last_commit_timestamp_seconds",
            "Commit time of the last transaction written (Unix time)",
            stats.last_commit_time / 1e6 + PG_EPOCH_UNIX,
        )
    return generate_latest(registry)


def write(path: Path, data: bytes) -> None:
    write_atomic(path, data, what="the metrics file", mode=0o644)
