"""Many small tables in one set of Spark jobs (pgrecv/spark/engine/together.py, issue 56): the
tables applied as a group equal the same tables applied one by one, through two runs that insert,
update, delete, change keys, add a column and a table; a table the group cannot take (a value its
type cannot hold, two changes at one position, unchanged TOAST values) goes to the per-table
replay alone, and the others are still grouped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import deltalake
import orjson
import pyarrow.parquet as pq
import pytest

from pgrecv.spark.apply import run_apply
from pgrecv.spark.model import ApplyConfig, Summary, Tuning, table_dir_name
from tests.spark.test_engine import _txn, _write

pytest.importorskip("pyspark")

# name → (columns as (name, type, typmod), key)
TABLES: dict[str, tuple[list[tuple[str, str, int]], list[str]]] = {
    "a": ([("id", "integer", -1), ("v", "text", -1)], ["id"]),
    "b": ([("id", "bigint", -1), ("n", "numeric", (10 << 16) + 2 + 4), ("ok", "boolean", -1)], ["id"]),
    "c": ([("k", "text", -1), ("d", "date", -1), ("ts", "timestamp with time zone", -1)], ["k"]),
    "d": ([("id", "integer", -1), ("arr", "integer[]", -1), ("b", "bytea", -1)], ["id"]),
    "e": ([("u", "uuid", -1), ("f", "double precision", -1)], ["u"]),
    "f": ([("x", "integer", -1), ("y", "text", -1), ("z", "smallint", -1)], ["x", "y"]),
}


def _rel(table: str, cols: list[tuple[str, str, int]], key: list[str]) -> str:
    return orjson.dumps(
        {
            "v": 1,
            "op": "relation",
            "schema": "public",
            "table": table,
            "replica_identity": "default",
            "key": key,
            "columns": [{"name": n, "type": t, "typmod": m, "key": n in key} for n, t, m in cols],
        }
    ).decode()


def _change(op: str, table: str, commit: str, lsn: str, new: dict[str, Any] | None, old: dict[str, Any] | None) -> str:
    key = TABLES[table][1] if table in TABLES else ["id"]
    line: dict[str, Any] = {"v": 1, "op": op, "schema": "public", "table": table, "xid": 1}
    line.update(commit_lsn=commit, lsn=lsn, key=key, new=new, old=old, unchanged_toast=[])
    return orjson.dumps(line).decode()


def _row(table: str, i: int) -> dict[str, Any]:
    """Row ``i`` of a table, its values of the types the table's columns have."""
    return {
        "a": {"id": i, "v": f"a{i}"},
        "b": {"id": 10**12 + i, "n": f"{i}.{i % 100:02d}", "ok": i % 2 == 0},
        "c": {"k": f"key {i}", "d": f"2026-01-{1 + i % 28:02d}", "ts": f"2026-02-03 04:05:{i % 60:02d}.5+00"},
        "d": {"id": i, "arr": [i, None, i + 1], "b": "AAEC"},
        "e": {"u": f"00000000-0000-0000-0000-{i:012d}", "f": i / 3},
        "f": {"x": i % 3, "y": f"y{i}", "z": i},
    }[table]


def _key(table: str, row: dict[str, Any]) -> dict[str, Any]:
    return {k: row[k] for k in TABLES[table][1]}


def _first_run() -> list[str]:
    lines = [_rel(t, cols, key) for t, (cols, key) in TABLES.items()]
    changes = [_change("insert", t, "0/1000", f"0/{100 + i * 10 + j:X}", _row(t, i), None) for j, t in
               enumerate(TABLES) for i in range(6)]  # fmt: skip
    return lines + _txn("0/1000", changes)


def _second_run() -> list[str]:
    """Updates, deletes and key changes in every table; table a gains a column; table g is new."""
    lines = [_rel("a", [("id", "integer", -1), ("v", "text", -1), ("w", "integer", -1)], ["id"])]
    lines.append(_rel("g", [("id", "integer", -1), ("v", "text", -1)], ["id"]))
    out: list[str] = []
    for j, t in enumerate(TABLES):
        up = {**_row(t, 1), **({"w": 7} if t == "a" else {})}
        if t == "a":
            up["v"] = "changed"
        out.append(_change("update", t, "0/2000", f"0/{0x1100 + j * 16:X}", up, None))
        out.append(_change("delete", t, "0/2000", f"0/{0x1101 + j * 16:X}", None, _key(t, _row(t, 2))))
        moved = _row(t, 50)  # row 3 gets the key of row 50
        out.append(_change("update", t, "0/2000", f"0/{0x1102 + j * 16:X}", moved, _key(t, _row(t, 3))))
        out.append(_change("insert", t, "0/2000", f"0/{0x1103 + j * 16:X}", _row(t, 60), None))
    out.append(_change("insert", "g", "0/2000", "0/1F00", {"id": 1, "v": "new"}, None))
    return lines + _txn("0/2000", out)


def _content(target: Path, fmt: str) -> dict[str, list[str]]:
    out = {}
    for d in sorted(p for p in target.iterdir() if not p.name.startswith("_")):
        t = pq.read_table(d / "current") if fmt == "parquet" else deltalake.DeltaTable(str(d)).to_pyarrow_table()
        out[d.name] = sorted(repr(sorted(r.items())) for r in t.to_pylist())
    return out


def _brief(s: Summary) -> list[tuple[Any, ...]]:
    return sorted((t.table, t.status, t.inserts, t.updates, t.deletes, t.applied_lsn, t.error) for t in s.tables)


@pytest.mark.parametrize("fmt", ["parquet", "delta"])
def test_tables_applied_together_equal_tables_applied_one_by_one(tmp_path: Path, spark: Any, fmt: str) -> None:
    src = [_write(tmp_path / "1.jsonl", _first_run()), _write(tmp_path / "2.jsonl", _second_run())]
    got = {}
    for together in (True, False):
        target = tmp_path / f"lake-{together}"
        briefs = []
        for upto in (1, 2):
            cfg = ApplyConfig(tuple(str(p) for p in src[:upto]), target, fmt=fmt)
            s = run_apply(cfg, spark=spark, tuning=Tuning(together=together))
            assert not s.warnings, s.warnings
            assert s.tables_grouped == (len(s.tables) if together else 0), (s.tables_grouped, _brief(s))
            briefs.append(_brief(s))
        got[together] = (briefs, _content(target, fmt))
    assert got[True] == got[False]
    rows = got[True][1]
    assert len(rows) == 7 and all(len(r) == 6 for t, r in rows.items() if t != table_dir_name("public", "g"))
    assert any("'changed'" in r and "('w', 7)" in r for r in rows[table_dir_name("public", "a")])


POISON = {
    # a value table a's integer column cannot hold
    "bad value": lambda: _change("update", "a", "0/2000", "0/1F01", {"id": 4, "v": 5, "w": "x"}, None),
    # a second, different change of one row at the position of another
    "two changes at one position": lambda: _change("update", "a", "0/2000", "0/1100", {"id": 1, "v": "other"}, None),
}


@pytest.mark.parametrize("poison", list(POISON))
def test_one_poisoned_table_is_held_back_alone_and_the_others_are_grouped(
    tmp_path: Path, spark: Any, poison: str
) -> None:
    lines = _second_run()
    lines.insert(-1, POISON[poison]())  # in the transaction, before its commit
    src = [_write(tmp_path / "1.jsonl", _first_run()), _write(tmp_path / "2.jsonl", lines)]
    target = tmp_path / "lake"
    run_apply(ApplyConfig((str(src[0]),), target, fmt="parquet"), spark=spark)
    s = run_apply(ApplyConfig(tuple(map(str, src)), target, fmt="parquet"), spark=spark)
    held = [t for t in s.tables if t.status == "held back"]
    assert [t.table for t in held] == ["public.a"], _brief(s)
    assert held[0].error is not None and f"{src[1]}:" in held[0].error, held[0].error
    assert s.tables_grouped == len(s.tables) - 1
    assert {t.status for t in s.tables if t.table != "public.a"} == {"applied"}


def test_a_table_with_unchanged_toast_values_takes_the_per_table_replay(tmp_path: Path, spark: Any) -> None:
    lines = _second_run()
    toast = _change("update", "a", "0/2000", "0/1F02", {"id": 5, "w": 1}, None).replace(
        '"unchanged_toast":[]', '"unchanged_toast":["v"]'
    )
    lines.insert(-1, toast)
    src = [_write(tmp_path / "1.jsonl", _first_run()), _write(tmp_path / "2.jsonl", lines)]
    got = {}
    for together in (True, False):
        target = tmp_path / f"lake-{together}"
        for upto in (1, 2):
            cfg = ApplyConfig(tuple(map(str, src[:upto])), target, fmt="delta")
            s = run_apply(cfg, spark=spark, tuning=Tuning(together=together))
            assert {t.status for t in s.tables} == {"applied"}, _brief(s)
        assert s.tables_grouped == (len(s.tables) - 1 if together else 0)
        got[together] = (_brief(s), _content(target, "delta"))
    assert got[True] == got[False]


def test_the_driver_takes_the_final_events_in_bounded_chunks(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The final events come to the driver in chunks of whole tables of at most EVENT_BYTES of
    values; a table with more takes the per-table replay. Either way the tables are the same."""
    from pgrecv.spark.engine import together

    src = [_write(tmp_path / "1.jsonl", _first_run()), _write(tmp_path / "2.jsonl", _second_run())]
    chunks: list[int] = []
    real = together.final_events

    def spy(changes: Any, group: Any) -> Any:
        for events, types in real(changes, group):
            chunks.append(events.num_rows)
            yield events, types

    monkeypatch.setattr(together, "final_events", spy)
    got = {}
    for bound in (1 << 30, 300, 1):  # one chunk a run; several; none
        monkeypatch.setattr(together, "EVENT_BYTES", bound)
        chunks.clear()
        target = tmp_path / f"lake-{bound}"
        for upto in (1, 2):
            s = run_apply(ApplyConfig(tuple(map(str, src[:upto])), target, fmt="parquet"), spark=spark)
            assert {t.status for t in s.tables} == {"applied"}, _brief(s)
        grouped = {1 << 30: s.tables_grouped == len(s.tables), 300: s.tables_grouped > 1, 1: s.tables_grouped == 0}
        assert grouped[bound], (bound, s.tables_grouped, _brief(s))
        assert (len(chunks) == 2) if bound == 1 << 30 else (len(chunks) > 2) if bound == 300 else not chunks, (
            bound,
            chunks,
        )
        got[bound] = _content(target, "parquet")
    assert got[1 << 30] == got[300] == got[1]


@pytest.mark.parametrize("fmt", ["delta", "parquet"])
def test_tables_without_a_change_are_not_opened(tmp_path: Path, spark: Any, fmt: str) -> None:
    """An input that holds the relation records of many tables (a session's first file) and
    changes of a few: the others are not read at all. Here the unchanged table's files are made
    unreadable after the first run: the second run applies the changed tables, and names only
    them."""
    names = ["a", "b", "c"]
    rels = [_rel(t, *TABLES[t]) for t in names]
    first = [
        *rels,
        *_txn(
            "0/100", [_change("insert", t, "0/100", f"0/{0x10 + i:X}", _row(t, i), None) for i, t in enumerate(names)]
        ),
    ]
    target = tmp_path / "lake"
    cfg = ApplyConfig((str(_write(tmp_path / "1.jsonl", first)),), target, fmt=fmt)
    assert {t.status for t in run_apply(cfg, spark=spark).tables} == {"applied"}
    c = target / table_dir_name("public", "c")
    for f in [*c.rglob("*.json"), *c.rglob("*.parquet")]:
        f.write_bytes(b"not a table's file")  # opening c now fails
    second = [
        *rels,
        *_txn(
            "0/200",
            [_change("insert", t, "0/200", f"0/{0x110 + i:X}", _row(t, 10 + i), None) for i, t in enumerate(names[:2])],
        ),
    ]
    cfg = ApplyConfig((str(_write(tmp_path / "2.jsonl", second)),), target, fmt=fmt)
    summary = run_apply(cfg, spark=spark)
    assert sorted((t.table, t.status) for t in summary.tables) == [("public.a", "applied"), ("public.b", "applied")]
