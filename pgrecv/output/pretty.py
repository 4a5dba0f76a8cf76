"""Human-readable output: one rich table per transaction, printed when the transaction ends.

Rows are shown as the server's text form (no type conversion): this view is for reading, the
JSONL output is for machines. A transaction is printed only once its end is known, so what is on
screen is always a whole transaction; a prepared one is marked as such and its later COMMIT or
ROLLBACK PREPARED is printed as a one-line outcome.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from rich import box
from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from pgrecv import events as ev
from pgrecv.events import UNCHANGED, pg_time_iso
from pgrecv.lsn import lsn_str

MAX_VALUE: Final = 40  # characters of one value before it is cut with an ellipsis
MAX_ROWS: Final = 200  # rows shown per transaction; the rest are counted

OP_STYLE: Final[dict[str, str]] = {
    "insert": "green",
    "update": "yellow",
    "delete": "red",
    "truncate": "magenta",
    "message": "cyan",
}


# Control characters would move the cursor or drive the terminal: show them as escapes.
_VISIBLE: Final[dict[int, str]] = {
    **{c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))},
    ord("\n"): "↵",
    ord("\t"): "\\t",
}


@dataclass
class _Row:
    op: str
    table: str
    key: Text
    changes: Text
    xid: int | None = None  # set in streamed chunks: a subtransaction abort removes its rows


@dataclass
class _Txn:
    xid: int | None
    commit_lsn: int = 0
    commit_time: int | None = None
    origin: str | None = None
    rows: list[_Row] = field(default_factory=list)
    hidden: int = 0  # rows beyond max_rows, counted only
    loose: bool = False  # changes seen without their Begin (input started mid-transaction)

    @property
    def changes(self) -> int:
        return len(self.rows) + self.hidden


def compact(value: ev.Value, limit: int = MAX_VALUE) -> str:
    """One value as short text: NULL, the text form, or hex for binary; long ones cut with '…'."""
    if value is None:
        return "NULL"
    if isinstance(value, bytes):
        text = "\\x" + value[: limit // 2].hex()
        if len(value) > limit // 2:
            text += "…"
        return text
    text = str(value).translate(_VISIBLE)
    if len(text) > limit:
        return text[: limit - 1] + "…"
    return text


def _safe(name: str) -> str:
    """A name (table, prefix, gid) with its control characters made visible."""
    return name.translate(_VISIBLE)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


class PrettyRenderer:
    """Feed events in stream order; tables go to ``console``. Call :meth:`close` at the end."""

    def __init__(self, console: Console, *, max_rows: int = MAX_ROWS) -> None:
        self.console = console
        self.max_rows = max_rows
        self._txn: _Txn | None = None
        self._gid: str | None = None  # inside begin_prepare .. prepare
        self._streams: dict[int, _Txn] = {}  # streamed transactions by top-level xid
        self._stream_xid: int | None = None  # inside stream_start .. stream_stop
        self._prepared: dict[str, int] = {}  # gid -> changes shown, for the outcome line

    # --- feeding -------------------------------------------------------------------------------

    def feed(self, event: ev.Event) -> None:
        match event:
            case ev.Insert() | ev.Update() | ev.Delete() | ev.Truncate():
                self._add(_row(event), event.xid)
            case ev.Message(transactional=True):
                self._add(_message_row(event), event.xid)
            case ev.Message():
                self._print_message(event)
            case ev.Begin():
                self._flush_loose()
                self._txn = _Txn(event.xid, event.final_lsn, event.commit_time)
            case ev.Origin():
                if self._txn is not None:
                    self._txn.origin = _safe(event.name)
            case ev.Commit():
                txn = self._txn or _Txn(event.xid)
                self._txn = None
                txn.xid = txn.xid if txn.xid is not None else event.xid
                txn.commit_lsn = event.commit_lsn
                txn.commit_time = event.commit_time if event.commit_time is not None else txn.commit_time
                self._print_txn(txn, _title(txn, "commit"), "")
            case ev.BeginPrepare():
                self._flush_loose()
                self._txn = _Txn(event.xid, event.prepare_lsn, event.prepare_time)
                self._gid = event.gid
            case ev.Prepare():
                txn = self._txn or _Txn(event.xid)
                self._txn = None
                self._gid = None
                txn.xid = txn.xid if txn.xid is not None else event.xid
                txn.commit_lsn = event.prepare_lsn
                txn.commit_time = event.prepare_time
                self._print_prepared(txn, event.gid)
            case ev.CommitPrepared():
                self._outcome(event.gid, True, event.commit_lsn, event.commit_time)
            case ev.RollbackPrepared():
                self._outcome(event.gid, False, event.rollback_end_lsn, event.rollback_time)
            case ev.StreamStart():
                self._flush_loose()
                self._stream_xid = event.xid
                self._streams.setdefault(event.xid, _Txn(event.xid))
            case ev.StreamStop():
                self._stream_xid = None
            case ev.StreamCommit():
                txn = self._streams.pop(event.xid, _Txn(event.xid))
                txn.commit_lsn = event.commit_lsn
                txn.commit_time = event.commit_time
                self._print_txn(txn, _title(txn, "commit") + " · streamed", "")
            case ev.StreamAbort():
                self._stream_abort(event)
            case ev.StreamPrepare():
                txn = self._streams.pop(event.xid, _Txn(event.xid))
                txn.commit_lsn = event.prepare_lsn
                txn.commit_time = event.prepare_time
                self._print_prepared(txn, event.gid)
            case _:
                pass  # Relation, TypeInfo: schema only, nothing to show

    def close(self) -> None:
        """End of input: say what was left open instead of showing it as if it were complete."""
        self._flush_loose()
        for txn in self._streams.values():
            self._incomplete(txn)
        self._streams.clear()
        self._stream_xid = None

    # --- internals ------------------------------------------------------------------------------

    def _current(self) -> _Txn:
        if self._stream_xid is not None:
            return self._streams.setdefault(self._stream_xid, _Txn(self._stream_xid))
        if self._txn is None:  # a change outside any transaction: shown on its own at the next boundary
            self._txn = _Txn(None, loose=True)
        return self._txn

    def _add(self, row: _Row, xid: int | None) -> None:
        txn = self._current()
        if len(txn.rows) >= self.max_rows:
            txn.hidden += 1
            return
        row.xid = xid
        txn.rows.append(row)

    def _flush_loose(self) -> None:
        """Before a new transaction: show changes that came without a Begin, and say so about a
        transaction that never ended (a Begin arriving while one is open)."""
        txn = self._txn
        if txn is None:
            return
        self._txn = None
        self._gid = None
        if txn.loose:
            self._print_txn(txn, f"changes outside a transaction · {_plural(txn.changes, 'change')}", "")
        else:
            self._incomplete(txn)

    def _incomplete(self, txn: _Txn) -> None:
        what = f"xid {txn.xid}" if txn.xid is not None else "a transaction"
        self.console.print(
            Text(
                f"incomplete: {what} did not end ({_plural(txn.changes, 'change')} not shown)",
                style="dim",
            )
        )

    def _print_txn(self, txn: _Txn, title: str, caption: str) -> None:
        table = Table(
            title=title,
            title_justify="left",
            title_style="bold",
            caption=caption or None,
            caption_justify="left",
            box=box.SIMPLE_HEAD,
            show_edge=False,
            pad_edge=False,
            expand=True,
        )
        table.add_column("op", no_wrap=True)
        width = self.console.width  # most of it goes to the changes: narrow table and key columns
        table.add_column("table", overflow="fold", max_width=max(12, min(32, width // 5)))
        table.add_column("key", overflow="fold", max_width=max(10, min(28, width // 6)))
        table.add_column("changes", overflow="fold", ratio=1)
        for r in txn.rows:
            # names are data: Text, so that rich never reads "[bold]" in a table's name as markup
            table.add_row(Text(r.op, style=OP_STYLE.get(r.op, "")), Text(r.table), r.key, r.changes)
        if txn.hidden:
            table.add_row("", Text(f"… {_plural(txn.hidden, 'more change')}", style="dim"), "", "")
        self.console.print(table)

    def _print_prepared(self, txn: _Txn, gid: str) -> None:
        self._prepared[gid] = txn.changes
        title = (
            f"prepared '{_safe(gid)}' · xid {txn.xid} · prepare {lsn_str(txn.commit_lsn)}"
            f"{_when(txn.commit_time)} · {_plural(txn.changes, 'change')}"
        )
        caption = "PREPARED: not committed yet; applies only if COMMIT PREPARED follows"
        self._print_txn(txn, title, caption)

    def _outcome(self, gid: str, committed: bool, lsn: int, when: int | None) -> None:
        n = self._prepared.pop(gid, None)
        what = f"the {_plural(n, 'change')} shown above" if n is not None else "its changes (prepared earlier)"
        where = f"'{_safe(gid)}' at {lsn_str(lsn)}{_when(when)}"
        if committed:
            text = Text(f"COMMIT PREPARED {where}: committed, {what}", style="green")
        else:
            text = Text(f"ROLLBACK PREPARED {where}: rolled back, discard {what}", style="bold red")
        self.console.print(text)

    def _stream_abort(self, event: ev.StreamAbort) -> None:
        if event.subxid == event.xid:
            txn = self._streams.pop(event.xid, None)
            n = txn.changes if txn is not None else 0
            self.console.print(Text(f"streamed xid {event.xid} aborted: discard {_plural(n, 'change')}", style="red"))
            return
        txn = self._streams.get(event.xid)
        if txn is not None:
            txn.rows = [r for r in txn.rows if r.xid != event.subxid]

    def _print_message(self, m: ev.Message) -> None:
        body = Text.assemble(
            (f"message '{_safe(m.prefix)}'", "bold cyan"),
            (f" at {lsn_str(m.lsn)}: ", "dim"),
            _content(m.content, 200),
        )
        self.console.print(Panel(body, box=box.ROUNDED, expand=False, subtitle="non-transactional"))


# --- row rendering ---------------------------------------------------------------------------------


def _title(txn: _Txn, what: str) -> str:
    origin = f" · origin {txn.origin}" if txn.origin else ""
    return (
        f"xid {txn.xid} · {what} {lsn_str(txn.commit_lsn)}{_when(txn.commit_time)}"
        f" · {_plural(txn.changes, 'change')}{origin}"
    )


def _when(t: int | None) -> str:
    return "" if t is None else f" · {pg_time_iso(t)}"


def _content(data: bytes, limit: int) -> Text:
    try:
        return Text(compact(data.decode(), limit))
    except UnicodeDecodeError:
        return Text(compact(data, limit), style="dim")


def _pairs(names: list[str], values: list[ev.Value]) -> Text:
    out = Text()
    for i, (name, value) in enumerate(zip(names, values, strict=True)):
        if i:
            out.append(", ")
        out.append(f"{_safe(name)}=", style="dim")
        if value is UNCHANGED:
            out.append("‹unchanged toast›", style="dim italic")
        elif value is None:
            out.append("NULL", style="italic")
        else:
            out.append(compact(value))
    return out


def _key(rel: ev.Relation, image: ev.Tuple | None) -> Text:
    if image is None:
        return Text("")
    names = [c.name for c in rel.columns]
    keys = [i for i, c in enumerate(rel.columns) if c.key]
    if not keys or len(image) != len(names):
        return Text("")
    return _pairs([names[i] for i in keys], [image[i] for i in keys])


def _row(e: ev.Change) -> _Row:
    if isinstance(e, ev.Truncate):
        tables = ", ".join(_safe(f"{r.namespace}.{r.name}") for r in e.relations)
        flags = [f for f, on in (("cascade", e.cascade), ("restart identity", e.restart_identity)) if on]
        return _Row("truncate", tables, Text(""), Text(", ".join(flags), style="dim"))
    rel = e.relation
    table = _safe(f"{rel.namespace}.{rel.name}")
    names = [c.name for c in rel.columns]
    is_key = [c.key for c in rel.columns]
    if isinstance(e, ev.Insert):
        return _Row("insert", table, _key(rel, e.new), _image(names, is_key, e.new, None))
    if isinstance(e, ev.Update):
        key_image = e.old if e.old is not None and e.old_kind == "K" else e.new
        old = e.old if e.old_kind == "O" else None
        changes = _image(names, is_key, e.new, old)
        if e.old is not None and e.old_kind == "K":
            changes = Text.assemble(Text("key changed → ", style="yellow"), _key(rel, e.new), "; ", changes)
        return _Row("update", table, _key(rel, key_image), changes)
    old_values = _image(names, is_key, e.old, None) if e.old is not None and e.old_kind == "O" else Text("")
    return _Row("delete", table, _key(rel, e.old), old_values)


def _image(names: list[str], is_key: list[bool], tup: ev.Tuple | None, old: ev.Tuple | None) -> Text:
    """The non-key values of a row; with the old full row known, only those that changed."""
    if tup is None or len(tup) != len(names):
        return Text("")
    pick = [
        i
        for i, v in enumerate(tup)
        if not is_key[i] and (old is None or len(old) != len(tup) or v is UNCHANGED or old[i] != v)
    ]
    return _pairs([names[i] for i in pick], [tup[i] for i in pick])


def _message_row(m: ev.Message) -> _Row:
    return _Row("message", _safe(m.prefix), Text(""), _content(m.content, MAX_VALUE * 2))
