"""Which columns identify a table's rows: the input's relation records, or ``--key``.

pgoutput names a table's key in every Relation message (its primary key or replica identity
index; every column for REPLICA IDENTITY FULL). test_decoding names none: pgrecv learns key
columns only from the old key it prints for a DELETE or for an UPDATE that changes the key. A
table whose input has neither cannot be replayed by key, so ``--key SCHEMA.TABLE=COL[,COL]`` names
it. A named key never overrides one the input names: the two must agree, since a wrong key would
merge rows that PostgreSQL keeps apart. With REPLICA IDENTITY FULL the named key narrows the
whole-row identity; the rest of FULL's rules hold (every old image holds every column).
"""

from __future__ import annotations

from typing import Any

from pgrecv.errors import InputError, UsageError

Name = tuple[str, str]  # (schema, table)
_SPECIAL = set('.,="') | {" ", "\t"}


def _idents(text: str, sep: str, what: str, option: str) -> list[str]:
    """``text`` split at unquoted ``sep``; a part may be double-quoted, with ``""`` for a quote."""
    parts: list[str] = []
    i, n = 0, len(text)
    while True:
        if i < n and text[i] == '"':
            out = []
            i += 1
            while True:
                j = text.find('"', i)
                if j < 0:
                    raise UsageError(f"--key {option!r}: unterminated quote in the {what}")
                out.append(text[i:j])
                if j + 1 < n and text[j + 1] == '"':
                    out.append('"')
                    i = j + 2
                    continue
                i = j + 1
                break
            part = "".join(out)
            if i < n and text[i] != sep:
                raise UsageError(f"--key {option!r}: {text[i]!r} after a quoted name in the {what}")
        else:
            j = text.find(sep, i)
            j = n if j < 0 else j
            part = text[i:j]
            if '"' in part:
                raise UsageError(f"--key {option!r}: a quote inside an unquoted name in the {what}")
            i = j
        if not part:
            raise UsageError(f"--key {option!r}: an empty name in the {what}")
        parts.append(part)
        if i >= n:
            return parts
        i += 1  # past sep
        if i >= n:
            raise UsageError(f"--key {option!r}: an empty name in the {what}")


def parse_key(option: str) -> tuple[Name, tuple[str, ...]]:
    """``SCHEMA.TABLE=COL[,COL...]`` → ((schema, table), columns). Names are taken as written
    (case-sensitive, as the input spells them); a name holding ``.``, ``,``, ``=``, ``"`` or
    blanks is double-quoted, as in SQL."""
    table, cols = _split_at_unquoted(option, "=")
    if cols is None:
        raise UsageError(f"--key {option!r}: expected SCHEMA.TABLE=COLUMN[,COLUMN...], e.g. public.orders=id")
    name = _idents(table, ".", "table name", option)
    if len(name) != 2:
        raise UsageError(f"--key {option!r}: the table must be SCHEMA.TABLE (double-quote a name holding a dot)")
    columns = _idents(cols, ",", "columns", option)
    if len(set(columns)) != len(columns):
        raise UsageError(f"--key {option!r}: a column is named twice")
    return (name[0], name[1]), tuple(columns)


def parse_keys(options: tuple[str, ...]) -> dict[Name, tuple[str, ...]]:
    out: dict[Name, tuple[str, ...]] = {}
    for o in options:
        name, cols = parse_key(o)
        if name in out and out[name] != cols:
            raise UsageError(f"--key {o!r}: {option_name(*name)} has another --key already")
        out[name] = cols
    return out


def _split_at_unquoted(text: str, sep: str) -> tuple[str, str | None]:
    quoted = False
    for i, ch in enumerate(text):
        if ch == '"':
            quoted = not quoted
        elif ch == sep and not quoted:
            return text[:i], text[i + 1 :]
    return text, None


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"' if not name or _SPECIAL & set(name) else name


def option_name(schema: str, table: str) -> str:
    """The table as ``--key`` takes it (quoted where it must be)."""
    return f"{_quote(schema)}.{_quote(table)}"


def identity(
    schema: str,
    table: str,
    relations: list[dict[str, Any]],
    append_only: bool,
    named: tuple[str, ...] | None = None,
) -> tuple[list[str], bool, bool]:
    """(key columns, compared NULL-safe (REPLICA IDENTITY FULL), append-only) of a table, from its
    relation records (the latest that says), or from ``named`` (``--key``) where they name none."""
    name = f"{schema}.{table}"
    if not relations:
        raise InputError(f"table {name}: changes without any relation record before them: the input is incomplete")
    given = None
    for rel in reversed(relations):
        if rel.get("key") and rel.get("replica_identity") != "full":
            given = list(rel["key"])
            break
    full = given is None and relations[-1].get("replica_identity") == "full"
    if given is None and not full:
        for rel in reversed(relations):  # test_decoding: the key is whatever old images named
            if rel.get("key"):
                given = list(rel["key"])
                break
    if named:
        shown = f"--key {option_name(schema, table)}={','.join(map(_quote, named))}"
        # every record's columns: test_decoding's record of a DELETE holds the old key's only
        columns = {c["name"] for rel in relations for c in rel.get("columns") or []}
        missing = [c for c in named if c not in columns]
        if missing:
            raise UsageError(
                f"{shown}: no column {missing[0]!r} in table {name} (its columns: {', '.join(sorted(columns))})"
            )
        if given is not None and set(given) != set(named):
            raise UsageError(
                f"{shown}: the input names the key of table {name} as ({', '.join(given)}): give that, "
                "or leave --key out for this table"
            )
        # FULL stays FULL with a named key: its old images still hold every column (unchanged
        # TOAST values are taken from them) and the key is still compared NULL-safe
        return (given if given is not None else list(named)), full, False
    if given is not None:
        return given, False, False
    if full:
        return [c["name"] for c in relations[-1]["columns"]], True, False
    if append_only:
        return [], False, True
    hint = f"--key {option_name(schema, table)}=COLUMN[,COLUMN...]"
    # only test_decoding's records (a snapshot's, from the catalog, would know there is no key)
    if all(rel.get("replica_identity") == "unknown" for rel in relations):
        raise InputError(
            f"table {name}: the input names no key for it (test_decoding names key columns only in the old "
            f"row of a DELETE or of an UPDATE that changes the key): name its primary key with {hint}, "
            "or pass --append-only to append its inserts"
        )
    raise InputError(
        f"table {name} has no primary key or replica identity: give it one (or REPLICA IDENTITY FULL), "
        f"name a unique key with {hint}, or pass --append-only to append its inserts"
    )
