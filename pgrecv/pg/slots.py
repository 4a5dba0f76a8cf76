"""Replication slots and publications: create, drop, list.

Slots are created over a replication connection (the protocol's CREATE_REPLICATION_SLOT), as
pg_recvlogical does, so the same privileges and pg_hba.conf rules apply as for streaming later.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from pgrecv.errors import PublicationError, ServerConfigError, SlotError, UsageError
from pgrecv.lsn import LSN
from pgrecv.pg.conn import ConnOptions, connect, server_major, translate
from pgrecv.pg.slot_health import failover_ready


@dataclass(frozen=True, slots=True)
class CreatedSlot:
    name: str
    plugin: str
    consistent_point: LSN | None  # None when it already existed (--if-not-exists)
    created: bool
    publication_created: bool = False


def get_slot(conn: psycopg.Connection[Any], slot: str) -> dict[str, Any] | None:
    cur = conn.execute("SELECT * FROM pg_replication_slots WHERE slot_name = %s", (slot,))
    row = cur.fetchone()
    if row is None:
        return None
    return dict(zip([d.name for d in cur.description or ()], row, strict=True))


def logical_slot(conn: psycopg.Connection[Any], slot: str) -> dict[str, Any]:
    """The slot's row, checked to be a logical slot of the database ``conn`` is connected to."""
    info = get_slot(conn, slot)
    if info is None:
        raise SlotError(f"replication slot \"{slot}\" does not exist: create it with 'pgrecv create --slot {slot}'")
    if info["slot_type"] != "logical":
        raise SlotError(f'replication slot "{slot}" is a physical slot: logical decoding needs a logical slot')
    if info["database"] != conn.info.dbname:
        raise SlotError(f'replication slot "{slot}" belongs to database "{info["database"]}": connect to it with -d')
    return info


def _check_existing(
    existing: dict[str, Any], slot: str, plugin: str, dbname: str, *, two_phase: bool, failover: bool
) -> None:
    """--if-not-exists takes an existing slot only if it is the one asked for: a slot of another
    kind would fail later (another database, physical) or decode otherwise than asked (prepared
    transactions at COMMIT PREPARED, no synchronisation to standbys) with nothing said."""
    other = "use another slot name, or drop it with 'pgrecv drop --slot " + slot + "' and create it again"
    if existing["slot_type"] != "logical":
        raise SlotError(f'replication slot "{slot}" exists as a physical slot: {other}')
    if existing["database"] != dbname:
        raise SlotError(
            f'replication slot "{slot}" exists in database "{existing["database"]}": connect to it with -d, or {other}'
        )
    if existing["plugin"] != plugin:
        raise SlotError(
            f'replication slot "{slot}" exists with plugin {existing["plugin"]}, not {plugin}: '
            "pass the same --plugin or use another slot name"
        )
    if two_phase and not existing.get("two_phase"):
        raise SlotError(
            f'replication slot "{slot}" exists without two-phase decoding: leave out --two-phase, or {other}'
        )
    if failover and not existing.get("failover"):
        raise SlotError(f'replication slot "{slot}" exists without failover: leave out --failover, or {other}')


def create_slot(
    opts: ConnOptions,
    slot: str,
    plugin: str = "pgoutput",
    *,
    if_not_exists: bool = False,
    two_phase: bool = False,
    failover: bool = False,
    publication: str | None = None,
    tables: Sequence[str] = (),
    on_wait: Callable[[str], None] | None = None,
    pub_options: PublicationOptions | None = None,
) -> CreatedSlot:
    """``on_wait`` is told, once, when creation is still waiting after :data:`STANDBY_WAIT`
    seconds on a standby (it needs a running-transactions record from the primary)."""
    if tables and not publication:
        raise UsageError("--table needs --publication: tables are published through a publication")
    if publication and plugin != "pgoutput":
        raise UsageError(f"--publication applies to the pgoutput plugin only, not {plugin}")
    with connect(opts, replication=True) as conn:
        major = server_major(conn)
        if failover and major < 17:
            raise ServerConfigError(f"--failover needs PostgreSQL 17 or newer; this server is {major}")
        if two_phase and major < 14:
            raise ServerConfigError(f"--two-phase needs PostgreSQL 14 or newer; this server is {major}")
        if pub_options is not None:
            pub_options.check(publication, major)
        # Everything that can refuse is checked before the publication is made, and a slot
        # that still fails to be created takes the publication this run made with it.
        existing = get_slot(conn, slot)
        if existing is not None:
            if not if_not_exists:
                raise SlotError(
                    f'replication slot "{slot}" already exists: use --if-not-exists, '
                    f"or drop it with 'pgrecv drop --slot {slot}'"
                )
            _check_existing(existing, slot, plugin, conn.info.dbname, two_phase=two_phase, failover=failover)
            pub_created = ensure_publication(conn, publication, tables, pub_options) if publication else False
            return CreatedSlot(slot, plugin, None, created=False, publication_created=pub_created)
        pub_created = ensure_publication(conn, publication, tables, pub_options) if publication else False
        command = create_slot_command(slot, plugin, major, two_phase=two_phase, failover=failover)
        try:
            with told_if_slow(conn, on_wait):
                row = conn.execute(command).fetchone()
        except BaseException as exc:
            if pub_created and publication:
                drop_publication(conn, publication)
            if isinstance(exc, psycopg.Error):
                raise translate(exc, slot=slot) from None
            raise
        assert row is not None
        return CreatedSlot(str(row[0]), str(row[3]), LSN.parse(row[1]), created=True, publication_created=pub_created)


STANDBY_WAIT = 3.0


@contextlib.contextmanager
def told_if_slow(conn: psycopg.Connection[Any], on_wait: Callable[[str], None] | None) -> Iterator[None]:
    """On a standby, slot creation waits for the primary's next running-transactions record
    (which an idle primary writes only at checkpoints), and for the transactions it lists to
    end: say so, and how to end the wait, rather than hang silently."""
    if on_wait is None or not _in_recovery(conn):
        yield
        return
    timer = threading.Timer(
        STANDBY_WAIT,
        on_wait,
        [
            "this server is a standby: the slot is created once the primary logs its running "
            "transactions and those open now have ended; run SELECT pg_log_standby_snapshot() "
            "on the primary to end the wait"
        ],
    )
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _in_recovery(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
    return bool(row and row[0])


def drop_publication(conn: psycopg.Connection[Any], name: str) -> None:
    """Undo a publication this run created, best effort: the error that made us undo it is the
    one to report."""
    with contextlib.suppress(psycopg.Error):
        conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(name)))


def create_slot_command(
    slot: str,
    plugin: str,
    major: int,
    *,
    export: bool = False,
    two_phase: bool,
    failover: bool,
    temporary: bool = False,
) -> sql.Composed:
    """CREATE_REPLICATION_SLOT for a logical slot; ``export``: with a snapshot for other sessions to
    import (``pgrecv snapshot``), else none. ``temporary``: the server drops it when the session
    that made it ends (``pgrecv start --create --temporary``)."""
    ident, plug = sql.Identifier(slot), sql.Identifier(plugin)
    head = "CREATE_REPLICATION_SLOT {} TEMPORARY LOGICAL {}" if temporary else "CREATE_REPLICATION_SLOT {} LOGICAL {}"
    if major < 15:
        tail = (" EXPORT_SNAPSHOT" if export else " NOEXPORT_SNAPSHOT") + (" TWO_PHASE" if two_phase else "")
        return sql.SQL(head + tail).format(ident, plug)
    options = [sql.SQL("SNAPSHOT 'export'" if export else "SNAPSHOT 'nothing'")]
    if two_phase:
        options.append(sql.SQL("TWO_PHASE true"))
    if failover:
        options.append(sql.SQL("FAILOVER true"))
    return sql.SQL(head + " ({})").format(ident, plug, sql.SQL(", ").join(options))


@dataclass(frozen=True, slots=True)
class PublicationOptions:
    """WITH options for a publication pgrecv creates."""

    generated_columns: bool = False  # publish_generated_columns = stored (18+): their values in the stream
    via_root: bool = False  # publish_via_partition_root: changes carry the partitioned table's name

    def check(self, publication: str | None, major: int) -> None:
        """Refuse before anything is made."""
        if (self.generated_columns or self.via_root) and not publication:
            raise UsageError("--publish-generated-columns and --publish-via-partition-root need --publication")
        if self.generated_columns and major < 18:
            raise ServerConfigError(f"--publish-generated-columns needs PostgreSQL 18 or newer; this server is {major}")

    def sql(self) -> sql.Composable:
        parts = []
        if self.generated_columns:
            parts.append(sql.SQL("publish_generated_columns = stored"))
        if self.via_root:
            parts.append(sql.SQL("publish_via_partition_root = true"))
        return sql.SQL(" WITH ({})").format(sql.SQL(", ").join(parts)) if parts else sql.SQL("")


def ensure_publication_for(opts: ConnOptions, name: str) -> bool:
    """The publication ``--publication`` names, made FOR ALL TABLES if missing (as with --create)
    on a connection of its own: a temporary slot is made later, on the streaming connection."""
    with connect(opts) as conn:
        try:
            return ensure_publication(conn, name, ())
        except psycopg.Error as exc:
            raise translate(exc, publication=name) from None


def ensure_publication(
    conn: psycopg.Connection[Any], name: str, tables: Sequence[str], options: PublicationOptions | None = None
) -> bool:
    """Create the publication if missing (FOR ALL TABLES, or the listed ones); True if created."""
    if conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (name,)).fetchone():
        return False
    target: sql.Composable
    if tables:
        target = sql.SQL("FOR TABLE {}").format(sql.SQL(", ").join(_qualified(t) for t in tables))
    else:
        target = sql.SQL("FOR ALL TABLES")
    with_options = (options or PublicationOptions()).sql()
    try:
        conn.execute(sql.SQL("CREATE PUBLICATION {} {}{}").format(sql.Identifier(name), target, with_options))
    except psycopg.errors.UndefinedTable as exc:
        raise PublicationError(f"cannot create publication {name}: {exc.diag.message_primary}; check --table") from None
    except psycopg.Error as exc:
        raise translate(exc, publication=name) from None
    return True


def _qualified(table: str) -> sql.Composable:
    schema, dot, name = table.partition(".")
    if not dot:
        return sql.Identifier(table)
    return sql.Identifier(schema, name)


def drop_slot(opts: ConnOptions, slot: str, *, if_exists: bool = False) -> bool:
    """Drop the slot; False if it did not exist and ``if_exists``."""
    with connect(opts, replication=True) as conn:
        if get_slot(conn, slot) is None:
            if if_exists:
                return False
            raise SlotError(f"replication slot \"{slot}\" does not exist: check the name with 'pgrecv slots'")
        try:
            conn.execute(sql.SQL("DROP_REPLICATION_SLOT {}").format(sql.Identifier(slot)))
        except psycopg.Error as exc:
            raise translate(exc, slot=slot) from None
        return True


# Columns of pg_replication_slots shown by `pgrecv slots`, when the server has them.
SLOT_COLUMNS = (
    "slot_name",
    "plugin",
    "slot_type",
    "database",
    "temporary",
    "active",
    "active_pid",
    "restart_lsn",
    "confirmed_flush_lsn",
    "wal_status",
    "safe_wal_size",
    "two_phase",
    "failover",
    "synced",
    "conflicting",
    "invalidation_reason",
    "inactive_since",
)


def slot_column_missing(opts: ConnOptions, column: str) -> int | None:
    """The server's major version if ``pg_replication_slots`` has no ``column`` (``inactive_since``
    came with PostgreSQL 17), else None: a check on it must be refused, not passed unchecked."""
    with connect(opts) as conn:
        row = conn.execute(
            "SELECT 1 FROM pg_attribute WHERE attrelid = 'pg_catalog.pg_replication_slots'::regclass"
            " AND attname = %s AND NOT attisdropped",
            (column,),
        ).fetchone()
        return None if row is not None else server_major(conn)


def list_slots(opts: ConnOptions) -> list[dict[str, Any]]:
    """Every slot, with lag (bytes the consumer has not confirmed) and retained WAL in bytes;
    for an active slot what its walsender reports (``sync_state``, write and flush lag in
    seconds, as the server sees them); on a standby, whether each synchronized slot would
    survive a promotion (``failover_ready``)."""
    with connect(opts) as conn:
        cur = conn.execute(
            """
            SELECT s.*,
                   pg_wal_lsn_diff(c.pos, s.confirmed_flush_lsn)::bigint AS lag_bytes,
                   pg_wal_lsn_diff(c.pos, s.restart_lsn)::bigint AS retained_bytes,
                   r.sync_state,
                   extract(epoch FROM r.write_lag)::float8 AS write_lag_seconds,
                   extract(epoch FROM r.flush_lag)::float8 AS flush_lag_seconds,
                   c.in_recovery
              FROM pg_replication_slots s
                   LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid,
                   (SELECT pg_is_in_recovery() AS in_recovery,
                           CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()
                                ELSE pg_current_wal_lsn() END AS pos) c
             ORDER BY s.slot_name
            """
        )
        names = [d.name for d in cur.description or ()]
        rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    extra = ["lag_bytes", "retained_bytes", "sync_state", "write_lag_seconds", "flush_lag_seconds"]
    wanted = [c for c in SLOT_COLUMNS if c in names] + extra
    out = []
    for r in rows:
        row = {k: _jsonable(r[k]) for k in wanted}
        if r["in_recovery"] and r.get("synced"):
            row["failover_ready"] = failover_ready(row)
        out.append(row)
    return out


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)


def list_publications(conn: psycopg.Connection[Any]) -> list[str]:
    return [r[0] for r in conn.execute("SELECT pubname FROM pg_publication ORDER BY pubname").fetchall()]


def resolve_publication(conn: psycopg.Connection[Any], publication: str | None) -> str:
    """The named publication, or the only one in the database; a clear error otherwise."""
    pubs = list_publications(conn)
    if publication is not None:
        if publication not in pubs:
            raise PublicationError(
                f'publication "{publication}" does not exist in this database: '
                f"create it with 'pgrecv create --slot S --publication {publication}' or CREATE PUBLICATION"
            )
        return publication
    if len(pubs) == 1:
        return pubs[0]
    if not pubs:
        raise PublicationError(
            "the pgoutput plugin needs a publication and this database has none: "
            "create one with 'pgrecv create --slot S --publication NAME'"
        )
    raise PublicationError(f"several publications exist ({', '.join(pubs)}): choose one with --publication")
