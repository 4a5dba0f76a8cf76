"""What a target has wholly applied of its change directories, so that a run does not read it again.

A change directory only grows: ``pgrecv start --output-dir`` adds files named ``FIRST-LAST`` by
their first and last commit LSN, in commit order, and never changes one it has finished. Once a
run has read every file of a directory given as SOURCE and applied every table (none held back, no
transaction left incomplete), every file of that directory whose LAST is at or below the highest
LAST it saw is applied for good: the next run skips it by its name, unopened. That position is the
directory's *through* in ``TARGET/_pgrecv/applied.json``.

A record is kept per set of the options that choose what is applied (``--table``, ``--mode``,
``--append-only``, ``--key``, ``--format``): jobs that apply parts of one target each keep their
own, and a run with options of its own reads every file once. A record holds only while every
table it lists is still there, at or past the position it had then (a table removed, or restored
to an earlier version, must be rebuilt from every file: the run reads them all, and says why).

Prepared transactions whose outcome a run did not see are carried over under
``TARGET/_pgrecv/prepared`` (pgrecv.spark.engine.carry), so the files that hold them may be
skipped; a transaction left incomplete (a streamed one whose chunks span files, a file cut short)
keeps the directory's position where it was. Files named otherwise, and files given one by one, are always
read. ``--list-applied`` prints the files a run would skip: the ones that may be retired.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from pgrecv.lsn import lsn_str
from pgrecv.output.files import named_last
from pgrecv.spark import stores
from pgrecv.spark.inputs import parse_lsn
from pgrecv.spark.model import ApplyConfig, Summary
from pgrecv.spark.stores import SourceFile, is_store_source
from pgrecv.spark.targets import Target, target_of

if TYPE_CHECKING:
    from pyarrow.fs import FileSystem

LEDGER = "applied.json"
VERSION = 1


@dataclass
class Ledger:
    """A record of ``TARGET/_pgrecv/applied.json``: the options it holds for, each SOURCE
    directory's through, and each table's position when it was written (by directory name: the
    table as ``schema.table``, and the LSN)."""

    options: dict[str, Any] = field(default_factory=dict)
    through: dict[str, int] = field(default_factory=dict)  # resolved directory → commit LSN
    tables: dict[str, tuple[str, int]] = field(default_factory=dict)  # dir name → (schema.table, LSN)


def options_of(config: ApplyConfig) -> dict[str, Any]:
    """The options that choose which changes reach which table, as the record keeps them."""
    return {
        "tables": sorted(config.tables),
        "mode": config.mode,
        "append_only": config.append_only,
        "keys": sorted([f"{s}.{t}", list(cols)] for (s, t), cols in config.keys.items()),
        "format": config.fmt,
    }


KEPT = 16  # records of as many option sets (jobs that apply parts of one target); the oldest goes


def _records(target: Target) -> list[dict[str, Any]]:
    """The file's records, newest first (none: no file, or one of another version or unreadable,
    which only makes the next run read every file again)."""
    data = target.read_state(LEDGER)
    try:
        raw = orjson.loads(data) if data is not None else None
    except ValueError:
        return []
    if not isinstance(raw, dict) or raw.get("v") != VERSION or not isinstance(raw.get("records"), list):
        return []
    return [r for r in raw["records"] if isinstance(r, dict)]


def load(target: Target, options: dict[str, Any]) -> Ledger | None:
    """The record of runs with these options, or None."""
    for raw in _records(target):
        if raw.get("options") != options:
            continue
        try:
            return Ledger(
                options=options,
                through={str(d): parse_lsn(str(p)) for d, p in raw["through"].items()},
                tables={str(d): (str(n), parse_lsn(str(p))) for d, (n, p) in raw["tables"].items()},
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
    return None


def save(target: Target, ledger: Ledger) -> None:
    """Writes ``ledger`` as the newest record, in place of the one of its options."""
    mine = {
        "options": ledger.options,
        "through": {d: lsn_str(p) for d, p in sorted(ledger.through.items())},
        "tables": {d: [n, lsn_str(p)] for d, (n, p) in sorted(ledger.tables.items())},
    }
    others = [r for r in _records(target) if r.get("options") != ledger.options]
    data = {"v": VERSION, "records": [mine, *others][:KEPT]}
    target.write_state(LEDGER, orjson.dumps(data, option=orjson.OPT_INDENT_2), what="spark-apply's record")


def _source_dirs(config: ApplyConfig) -> set[str]:
    """The SOURCE arguments that are directories (or prefixes of an object store), as files' parents spell them."""
    out = set()
    made: dict[str, FileSystem] = {}
    for s in config.sources:
        if is_store_source(s):
            found = stores.expand(s, stores.filesystem_for(s, config.conf, made))
            if isinstance(found, stores.StoreDir):
                out.add(str(found))
        elif Path(s).is_dir():
            out.add(str(Path(s).resolve()))
    return out


def _stale(config: ApplyConfig, ledger: Ledger) -> str | None:
    """Why the record does not hold for this run (None: it holds)."""
    from pgrecv.spark.tables import applied_position

    for name, (table, at) in sorted(ledger.tables.items()):
        now = applied_position(config.target / name, config.fmt, table)
        if now is None or now < at:
            return f"table {table} is missing or behind the position it had ({lsn_str(at)})"
    return None


@dataclass
class Unread:
    """A run's split of its files: those to read, and those applied before (skipped)."""

    read: list[SourceFile]
    skipped: list[SourceFile]
    ledger: Ledger  # the record as it holds for this run (a new one when it did not hold)
    warning: str | None = None


def split(config: ApplyConfig, files: list[SourceFile]) -> Unread:
    """The files this run reads: every file but those at or below their directory's through."""
    options = options_of(config)
    if config.catalog is not None:  # its tables' positions are read through Spark only: every file is read
        return Unread(files, [], Ledger(options=options))
    ledger = load(target_of(config), options)
    if ledger is None or not ledger.through.keys() & _source_dirs(config):
        return Unread(files, [], ledger or Ledger(options=options))
    reason = _stale(config, ledger)
    if reason is not None:
        # a new record, from what this run applies: it reads every file
        warning = f"{config.target}: reading every file of SOURCE again: {reason}"
        return Unread(files, [], Ledger(options=options), warning)
    read, skipped = [], []
    for f in files:
        last = named_last(f.name)
        through = ledger.through.get(str(f.parent.resolve()))
        if last is not None and through is not None and last <= through:
            skipped.append(f)
        else:
            read.append(f)
    return Unread(read, skipped, ledger)


def advance(config: ApplyConfig, unread: Unread, summary: Summary) -> None:
    """Records what this run applied: each SOURCE directory's new through, when the run applied
    every table and left no transaction incomplete; each table's position as it is now."""
    if config.catalog is not None:
        return
    ledger = unread.ledger
    for t in summary.tables:
        if t.applied_lsn is not None:
            ledger.tables[Path(t.path).name] = (t.table, parse_lsn(t.applied_lsn))
    clean = summary.incomplete == 0 and all(t.status in ("applied", "up to date") for t in summary.tables)
    if clean:
        dirs = _source_dirs(config)
        for f in [*unread.read, *unread.skipped]:
            d, last = str(f.parent.resolve()), named_last(f.name)
            if last is not None and d in dirs:
                ledger.through[d] = max(ledger.through.get(d, 0), last)
    save(target_of(config), ledger)
