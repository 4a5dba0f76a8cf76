"""Property and fuzz tests for TestDecodingParser.

Lines are built here with test_decoding's own rules (quote_identifier for names, format_type
names in brackets, print_literal for values, quote_literal for gids), independently of the parser.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pgrecv.decode.test_decoding import TestDecodingParser, parse_timestamptz
from pgrecv.errors import DecodeError
from pgrecv.events import (
    UNCHANGED,
    CommitPrepared,
    Delete,
    Insert,
    Message,
    Prepare,
    RollbackPrepared,
    StreamPrepare,
    Update,
    Value,
)

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --- test_decoding's quoting rules --------------------------------------------------------------


def quote_ident(name: str, force: bool = False) -> str:
    """quote_identifier(): bare only for [a-z_][a-z0-9_]* (keywords are quoted too: ``force``)."""
    if not force and re.fullmatch(r"[a-z_][a-z0-9_]*", name):
        return name
    return '"' + name.replace('"', '""') + '"'


def quote_literal(text: str) -> str:
    """quote_literal_cstr(): E'' form with doubled backslashes when the text has any."""
    body = "'" + text.replace("\\", "\\\\").replace("'", "''") + "'"
    return "E" + body if "\\" in text else body


BUILTIN_TYPES = {
    "integer": "int",
    "bigint": "int",
    "smallint": "int",
    "oid": "int",
    "real": "float",
    "double precision": "float",
    "numeric": "numeric",
    "boolean": "bool",
    "bit": "bits",
    "bit varying": "bits",
    "text": "text",
    "character varying": "text",
    "character": "text",
    "timestamp with time zone": "text",
    "jsonb": "text",
    "bytea": "text",
    "text[]": "text",
    "integer[]": "text",
    '"char"': "text",
    "interval": "text",
}

# server text: no NUL, no lone surrogates
chars = st.characters(exclude_characters="\x00", exclude_categories=["Cs"])
names = st.text(chars, min_size=1, max_size=8)
idents = st.one_of(st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True), names)


@st.composite
def type_names(draw: st.DrawFn) -> tuple[str, str]:
    """(format_type name, value kind)."""
    if draw(st.booleans()):
        name = draw(st.sampled_from(sorted(BUILTIN_TYPES)))
        return name, BUILTIN_TYPES[name]
    typ = quote_ident(draw(idents), draw(st.booleans()))
    if draw(st.booleans()):
        typ = quote_ident(draw(idents), draw(st.booleans())) + "." + typ
    if draw(st.booleans()):
        typ += "[]"
    return typ, "text"


@st.composite
def rendered_values(draw: st.DrawFn, kind: str) -> tuple[str, Value]:
    """(print_literal text, the value the parser should give)."""
    special = draw(st.sampled_from(["value", "value", "value", "null", "toast"]))
    if special == "null":
        return "null", None
    if special == "toast":
        return "unchanged-toast-datum", UNCHANGED
    if kind == "int":
        text = str(draw(st.integers(-(2**63), 2**63 - 1)))
        return text, text
    if kind == "float":
        f = draw(st.floats(allow_nan=True, allow_infinity=True))
        text = "NaN" if f != f else "Infinity" if f == float("inf") else "-Infinity" if f == -float("inf") else repr(f)
        return text, text
    if kind == "numeric":
        text = draw(st.one_of(st.decimals(allow_nan=False, allow_infinity=False).map(str), st.just("NaN")))
        return text, text
    if kind == "bool":
        b = draw(st.booleans())
        return ("true", "t") if b else ("false", "f")
    if kind == "bits":
        bits = draw(st.from_regex(r"[01]{0,12}", fullmatch=True))
        return f"B'{bits}'", bits
    text = draw(st.text(chars))
    return "'" + text.replace("'", "''") + "'", text


@dataclass
class Col:
    name: str
    quoted_name: str
    typ: str
    rendered: str
    value: Value


@st.composite
def columns(draw: st.DrawFn, min_size: int = 1) -> list[Col]:
    col_names = draw(st.lists(names, min_size=min_size, max_size=6, unique=True))
    out = []
    for name in col_names:
        typ, kind = draw(type_names())
        rendered, value = draw(rendered_values(kind))
        out.append(Col(name, quote_ident(name, draw(st.booleans())), typ, rendered, value))
    return out


def tuple_text(cols: list[Col]) -> str:
    return "".join(f" {c.quoted_name}[{c.typ}]:{c.rendered}" for c in cols)


@st.composite
def table_names(draw: st.DrawFn) -> tuple[str, str, str]:
    schema, table = draw(idents), draw(idents)
    return schema, table, quote_ident(schema, draw(st.booleans())) + "." + quote_ident(table, draw(st.booleans()))


def decode_thrice(line: str) -> Any:
    """Decode with a fresh parser three times: scanner, scanner + compile, compiled regex."""
    p = TestDecodingParser()
    first = p.decode(line, 5)
    assert p.decode(line, 5) == first
    assert p.decode(line, 5) == first
    return first


# --- round trips ----------------------------------------------------------------------------


@FUZZ
@given(table_names(), columns())
def test_insert_round_trip(table: tuple[str, str, str], cols: list[Col]) -> None:
    schema, name, qualified = table
    e = decode_thrice(f"table {qualified}: INSERT:{tuple_text(cols)}")
    assert isinstance(e, Insert)
    assert (e.relation.namespace, e.relation.name, e.lsn, e.xid) == (schema, name, 5, None)
    assert [(c.name, c.type_name, c.key) for c in e.relation.columns] == [(c.name, c.typ, False) for c in cols]
    assert e.new == tuple(c.value for c in cols)


@FUZZ
@given(table_names(), columns(), st.data())
def test_update_with_old_key_round_trip(table: tuple[str, str, str], cols: list[Col], data: st.DataObject) -> None:
    schema, name, qualified = table
    # the old image: a subset of the columns, in table order, never NULL (test_decoding skips those)
    picked = data.draw(st.lists(st.sampled_from(range(len(cols))), min_size=1, unique=True).map(sorted))
    old_cols = [cols[i] for i in picked if cols[i].value is not None]
    assume(old_cols)
    line = f"table {qualified}: UPDATE: old-key:{tuple_text(old_cols)} new-tuple:{tuple_text(cols)}"
    e = decode_thrice(line)
    assert isinstance(e, Update)
    assert (e.relation.namespace, e.relation.name, e.old_kind) == (schema, name, "K")
    assert e.new == tuple(c.value for c in cols)
    old_names = {c.name for c in old_cols}
    assert e.relation.key_names == tuple(c.name for c in cols if c.name in old_names)
    assert e.old == tuple(c.value if c.name in old_names else None for c in cols)


@FUZZ
@given(table_names(), columns())
def test_update_and_delete_round_trip(table: tuple[str, str, str], cols: list[Col]) -> None:
    _, _, qualified = table
    e = decode_thrice(f"table {qualified}: UPDATE:{tuple_text(cols)}")
    assert isinstance(e, Update)
    assert (e.new, e.old, e.old_kind, e.relation.key_names) == (tuple(c.value for c in cols), None, None, ())
    d = decode_thrice(f"table {qualified}: DELETE:{tuple_text(cols)}")
    assert isinstance(d, Delete)
    assert (d.old, d.old_kind) == (tuple(c.value for c in cols), "K")
    assert d.relation.key_names == tuple(c.name for c in cols)


@FUZZ
@given(st.lists(columns(), min_size=2, max_size=5))
def test_changing_signatures_on_one_table(signatures: list[list[Col]]) -> None:
    """Rows of one table whose columns change between lines (DDL, NULL-skipping) never mix up."""
    p = TestDecodingParser()
    for cols in signatures + signatures[::-1] + signatures:
        e = p.decode(f"table public.t: INSERT:{tuple_text(cols)}")
        assert isinstance(e, Insert)
        assert [(c.name, c.type_name) for c in e.relation.columns] == [(c.name, c.typ) for c in cols]
        assert e.new == tuple(c.value for c in cols)


@FUZZ
@given(st.text(chars), st.binary(), st.booleans())
def test_message_round_trip(prefix: str, content: bytes, transactional: bool) -> None:
    assume(", sz: " not in prefix)  # the one ambiguity the format has (the parser then checks sizes)
    head = f"message: transactional: {int(transactional)} prefix: {prefix}, sz: {len(content)} content:"
    from_bytes = TestDecodingParser().decode(head.encode() + content, 9)
    assert from_bytes == Message(transactional, 9, prefix, content, None)
    text = content.decode("utf-8", "replace")
    from_text = TestDecodingParser().decode(head.replace(f"sz: {len(content)}", f"sz: {len(text.encode())}") + text)
    assert isinstance(from_text, Message) and from_text.content == text.encode()


@FUZZ
@given(
    st.text(chars, max_size=20),
    st.none() | st.integers(0, 2**32 - 1),
    st.none() | st.datetimes(datetime(1, 1, 1), datetime(9999, 12, 31), timezones=st.just(UTC)),
)
def test_gid_round_trip(gid: str, xid: int | None, when: datetime | None) -> None:
    tail = ("" if xid is None else f", txid {xid}") + ("" if when is None else f" (at {pg_iso(when, 0)})")
    micros = None if when is None else to_micros(when)
    lit = quote_literal(gid)
    assert TestDecodingParser().decode(f"PREPARE TRANSACTION {lit}{tail}", 3) == Prepare(0, 3, 3, micros, xid, gid)
    assert TestDecodingParser().decode(f"COMMIT PREPARED {lit}{tail}", 3) == CommitPrepared(0, 3, 3, micros, xid, gid)
    rb = TestDecodingParser().decode(f"ROLLBACK PREPARED {lit}{tail}", 3)
    assert rb == RollbackPrepared(0, 0, 3, None, micros, xid, gid)
    txn = "" if xid is None else "TXN "
    sp = TestDecodingParser().decode(f"preparing streamed transaction {txn}{lit}{tail}", 3)
    assert sp == StreamPrepare(0, 3, 3, micros or 0, xid or 0, gid)


# --- timestamps ---------------------------------------------------------------------------


def pg_iso(when: datetime, offset_seconds: int) -> str:
    """timestamptz_to_str() style: local time at the offset, fraction without trailing zeros,
    offset as +HH[:MM[:SS]]."""
    local = when.astimezone(UTC).replace(tzinfo=None) + timedelta(seconds=offset_seconds)
    text = local.strftime("%Y-%m-%d %H:%M:%S")
    if local.year < 1000:
        text = f"{local.year:04d}" + text[text.index("-") :]
    if local.microsecond:
        text += f".{local.microsecond:06d}".rstrip("0")
    sign = "-" if offset_seconds < 0 else "+"
    h, rest = divmod(abs(offset_seconds), 3600)
    m, s = divmod(rest, 60)
    text += f"{sign}{h:02d}"
    if m or s:
        text += f":{m:02d}"
    if s:
        text += f":{s:02d}"
    return text


def to_micros(when: datetime) -> int:
    delta = when - datetime(2000, 1, 1, tzinfo=UTC)
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


@FUZZ
@given(
    st.datetimes(datetime(1, 1, 2), datetime(9999, 12, 30), timezones=st.just(UTC)),
    st.integers(-15 * 3600, 15 * 3600),
)
def test_timestamp_round_trip(when: datetime, offset: int) -> None:
    assert parse_timestamptz(pg_iso(when, offset)) == to_micros(when)


def test_timestamp_bc_and_far_future() -> None:
    # 1 BC is year 0; days between 0001-01-01 and 0001-01-01 BC: 366 (year 0 is a leap year)
    assert parse_timestamptz("0001-01-01 00:00:00+00") - parse_timestamptz("0001-01-01 00:00:00+00 BC") == (
        366 * 86400 * 1_000_000
    )
    assert parse_timestamptz("10000-01-01 00:00:00+00") - parse_timestamptz("9999-12-31 00:00:00+00") == (
        86400 * 1_000_000
    )


# --- fuzz: anything in, an event / None / DecodeError out ---------------------------------------

PREFIXES = [
    "",
    "table ",
    "table public.t: INSERT:",
    "table public.t: UPDATE: old-key:",
    "table public.t: DELETE:",
    "table a.b, ",
    "BEGIN",
    "COMMIT",
    "COMMIT PREPARED ",
    "PREPARE TRANSACTION ",
    "ROLLBACK PREPARED E'",
    "message: transactional: 1 prefix: ",
    "streaming message: transactional: 0 prefix: ",
    "streaming change for ",
    "opening a streamed block for transaction",
    "aborting streamed (sub)transaction",
    "committing streamed transaction",
    "preparing streamed transaction ",
]


def decode_or_error(parser: TestDecodingParser, line: str | bytes) -> None:
    try:
        parser.decode(line, 1)
    except DecodeError as exc:
        assert str(exc).startswith("test_decoding: ")
        assert len(str(exc).splitlines()) == 1


@FUZZ
@given(st.sampled_from(PREFIXES), st.text())
def test_random_text(prefix: str, rest: str) -> None:
    decode_or_error(TestDecodingParser(), prefix + rest)


@FUZZ
@given(st.sampled_from(PREFIXES), st.binary())
def test_random_bytes(prefix: str, rest: bytes) -> None:
    decode_or_error(TestDecodingParser(), prefix.encode() + rest)


@st.composite
def valid_lines(draw: st.DrawFn) -> str:
    _, _, qualified = draw(table_names())
    cols = draw(columns())
    shape = draw(st.sampled_from(["insert", "update", "old", "delete", "truncate", "commit", "prepare"]))
    if shape == "insert":
        return f"table {qualified}: INSERT:{tuple_text(cols)}"
    if shape == "update":
        return f"table {qualified}: UPDATE:{tuple_text(cols)}"
    if shape == "old":
        return f"table {qualified}: UPDATE: old-key:{tuple_text(cols[:1])} new-tuple:{tuple_text(cols)}"
    if shape == "delete":
        return f"table {qualified}: DELETE:{tuple_text(cols)}"
    if shape == "truncate":
        return f"table {qualified}, public.x: TRUNCATE: restart_seqs cascade"
    if shape == "commit":
        return "COMMIT 1234 (at 2026-11-22 07:37:15.123456+05:30)"
    return f"PREPARE TRANSACTION {quote_literal(draw(names))}, txid 7 (at 2026-11-22 07:37:15+00)"


@FUZZ
@given(valid_lines(), st.data())
def test_truncated_and_mutated_lines(line: str, data: st.DataObject) -> None:
    parser = TestDecodingParser()
    parser.decode(line)  # valid as built
    parser.decode(line)  # the second sighting compiles the fast path, so mutations hit it too
    cut = data.draw(st.integers(0, len(line)))
    decode_or_error(parser, line[:cut])
    pos = data.draw(st.integers(0, len(line)))
    char = data.draw(st.sampled_from(["'", '"', " ", ":", "[", "]", ",", ".", "B", "\n", "x", ""]))
    how = data.draw(st.sampled_from(["insert", "replace", "delete"]))
    if how == "insert":
        mutated = line[:pos] + char + line[pos:]
    elif how == "replace":
        mutated = line[:pos] + char + line[pos + 1 :]
    else:
        mutated = line[:pos] + line[pos + 1 :]
    decode_or_error(parser, mutated)
    decode_or_error(TestDecodingParser(), mutated)
