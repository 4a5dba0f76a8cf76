"""The typed event model shared by both decoders and every sink.

Events are frozen dataclasses with slots: cheap to build on the hot path and safe to share.

Column values in a tuple keep their kind, by Python type:

* ``None``            SQL NULL
* :data:`UNCHANGED`   an unchanged TOASTed value the server did not send (never NULL!)
* ``str``             the server's text form of the value
* ``bytes``           the binary (``send``) form, from pgoutput's ``binary`` option

Times are ``int`` microseconds since 2000-01-01 00:00 UTC (PostgreSQL's epoch), as on the wire;
:func:`pg_time_iso` renders them. LSN fields are plain ``int`` (see :mod:`pgrecv.lsn`).

``xid`` fields on change messages are set only inside streamed transactions (pgoutput sends the
xid there only); elsewhere they are ``None`` and the transaction's xid is on its Begin.
``lsn`` on change events is the position the server reported for the message (XLogData start or
the SQL interface's ``lsn`` column), 0 when unknown.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final, Literal

PG_EPOCH_UNIX: Final = 946_684_800
_PG_EPOCH_DT: Final = datetime(2000, 1, 1, tzinfo=UTC)


class _Unchanged:
    """Singleton marker for an unchanged TOAST value."""

    __slots__ = ()
    _instance: _Unchanged | None = None

    def __new__(cls) -> _Unchanged:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNCHANGED"

    def __reduce__(self) -> str:
        return "UNCHANGED"


UNCHANGED: Final = _Unchanged()

Value = None | str | bytes | _Unchanged
Tuple = tuple[Value, ...]


def pg_time_iso(micros: int) -> str:
    """ISO 8601 in UTC with microseconds, e.g. ``2026-11-22T07:37:15.123456Z``."""
    return (_PG_EPOCH_DT + timedelta(microseconds=micros)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# --- relations and types -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type_oid: int  # 0 when unknown (test_decoding prints names, not OIDs)
    type_modifier: int  # atttypmod, -1 when none
    type_name: str  # format_type() style: "integer", "character varying", "text[]", "myschema.mood"
    key: bool  # part of the replica identity


ReplicaIdentity = Literal["d", "n", "f", "i", "?"]  # default, nothing, full, index, unknown


@dataclass(frozen=True, slots=True)
class Relation:
    """pgoutput 'R'. test_decoding has no such message; its parser synthesises one per table
    and column signature (oid 0, replica identity '?')."""

    oid: int
    namespace: str
    name: str
    replica_identity: ReplicaIdentity
    columns: tuple[Column, ...]
    xid: int | None = None

    @property
    def key_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns if c.key)


@dataclass(frozen=True, slots=True)
class TypeInfo:
    """pgoutput 'Y': sent for user-defined types before a Relation that uses them."""

    oid: int
    namespace: str
    name: str
    xid: int | None = None


# --- transactions -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: int  # LSN of the commit record; 0 when the plugin does not say (test_decoding)
    commit_time: int | None
    xid: int | None


@dataclass(frozen=True, slots=True)
class Commit:
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: int | None
    xid: int | None = None  # test_decoding prints it; pgoutput does not


@dataclass(frozen=True, slots=True)
class Origin:
    commit_lsn: int
    name: str


# --- row changes --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Insert:
    relation: Relation
    new: Tuple
    xid: int | None = None
    lsn: int = 0


OldKind = Literal["K", "O"] | None  # key columns only / the whole old row (REPLICA IDENTITY FULL)


@dataclass(frozen=True, slots=True)
class Update:
    """``new`` holds, for a column the server marked unchanged-TOAST, the value ``old`` holds for it
    when ``old`` has one (see :func:`fill_from_old`); ``toast_from_old`` names those columns. A
    column still :data:`UNCHANGED` in ``new`` is one whose value nobody sent."""

    relation: Relation
    new: Tuple
    old: Tuple | None = None  # None when the key did not change and identity is not FULL
    old_kind: OldKind = None
    xid: int | None = None
    lsn: int = 0
    toast_from_old: tuple[str, ...] = ()


def fill_from_old(relation: Relation, new: Tuple, old: Tuple, old_kind: OldKind) -> tuple[Tuple, tuple[str, ...]]:
    """(``new`` with each unchanged TOAST value that ``old`` holds put in, the names of those columns).

    An update's old image is a value of the very row the new image is written over, so where the
    new image says "unchanged, not sent" the old image's value is the new value, exactly. A full
    old image (``"O"``, REPLICA IDENTITY FULL) holds every column; a key image (``"K"``) only the
    key columns: its other columns are NULL placeholders, not values. The server writes old
    images with their TOASTed values inline, so in practice every marked column of a FULL table is
    filled; one the old image marks unchanged too stays :data:`UNCHANGED`.

    The decoders call this for every update that has an old image: the same pure step for
    pgoutput and test_decoding (and ``pgrecv/_copyfast.c``'s ``fill_from_old`` does the same for
    the native JSONL encoder). ``new`` comes back as it is when nothing was filled.
    """
    cols = relation.columns
    n = len(new)
    if len(old) != n or len(cols) != n:
        return new, ()
    out: list[Value] | None = None
    names: list[str] = []
    full = old_kind == "O"
    for i, v in enumerate(new):
        if v is UNCHANGED and (full or cols[i].key):
            o = old[i]
            if o is UNCHANGED:
                continue
            if out is None:
                out = list(new)
            out[i] = o
            names.append(cols[i].name)
    if out is None:
        return new, ()
    return tuple(out), tuple(names)


@dataclass(frozen=True, slots=True)
class Delete:
    relation: Relation
    old: Tuple | None  # None with REPLICA IDENTITY NOTHING (test_decoding's "(no-tuple-data)")
    old_kind: OldKind = None
    xid: int | None = None
    lsn: int = 0


@dataclass(frozen=True, slots=True)
class Truncate:
    relations: tuple[Relation, ...]
    cascade: bool
    restart_identity: bool
    xid: int | None = None
    lsn: int = 0


@dataclass(frozen=True, slots=True)
class Message:
    """A logical decoding message (pg_logical_emit_message)."""

    transactional: bool
    lsn: int
    prefix: str
    content: bytes
    xid: int | None = None


# --- streamed (large, in-progress) transactions ------------------------------------------


@dataclass(frozen=True, slots=True)
class StreamStart:
    xid: int
    first: bool


@dataclass(frozen=True, slots=True)
class StreamStop:
    pass


@dataclass(frozen=True, slots=True)
class StreamCommit:
    xid: int
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: int


@dataclass(frozen=True, slots=True)
class StreamAbort:
    """``subxid == xid`` aborts the whole transaction; otherwise one rolled-back subtransaction.
    ``abort_lsn``/``abort_time`` come with protocol 4 and streaming=parallel only."""

    xid: int
    subxid: int
    abort_lsn: int | None = None
    abort_time: int | None = None


# --- two-phase commit ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BeginPrepare:
    prepare_lsn: int
    end_lsn: int
    prepare_time: int | None
    xid: int | None
    gid: str


@dataclass(frozen=True, slots=True)
class Prepare:
    flags: int
    prepare_lsn: int
    end_lsn: int
    prepare_time: int | None
    xid: int | None
    gid: str


@dataclass(frozen=True, slots=True)
class CommitPrepared:
    flags: int
    commit_lsn: int
    end_lsn: int
    commit_time: int | None
    xid: int | None
    gid: str


@dataclass(frozen=True, slots=True)
class RollbackPrepared:
    flags: int
    prepare_end_lsn: int
    rollback_end_lsn: int
    prepare_time: int | None
    rollback_time: int | None
    xid: int | None
    gid: str


@dataclass(frozen=True, slots=True)
class StreamPrepare:
    flags: int
    prepare_lsn: int
    end_lsn: int
    prepare_time: int
    xid: int
    gid: str


Change = Insert | Update | Delete | Truncate
Event = (
    Begin
    | Commit
    | Origin
    | Relation
    | TypeInfo
    | Insert
    | Update
    | Delete
    | Truncate
    | Message
    | StreamStart
    | StreamStop
    | StreamCommit
    | StreamAbort
    | BeginPrepare
    | Prepare
    | CommitPrepared
    | RollbackPrepared
    | StreamPrepare
)
