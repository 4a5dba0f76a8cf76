"""PrettyRenderer: what a reader sees for transactions, prepared transactions, messages, streams."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from rich.console import Console

from pgrecv import events as ev
from pgrecv.decode.pgoutput import PgOutputDecoder
from pgrecv.events import UNCHANGED, pg_time_iso
from pgrecv.output.pretty import PrettyRenderer, compact

T0 = 817_000_000_123_456


def col(name: str, oid: int, type_name: str, key: bool = False) -> ev.Column:
    return ev.Column(name, oid, -1, type_name, key)


ACCOUNTS = ev.Relation(
    16385,
    "public",
    "accounts",
    "f",
    (col("id", 23, "integer", key=True), col("owner", 25, "text"), col("note", 25, "text")),
)


def render(events: list[ev.Event], width: int = 100, **kwargs: int) -> str:
    console = Console(record=True, width=width, color_system=None)
    renderer = PrettyRenderer(console, **kwargs)
    for e in events:
        renderer.feed(e)
    renderer.close()
    return console.export_text()


def txn(*changes: ev.Event, xid: int = 750, lsn: int = 0x1A2B3C0) -> list[ev.Event]:
    return [ev.Begin(lsn, T0, xid), *changes, ev.Commit(0, lsn, lsn + 0x30, T0)]


def line_with(text: str, needle: str) -> str:
    lines = [line for line in text.splitlines() if needle in line]
    assert lines, f"{needle!r} not in:\n{text}"
    return lines[0]


def test_transaction_table() -> None:
    out = render(
        txn(
            ACCOUNTS,
            ev.Insert(ACCOUNTS, ("1", "ann", "first")),
            ev.Update(ACCOUNTS, ("1", "bob", "first"), old=("1", "ann", "first"), old_kind="O"),
            ev.Delete(ACCOUNTS, ("1", "bob", "first"), old_kind="O"),
            ev.Truncate((ACCOUNTS,), cascade=False, restart_identity=True),
            ev.Message(True, 0x99, "audit", b"did things"),
        )
    )
    title = line_with(out, "xid 750")
    assert "0/1A2B3C0" in title and pg_time_iso(T0) in title and "5 changes" in title
    assert "insert" in line_with(out, "owner=ann")
    update = line_with(out, "update")
    # with the old row known, only the column that changed is shown
    assert "owner=bob" in update and "note=" not in update and "id=1" in update
    assert "public.accounts" in line_with(out, "delete")
    assert "restart identity" in line_with(out, "truncate")
    assert "did things" in line_with(out, "message") and "audit" in line_with(out, "message")


def test_key_change_and_unchanged_toast() -> None:
    rel = ev.Relation(2, "app", "docs", "d", (col("id", 23, "integer", key=True), col("body", 25, "text")))
    out = render(
        txn(
            ev.Update(rel, ("2", UNCHANGED), old=("1", None), old_kind="K"),
            ev.Update(rel, ("3", "new body")),
        )
    )
    first = line_with(out, "key changed")
    assert "id=1" in first and "id=2" in first and "unchanged toast" in first
    assert "body=new body" in line_with(out, "id=3")


def test_unchanged_toast_taken_from_the_full_old_row_is_not_a_change() -> None:
    """REPLICA IDENTITY FULL: the decoder puts the old row's value in the new row (issue 60); the
    update then shows only what changed, not an unchanged TOAST marker."""
    old = ("1", "ann", "x" * 3000)
    new, filled = ev.fill_from_old(ACCOUNTS, ("1", "bob", UNCHANGED), old, "O")
    assert new == ("1", "bob", "x" * 3000) and filled == ("note",)
    out = render(txn(ev.Update(ACCOUNTS, new, old=old, old_kind="O", toast_from_old=filled)))
    update = line_with(out, "update")
    assert "owner=bob" in update and "note=" not in update and "unchanged toast" not in out


def test_long_values_are_cut_and_sql_null_is_shown() -> None:
    long_value = "x" * 300
    out = render(txn(ev.Insert(ACCOUNTS, ("1", long_value, None))))
    row = line_with(out, "insert")
    assert "x" * 300 not in out and "…" in out
    assert "NULL" in out and "owner=" in row
    assert compact("a" * 50) == "a" * 39 + "…"
    assert compact(b"\x01\x02") == "\\x0102" and compact(None) == "NULL"


def test_prepared_transactions_and_outcomes() -> None:
    events: list[ev.Event] = [
        ev.BeginPrepare(0x700, 0x730, T0, 910, "tx-rolled"),
        ev.Insert(ACCOUNTS, ("5", "eve", None)),
        ev.Prepare(0, 0x700, 0x730, T0, 910, "tx-rolled"),
        ev.BeginPrepare(0x800, 0x830, T0, 911, "tx-kept"),
        ev.Insert(ACCOUNTS, ("6", "fay", None)),
        ev.Prepare(0, 0x800, 0x830, T0, 911, "tx-kept"),
        ev.RollbackPrepared(0, 0x730, 0x900, T0, T0 + 1, 910, "tx-rolled"),
        ev.CommitPrepared(0, 0xA00, 0xA30, T0 + 2, 911, "tx-kept"),
        ev.RollbackPrepared(0, 0x100, 0xB00, None, None, 905, "tx-older"),
    ]
    out = render(events)
    assert "prepared 'tx-rolled'" in out and "prepared 'tx-kept'" in out
    assert out.count("PREPARED: not committed yet") == 2
    rolled = line_with(out, "ROLLBACK PREPARED 'tx-rolled'")
    assert "rolled back" in out[out.index(rolled) :].split("\n\n")[0]
    assert "COMMIT PREPARED 'tx-kept' at 0/A00" in out
    assert "ROLLBACK PREPARED 'tx-older'" in out and "prepared earlier" in out
    assert "eve" in out and "fay" in out


def test_non_transactional_message_panel() -> None:
    out = render([ev.Message(False, 0x10, "ping", b"hello there")])
    line = line_with(out, "hello there")
    assert "ping" in line and "0/10" in line
    assert "non-transactional" in out


def test_incomplete_transaction_is_not_shown_as_complete() -> None:
    out = render([ev.Begin(0, None, 777), ev.Insert(ACCOUNTS, ("9", "zed", None))])
    assert "incomplete" in out and "xid 777" in out and "1 change" in out
    assert "zed" not in out


def test_streamed_transaction_with_aborted_subtransaction() -> None:
    events: list[ev.Event] = [
        ev.StreamStart(920, True),
        ev.Insert(ACCOUNTS, ("1", "kept", None), xid=920),
        ev.Insert(ACCOUNTS, ("2", "rolled-back-savepoint", None), xid=921),
        ev.StreamStop(),
        ev.StreamAbort(920, 921),
        ev.StreamStart(920, False),
        ev.Insert(ACCOUNTS, ("3", "later", None), xid=920),
        ev.StreamStop(),
        ev.StreamCommit(920, 0, 0x90, 0x98, T0),
        ev.StreamStart(930, True),
        ev.Insert(ACCOUNTS, ("4", "gone", None), xid=930),
        ev.StreamStop(),
        ev.StreamAbort(930, 930),
    ]
    out = render(events)
    assert "kept" in out and "later" in out and "streamed" in line_with(out, "xid 920")
    assert "rolled-back-savepoint" not in out
    assert "gone" not in out and "streamed xid 930 aborted" in out


def test_many_rows_are_counted_not_shown() -> None:
    inserts = [ev.Insert(ACCOUNTS, (str(i), f"user{i}", None)) for i in range(30)]
    out = render(txn(*inserts), max_rows=10)
    assert "user9" in out and "user10" not in out
    assert "… 20 more changes" in out and "30 changes" in out


def test_fits_in_80_columns() -> None:
    wide = ev.Relation(
        3,
        "a_rather_long_schema_name",
        "an_even_longer_table_name_for_testing",
        "d",
        tuple(col(f"column_{i}", 25, "text", key=i == 0) for i in range(8)),
    )
    out = render(txn(ev.Insert(wide, tuple("v" * 30 for _ in range(8)))), width=80)
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "insert" in out and "column_7" in out


# --- captured server output ----------------------------------------------------------------------

GOLDEN = sorted((Path(__file__).parent.parent / "golden").glob("pg*/*.pgoutput.jsonl"))


@pytest.mark.skipif(not GOLDEN, reason="no golden files captured yet")
@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_golden_pgoutput_renders_in_80_columns(path: Path) -> None:
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
    decoder = PgOutputDecoder(int(lines[0]["meta"].get("proto_version", 1)))
    events = [decoder.decode(bytes.fromhex(m["data"])) for m in lines if "data" in m]
    out = render(events, width=80)
    assert max((len(line) for line in out.splitlines()), default=0) <= 80
    assert "incomplete" not in out
    commits = sum(isinstance(e, ev.Commit | ev.StreamCommit) for e in events)
    assert sum(1 for line in out.splitlines() if line.startswith("xid ")) == commits
    prepares = sum(isinstance(e, ev.Prepare | ev.StreamPrepare) for e in events)
    assert out.count("PREPARED: not committed yet") == prepares


def test_control_characters_are_shown_escaped() -> None:
    rel = ev.Relation(4, "public", "we\x1bird", "d", (col("id", 23, "integer", key=True), col("v", 25, "text")))
    out = render(
        [
            *txn(ev.Insert(rel, ("1", "red\x1b[31m\x00 and\nnext"))),
            ev.Message(False, 0x10, "p\x07", b"bell\x07"),
            ev.BeginPrepare(0x20, 0x30, None, 5, "g\x1b"),
            ev.Prepare(0, 0x20, 0x30, None, 5, "g\x1b"),
        ]
    )
    assert not any(ch in out for ch in "\x1b\x00\x07")
    assert "red\\x1b[31m\\x00 and↵next" in out and "we\\x1bird" in out and "bell\\x07" in out
    assert "prepared 'g\\x1b'" in out


def test_names_that_look_like_markup_are_shown_as_they_are() -> None:
    # PostgreSQL allows "[bold]x" as a table's name; rich would read it as markup and show "x"
    rel = ev.Relation(5, "[red]s", "[bold]x", "d", (col("[b]id", 23, "integer", key=True), col("v", 25, "text")))
    out = render([*txn(ev.Insert(rel, ("1", "[dim]v"))), *txn(ev.Message(True, 0x99, "[i]p", b"[u]c"), lsn=0x2000)])
    assert "[red]s.[bold]x" in line_with(out, "insert")
    assert "[b]id=1" in line_with(out, "insert") and "v=[dim]v" in line_with(out, "insert")
    assert "[i]p" in line_with(out, "message") and "[u]c" in line_with(out, "message")
