"""The shell around :mod:`pgrecv.output.debezium` for the commands: the database name, the format names."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from pgrecv.errors import UsageError
from pgrecv.output.debezium import DebeziumEncoder
from pgrecv.pg.conn import ConnOptions, connect

FORMATS: Final = ("debezium", "debezium-schema")
"""``--format`` values: envelopes alone, or wrapped as ``{"schema": ..., "payload": ...}``."""
SUFFIX: Final = ".debezium.jsonl"
"""File suffix under ``--output-dir``: spark-apply's reader sees these files and refuses them by name."""


def current_database(opts: ConnOptions) -> str:
    """``source.db`` of every envelope."""
    with connect(opts) as conn:
        row = conn.execute("SELECT current_database()").fetchone()
    assert row is not None
    return str(row[0])


def debezium_factory(opts: ConnOptions, fmt: str, server: str) -> Callable[[Callable[[bytes], None]], DebeziumEncoder]:
    """A formatter factory (one encoder per connection and output file) for ``--format debezium[-schema]``."""
    database = current_database(opts)
    schemas = fmt == "debezium-schema"

    def make(write: Callable[[bytes], None]) -> DebeziumEncoder:
        return DebeziumEncoder(write, database=database, server=server, schemas=schemas)

    return make


def peek_closer(enc: DebeziumEncoder, consume: bool) -> Callable[[], None]:
    """End of a peek. Rows of a transaction prepared but not yet committed are held back; with
    ``--consume`` the slot would move past its PREPARE and they could never be written: refuse
    (before the output is published and before the slot advances)."""

    def close() -> None:
        held = enc.close()
        if held and consume:
            raise UsageError(
                f"{held} changes of transactions prepared but not yet committed would be skipped by "
                "--consume with --format debezium (it writes committed rows only): peek without "
                "--consume, or after COMMIT PREPARED"
            )

    return close
