"""spark-apply's summary: names and values as they are, each warning on one line."""

from __future__ import annotations

from rich.console import Console

from pgrecv.spark.model import Summary, TableResult
from pgrecv.spark.ui import print_summary


def test_names_and_warnings_are_shown_whole() -> None:
    console = Console(record=True, width=120, color_system=None)
    long = "x" * 200
    warning = f"public.[bold]t: f.jsonl:3: value '[[1,2],[3,4]]' of column [i]a cannot be stored: {long}"
    summary = Summary("parquet/spark", files=1, lines=3, tables=[TableResult("public.[bold]t", "/t", "held back")])
    summary.warnings.append(warning)
    print_summary(summary, console)
    out = console.export_text()
    assert any("public.[bold]t" in line and "held back" in line for line in out.splitlines())
    # one line, however narrow the console: a log keeps it whole
    assert f"warning: {warning}" in out.splitlines()
