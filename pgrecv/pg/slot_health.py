"""Slot health for cron and monitoring: problems as one line each, and Prometheus metrics.

Pure: it reads the rows of :func:`pgrecv.pg.slots.list_slots` (and, for failover readiness, the
standby's rows) and decides; the CLI prints and picks the exit code. A slot in trouble is
invisible until the disk is full, so every check here names what will happen and what to do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any


@dataclass(frozen=True, slots=True)
class Limits:
    max_lag: int | None = None  # bytes of WAL the consumer has not confirmed
    max_retained: int | None = None  # bytes of WAL the slot keeps on the server
    max_inactive: float | None = None  # seconds without a consumer (PostgreSQL 17+ knows since when)


def human_bytes(n: int | None) -> str:
    """A byte count for people (kB, MB, ...: powers of 1024); "-" for unknown."""
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(size) < 1024 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(n)


def _size(n: int) -> str:
    return human_bytes(n)


def failover_ready(standby_row: dict[str, Any]) -> bool:
    """A synchronized copy survives a promotion only once persisted: a temporary copy (the standby
    could not yet build a consistent snapshot at the slot's position) is dropped at promotion."""
    return (
        bool(standby_row.get("synced"))
        and not standby_row.get("temporary")
        and not standby_row.get("invalidation_reason")
    )


def problems(
    rows: Sequence[dict[str, Any]],
    limits: Limits,
    *,
    now: datetime | None = None,
    standby: Sequence[dict[str, Any]] | None = None,
) -> list[str]:
    """One line per problem of each slot in ``rows``; empty when all is well.

    ``standby``: the rows of a standby's slots; every failover slot of ``rows`` must have a copy
    there that would survive a promotion.
    """
    now = now or datetime.now(UTC)
    out: list[str] = []
    on_standby = {r["slot_name"]: r for r in standby or ()}
    for r in rows:
        name = r["slot_name"]
        reason = r.get("invalidation_reason")
        wal = r.get("wal_status")
        if reason:
            out.append(
                f"slot {name} is invalidated ({reason}): its changes are gone; drop it, re-create it "
                "and take a new snapshot"
            )
        elif wal == "lost":
            out.append(f"slot {name} has lost WAL it needs: drop it, re-create it and take a new snapshot")
        elif wal == "unreserved":
            out.append(
                f"slot {name} holds WAL past max_slot_wal_keep_size (wal_status unreserved): it will be "
                "invalidated at the next checkpoint unless its consumer catches up now"
            )
        lag, retained = r.get("lag_bytes"), r.get("retained_bytes")
        if limits.max_lag is not None and lag is not None and lag > limits.max_lag:
            out.append(
                f"slot {name} lags {_size(lag)} behind the server (limit {_size(limits.max_lag)}): "
                "is its consumer running?"
            )
        if limits.max_retained is not None and retained is not None and retained > limits.max_retained:
            out.append(
                f"slot {name} retains {_size(retained)} of WAL (limit {_size(limits.max_retained)}): "
                "consume it, or drop it if nothing does"
            )
        if limits.max_inactive is not None and not r.get("active"):
            since = r.get("inactive_since")
            if since is not None:
                idle = (now - datetime.fromisoformat(since)).total_seconds()
                if idle > limits.max_inactive:
                    out.append(
                        f"slot {name} has had no consumer for {idle:.0f} s (limit {limits.max_inactive:.0f} s): "
                        "start its consumer, or drop it"
                    )
        if standby is not None and r.get("failover"):
            copy = on_standby.get(name)
            if copy is None:
                out.append(
                    f"failover slot {name} has no copy on the standby: check sync_replication_slots, "
                    "primary_slot_name and hot_standby_feedback there"
                )
            elif not failover_ready(copy):
                why = copy.get("invalidation_reason") or "still temporary"
                out.append(
                    f"failover slot {name} would not survive a promotion of the standby ({why}): let its "
                    "consumer advance it past a running-transactions record (SELECT pg_log_standby_snapshot() "
                    "on the primary) until the standby's copy is persisted"
                )
    return out


_WAL_STATUSES = ("reserved", "extended", "unreserved", "lost")


def prometheus(rows: Sequence[dict[str, Any]]) -> bytes:
    """The Prometheus text exposition of the slots, for node_exporter's textfile collector."""
    from prometheus_client import CollectorRegistry, Gauge, generate_latest  # only this command needs it

    registry = CollectorRegistry()
    labels = ["slot", "database", "plugin"]

    def gauge(name: str, doc: str, extra: Sequence[str] = ()) -> Gauge:
        return Gauge(f"pgrecv_slot_{name}", doc, [*labels, *extra], registry=registry)

    retained = gauge("retained_bytes", "WAL the slot keeps on the server, in bytes")
    lag = gauge("confirmed_lag_bytes", "WAL written since the slot's confirmed flush position, in bytes")
    active = gauge("active", "1 while a consumer is streaming the slot")
    status = gauge("wal_status", "1 for the slot's current wal_status", ["status"])
    invalid = gauge("invalidated", "1 when the slot is invalidated", ["reason"])
    for r in rows:
        key = [r["slot_name"], r.get("database") or "", r.get("plugin") or ""]
        if r.get("retained_bytes") is not None:
            retained.labels(*key).set(r["retained_bytes"])
        if r.get("lag_bytes") is not None:
            lag.labels(*key).set(r["lag_bytes"])
        active.labels(*key).set(1 if r.get("active") else 0)
        for s in _WAL_STATUSES:
            status.labels(*key, s).set(1 if r.get("wal_status") == s else 0)
        reason = r.get("invalidation_reason")
        invalid.labels(*key, reason or "").set(1 if reason else 0)
    return generate_latest(registry)
