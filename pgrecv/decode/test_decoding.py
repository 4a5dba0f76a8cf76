"""test_decoding lines in, :mod:`pgrecv.events` out.

test_decoding (contrib/test_decoding) is PostgreSQL's example plugin: one human-readable line per
change. The parser is pure: :meth:`TestDecodingParser.decode` turns one line into one event.

Line shapes (PostgreSQL 14-18; ``[...]`` marks what the options include-xids/include-timestamp add):

* ``BEGIN[ xid]``, ``COMMIT[ xid][ (at TIMESTAMPTZ)]``
* ``table SCHEMA.NAME: INSERT: col[type]:value ...`` (or ``(no-tuple-data)``)
* ``table SCHEMA.NAME: UPDATE: [old-key: COLUMNS new-tuple: ]COLUMNS`` (or ``(no-tuple-data)``)
* ``table SCHEMA.NAME: DELETE: COLUMNS`` (or ``(no-tuple-data)``: REPLICA IDENTITY NOTHING)
* ``table S.A, S.B: TRUNCATE: (no-flags)|restart_seqs|cascade|restart_seqs cascade``
* ``message: transactional: 0|1 prefix: P, sz: N content:BYTES``
* ``PREPARE TRANSACTION 'gid'[, txid N][ (at T)]``, ``COMMIT PREPARED ...``, ``ROLLBACK PREPARED ...``
* streaming (stream-changes): ``opening a streamed block for transaction[ TXN N]``,
  ``closing a streamed block ...``, ``streaming change for TXN N``/``... for transaction``,
  ``streaming truncate for ...``, ``streaming message: transactional: 1 prefix: P, sz: N``
  (content only when non-transactional), ``aborting streamed (sub)transaction[ TXN N]``,
  ``committing streamed transaction[ TXN N][ (at T)]``,
  ``preparing streamed transaction [TXN ]'gid'[, txid N][ (at T)]``

Decisions (the plugin prints less than the event model holds):

* Lines that carry no event return ``None``: ``streaming change``, ``streaming truncate`` and
  transactional ``streaming message`` lines only say that *something* happened in a streamed
  transaction; test_decoding withholds the data until it commits (and then does not send it again).
* Values: quoted values are unquoted (``''`` undoubled), ``true``/``false`` become ``'t'``/``'f'``
  and ``B'0101'`` becomes ``'0101'``, i.e. the server's text form, the same as ``col::text``;
  ``null`` is ``None`` and ``unchanged-toast-datum`` is :data:`~pgrecv.events.UNCHANGED`.
* Relations are synthesised (oid 0, replica identity ``'?'``) per table and column signature and
  cached, so the same signature yields the same :class:`~pgrecv.events.Relation` object. Type names
  are kept as printed (format_type, without typmod); ``type_oid`` is the built-in OID for a known
  name, else 0. Type modifiers are unknown (-1).
* Old images: test_decoding prints the old tuple without its NULL columns and does not say whether
  it is a key (REPLICA IDENTITY DEFAULT/INDEX) or a whole row (FULL). Every old image is therefore
  reported as ``old_kind='K'`` and the columns it names are the relation's key columns
  (``Column.key``): for an UPDATE the relation lists the new tuple's columns and ``old`` is aligned
  to them, ``None`` where the old image has no column; for a DELETE the relation lists exactly the
  old image's columns. Insert/Update relations without an old image have no key columns (unknown).
* ``Begin.final_lsn`` is 0 (unknown at BEGIN); commit and prepare LSNs are the ``lsn`` given with the
  line. Missing xids (include-xids off) are ``None`` where the model allows it and 0 in the stream
  events that require an int; a missing timestamp is ``None``, or 0 in StreamCommit/StreamPrepare.
* Stream aborts name one xid: it is the whole transaction when that xid opened a streamed block
  (``subxid == xid``); otherwise a subtransaction of the one open streamed transaction (``xid`` 0 when
  several are open). ``StreamStart.first`` is True the first time an xid opens a block.

Input may be ``str`` (SQL interface) or bytes (replication stream). Message contents are returned
as bytes exactly as sent (from bytes input) or UTF-8 encoded (from str input).
"""

from __future__ import annotations

import re
from typing import Final

from pgrecv.dates import days_from_civil
from pgrecv.errors import DecodeError
from pgrecv.events import (
    UNCHANGED,
    Begin,
    Column,
    Commit,
    CommitPrepared,
    Delete,
    Event,
    Insert,
    Message,
    Prepare,
    Relation,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    Update,
    Value,
    fill_from_old,
)
from pgrecv.pg.types import oid_for_name

__all__ = ["TestDecodingParser", "parse_timestamptz"]

_MISSING: Final = object()
# unquoted values: print_literal leaves numbers bare and spells bool/NULL/TOAST as words
_WORDS: Final[dict[str, object]] = {
    "null": None,
    "unchanged-toast-datum": UNCHANGED,
    "true": "t",
    "false": "f",
}
# bare values are numbers (int, float, numeric: also NaN, Infinity, 1e+100) and bit strings
_BARE: Final = "[-+.0-9A-Za-z]+"
_BARE_RE: Final = re.compile(_BARE)
_BITS_RE: Final = re.compile("B'[01]*'")
# one column's value in a compiled signature regex: quoted text, bit string or bare word
_VALUE: Final = "('[^']*(?:''[^']*)*'|B'[01]*'|" + _BARE + ")"
_NEW_TUPLE: Final = " new-tuple:"
_NO_TUPLE: Final = " (no-tuple-data)"
_SNIPPET: Final = 120
# relations kept per parser; REPLICA IDENTITY FULL tables make one per NULL pattern of the old row,
# so the cache is bounded (a dropped relation is rebuilt equal, as a new object)
_MAX_RELATIONS: Final = 4096

_TS_RE: Final = re.compile(
    r"(\d{4,})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?([+-])(\d\d)(?::(\d\d))?(?::(\d\d))?( BC)?\Z", re.ASCII
)
_XID_AT_RE: Final = re.compile(r"(?: ([0-9]+))?(?: \(at (.+)\))?\Z", re.S)
_TXID_AT_RE: Final = re.compile(r"(?:, txid ([0-9]+))?(?: \(at (.+)\))?\Z", re.S)
_TXN_RE: Final = re.compile(r"(?: TXN ([0-9]+))?\Z")
_TXN_AT_RE: Final = re.compile(r"(?: TXN ([0-9]+))?(?: \(at (.+)\))?\Z", re.S)
_FOR_RE: Final = re.compile(r"(?:transaction|TXN [0-9]+)\Z")
_MSG_HEAD_RE: Final = re.compile(r"transactional: ([01]) prefix: ")
_SZ_RE: Final = re.compile(r", sz: ([0-9]+)( content:)?")
_UNQUOTED_IDENT_END: Final = re.compile(r'[.:,\[\]" ]')
_PG_EPOCH_DAYS: Final = days_from_civil(2000, 1, 1)


def parse_timestamptz(text: str) -> int:
    """timestamptz_to_str() output (ISO style, numeric UTC offset, e.g. ``2026-11-22 07:37:15.12+05:30``)
    to microseconds since 2000-01-01 00:00 UTC. Raises ValueError on anything else."""
    m = _TS_RE.match(text)
    if m is None:
        raise ValueError(f"not a timestamp with time zone: {text!r}")
    year = int(m.group(1))
    if m.group(12):  # 1 BC is year 0 in the proleptic calendar
        year = 1 - year
    month, day = int(m.group(2)), int(m.group(3))
    hh, mi, ss = int(m.group(4)), int(m.group(5)), int(m.group(6))
    if not (1 <= month <= 12 and 1 <= day <= 31 and hh <= 24 and mi <= 59 and ss <= 60):
        raise ValueError(f"timestamp field out of range: {text!r}")
    frac = m.group(7)
    micros = int(frac.ljust(6, "0")) if frac else 0
    offset = int(m.group(9)) * 3600 + int(m.group(10) or 0) * 60 + int(m.group(11) or 0)
    if m.group(8) == "-":
        offset = -offset
    seconds = (days_from_civil(year, month, day) - _PG_EPOCH_DAYS) * 86400 + hh * 3600 + mi * 60 + ss - offset
    return seconds * 1_000_000 + micros


def _split_header(header: str) -> tuple[str, str]:
    """`` name[type]:`` (as validated by the scanner) -> (name, type name as printed)."""
    if header.startswith('"', 1):
        end = 2
        while True:
            q = header.find('"', end)
            if header.startswith('"', q + 1):
                end = q + 2
                continue
            break
        name = header[2:q].replace('""', '"')
        bracket = q + 1
    else:
        bracket = header.index("[", 1)
        name = header[1:bracket]
    return name, header[bracket + 1 : -2]


class _Scan(Exception):
    """Internal: where and what, turned into a DecodeError with the line by the caller."""

    def __init__(self, what: str, pos: int) -> None:
        super().__init__(what)
        self.what = what
        self.pos = pos


def _closing_quote(line: str, start: int, what: str) -> int:
    """The index of the '"' closing the quoted name (quote_identifier) that opens at ``start``;
    a doubled '""' inside it is a quote, not the end."""
    q = start + 1
    while True:
        q = line.find('"', q)
        if q < 0:
            raise _Scan(f"unterminated quoted {what}", start)
        if not line.startswith('"', q + 1):
            return q
        q += 2


class _Table:
    """What the parser remembers per table: its unquoted name and, per tuple kind, the last column
    signature with its compiled regex and relation (the fast path)."""

    __slots__ = ("fast", "pending", "schema", "table")

    def __init__(self, schema: str, table: str) -> None:
        self.schema = schema
        self.table = table
        # per kind (_NEW, _DEL, _OLD): (regex, headers, relation or None)
        self.fast: list[tuple[re.Pattern[str], tuple[str, ...], Relation | None] | None] = [None, None, None]
        self.pending: list[tuple[str, ...] | None] = [None, None, None]


_NEW, _DEL, _OLD = 0, 1, 2  # tuple kinds: new tuple (INSERT/UPDATE), DELETE old, UPDATE old-key


class TestDecodingParser:
    """One test_decoding line in, one event (or ``None``) out; keeps the synthesised relations."""

    __test__ = False  # not a pytest test class despite the name

    def __init__(self) -> None:
        self._tables: dict[str, _Table] = {}  # raw "schema.table" text -> state
        self._rels: dict[tuple[object, ...], Relation] = {}
        self._aligned: dict[tuple[object, ...], tuple[Relation, tuple[int, ...]]] = {}
        self._streamed: set[int] = set()  # xids whose streamed block was opened and not yet ended

    # --- entry point ----------------------------------------------------------------------

    def decode(self, line: str | bytes | bytearray | memoryview, lsn: int = 0) -> Event | None:
        """Parse one output line; ``lsn`` is the position the server reported for it."""
        if not isinstance(line, str):
            line = self._text(line)
        try:
            if line.startswith("table "):
                return self._table(line, lsn)
            return self._control(line, lsn)
        except _Scan as exc:
            raise self._error(line, exc.what, exc.pos) from None

    # --- errors ---------------------------------------------------------------------------

    @staticmethod
    def _error(line: str, what: str, pos: int) -> DecodeError:
        snippet = _oneline(line[:_SNIPPET]) + ("..." if len(line) > _SNIPPET else "")
        return DecodeError(
            f"test_decoding: {_oneline(what)} at column {pos + 1} of line: {snippet} "
            "(is the slot's plugin test_decoding, and the server a supported version?)",
            detail=repr(line[:4000]),
        )

    def _text(self, data: bytes | bytearray | memoryview) -> str:
        raw = bytes(data)
        if raw.startswith((b"message: ", b"streaming message: ")):
            # the content is arbitrary bytes: keep them recoverable through surrogateescape
            return raw.decode("utf-8", "surrogateescape")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            text = raw.decode("utf-8", "replace")
            raise self._error(
                text, "not valid UTF-8 (pgrecv needs a UTF8 database for test_decoding)", exc.start
            ) from None

    # --- rows -----------------------------------------------------------------------------

    def _qualified_name(self, line: str, pos: int) -> tuple[str, str, int]:
        """``schema.table`` at ``pos`` (quote_qualified_identifier) -> (schema, table, end)."""
        parts: list[str] = []
        for part in range(2):
            if line.startswith('"', pos):
                q = _closing_quote(line, pos, "table name")
                parts.append(line[pos + 1 : q].replace('""', '"'))
                pos = q + 1
            else:
                m = _UNQUOTED_IDENT_END.search(line, pos)
                end = len(line) if m is None else m.start()
                if end == pos:
                    raise _Scan("expected a schema-qualified table name", pos)
                parts.append(line[pos:end])
                pos = end
            if part == 0:
                if not line.startswith(".", pos):
                    raise _Scan("expected '.' between schema and table name", pos)
                pos += 1
        return parts[0], parts[1], pos

    def _table(self, line: str, lsn: int) -> Event:
        colon = line.find(":", 6)
        raw = line[6:colon]
        st = self._tables.get(raw) if colon > 0 else None
        if st is None:
            # a quoted name may hold ':'; only names that end at the first ':' are cached
            schema, table, end = self._qualified_name(line, 6)
            if line.startswith(", ", end) or line.startswith(": TRUNCATE:", end):
                return self._truncate(line, lsn)
            if not line.startswith(":", end):
                raise _Scan("expected ':' after the table name", end)
            st = _Table(schema, table)
            if end == colon:
                self._tables[raw] = st
            pos = end + 1
        else:
            pos = colon + 1
        if line.startswith(" INSERT:", pos):
            pos += 8
            fast = st.fast[_NEW]
            if fast is not None:
                m = fast[0].fullmatch(line, pos)
                if m is not None:
                    return Insert(fast[2], _values(m.groups()), None, lsn)  # type: ignore[arg-type]
            if line.startswith(_NO_TUPLE, pos) and pos + len(_NO_TUPLE) == len(line):
                return Insert(self._relation(st, (), ()), (), None, lsn)
            hdrs, vals, _ = self._tuple(line, pos, st, _NEW)
            return Insert(self._relation(st, hdrs, ()), vals, None, lsn)
        if line.startswith(" UPDATE:", pos):
            return self._update(line, pos + 8, st, lsn)
        if line.startswith(" DELETE:", pos):
            pos += 8
            fast = st.fast[_DEL]
            if fast is not None:
                m = fast[0].fullmatch(line, pos)
                if m is not None:
                    return Delete(fast[2], _values(m.groups()), "K", None, lsn)  # type: ignore[arg-type]
            if line.startswith(_NO_TUPLE, pos) and pos + len(_NO_TUPLE) == len(line):
                return Delete(self._relation(st, (), ()), None, None, None, lsn)
            hdrs, vals, _ = self._tuple(line, pos, st, _DEL)
            return Delete(self._relation(st, hdrs, hdrs), vals, "K", None, lsn)
        if line.startswith(" TRUNCATE:", pos):
            return self._truncate(line, lsn)
        raise _Scan("expected INSERT:, UPDATE:, DELETE: or TRUNCATE:", pos)

    def _update(self, line: str, pos: int, st: _Table, lsn: int) -> Update:
        n = len(line)
        old_hdrs: tuple[str, ...] = ()
        old_vals: tuple[Value, ...] = ()
        has_old = line.startswith(" old-key:", pos)
        if has_old:
            pos += 9
            fast = st.fast[_OLD]
            m = None if fast is None else fast[0].match(line, pos)
            if fast is not None and m is not None:
                old_hdrs, old_vals, pos = fast[1], _values(m.groups()), m.end()
            else:
                old_hdrs, old_vals, pos = self._tuple(line, pos, st, _OLD)
            if not line.startswith(_NEW_TUPLE, pos):
                raise _Scan("expected 'new-tuple:' after the old key", pos)
            pos += len(_NEW_TUPLE)
        fast = st.fast[_NEW]
        m = None if fast is None else fast[0].fullmatch(line, pos)
        if fast is not None and m is not None:
            hdrs, vals = fast[1], _values(m.groups())
            if not has_old:
                return Update(fast[2], vals, None, None, None, lsn)  # type: ignore[arg-type]
        elif line.startswith(_NO_TUPLE, pos) and pos + len(_NO_TUPLE) == n:
            # the server sent no new tuple (not seen in practice): every new value is "not sent"
            rel = self._relation(st, old_hdrs, old_hdrs)
            unsent: tuple[Value, ...] = (UNCHANGED,) * len(old_hdrs)
            if has_old:
                new, filled = fill_from_old(rel, unsent, old_vals, "K")
                return Update(rel, new, old_vals, "K", None, lsn, filled)
            return Update(rel, unsent, None, None, None, lsn)
        else:
            hdrs, vals, _ = self._tuple(line, pos, st, _NEW)
            if not has_old:
                return Update(self._relation(st, hdrs, ()), vals, None, None, None, lsn)
        key = (st.schema, st.table, hdrs, old_hdrs)
        hit = self._aligned.get(key)
        if hit is None:
            index = {h: i for i, h in enumerate(hdrs)}
            where = []
            for h in old_hdrs:
                if h not in index:
                    name, typ = _split_header(h)
                    raise _Scan(f"old-key column {name} [{typ}] is not in the new tuple", pos)
                where.append(index[h])
            rel = self._relation(st, hdrs, old_hdrs)
            hit = self._aligned[key] = (rel, tuple(where))
        rel, slots = hit
        old: list[Value] = [None] * len(hdrs)
        for slot, value in zip(slots, old_vals, strict=True):
            old[slot] = value
        old_tuple = tuple(old)
        if UNCHANGED in vals:
            new, filled = fill_from_old(rel, vals, old_tuple, "K")
            return Update(rel, new, old_tuple, "K", None, lsn, filled)
        return Update(rel, vals, old_tuple, "K", None, lsn)

    def _tuple(self, line: str, pos: int, st: _Table, kind: int) -> tuple[tuple[str, ...], tuple[Value, ...], int]:
        """Columns `` name[type]:value`` from ``pos`` to the end (or to `` new-tuple:`` for an old key).

        Returns the raw column headers (`` name[type]:``, the relation's signature), the values
        and the end position. When a table shows the same signature twice in a row, a regex for
        it is compiled: later rows are matched by it in one call (see :func:`_values`).
        """
        n = len(line)
        find = line.find
        startswith = line.startswith
        words = _WORDS
        stop_at_new = kind == _OLD
        hdrs: list[str] = []
        vals: list[Value] = []
        while pos < n:
            if line[pos] != " ":
                raise _Scan("expected a space before the next column", pos)
            if stop_at_new and startswith(_NEW_TUPLE, pos):
                break
            end = self._header_end(line, pos)
            hdrs.append(line[pos:end])
            pos = end
            if startswith("'", pos):
                q = find("'", pos + 1)
                if q < 0:
                    raise _Scan("unterminated quoted value", pos)
                if startswith("'", q + 1):
                    while True:
                        q = find("'", q + 2)
                        if q < 0:
                            raise _Scan("unterminated quoted value", pos)
                        if not startswith("'", q + 1):
                            break
                    vals.append(line[pos + 1 : q].replace("''", "'"))
                else:
                    vals.append(line[pos + 1 : q])
                pos = q + 1
            else:
                sp = find(" ", pos)
                if sp < 0:
                    sp = n
                tok = line[pos:sp]
                v = words.get(tok, _MISSING)
                if v is not _MISSING:
                    vals.append(v)  # type: ignore[arg-type]  # None, UNCHANGED or 't'/'f'
                elif _BITS_RE.fullmatch(tok):
                    vals.append(tok[2:-1])
                elif _BARE_RE.fullmatch(tok):
                    vals.append(tok)
                else:
                    raise _Scan("expected a value (quoted text, number, true/false, null)", pos)
                pos = sp
        sig = tuple(hdrs)
        if st.pending[kind] == sig:
            rel = None if kind == _OLD else self._relation(st, sig, () if kind == _NEW else sig)
            st.fast[kind] = (_signature_regex(sig, kind), sig, rel)
        st.pending[kind] = sig
        return sig, tuple(vals), pos

    @staticmethod
    def _header_end(line: str, pos: int) -> int:
        """End of `` name[type]:`` starting at the space at ``pos``: quoted names (quote_identifier)
        and type names (format_type: spaces, ``[]``, quoted and schema-qualified user types)."""
        i = pos + 1
        if line.startswith('"', i):
            bracket = _closing_quote(line, i, "column name") + 1
            if not line.startswith("[", bracket):
                raise _Scan("expected '[' and a type name after the column name", bracket)
        else:
            bracket = line.find("[", i)
            if bracket <= i:
                raise _Scan("expected a column name", i)
            for ch in (" ", ":", "'", '"', "]"):
                if ch in line[i:bracket]:
                    raise _Scan("expected a column name followed by '[type]'", i)
        close = line.find("]:", bracket)
        if close < 0:
            raise _Scan("unterminated type name", bracket)
        if '"' in line[bracket:close]:
            # a quoted type name may hold ']' and ':'; walk it
            j = bracket + 1
            n = len(line)
            depth = 0
            while True:
                if j >= n:
                    raise _Scan("unterminated type name", bracket)
                ch = line[j]
                if ch == '"':
                    j = _closing_quote(line, j, "type name") + 1
                    continue
                if ch == "[":
                    depth += 1
                elif ch == "]":
                    if depth == 0:
                        break
                    depth -= 1
                j += 1
            if not line.startswith(":", j + 1):
                raise _Scan("expected ':' after the type name", j + 1)
            close = j
        if close == bracket + 1:
            raise _Scan("empty type name", bracket)
        return close + 2

    def _relation(self, st: _Table, hdrs: tuple[str, ...], keys: tuple[str, ...]) -> Relation:
        key = (st.schema, st.table, hdrs, keys)
        rel = self._rels.get(key)
        if rel is None:
            cols = []
            for h in hdrs:
                name, typ = _split_header(h)
                cols.append(Column(name, oid_for_name(typ), -1, typ, h in keys))
            if len(self._rels) >= _MAX_RELATIONS:
                self._rels.clear()
                self._aligned.clear()
            rel = self._rels[key] = Relation(0, st.schema, st.table, "?", tuple(cols))
        return rel

    def _truncate(self, line: str, lsn: int) -> Truncate:
        pos = 6
        rels = []
        while True:
            schema, table, pos = self._qualified_name(line, pos)
            rels.append(self._relation(_Table(schema, table), (), ()))
            if line.startswith(", ", pos):
                pos += 2
                continue
            if line.startswith(": TRUNCATE:", pos):
                pos += 11
                break
            raise _Scan("expected ', ' or ': TRUNCATE:' after the table name", pos)
        flags = line[pos:]
        if flags == " (no-flags)":
            restart, cascade = False, False
        elif flags == " restart_seqs":
            restart, cascade = True, False
        elif flags == " cascade":
            restart, cascade = False, True
        elif flags == " restart_seqs cascade":
            restart, cascade = True, True
        else:
            raise _Scan("expected (no-flags), restart_seqs or cascade", pos)
        return Truncate(tuple(rels), cascade, restart, None, lsn)

    # --- transactions, messages, streams ----------------------------------------------------

    def _control(self, line: str, lsn: int) -> Event | None:
        if line.startswith("BEGIN"):
            m = _XID_AT_RE.match(line, 5)
            if m is None or m.group(2) is not None:
                raise _Scan("expected BEGIN or BEGIN <xid>", 5)
            return Begin(0, None, _int(m.group(1)))
        if line.startswith("COMMIT PREPARED "):
            gid, xid, at = self._gid_tail(line, 16)
            return CommitPrepared(0, lsn, lsn, at, xid, gid)
        if line.startswith("COMMIT"):
            m = _XID_AT_RE.match(line, 6)
            if m is None:
                raise _Scan("expected COMMIT [<xid>] [(at <timestamp>)]", 6)
            return Commit(0, lsn, lsn, self._time(line, m, 2), _int(m.group(1)))
        if line.startswith("PREPARE TRANSACTION "):
            gid, xid, at = self._gid_tail(line, 20)
            return Prepare(0, lsn, lsn, at, xid, gid)
        if line.startswith("ROLLBACK PREPARED "):
            gid, xid, at = self._gid_tail(line, 18)
            return RollbackPrepared(0, 0, lsn, None, at, xid, gid)
        if line.startswith("message: "):
            return self._message(line, 9, lsn, streaming=False)
        if line.startswith("streaming "):
            if line.startswith("streaming change for ") or line.startswith("streaming truncate for "):
                start = line.index("for ") + 4
                if _FOR_RE.match(line, start) is None:
                    raise _Scan("expected 'transaction' or 'TXN <xid>'", start)
                return None
            if line.startswith("streaming message: "):
                return self._message(line, 19, lsn, streaming=True)
        elif line.startswith("opening a streamed block for transaction"):
            xid = self._txn(line, 40)
            first = xid not in self._streamed
            self._streamed.add(xid)
            return StreamStart(xid, first)
        elif line.startswith("closing a streamed block for transaction"):
            self._txn(line, 40)
            return StreamStop()
        elif line.startswith("aborting streamed (sub)transaction"):
            sub = self._txn(line, 34)
            if sub in self._streamed:
                self._streamed.discard(sub)
                return StreamAbort(sub, sub)
            top = next(iter(self._streamed)) if len(self._streamed) == 1 else 0
            return StreamAbort(top, sub)
        elif line.startswith("committing streamed transaction"):
            m = _TXN_AT_RE.match(line, 31)
            if m is None:
                raise _Scan("expected [TXN <xid>] [(at <timestamp>)]", 31)
            xid = _int(m.group(1)) or 0
            self._streamed.discard(xid)
            return StreamCommit(xid, 0, lsn, lsn, self._time(line, m, 2) or 0)
        elif line.startswith("preparing streamed transaction "):
            pos = 31
            if line.startswith("TXN ", pos):
                pos += 4
            gid, xid, at = self._gid_tail(line, pos)
            self._streamed.discard(xid or 0)
            return StreamPrepare(0, lsn, lsn, at or 0, xid or 0, gid)
        raise _Scan("unrecognised test_decoding line", 0)

    def _txn(self, line: str, pos: int) -> int:
        m = _TXN_RE.match(line, pos)
        if m is None:
            raise _Scan("expected end of line or 'TXN <xid>'", pos)
        return _int(m.group(1)) or 0

    @staticmethod
    def _time(line: str, m: re.Match[str], group: int) -> int | None:
        text = m.group(group)
        if text is None:
            return None
        try:
            return parse_timestamptz(text)
        except ValueError:
            raise _Scan("expected a timestamp like 2026-11-22 07:37:15.123456+00", m.start(group)) from None

    def _gid_tail(self, line: str, pos: int) -> tuple[str, int | None, int | None]:
        """``'gid'`` (quote_literal: E'...' with doubled backslashes when it has any) then
        ``[, txid N][ (at T)]``."""
        escaped = line.startswith("E'", pos)
        if escaped:
            pos += 1
        if not line.startswith("'", pos):
            raise _Scan("expected a quoted transaction identifier (gid)", pos)
        j = pos + 1
        n = len(line)
        out: list[str] = []
        while True:
            if j >= n:
                raise _Scan("unterminated quoted gid", pos)
            ch = line[j]
            if ch == "'":
                if line.startswith("'", j + 1):
                    out.append("'")
                    j += 2
                    continue
                break
            if ch == "\\" and escaped:
                if j + 1 >= n:
                    raise _Scan("unterminated quoted gid", pos)
                out.append(line[j + 1])
                j += 2
                continue
            out.append(ch)
            j += 1
        m = _TXID_AT_RE.match(line, j + 1)
        if m is None:
            raise _Scan("expected [, txid <xid>] [(at <timestamp>)] after the gid", j + 1)
        return "".join(out), _int(m.group(1)), self._time(line, m, 2)

    def _message(self, line: str, pos: int, lsn: int, *, streaming: bool) -> Message | None:
        m = _MSG_HEAD_RE.match(line, pos)
        if m is None:
            raise _Scan("expected 'transactional: 0|1 prefix: '", pos)
        transactional = m.group(1) == "1"
        start = m.end()
        # the prefix may itself contain ", sz: "; the content length decides which one is ours
        fallback: tuple[str, bytes] | None = None
        for sz in _SZ_RE.finditer(line, start):
            size = int(sz.group(1))
            if sz.group(2) is None:
                if sz.end() == len(line) and streaming and transactional:
                    return None  # content withheld until the streamed transaction commits
                continue
            try:
                content = line[sz.end() :].encode("utf-8", "surrogateescape")
            except UnicodeEncodeError as exc:
                raise _Scan("message content is not text", sz.end() + exc.start) from None
            prefix = line[start : sz.start()]
            if len(content) == size:
                return Message(transactional, lsn, prefix, content, None)
            if fallback is None:
                fallback = (prefix, content)
        if fallback is not None:
            # a size that does not match: the text was re-encoded on the way (SQL interface in a
            # non-UTF8 client encoding); keep the first reading
            return Message(transactional, lsn, fallback[0], fallback[1], None)
        raise _Scan("expected ', sz: <size> content:'", start)


def _signature_regex(hdrs: tuple[str, ...], kind: int) -> re.Pattern[str]:
    """A regex matching one tuple with exactly these column headers, one group per value."""
    body = "".join(re.escape(h) + _VALUE for h in hdrs)
    return re.compile(body + "(?= new-tuple:)" if kind == _OLD else body)


def _values(groups: tuple[str, ...]) -> tuple[Value, ...]:
    """Values captured by a signature regex to their text form (same rules as the scanner)."""
    words = _WORDS
    out: list[Value] = []
    for v in groups:
        c = v[0]
        if c == "'":
            v = v[1:-1]
            out.append(v.replace("''", "'") if "''" in v else v)
        elif c == "B" and v[1:2] == "'":
            out.append(v[2:-1])
        else:
            out.append(words.get(v, v))  # type: ignore[arg-type]
    return tuple(out)


def _oneline(text: str) -> str:
    """Backslash escapes for backslashes and anything unprintable (newlines, tabs, U+2028...)."""
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(
        "\\\\" if c == "\\" else c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text
    )


def _int(text: str | None) -> int | None:
    return None if text is None else int(text)
