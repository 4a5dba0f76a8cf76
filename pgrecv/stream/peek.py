"""The SQL interface: read a slot's changes with pg_logical_slot_peek_binary_changes.

The changes are decoded by the same decoders as the stream and go through the same
:class:`~pgrecv.stream.pipeline.Pipeline` (``--table``, ``--exclude-table``, ``--op``).
``…_get_changes`` is never used to consume: it moves the slot when the function returns, before a
single row has been written (and a rollback does not undo it, slots are not transactional). With
``consume`` the changes are peeked, written, made durable, and only then is the slot advanced past them with
``pg_replication_slot_advance``: a failed write leaves the slot where it was.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from pgrecv.decode.plugins import PgOutputSettings, make_decoder, max_proto_version, plan_options
from pgrecv.events import Event
from pgrecv.lsn import LSN
from pgrecv.pg.conn import ConnOptions, connect, server_major, translate
from pgrecv.pg.slots import logical_slot
from pgrecv.stream.pipeline import Pipeline

FETCH_SIZE = 2000


@dataclass(frozen=True, slots=True)
class PeekResult:
    messages: int
    last_lsn: LSN | None
    plugin: str
    consumed: bool


def peek(
    opts: ConnOptions,
    slot: str,
    *,
    sink: Callable[[Event], None] | None,
    raw: Callable[[bytes], None] | None = None,
    durable: Callable[[], object] = lambda: None,
    consume: bool = False,
    upto_lsn: LSN | None = None,
    upto_nchanges: int | None = None,
    options: Sequence[tuple[str, str]] = (),
    publication: str | None = None,
    tables: Sequence[str] = (),
    exclude_tables: Sequence[str] = (),
    ops: frozenset[str] | None = None,
) -> PeekResult:
    """Read changes into ``sink`` (decoded events) or ``raw`` (the plugin's bytes, one per call),
    filtered by table globs and operations as ``start`` filters them.

    ``durable`` is called once everything is handed over; with ``consume`` the slot advances
    only after it returns.
    """
    with connect(opts, autocommit=False) as conn:
        info = logical_slot(conn, slot)
        plugin = str(info["plugin"])
        two_phase = bool(info.get("two_phase")) and max_proto_version(server_major(conn)) >= 3
        all_options = plan_options(
            conn, info, publication, PgOutputSettings(two_phase=two_phase), options, sql_interface=True
        )
        pipeline = Pipeline(_emitter(sink, raw), tables=tables, exclude_tables=exclude_tables, ops=ops)
        # raw output without a filter is the plugin's bytes as they come: nothing to decode
        handle = raw if raw is not None and not pipeline.filters else None
        if handle is None:
            handle_event = pipeline.handler(make_decoder(plugin, all_options).decode)
        # the _binary_ functions for every plugin: the text ones fail on output that is not valid
        # in the database encoding (test_decoding prints message contents raw) and stop at a NUL
        func = "pg_logical_slot_peek_binary_changes"
        variadic: list[str] = [x for pair in all_options for x in pair]
        query = sql.SQL(
            "SELECT (lsn - '0/0'::pg_lsn)::int8, data FROM {}(%s, %s::pg_lsn, %s, VARIADIC %s::text[])"
        ).format(sql.Identifier(func))
        params = (slot, None if upto_lsn is None else str(upto_lsn), upto_nchanges, variadic)
        count = 0
        last: int | None = None
        try:
            with conn.cursor(name="pgrecv_peek", binary=True) as cur:
                cur.itersize = FETCH_SIZE
                cur.execute(query, params)
                while rows := cur.fetchmany(FETCH_SIZE):
                    for lsn, data in rows:
                        if handle is not None:
                            handle(data)
                        else:
                            handle_event(data, lsn)
                        last = lsn
                    count += len(rows)
        except psycopg.Error as exc:
            conn.rollback()
            raise translate(exc, slot=slot, publication=publication) from None
        conn.rollback()
        durable()
        if consume and last is not None:
            # The SQL interface returns whole transactions, so the last row ends one (a commit, or a
            # message outside a transaction) and its LSN is that unit's end: everything before it
            # is in the output now.
            try:
                conn.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (slot, str(LSN(last))))
                conn.commit()
            except psycopg.Error as exc:
                raise translate(exc, slot=slot) from None
        return PeekResult(count, None if last is None else LSN(last), plugin, consume)


def _emitter(sink: Callable[[Event], None] | None, raw: Callable[[bytes], None] | None) -> Callable[[Event, Any], None]:
    """What the pipeline lets through: the event to ``sink``, or the plugin's bytes to ``raw``."""
    if raw is not None:

        def write_raw(event: Event, data: Any) -> None:
            raw(data)

        return write_raw
    assert sink is not None

    def feed(event: Event, data: Any) -> None:
        sink(event)

    return feed
