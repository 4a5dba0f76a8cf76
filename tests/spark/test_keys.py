"""--key: parsing SCHEMA.TABLE=COLUMNS, and which key a table is replayed by (pgrecv/spark/keys.py)."""

from __future__ import annotations

from typing import Any

import pytest

from pgrecv.errors import InputError, UsageError
from pgrecv.spark.keys import identity, option_name, parse_key, parse_keys


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("public.orders=id", (("public", "orders"), ("id",))),
        ("public.comp=k1,k2", (("public", "comp"), ("k1", "k2"))),
        ("Sales.Orders=OrderId", (("Sales", "Orders"), ("OrderId",))),  # as written: no case folding
        ('"my.schema"."t=1"="a,b","c""d"', (("my.schema", "t=1"), ("a,b", 'c"d'))),
        ("s.t=ü", (("s", "t"), ("ü",))),
    ],
)
def test_key_options_parse(text: str, want: tuple[Any, ...]) -> None:
    assert parse_key(text) == want


@pytest.mark.parametrize(
    "text",
    [
        "public.orders",
        "orders=id",
        "a.b.c=id",
        "public.t=",
        "public.t=a,,b",
        "public.t=a,",
        '"public.t=id',
        'pub"lic.t=id',
        '"public"x.t=id',
        ".t=id",
        "public.t=a,a",
    ],
)
def test_bad_key_options_are_usage_errors(text: str) -> None:
    with pytest.raises(UsageError) as e:
        parse_key(text)
    assert e.value.message.startswith(f"--key {text!r}: ")


def test_one_key_per_table() -> None:
    assert parse_keys(("s.t=a", "s.t=a", "s.u=b")) == {("s", "t"): ("a",), ("s", "u"): ("b",)}
    with pytest.raises(UsageError, match="has another --key"):
        parse_keys(("s.t=a", "s.t=b"))


@pytest.mark.parametrize(("schema", "table"), [("public", "t"), ("my.s", 'q"t'), ("a b", "x,y=z"), ("Ü", "T")])
def test_option_name_reads_back(schema: str, table: str) -> None:
    assert parse_key(f"{option_name(schema, table)}=c") == ((schema, table), ("c",))


def _rel(key: list[str], ri: str = "default", cols: tuple[str, ...] = ("id", "a", "b")) -> dict[str, Any]:
    return {"replica_identity": ri, "key": key, "columns": [{"name": c} for c in cols]}


def test_the_input_key_is_used_and_a_named_one_must_agree() -> None:
    rels = [_rel(["id"])]
    assert identity("s", "t", rels, False) == (["id"], False, False)
    assert identity("s", "t", rels, False, ("id",)) == (["id"], False, False)
    with pytest.raises(UsageError, match=r"the input names the key of table s\.t as \(id\)"):
        identity("s", "t", rels, False, ("a",))


def test_full_identity_is_the_whole_row_unless_a_key_is_named() -> None:
    rels = [_rel(["id", "a", "b"], "full")]
    assert identity("s", "t", rels, False) == (["id", "a", "b"], True, False)
    assert identity("s", "t", rels, False, ("id",)) == (["id"], True, False)


def test_test_decoding_tables_without_an_old_key_need_key_or_append_only() -> None:
    rels = [_rel([], "unknown")]
    with pytest.raises(InputError) as e:
        identity("s", "t", rels, False)
    assert "test_decoding names key columns only in the old row" in e.value.message
    assert "--key s.t=COLUMN[,COLUMN...]" in e.value.message
    assert identity("s", "t", rels, True) == ([], False, True)
    assert identity("s", "t", rels, False, ("id", "a")) == (["id", "a"], False, False)
    # an old key seen later names it: then --key must agree
    assert identity("s", "t", [*rels, _rel(["id"], "unknown")], False, ("id",)) == (["id"], False, False)
    with pytest.raises(UsageError):
        identity("s", "t", [*rels, _rel(["id"], "unknown")], False, ("a",))


def test_a_snapshot_that_found_no_key_is_believed() -> None:
    """test_decoding after a snapshot: the snapshot's relation record (from the catalog) says the
    table has no key, so the message does not ask for its primary key."""
    rels = [_rel([], "default"), _rel([], "unknown")]
    with pytest.raises(InputError, match="has no primary key or replica identity"):
        identity("s", "t", rels, False)
    assert identity("s", "t", [_rel(["id"], "default"), _rel([], "unknown")], False) == (["id"], False, False)


def test_a_named_column_must_exist() -> None:
    with pytest.raises(UsageError, match=r"no column 'nope' in table s\.t \(its columns: a, b, id\)"):
        identity("s", "t", [_rel([], "unknown")], False, ("id", "nope"))


def test_no_key_anywhere() -> None:
    with pytest.raises(InputError, match=r"has no primary key or replica identity: .*--key s\.t=COLUMN"):
        identity("s", "t", [_rel([], "nothing")], False)
    with pytest.raises(InputError, match="without any relation record"):
        identity("s", "t", [], False, ("id",))
