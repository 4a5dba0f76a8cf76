"""pgoutput and test_decoding, decoded by pgrecv, tell the same story about the same changes.

The golden files (tools/capture_golden.py) come from two slots on one workload. Files of a
directory whose meta ``changes`` label is the same describe the same changes; each pgoutput file
is compared with each test_decoding file of its label that shows rows (not ``stream-changes``):
transactions with their row changes in order, every value converted the way sinks convert it
(:func:`pgrecv.output.values.text_converter` for text, :func:`pgrecv.output.values.binary_converter` for
pgoutput's binary values), old images, TOAST placeholders, truncates, logical messages and the
outcome of prepared transactions. Streamed pgoutput files go through the StreamAssembler first.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from pgrecv.decode.assemble import StreamAssembler
from pgrecv.decode.pgoutput import PgOutputDecoder
from pgrecv.decode.test_decoding import TestDecodingParser
from pgrecv.events import (
    UNCHANGED,
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    Delete,
    Event,
    Insert,
    Message,
    Prepare,
    Relation,
    RollbackPrepared,
    Truncate,
    Tuple,
    Update,
)
from pgrecv.lsn import LSN
from pgrecv.output.values import JSON_NULL, binary_converter, text_converter

GOLDEN = Path(__file__).parent.parent / "golden"
_BASE64 = binary_converter(0)  # what binary_converter gives for a type it cannot decode
BYTEA_OID = 17


@dataclass
class Golden:
    path: Path
    meta: dict[str, Any]
    lines: list[dict[str, Any]]

    @property
    def label(self) -> str:
        return f"{self.path.parent.name}/{self.path.name}"


def _load(path: Path) -> Golden:
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
    return Golden(path, rows[0]["meta"], rows[1:])


def _pairs() -> list[tuple[Path, Path]]:
    pairs = []
    for version_dir in sorted(GOLDEN.glob("pg*")):
        files = [_load(p) for p in sorted(version_dir.glob("*.jsonl"))]
        for pgo in (f for f in files if f.meta["plugin"] == "pgoutput"):
            for ref in files:
                if (
                    ref.meta["plugin"] == "test_decoding"
                    and ref.meta["changes"] == pgo.meta["changes"]
                    and "stream-changes" not in ref.meta["options"]
                ):
                    pairs.append((pgo.path, ref.path))
    return pairs


# --- decoding to comparable records --------------------------------------------------------


class Skipped:
    """Binary values of types binary_converter has no decoder for (counted, not compared)."""

    count = 0


def _value(value: object, oid: int, type_name: str) -> object:
    if value is None:
        return None
    if value is UNCHANGED:
        return "<unchanged toast>"
    if isinstance(value, bytes):
        conv = binary_converter(oid)
        if conv is _BASE64 and oid != BYTEA_OID:  # bytea's JSON value *is* base64
            Skipped.count += 1
            return "<binary, no decoder>"
        out = conv(value)
    else:
        assert isinstance(value, str)
        text_conv = text_converter(oid, type_name)
        out = value if text_conv is None else text_conv(value)
    if out is JSON_NULL:
        return "<json null>"
    return orjson.dumps(out).decode()


def _image(rel: Relation, values: Tuple | None, *, drop_nulls: bool) -> dict[str, object] | None:
    if values is None:
        return None
    image = {c.name: _value(v, c.type_oid, c.type_name) for c, v in zip(rel.columns, values, strict=True)}
    return {k: v for k, v in image.items() if v is not None} if drop_nulls else image


def _records(events: Iterator[Event], not_published: dict[str, list[str]]) -> dict[str, list[Any]]:
    """Transactions (lists of row changes), logical messages, and prepared-transaction outcomes."""
    txns: list[list[Any]] = []
    messages: list[Any] = []
    outcomes: list[Any] = []
    current: list[Any] = []
    for ev in events:
        if isinstance(ev, Begin | BeginPrepare):
            current = []
        elif isinstance(ev, Commit | Prepare):
            if current:
                txns.append(current)
            current = []
        elif isinstance(ev, Insert | Update | Delete):
            rel = ev.relation
            op = type(ev).__name__.lower()
            if op in not_published.get(f"{rel.namespace}.{rel.name}", ()):
                continue
            new = None if isinstance(ev, Delete) else _image(rel, ev.new, drop_nulls=False)
            old = None if isinstance(ev, Insert) else _image(rel, ev.old, drop_nulls=True)
            current.append((op, rel.namespace, rel.name, new, old))
        elif isinstance(ev, Truncate):
            names = tuple((r.namespace, r.name) for r in ev.relations)
            current.append(("truncate", names, ev.cascade, ev.restart_identity))
        elif isinstance(ev, Message):
            messages.append((ev.transactional, ev.prefix, bytes(ev.content)))
        elif isinstance(ev, CommitPrepared | RollbackPrepared):
            outcomes.append((type(ev).__name__, ev.gid))
    return {"transactions": txns, "messages": messages, "prepared outcomes": outcomes}


def _pgoutput_events(g: Golden) -> Iterator[Event]:
    options = g.meta["options"]
    parallel = options.get("streaming") == "parallel"
    decoder = PgOutputDecoder(int(g.meta["proto_version"]), streaming_parallel=True if parallel else None)
    streamed = options.get("streaming") in ("on", "parallel")
    with StreamAssembler() as assembler:
        for line in g.lines:
            data, lsn = bytes.fromhex(line["data"]), int(LSN.parse(line["lsn"]))
            for payload, at in assembler.feed(data, lsn) if streamed else ((data, lsn),):
                yield decoder.decode(bytes(payload), at)


def _test_decoding_events(g: Golden) -> Iterator[Event]:
    parser = TestDecodingParser()
    for line in g.lines:
        data: str | bytes = line["data"] if "data" in line else bytes.fromhex(line["data_hex"])
        event = parser.decode(data, int(LSN.parse(line["lsn"])))
        if event is not None:
            yield event


# --- the tests ---------------------------------------------------------------------------------

PAIRS = _pairs()


def test_golden_files_pair_up() -> None:
    """Every golden directory has pairs for the main cases (a capture that lost a file fails here)."""
    assert GOLDEN.is_dir(), "tests/golden is missing: run tools/capture_golden.py"
    for version_dir in sorted(GOLDEN.glob("pg*")):
        paired = {p.name.split(".")[0] for p, _ in PAIRS if p.parent == version_dir}
        cases = {"types", "replica_identity", "toast", "truncate", "messages", "streaming", "twophase", "binary"}
        assert cases <= paired, f"{version_dir.name}: no pair for {sorted(cases - paired)}"


@pytest.mark.parametrize(
    ("pgoutput_path", "test_decoding_path"),
    PAIRS,
    ids=[f"{p.parent.name}/{p.name.split('.')[0]}-vs-{t.name.split('.')[0]}" for p, t in PAIRS],
)
def test_plugins_agree(pgoutput_path: Path, test_decoding_path: Path) -> None:
    pgo, ref = _load(pgoutput_path), _load(test_decoding_path)
    problem, skipped = _differences(pgo, ref)
    assert problem is None, problem
    if skipped:
        assert pgo.meta["options"].get("binary") == "true", "only binary values may lack a decoder"


def test_a_changed_value_is_noticed() -> None:
    """The comparison is not vacuous: one altered character in one value makes it fail."""
    pgo_path, ref_path = next((p, t) for p, t in PAIRS if p.name == "types.pgoutput.jsonl")
    pgo, ref = _load(pgo_path), _load(ref_path)
    assert _differences(pgo, ref)[0] is None
    for line in ref.lines:
        if "'hello'" in line.get("data", ""):
            line["data"] = line["data"].replace("'hello'", "'hellO'")
            break
    else:
        pytest.fail("the types case has no 'hello' value any more")
    problem = _differences(pgo, ref)[0]
    assert problem is not None and "hello" in problem


def test_a_missing_change_is_noticed() -> None:
    pgo_path, ref_path = next((p, t) for p, t in PAIRS if p.name == "replica_identity.pgoutput.jsonl")
    pgo, ref = _load(pgo_path), _load(ref_path)
    ref.lines = [ln for ln in ref.lines if "UPDATE: old-key: id[integer]:2 " not in ln.get("data", "")]
    assert _differences(pgo, ref)[0] is not None


def _differences(pgo: Golden, ref: Golden) -> tuple[str | None, int]:
    """The first difference between the two files' records (None: same), and how many binary
    values had no decoder."""
    not_published = pgo.meta.get("not_published") or {}
    Skipped.count = 0
    got = _records(_pgoutput_events(pgo), not_published)
    skipped = Skipped.count
    want = _records(_test_decoding_events(ref), not_published)
    if not got["transactions"]:
        return f"{pgo.label}: no row changes decoded", skipped
    for what in ("transactions", "messages", "prepared outcomes"):
        a, b = got[what], want[what]
        if what == "transactions" and skipped:
            b = [[_mask(change, g) for change, g in zip(t, gt, strict=False)] for t, gt in zip(b, a, strict=False)]
        if len(a) != len(b):
            return f"{what}: {pgo.label} has {len(a)}, {ref.label} has {len(b)}", skipped
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y:
                return f"{what} #{i} differ:\n{pgo.label}: {_diff(x, y)}\n{ref.label}: {_diff(y, x)}", skipped
    return None, skipped


def _mask(change: Any, other: Any) -> Any:
    """Where pgoutput's binary value had no decoder, the test_decoding value is not comparable."""
    if change[0] in ("insert", "update", "delete") and other[0] == change[0]:
        op, schema, table, new, old = change
        new = _masked(new, other[3])
        old = _masked(old, other[4])
        return (op, schema, table, new, old)
    return change


def _masked(image: dict[str, object] | None, other: dict[str, object] | None) -> dict[str, object] | None:
    if image is None or other is None:
        return image
    return {k: (other[k] if other.get(k) == "<binary, no decoder>" else v) for k, v in image.items()}


def _diff(a: Any, b: Any) -> str:
    """The parts of ``a`` that differ from ``b`` (whole item when the shapes differ)."""
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return "; ".join(f"[{i}] {_diff(x, y)}" for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) and a[:3] == b[:3]:
        parts = []
        for x, y in zip(a[3:], b[3:], strict=True):
            if isinstance(x, dict) and isinstance(y, dict):
                parts.append(str({k: v for k, v in x.items() if y.get(k, "<absent>") != v}))
            elif x != y:
                parts.append(repr(x))
        return f"{a[:3]} {' '.join(parts)}"
    return repr(a)[:2000]


# --- replaying pgoutput's text values gives the server's final tables ------------------------


def _replay_files() -> list[Path]:
    out = []
    for path in sorted(GOLDEN.glob("pg*/*.pgoutput.jsonl")):
        options = _load(path).meta["options"]
        if options.get("binary") != "true" and options.get("origin") != "none":
            out.append(path)
    return out


Row = dict[str, object]


def _matches(row: Row, image: Row, columns: tuple[str, ...]) -> bool:
    return all(row[c] == image[c] for c in columns)


def _replay(g: Golden) -> dict[str, list[Row]]:
    """Apply the committed (and commit-prepared) row changes, text values as sent."""
    tables: dict[str, list[Row]] = {}
    pending: list[Event] = []
    prepared: dict[str, list[Event]] = {}

    def apply(ev: Event) -> None:
        if isinstance(ev, Truncate):
            for r in ev.relations:
                tables[f"{r.namespace}.{r.name}"] = []
            return
        assert isinstance(ev, Insert | Update | Delete)
        rel = ev.relation
        rows = tables.setdefault(f"{rel.namespace}.{rel.name}", [])
        names = tuple(c.name for c in rel.columns)
        if isinstance(ev, Insert):
            rows.append(dict(zip(names, ev.new, strict=True)))
            return
        before = ev.old if ev.old is not None or isinstance(ev, Delete) else ev.new  # no old: key unchanged
        assert before is not None, "a DELETE without old image cannot be replayed"
        image: Row = dict(zip(names, before, strict=True))
        match = names if ev.old_kind == "O" else rel.key_names  # the whole old row, or the key
        index = next(i for i, row in enumerate(rows) if _matches(row, image, match))
        if isinstance(ev, Delete):
            del rows[index]
        else:
            old = rows[index]
            rows[index] = {n: (old[n] if v is UNCHANGED else v) for n, v in zip(names, ev.new, strict=True)}

    for ev in _pgoutput_events(g):
        if isinstance(ev, Begin | BeginPrepare):
            pending = []
        elif isinstance(ev, Insert | Update | Delete | Truncate):
            pending.append(ev)
        elif isinstance(ev, Commit):
            for change in pending:
                apply(change)
        elif isinstance(ev, Prepare):
            prepared[ev.gid] = pending
        elif isinstance(ev, CommitPrepared):
            for change in prepared.pop(ev.gid):
                apply(change)
        elif isinstance(ev, RollbackPrepared):
            prepared.pop(ev.gid)
    return tables


@pytest.mark.parametrize("path", _replay_files(), ids=lambda p: f"{p.parent.name}/{p.name.split('.')[0]}")
def test_replayed_text_values_are_the_final_tables(path: Path) -> None:
    """Every text value pgoutput sent is the server's own text form (``col::text``): replaying the
    changes by key reproduces the tables as the server dumped them after the workload."""
    g = _load(path)
    final = orjson.loads((path.parent / f"{g.meta['case']}.tables.json").read_bytes())
    replayed = _replay(g)
    skip = set(g.meta.get("not_published") or {})
    compared = 0
    for table, rows in final.items():
        if table in skip:
            continue
        got = sorted(replayed.get(table, []), key=repr)
        want = sorted(rows, key=repr)
        assert got == want, f"{table}: {_diff(got, want)}"
        compared += len(rows)
    assert compared or not any(final.values()), "nothing compared"
