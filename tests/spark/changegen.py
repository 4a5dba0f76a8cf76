"""Random but valid pgrecv JSONL change streams, with the true final tables beside them.

A stream covers several tables at once, each a small model of a PostgreSQL table (a primary key,
a composite key, or REPLICA IDENTITY FULL without a key), and every shape of docs/event-format.md
that spark-apply must replay: plain transactions, a transaction cut and sent again, duplicates,
streamed transactions in chunks interleaved with other transactions (sub-transactions rolled back,
whole ones aborted), two-phase transactions committed or rolled back later (or still pending at
the end), unchanged-TOAST columns (also across primary-key changes), truncates, snapshots.

The model applies each committed transaction at its commit, as PostgreSQL does, so ``truth`` is
what the target tables must hold after applying all the lines.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import orjson

INT4 = {"name": "id", "type": "integer", "typmod": -1}


def _lsn(x: int) -> str:
    return f"{x >> 32:X}/{x & 0xFFFFFFFF:X}"


def _num(p: int, s: int) -> int:
    return ((p << 16) | s) + 4


@dataclass
class TableModel:
    schema: str
    name: str
    kind: str  # "pk", "comp", "full"
    columns: list[dict[str, Any]]
    key: list[str]
    rows: dict[Any, dict[str, Any]] = field(
        default_factory=dict
    )  # key tuple -> image (json values, json cols raw text)
    busy: bool = False  # a prepared transaction holds its rows

    @property
    def json_cols(self) -> set[str]:
        return {c["name"] for c in self.columns if c["type"] == "jsonb"}

    def relation(self) -> dict[str, Any]:
        return {
            "v": 1,
            "op": "relation",
            "oid": 0,
            "schema": self.schema,
            "table": self.name,
            "replica_identity": "full" if self.kind == "full" else "default",
            "columns": [
                {**c, "type_oid": 0, "key": c["name"] in self.key or self.kind == "full"} for c in self.columns
            ],
            "key": [c["name"] for c in self.columns] if self.kind == "full" else self.key,
        }

    def keyof(self, image: dict[str, Any]) -> tuple[Any, ...]:
        cols = [c["name"] for c in self.columns] if self.kind == "full" else self.key
        return tuple(
            orjson.dumps(image.get(c)) if isinstance(image.get(c), (dict, list)) else image.get(c) for c in cols
        )


def obj(image: dict[str, Any], json_cols: set[str]) -> str:
    """The row image as pgrecv writes it: json columns are raw JSON text, not strings."""
    parts = []
    for k, v in image.items():
        val = v if k in json_cols and v is not None else orjson.dumps(v).decode()
        parts.append(orjson.dumps(k).decode() + ":" + val)
    return "{" + ",".join(parts) + "}"


JSON_VALUES = [
    '{"a":[1,"b"],"n":null}',
    "12345678901234567890123",
    "3.14159265358979323846264",
    '"a string"',
    '"{\\"looks\\":\\"like json\\"}"',
    "[]",
    "true",
    '{"x":{"y":[1.5,2.25,-0]}}',
]


class Gen:
    def __init__(self, seed: int, tables: int = 6, plain: bool = False, lean: bool = False) -> None:
        self.rng = random.Random(seed)
        self.plain = plain  # plain transactions only (no streamed or two-phase ones)
        self.lean = lean  # no unchanged TOAST value and no TRUNCATE (what spark-apply's lean read takes)
        self.pos = 0x10_0000
        self.xid = 1000
        self.lines: list[str] = []
        self.tables = [self._model(i) for i in range(tables)]
        self.pending: list[tuple[str, int, TableModel, list[tuple[str, Any]]]] = []  # prepared: gid, xid, table, ops
        self.gids = 0
        for t in self.tables:
            self.lines.append(orjson.dumps(t.relation()).decode())

    # --- model -----------------------------------------------------------------------------------

    def _model(self, i: int) -> TableModel:
        kind = ["pk", "comp", "full"][i % 3]
        name = f"t{i}"
        if kind == "pk":
            cols = [
                dict(INT4),
                {"name": "v", "type": "text", "typmod": -1},
                {"name": "big", "type": "text", "typmod": -1},
                {"name": "n", "type": "numeric", "typmod": _num(10, 2)},
                {"name": "j", "type": "jsonb", "typmod": -1},
                {"name": "f", "type": "double precision", "typmod": -1},
                {"name": "ts", "type": "timestamp with time zone", "typmod": -1},
                {"name": "arr", "type": "integer[]", "typmod": -1},
                {"name": "b", "type": "boolean", "typmod": -1},
            ]
            return TableModel("public", name, kind, cols, ["id"])
        if kind == "comp":
            cols = [
                {"name": "k1", "type": "text", "typmod": -1},
                {"name": "k2", "type": "integer", "typmod": -1},
                {"name": "v", "type": "text", "typmod": -1},
                {"name": "big", "type": "text", "typmod": -1},
            ]
            return TableModel("s p", name, kind, cols, ["k1", "k2"])
        cols = [
            {"name": "a", "type": "integer", "typmod": -1},
            {"name": "b", "type": "text", "typmod": -1},
            {"name": "big", "type": "text", "typmod": -1},
        ]
        return TableModel("public", name, kind, cols, [])

    def _value(self, t: TableModel, col: str) -> Any:
        r = self.rng
        typ = next(c["type"] for c in t.columns if c["name"] == col)
        if r.random() < 0.1 and col not in ("id", "k1", "k2", "a"):
            return None
        if typ == "text":
            return (
                r.choice(["x", "ä€😀", "line\nbreak", 'q"uote']) + str(r.randint(0, 999))
                if col != "big"
                else "B" * r.randint(1, 50) + str(r.random())
            )
        if typ == "numeric":
            return r.choice(["1.50", "-0.01", "12345678.99", "0.00"])
        if typ == "jsonb":
            return r.choice(JSON_VALUES)
        if typ == "double precision":
            return r.choice([1.5, -0.25, "NaN", "Infinity", 1e300, 0.1])
        if typ == "timestamp with time zone":
            return r.choice(
                ["2024-02-29 12:34:56.789+02", "1999-12-31 23:59:59+00", "2026-11-25 13:00:00.000001-05:30"]
            )
        if typ == "integer[]":
            return r.choice([[1, None, 3], [], [2147483647]])
        if typ == "boolean":
            return r.choice([True, False])
        if typ == "integer":
            return r.randint(-1000, 1000)
        raise AssertionError(typ)

    def _fresh_key(self, t: TableModel) -> dict[str, Any]:
        while True:
            if t.kind == "pk":
                k = {"id": self.rng.randint(1, 200)}
            elif t.kind == "comp":
                k = {"k1": self.rng.choice(["a", "b", "ü", "a b"]), "k2": self.rng.randint(1, 30)}
            else:
                k = {"a": self.rng.randint(1, 10_000)}
            if t.kind == "full":
                if not any(row["a"] == k["a"] for row in t.rows.values()):
                    return k
            elif t.keyof(k) not in t.rows:
                return k

    def _image(self, t: TableModel, key: dict[str, Any]) -> dict[str, Any]:
        return {c["name"]: key[c["name"]] if c["name"] in key else self._value(t, c["name"]) for c in t.columns}

    # --- operations on a table's model (state as of the transaction's commit) ----------------------

    def _ops(self, t: TableModel, n: int, state: dict[Any, dict[str, Any]]) -> list[tuple[str, Any]]:
        """(op, record-without-envelope) list, applying to ``state`` as it goes."""
        ops: list[tuple[str, Any]] = []
        r = self.rng
        for _ in range(n):
            choice = r.random()
            if not state or choice < 0.35:
                key = self._fresh_key(t)
                if t.keyof(key) in state:
                    continue
                img = self._image(t, key)
                state[t.keyof(img)] = img
                ops.append(("insert", {"new": img, "unchanged_toast": []}))
            elif choice < 0.65:
                k = r.choice(sorted(state, key=repr))
                old = state[k]
                new = dict(old)
                for c in t.columns:
                    if c["name"] not in t.key and c["name"] not in ("a",) and r.random() < 0.5:
                        new[c["name"]] = self._value(t, c["name"])
                toast = old.get("big") is not None and r.random() < 0.5 and not self.lean
                if toast:
                    new["big"] = old["big"]
                if t.kind == "full":
                    del state[k]
                    state[t.keyof(new)] = new
                    ops.append(("update", {"new": new, "old": old, "old_kind": "full", "toast": toast}))
                else:
                    state[k] = new
                    ops.append(("update", {"new": new, "old": None, "old_kind": None, "toast": toast}))
            elif choice < 0.78 and t.kind != "full":
                k = r.choice(sorted(state, key=repr))
                old = state[k]
                nk = self._fresh_key(t)
                if t.keyof(nk) in state:
                    continue
                new = {**dict(old), **nk}
                toast = old.get("big") is not None and r.random() < 0.6 and not self.lean
                del state[k]
                state[t.keyof(new)] = new
                oldkey = {c: old[c] for c in t.key}
                ops.append(("update", {"new": new, "old": oldkey, "old_kind": "key", "toast": toast}))
            elif choice < 0.97 or self.lean:
                k = r.choice(sorted(state, key=repr))
                old = state.pop(k)
                image = old if t.kind == "full" else {c: old[c] for c in t.key}
                ops.append(("delete", {"old": image, "old_kind": "full" if t.kind == "full" else "key"}))
            else:
                state.clear()
                ops.append(("truncate", None))
        return ops

    # --- lines -----------------------------------------------------------------------------------

    def _next(self) -> int:
        self.pos += self.rng.randint(1, 0x200)
        return self.pos

    def _row_line(self, t: TableModel, op: str, rec: Any, env: dict[str, Any]) -> str:
        head = {"v": 1, "op": op}
        if op == "truncate":
            return orjson.dumps(
                {
                    **head,
                    "tables": [{"schema": t.schema, "table": t.name}],
                    "cascade": False,
                    "restart_identity": False,
                    **env,
                }
            ).decode()
        parts = [orjson.dumps({**head, "schema": t.schema, "table": t.name, **env, "key": t.key}).decode()[:-1]]
        jc = t.json_cols
        if op in ("insert", "update"):
            new = dict(rec["new"])
            toast: list[str] = []
            if rec.get("toast"):
                del new["big"]
                toast = ["big"]
            parts.append(',"new":' + obj(new, jc))
            parts.append(',"unchanged_toast":' + orjson.dumps(toast).decode())
            nulls = [c for c in jc if c in new and new[c] == "null"]
            if nulls:
                parts.append(',"json_nulls":' + orjson.dumps(nulls).decode())
        if op in ("update", "delete"):
            old = rec.get("old")
            parts.append(',"old":' + (obj(old, jc) if old is not None else "null"))
            parts.append(',"old_kind":' + orjson.dumps(rec.get("old_kind")).decode())
        return "".join(parts) + "}"

    def _plain(self, t: TableModel, ops: list[tuple[str, Any]], cut: bool = False, dup: bool = False) -> None:
        xid = self.xid = self.xid + 1
        lsns = [self._next() for _ in ops]
        c = self._next()
        env = {"xid": xid, "commit_lsn": _lsn(c), "commit_time": "2026-11-25T10:00:00Z"}
        body = [self._row_line(t, op, rec, {**env, "lsn": _lsn(x)}) for (op, rec), x in zip(ops, lsns, strict=True)]
        begin = orjson.dumps({"v": 1, "op": "begin", **env}).decode()
        commit = orjson.dumps({"v": 1, "op": "commit", **env, "end_lsn": _lsn(c + 1)}).decode()
        if cut and body:
            self.lines += [begin, *body[: max(1, len(body) // 2)]]
        self.lines += [begin, *body, commit]
        if dup:
            self.lines += [begin, *body, commit]

    def step(self) -> None:
        r = self.rng
        free = [t for t in self.tables if not t.busy]
        if self.pending and r.random() < 0.3:
            gid, xid, t, ops = self.pending.pop(0)
            c = self._next()
            if r.random() < 0.75:
                self.lines.append(
                    orjson.dumps(
                        {
                            "v": 1,
                            "op": "commit_prepared",
                            "xid": xid,
                            "gid": gid,
                            "commit_lsn": _lsn(c),
                            "end_lsn": _lsn(c + 1),
                            "commit_time": "2026-11-25T10:00:01Z",
                        }
                    ).decode()
                )
                self._apply(t, ops)
            else:
                self.lines.append(
                    orjson.dumps(
                        {
                            "v": 1,
                            "op": "rollback_prepared",
                            "xid": xid,
                            "gid": gid,
                            "prepare_end_lsn": None,
                            "rollback_end_lsn": _lsn(c),
                            "prepare_time": None,
                            "rollback_time": None,
                        }
                    ).decode()
                )
            t.busy = False
            return
        if not free:
            return
        t = r.choice(free)
        kind = 0.0 if self.plain else r.random()
        if kind < 0.6:
            state = dict(t.rows)
            ops = self._ops(t, r.randint(1, 4), state)
            t.rows = state
            self._plain(t, ops, cut=r.random() < 0.1, dup=r.random() < 0.1)
        elif kind < 0.8:
            self._streamed(t)
        else:
            self._prepared(t)

    def _apply(self, t: TableModel, ops: list[tuple[str, Any]]) -> None:
        state = t.rows
        for op, rec in ops:
            if op == "truncate":
                state.clear()
            elif op == "delete":
                state.pop(t.keyof(rec["old"]), None)
            else:
                if op == "update" and rec.get("old") is not None:
                    state.pop(t.keyof(rec["old"]), None)
                state[t.keyof(rec["new"])] = rec["new"]

    def _streamed(self, t: TableModel) -> None:
        r = self.rng
        xid = self.xid = self.xid + 1
        state = dict(t.rows)
        committed_ops: list[tuple[str, Any]] = []
        chunks = r.randint(1, 3)
        first = True
        sub = xid + 100_000
        abort_all = r.random() < 0.15
        for _ in range(chunks):
            self.lines.append(orjson.dumps({"v": 1, "op": "stream_start", "xid": xid, "first": first}).decode())
            first = False
            # a sub-transaction rolled back: its rows are streamed and then dropped
            if r.random() < 0.4:
                sub += 1
                scratch = dict(state)
                for op, rec in self._ops(t, r.randint(1, 2), scratch):
                    env = {"xid": sub, "commit_lsn": None, "commit_time": None, "lsn": _lsn(self._next())}
                    self.lines.append(self._row_line(t, op, rec, env))
                self.lines.append(orjson.dumps({"v": 1, "op": "stream_stop", "xid": xid}).decode())
                self.lines.append(
                    orjson.dumps(
                        {"v": 1, "op": "stream_abort", "xid": xid, "subxid": sub, "abort_lsn": None, "abort_time": None}
                    ).decode()
                )
                self.lines.append(orjson.dumps({"v": 1, "op": "stream_start", "xid": xid, "first": False}).decode())
            ops = self._ops(t, r.randint(1, 4), state)
            for op, rec in ops:
                row_xid = xid if r.random() < 0.5 else sub + 50  # a committed sub-transaction
                env = {"xid": row_xid, "commit_lsn": None, "commit_time": None, "lsn": _lsn(self._next())}
                self.lines.append(self._row_line(t, op, rec, env))
            committed_ops += ops
            self.lines.append(orjson.dumps({"v": 1, "op": "stream_stop", "xid": xid}).decode())
            # other tables' transactions commit between the chunks
            others = [o for o in self.tables if o is not t and not o.busy]
            if others and r.random() < 0.7:
                o = r.choice(others)
                ostate = dict(o.rows)
                oops = self._ops(o, r.randint(1, 3), ostate)
                o.rows = ostate
                self._plain(o, oops)
        if abort_all:
            self.lines.append(
                orjson.dumps(
                    {"v": 1, "op": "stream_abort", "xid": xid, "subxid": xid, "abort_lsn": None, "abort_time": None}
                ).decode()
            )
            return
        c = self._next()
        self.lines.append(
            orjson.dumps(
                {
                    "v": 1,
                    "op": "stream_commit",
                    "xid": xid,
                    "commit_lsn": _lsn(c),
                    "end_lsn": _lsn(c + 1),
                    "commit_time": "2026-11-25T10:00:02Z",
                }
            ).decode()
        )
        t.rows = state

    def _prepared(self, t: TableModel) -> None:
        r = self.rng
        xid = self.xid = self.xid + 1
        self.gids += 1
        gid = f"g{self.gids % 3}"  # gids are reused once their transaction is finished
        if any(p[0] == gid for p in self.pending):
            gid = f"g{self.gids}"
        state = dict(t.rows)
        ops = self._ops(t, r.randint(1, 3), state)
        p = self._next()
        env = {"xid": xid, "gid": gid, "prepare_lsn": _lsn(p), "end_lsn": _lsn(p + 1), "prepare_time": None}
        self.lines.append(orjson.dumps({"v": 1, "op": "begin_prepare", **env}).decode())
        for op, rec in ops:
            renv = {
                "xid": xid,
                "commit_lsn": None,
                "commit_time": None,
                "gid": gid,
                "prepare_lsn": _lsn(p),
                "lsn": _lsn(self._next()),
            }
            self.lines.append(self._row_line(t, op, rec, renv))
        self.lines.append(orjson.dumps({"v": 1, "op": "prepare", **env}).decode())
        self.pending.append((gid, xid, t, ops))
        t.busy = True

    def run(self, steps: int) -> list[str]:
        for _ in range(steps):
            self.step()
        return self.lines

    def truth(self) -> dict[tuple[str, str], list[dict[str, Any]]]:
        return {(t.schema, t.name): list(t.rows.values()) for t in self.tables}
