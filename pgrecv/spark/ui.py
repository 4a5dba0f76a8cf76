"""Progress bar on a terminal and the summary table (rich)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from pgrecv.output.console import PipeConsole
from pgrecv.spark.model import Progress as Hooks
from pgrecv.spark.model import Summary


class RichProgress(Hooks):
    """spark-apply's files read and tables applied (``verify``: its tables compared, ``label``)."""

    def __init__(self, label: str = "tables applied") -> None:
        self.label = label
        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self.bar.start()
        self.read: Any = None
        self.apply: Any = None

    def files(self, total: int) -> None:
        self.read = self.bar.add_task("files read", total=total)

    def file_done(self) -> None:
        self.bar.advance(self.read)

    def tables(self, total: int) -> None:
        self.apply = self.bar.add_task(self.label, total=total)

    def table_done(self, name: str) -> None:
        self.bar.advance(self.apply)

    def stop(self) -> None:
        self.bar.stop()


def print_summary(summary: Summary, console: Console | None = None) -> None:
    if console is None:
        console = PipeConsole()
        if not console.is_terminal:  # a log file or pipe: whole headers and statuses, not 80 columns
            console = PipeConsole(width=max(console.width, 160))
    table = Table(title=f"spark-apply ({summary.engine})", title_justify="left")
    for col in ("table", "status", "inserted", "updated", "deleted", "truncated", "version", "applied position"):
        table.add_column(col, justify="right" if col in ("inserted", "updated", "deleted", "truncated") else "left")
    for t in summary.tables:
        table.add_row(
            Text(t.table),  # a name is data: "[b]" in it is not rich's markup
            t.status,
            str(t.inserts),
            str(t.updates),
            str(t.deletes),
            str(t.truncates),
            "-" if t.version is None else str(t.version),
            t.applied_lsn or "-",
        )
    console.print(table)
    # one line each, however long, so that a log keeps every warning whole (and greppable)
    console.print(
        f"{summary.files} files"
        + (f" ({summary.files_skipped} more applied before, not read)" if summary.files_skipped else "")
        + f", {summary.lines} lines, {summary.transactions} committed transactions; "
        f"{summary.incomplete} incomplete and {summary.rolled_back} rolled back skipped; "
        f"{summary.pending_prepared} prepared pending; {summary.seconds:.1f} s",
        soft_wrap=True,
    )
    if not summary.tables:
        console.print("nothing new for any (selected) table in the input")
    for w in summary.warnings:
        console.print(Text.assemble(("warning:", "yellow"), " ", w), soft_wrap=True)
