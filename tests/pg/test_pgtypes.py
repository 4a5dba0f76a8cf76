"""The built-in type table against the catalog of every live test server, and the name lookups."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from pgrecv.pg import types as pgtypes
from pgrecv.pg.server import TempServer
from pgrecv.pg.types import ARRAY_DELIMITER, ARRAY_ELEMENT, TYPE_NAMES, oid_for_name, type_name


def _catalog(server: TempServer) -> dict[int, tuple[str, int, int, str, str, str]]:
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        rows: list[Any] = conn.execute(
            "SELECT oid::int, format_type(oid, NULL), typelem::int, typarray::int, typdelim::text, typtype::text,"
            " typname::text FROM pg_type WHERE oid < 10000"
        ).fetchall()
    return {r[0]: tuple(r[1:]) for r in rows}


def test_every_entry_matches_the_live_catalog(pg_server: TempServer) -> None:
    cat = _catalog(pg_server)
    wrong = {oid: (name, cat.get(oid)) for oid, name in TYPE_NAMES.items() if oid not in cat or cat[oid][0] != name}
    assert wrong == {}
    for arr, elem in ARRAY_ELEMENT.items():
        assert cat[arr][1] == elem and cat[elem][2] == arr and cat[arr][5].startswith("_")
    for elem, delim in ARRAY_DELIMITER.items():
        assert cat[elem][3] == delim


def test_covers_every_base_range_and_multirange_type_and_array(pg_server: TempServer) -> None:
    cat = _catalog(pg_server)
    wanted = {oid for oid, (_, _, _, _, typtype, _) in cat.items() if typtype in "brm"}
    # element-less true arrays of those, and the composite-row/pseudo-type arrays we leave out
    wanted -= {oid for oid, row in cat.items() if row[5].startswith("_") and row[1] not in wanted}
    assert wanted - TYPE_NAMES.keys() == set()
    true_arrays = {oid: row[1] for oid, row in cat.items() if oid in TYPE_NAMES and row[5].startswith("_") and row[1]}
    assert true_arrays == ARRAY_ELEMENT
    elements = {oid: row for oid, row in cat.items() if oid in TYPE_NAMES and not row[5].startswith("_")}
    other_delims = {oid: row[3] for oid, row in elements.items() if row[3] != ","}
    assert other_delims == ARRAY_DELIMITER


def test_names_a_table_column_gets(db_conn: psycopg.Connection[Any]) -> None:
    """format_type with a typmod (as a column has) maps back to the same OID."""
    cols = {
        "a": "varchar(10)",
        "b": "numeric(10,2)[]",
        "c": "timestamp(3) with time zone",
        "d": "time(2)",
        "e": "interval day to second(3)",
        "f": "interval year[]",
        "g": "bit(3)",
        "h": "char(4)",
        "i": '"char"',
        "j": "int4multirange",
        "k": "bit varying(5)[]",
    }
    db_conn.execute("CREATE TABLE t (" + ", ".join(f"{k} {v}" for k, v in cols.items()) + ")")
    rows: list[Any] = db_conn.execute(
        "SELECT attname::text, atttypid::int, format_type(atttypid, atttypmod) FROM pg_attribute"
        " WHERE attrelid = 't'::regclass AND attnum > 0 ORDER BY attnum"
    ).fetchall()
    assert len(rows) == len(cols)
    for name, oid, shown in rows:
        assert oid_for_name(shown) == oid, (name, shown)
        assert type_name(oid) is not None


def test_type_name_and_reverse_lookup() -> None:
    assert type_name(23) == "integer"
    assert type_name(1009) == "text[]"
    assert type_name(18) == '"char"'
    assert type_name(16384) is None
    for oid, name in TYPE_NAMES.items():
        assert oid_for_name(name) == oid
        assert oid_for_name("pg_catalog." + name) == oid


@pytest.mark.parametrize("name", ["int4", "varchar", "public.mood", '"integer"', "", "integer[][]x", "foo(3)"])
def test_unknown_names_give_zero(name: str) -> None:
    assert oid_for_name(name) == 0


def test_table_has_no_duplicate_names() -> None:
    names = [name for _, name, _ in pgtypes._BUILTINS]
    assert len(set(names)) == len(names)
    assert len(set(TYPE_NAMES.values())) == len(TYPE_NAMES)
