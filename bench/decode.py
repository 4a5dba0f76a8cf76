"""Throughput of the pgoutput decoder, against a plain copy of the same bytes in the same run.

    python bench/decode.py [--rows 1000000] [--golden tests/golden] [--jsonl]

* synthetic: a stream of ``--rows`` Inserts into a typical 6-column table (10 transactions, as the
  throughput reference in the notes), built with the byte layout of real pgoutput messages. The
  builder is first checked against an Insert captured from PostgreSQL 15 (below) and against every
  Insert of the golden files, so the numbers are about the bytes a server really sends.
* golden: every captured pgoutput file under ``--golden`` decoded with its protocol version.
* ``--jsonl``: decode plus the JSONL encoder, the client's whole CPU path per row but the socket;
  also without the generated per-relation row function (``jsonl._Compiled.fast``, made with
  ``exec``) and with the fused insert path of ``pgrecv.output.fastpath`` (also ``exec``): the two code
  generators are kept only as long as these lines show them paying for themselves.

The copy baseline is ``bytes(memoryview(msg))`` per message (what receiving costs at least); the
ratio says how many copies one decode is worth. Numbers vary with the machine; compare ratios.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from pgrecv.decode.pgoutput import PgOutputDecoder
from pgrecv.events import UNCHANGED, Insert, Relation, Value

# Captured with pg_logical_slot_peek_binary_changes (PostgreSQL 15, proto_version 1) after
#   CREATE TABLE accounts (id bigint PRIMARY KEY, name text, email varchar(100), balance numeric(12,2),
#                          created timestamptz, active boolean);
#   INSERT INTO accounts VALUES (1, 'Alice Example', 'alice@example.com', 1234.56,
#                                '2026-11-22 07:37:15.123456+00', true);
REAL_RELATION = bytes.fromhex(
    "52000040007075626c6963006163636f756e7473006400060169640000000014ffffffff006e616d650000000019ffffffff"
    "00656d61696c0000000413000000680062616c616e636500000006a4000c0006006372656174656400000004a0ffffffff00"
    "6163746976650000000010ffffffff"
)
REAL_INSERT = bytes.fromhex(
    "49000040004e0006740000000131740000000d416c696365204578616d706c657400000011616c696365406578616d706c652e"
    "636f6d7400000007313233342e3536740000001d323032362d31312d32322030373a33373a31352e3132333435362b3030740000"
    "000174"
)

# --- builders: the documented layout ----------------------------------------------------------


def cstr(s: str) -> bytes:
    return s.encode() + b"\0"


def relation_msg(rel: Relation) -> bytes:
    out = b"R" + struct.pack(">I", rel.oid) + cstr("" if rel.namespace == "pg_catalog" else rel.namespace)
    out += cstr(rel.name) + rel.replica_identity.encode() + struct.pack(">H", len(rel.columns))
    for c in rel.columns:
        out += bytes([int(c.key)]) + cstr(c.name) + struct.pack(">Ii", c.type_oid, c.type_modifier)
    return out


def tuple_data(values: Sequence[Value]) -> bytes:
    parts = [struct.pack(">H", len(values))]
    for v in values:
        if v is None:
            parts.append(b"n")
        elif v is UNCHANGED:
            parts.append(b"u")
        elif isinstance(v, str):
            raw = v.encode()
            parts.append(b"t" + struct.pack(">I", len(raw)) + raw)
        else:
            assert isinstance(v, bytes)
            parts.append(b"b" + struct.pack(">I", len(v)) + v)
    return b"".join(parts)


def insert_msg(oid: int, values: Sequence[Value], xid: int | None = None) -> bytes:
    prefix = b"" if xid is None else struct.pack(">I", xid)
    return b"I" + prefix + struct.pack(">I", oid) + b"N" + tuple_data(values)


def begin_msg(final_lsn: int, commit_time: int, xid: int) -> bytes:
    return b"B" + struct.pack(">QqI", final_lsn, commit_time, xid)


def commit_msg(commit_lsn: int, end_lsn: int, commit_time: int) -> bytes:
    return b"C" + struct.pack(">BQQq", 0, commit_lsn, end_lsn, commit_time)


# --- inputs -----------------------------------------------------------------------------------

GoldenFile = tuple[Path, dict[str, Any], list[bytes]]


def load_golden(root: Path) -> list[GoldenFile]:
    files = []
    for path in sorted(root.glob("pg*/*.pgoutput.jsonl")):
        lines = path.read_text().splitlines()
        meta = json.loads(lines[0])["meta"]
        files.append((path, meta, [bytes.fromhex(json.loads(line)["data"]) for line in lines[1:] if line]))
    return files


def golden_decoder(meta: dict[str, Any]) -> PgOutputDecoder:
    options = meta.get("options", {})
    parallel = True if str(options.get("streaming", "")).lower() == "parallel" else None
    return PgOutputDecoder(int(meta["proto_version"]), streaming_parallel=parallel)


def validate_layout(golden: list[GoldenFile]) -> int:
    """Re-encode real Inserts with the builders: any difference means the synthetic stream would
    not look like what a server sends. Returns how many Inserts were checked."""
    dec = PgOutputDecoder(1)
    rel = dec.decode(REAL_RELATION)
    assert isinstance(rel, Relation) and relation_msg(rel) == REAL_RELATION, "Relation layout differs"
    ev = dec.decode(REAL_INSERT)
    assert isinstance(ev, Insert) and insert_msg(rel.oid, ev.new) == REAL_INSERT, "Insert layout differs"
    checked = 1
    for path, meta, msgs in golden:
        gdec = golden_decoder(meta)
        for msg in msgs:
            gev = gdec.decode(msg)
            if isinstance(gev, Insert):
                xid = gev.xid if gdec.in_stream else None
                if insert_msg(gev.relation.oid, gev.new, xid) != msg:
                    raise AssertionError(f"{path}: an Insert does not re-encode to its captured bytes")
                checked += 1
    return checked


NAMES = ["Alice", "Bob", "Chloé", "Dmitri", "Eve", "François", "Grace", "Hiro", "Ingrid", "Jürgen"]


def synthetic(rows: int, transactions: int = 10) -> tuple[list[bytes], int]:
    """Begin, Relation, Inserts, Commit per transaction; values vary in length like real data
    (ids growing, names with some non-ASCII, ~5% NULL e-mails, numeric, timestamptz, boolean)."""
    dec = PgOutputDecoder(1)
    rel = dec.decode(REAL_RELATION)
    assert isinstance(rel, Relation)
    msgs: list[bytes] = []
    per_tx = max(1, rows // transactions)
    lsn = 0x1_0000_0000
    t0 = 849_000_000_000_000
    done = 0
    xid = 1000
    while done < rows:
        n = min(per_tx, rows - done)
        msgs.append(begin_msg(lsn + n * 120, t0, xid))
        msgs.append(REAL_RELATION)
        for i in range(done, done + n):
            name = NAMES[i % len(NAMES)]
            email = None if i % 20 == 7 else f"{name.lower()}.{i}@example.com"
            created = f"2026-11-{1 + i % 28:02d} {i % 24:02d}:{i % 60:02d}:{(i * 7) % 60:02d}.{i % 1000000:06d}+00"
            values = (str(i + 1), f"{name} {i:x}", email, f"{i % 100000}.{i % 100:02d}", created, "t" if i % 3 else "f")
            msgs.append(insert_msg(rel.oid, values))
        msgs.append(commit_msg(lsn + n * 120, lsn + n * 120 + 48, t0))
        lsn += n * 120 + 64
        done += n
        xid += 1
    return msgs, rows


# --- timing -----------------------------------------------------------------------------------


def best_of(runs: int, fn: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def decode_all(msgs: Iterable[Any], make: Callable[[], PgOutputDecoder]) -> Callable[[], object]:
    def run() -> None:
        decode = make().decode
        for m in msgs:
            decode(m, 1)

    return run


def copy_all(msgs: Sequence[bytes]) -> Callable[[], object]:
    def run() -> None:
        for m in msgs:
            bytes(memoryview(m))

    return run


def jsonl_all(msgs: Sequence[bytes], generated: bool = True) -> Callable[[], object]:
    from pgrecv.output import jsonl

    def run() -> None:
        out: list[bytes] = []
        feed = jsonl.JsonlEncoder(out.append).feed
        decode = PgOutputDecoder(1).decode
        for m in msgs:
            feed(decode(m, 1))

    if generated:
        return run

    def general_loop_only() -> None:
        real = jsonl._Compiled._generate
        jsonl._Compiled._generate = lambda self, rel: lambda t: None  # type: ignore[method-assign]
        try:
            run()
        finally:
            jsonl._Compiled._generate = real  # type: ignore[method-assign]

    return general_loop_only


def fused_all(msgs: Sequence[bytes]) -> Callable[[], object]:
    from pgrecv.output.fastpath import FastRows
    from pgrecv.output.jsonl import JsonlEncoder

    def run() -> None:
        out: list[bytes] = []
        encoder = JsonlEncoder(out.append)
        decoder = PgOutputDecoder(1)
        fast = FastRows(encoder, decoder, out.append)
        for m in msgs:
            if not fast.row(m, 1):
                encoder.feed(decoder.decode(m, 1))

    return run


def report(label: str, count: int, unit: str, t_decode: float, t_copy: float) -> None:
    print(
        f"{label}: {count / t_decode:,.0f} {unit}/s ({t_decode / count * 1e9:,.0f} ns each); "
        f"copy: {count / t_copy:,.0f} {unit}/s; ratio {t_decode / t_copy:.1f}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3, help="best of this many runs")
    ap.add_argument("--golden", type=Path, default=Path(__file__).resolve().parent.parent / "tests" / "golden")
    ap.add_argument("--jsonl", action="store_true", help="also time decode + JSONL encoding")
    args = ap.parse_args(argv)

    golden = load_golden(args.golden) if args.golden.is_dir() else []
    checked = validate_layout(golden)
    print(f"layout: {checked} real Insert(s) re-encode byte for byte ({len(golden)} golden files)")

    msgs, rows = synthetic(args.rows)
    t_dec = best_of(args.runs, decode_all(msgs, lambda: PgOutputDecoder(1)))
    t_copy = best_of(args.runs, copy_all(msgs))
    # rows/s counts rows; the time includes the Begin/Relation/Commit messages around them
    report(f"decode ({rows:,} rows, 6 columns)", rows, "rows", t_dec, t_copy)
    views = [memoryview(m) for m in msgs]
    t_view = best_of(args.runs, decode_all(views, lambda: PgOutputDecoder(1)))
    report("decode from memoryview (as psycopg hands them)", rows, "rows", t_view, t_copy)
    if args.jsonl:
        t_json = best_of(args.runs, jsonl_all(msgs))
        report("decode + JSONL", rows, "rows", t_json, t_copy)
        t_loop = best_of(args.runs, jsonl_all(msgs, generated=False))
        report("decode + JSONL, general loop only", rows, "rows", t_loop, t_copy)
        t_fused = best_of(args.runs, fused_all(msgs))
        report("fused insert path (pgrecv.output.fastpath)", rows, "rows", t_fused, t_copy)
        print(f"generated row function: {t_loop / t_json:.2f}x faster; fused path: {t_json / t_fused:.2f}x faster")

    if golden:
        all_msgs = [m for _, _, ms in golden for m in ms]
        repeat = max(1, 200_000 // max(1, len(all_msgs)))

        def run_golden() -> None:
            for _ in range(repeat):
                for _path, meta, ms in golden:
                    decode = golden_decoder(meta).decode
                    for m in ms:
                        decode(m, 1)

        t_gold = best_of(args.runs, run_golden)
        t_gcopy = best_of(args.runs, copy_all(all_msgs * repeat))
        report(f"golden ({len(all_msgs):,} messages x {repeat})", len(all_msgs) * repeat, "messages", t_gold, t_gcopy)
    return 0


if __name__ == "__main__":
    sys.exit(main())
