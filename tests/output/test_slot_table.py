"""The slot table shows names as they are: a database may be called "[bold]db"."""

from __future__ import annotations

from rich.console import Console

from pgrecv.output.slot_table import render_slots


def test_names_that_look_like_markup_are_shown_as_they_are() -> None:
    console = Console(record=True, width=160, color_system=None)
    row = {
        "slot_name": "s1",
        "plugin": "pgoutput",
        "database": "[bold]db\\",  # a trailing backslash would escape rich's closing tag
        "active": False,
        "confirmed_flush_lsn": "0/1",
        "lag_bytes": 0,
        "retained_bytes": 0,
        "wal_status": "reserved",
        "invalidation_reason": "[x]odd",
    }
    render_slots([row], console)
    out = console.export_text()
    assert "pgoutput · [bold]db\\" in out
    assert "invalidated: [x]odd" in out
