"""Warnings where a mirror built from the stream can silently differ from the source.

Each is legal server configuration, so none is an error; but each makes the output hold less
than the tables (row filters, column lists), name other tables (partitions published under their
own names), or end without warning (a slot that loses its WAL). `create`, `start` and `snapshot`
print them, one line each, so the choice is made knowingly.
"""

from __future__ import annotations

from typing import Any

import psycopg

from pgrecv.pg.conn import server_major
from pgrecv.pg.names import quote_name
from pgrecv.pg.slots import list_publications


def only_publication(conn: psycopg.Connection[Any], name: str | None) -> str | None:
    """The publication a pgoutput stream would read: the named one, or the only one; None when
    there is none to check (an error for that comes from the command itself, if it needs one)."""
    pubs = list_publications(conn)
    if name is not None:
        return name if name in pubs else None
    return pubs[0] if len(pubs) == 1 else None


def warnings(
    conn: psycopg.Connection[Any], publication: str | None, slot: dict[str, Any] | None, *, temporary: bool = False
) -> list[str]:
    """One line per risk: the publication's filters and partitions, the server's
    max_slot_wal_keep_size, and the slot's wal_status (``slot`` is its pg_replication_slots row).
    A ``temporary`` slot keeps no WAL once its consumer stops: no word on the WAL limit."""
    major = server_major(conn)
    out: list[str] = []
    if publication is not None:
        out += _publication(conn, publication, major)
    if major >= 13 and not temporary:
        row = conn.execute("SELECT setting FROM pg_settings WHERE name = 'max_slot_wal_keep_size'").fetchone()
        if row is not None and row[0] == "-1":
            out.append(
                "max_slot_wal_keep_size is -1: a slot whose consumer stops keeps WAL without limit and can "
                "fill the server's disk (a limit instead invalidates the slot, and the mirror then needs a "
                "new snapshot); either way watch it with 'pgrecv slots --check'"
            )
    if slot is not None and slot.get("wal_status") == "unreserved":
        out.append(
            f'slot "{slot["slot_name"]}" is unreserved: WAL it still needs is beyond max_slot_wal_keep_size '
            "and may be removed at the next checkpoint, which loses the slot (the mirror then needs a new "
            "snapshot); consume it now"
        )
    return out


def _publication(conn: psycopg.Connection[Any], pub: str, major: int) -> list[str]:
    out: list[str] = []
    if major >= 15:  # row filters and column lists exist from 15 on
        rows = conn.execute(
            """
            SELECT format('%%I.%%I', n.nspname, c.relname), pr.prqual IS NOT NULL, pr.prattrs IS NOT NULL
              FROM pg_publication p
              JOIN pg_publication_rel pr ON pr.prpubid = p.oid
              JOIN pg_class c ON c.oid = pr.prrelid
              JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE p.pubname = %s AND (pr.prqual IS NOT NULL OR pr.prattrs IS NOT NULL)
             ORDER BY 1
            """,
            (pub,),
        ).fetchall()
        for table, has_filter, has_columns in rows:
            if has_filter:
                out.append(
                    f'publication "{pub}" has a row filter on {table}: rows outside it are not sent and a '
                    "row updated out of it arrives as a delete, so the output holds a subset of the table"
                )
            if has_columns:
                out.append(
                    f'publication "{pub}" publishes a column list of {table}: its other columns are '
                    "missing from the output"
                )
    if major >= 13:  # publish_via_partition_root exists from 13 on
        rows = conn.execute(
            """
            SELECT DISTINCT format('%%I.%%I', rn.nspname, r.relname), p.pubname
              FROM pg_publication p
              JOIN pg_publication_tables pt ON pt.pubname = p.pubname
              JOIN pg_namespace n ON n.nspname = pt.schemaname
              JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
              JOIN pg_class r ON r.oid = pg_partition_root(c.oid)
              JOIN pg_namespace rn ON rn.oid = r.relnamespace
             WHERE p.pubname = %s AND NOT p.pubviaroot AND c.relispartition
             ORDER BY 1
            """,
            (pub,),
        ).fetchall()
        for root, name in rows:
            out.append(
                f'publication "{name}" publishes partitions of {root} under their own names '
                "(publish_via_partition_root is off): changes name the partitions, not the table; "
                f"ALTER PUBLICATION {quote_name(name)} SET (publish_via_partition_root = true) to mirror one table"
            )
    return out
