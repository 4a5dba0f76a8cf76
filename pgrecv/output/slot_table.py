"""`pgrecv slots` for people: one rich table, readable at a glance."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pgrecv.pg.slot_health import human_bytes

if TYPE_CHECKING:
    from rich.console import Console


def render_slots(rows: list[dict[str, Any]], console: Console | None = None) -> None:
    # rich here, not at import: the module is imported by `slots` for every output format
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    from pgrecv.output.console import PipeConsole

    if console is None:
        console = PipeConsole()
        if not console.is_terminal:
            console = PipeConsole(width=160)
    if not rows:
        console.print("no replication slots")
        return
    table = Table(title="replication slots", title_justify="left", box=box.SIMPLE_HEAD)
    headers = ("slot", "active", "confirmed", "lag", "retained", "wal", "flags")
    for name in headers:
        table.add_column(
            name,
            no_wrap=name not in ("slot", "flags"),
            overflow="fold",
            justify="right" if name in ("lag", "retained") else "left",
        )
    for r in rows:
        active = f"[green]pid {r['active_pid']}[/]" if r.get("active") else "[dim]no[/]"
        wal = r.get("wal_status") or "-"
        wal_style = {"reserved": "green", "extended": "yellow", "unreserved": "red", "lost": "bold red"}.get(wal, "")
        flags = [
            name
            for name, on in (
                ("temporary", r.get("temporary")),
                ("two-phase", r.get("two_phase")),
                ("failover", r.get("failover")),
                ("synced", r.get("synced")),
                ("conflicting", r.get("conflicting")),
            )
            if on
        ]
        if r.get("failover_ready") is True:
            flags.append("[green]ready for promotion[/]")
        elif r.get("failover_ready") is False:
            flags.append("[red]not ready: dropped at promotion[/]")
        if r.get("sync_state"):
            lag = r.get("flush_lag_seconds")
            flags.append(f"{r['sync_state']}" + (f", flush lag {lag * 1000:.1f} ms" if lag is not None else ""))
        if r.get("invalidation_reason"):
            flags.append(f"[red]invalidated: {escape(r['invalidation_reason'])}[/]")
        plugin = r.get("plugin") or r.get("slot_type") or "-"
        where = f"{plugin} · {r.get('database') or '-'}"  # a database's name may hold "[b]": escaped
        table.add_row(
            f"[bold]{escape(r['slot_name'])}[/]\n[dim]{escape(where)}[/]",
            active,
            str(r.get("confirmed_flush_lsn") or "-"),
            human_bytes(r.get("lag_bytes")),
            human_bytes(r.get("retained_bytes")),
            f"[{wal_style}]{wal}[/]" if wal_style else wal,
            ", ".join(flags) or "-",
        )
    console.print(table)
