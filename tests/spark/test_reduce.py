"""The fast ``latest`` reduction agrees with the general replay on random change sequences."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgrecv.errors import InputError
from tests.spark.oracle import reduce as rd
from tests.spark.oracle.read import Change

KEY_VALUES = st.one_of(st.integers(-3, 3), st.sampled_from(["a", "b", "1"]), st.none(), st.just(1.5), st.just(True))


@st.composite
def changes(draw: Any, key_cols: tuple[str, ...]) -> list[Change]:
    out: list[Change] = []
    for i in range(draw(st.integers(0, 30))):
        op = draw(st.sampled_from(["insert", "update", "update", "delete", "truncate"]))
        rec: dict[str, Any] = {"op": op}

        def image() -> dict[str, Any]:
            img = {c: draw(KEY_VALUES) for c in key_cols}
            for c in ("b", "j", "x"):
                if draw(st.booleans()):
                    img[c] = draw(st.sampled_from([None, "v", 7]))
            return img

        if op in ("insert", "update"):
            rec["new"] = image()
            rec["unchanged_toast"] = [c for c in ("b", "x") if c not in rec["new"] and draw(st.booleans())]
            if draw(st.booleans()):
                rec["json_nulls"] = ["j"]
        if op in ("update", "delete") and draw(st.booleans()):
            rec["old"] = image()
            if draw(st.booleans()):
                rec["old_json_nulls"] = ["j"]
            if draw(st.booleans()):
                rec["old_unchanged_toast"] = ["x"]
        out.append(Change(i // 3, i, i, op, rec, None, f"f:{i}"))
    return out


def _norm(red: rd.Reduced) -> Any:
    deletes = sorted(orjson.dumps(kv) for kv in red.deletes.values())
    upserts = sorted(
        orjson.dumps(
            [r.values, sorted(r.missing), r.source, sorted(r.json_nulls), r.deleted, list(r.start), r.where],
            option=orjson.OPT_SORT_KEYS,
        )
        for r in red.upserts.values()
    )
    counts = (red.inserts, red.updates, red.deletes_n, red.truncates, red.truncated)
    return deletes, upserts, counts


def _run(f: Any, *args: Any, **kw: Any) -> Any:
    try:
        return _norm(f(*args, **kw))
    except InputError as exc:
        return ("error", str(exc))


@pytest.mark.parametrize("key_cols", [("id",), ("id", "k2")])
@pytest.mark.parametrize("full", [False, True])
def test_fast_latest_equals_general_replay(key_cols: tuple[str, ...], full: bool) -> None:
    @settings(max_examples=300, deadline=None)
    @given(changes(key_cols))
    def check(chs: list[Change]) -> None:
        fast = _run(rd.reduce_changes, chs, key_cols, full=full, history=False)
        slow = _run(rd._replay, chs, key_cols, full=full, history=False)
        assert fast == slow

    check()


def test_primary_key_update_deletes_old_key_and_keeps_toast_source() -> None:
    rec = {"op": "update", "new": {"id": 2}, "old": {"id": 1}, "unchanged_toast": ["b"]}
    chs = [Change(1, 1, 1, "update", rec, None, "f:1")]
    red = rd.reduce_changes(chs, ["id"], full=False, history=False)
    assert list(red.deletes.values()) == [[1]]
    (row,) = red.upserts.values()
    assert row.values == {"id": 2} and set(row.missing) == {"b"} and row.source == [1]
