"""pgrecv snapshot: existing rows + the slot's changes == the source table, on real servers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from importlib import resources
from itertools import pairwise
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import psycopg
import pytest
from psycopg import sql as psql

from pgrecv import events as ev
from pgrecv.output.jsonl import JsonlEncoder
from pgrecv.output.values import JSON_NULL, text_converter
from pgrecv.pg.types import type_name
from tests.util import Terminal, err, pgrecv, sql, wait_for

SCHEMA = json.loads(resources.files("pgrecv").joinpath("schema/event-v1.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)

ODD_TEXTS = [
    "plain",
    'it\'s "quoted"',
    "back\\slash \\N \\t",
    "new\nline\r\nand\ttab",
    "unicode ✓ ünï 中文 \u2028 😀",
    "\\",
    "",
    "\x01\x1f\x7f ctl",
]


def _setup(dsn: str, rows: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(
            """CREATE TABLE items (id int PRIMARY KEY, qty int, price numeric, note text, tags text[],
                                   doc jsonb, blob bytea, at timestamptz, ok boolean, f float8)"""
        )
        c.execute(
            """INSERT INTO items SELECT g, g %% 7, (g * 1.25)::numeric, 'n' || g, ARRAY['a', 'b' || g],
                      jsonb_build_object('g', g), decode(lpad(to_hex(g), 8, '0'), 'hex'),
                      '2026-01-01'::timestamptz + g * interval '1 s', g %% 2 = 0, g / 3.0
                 FROM generate_series(1, %s) g""",
            (rows,),
        )
        c.execute(
            """CREATE TABLE odd (k text PRIMARY KEY, t text, n numeric, j json, jb jsonb, a int[],
                                 ta text[], b bytea, r real)"""
        )
        for i, text in enumerate(ODD_TEXTS):
            c.execute(
                "INSERT INTO odd VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                (
                    f"k{i}\t{text}",
                    text,
                    ["1.50", "-0.000", "NaN", "12345678901234567890.123"][i % 4],
                    '{"a": "x\\ny", "b": [1, null]}' if i % 2 else None,
                    "null" if i == 3 else json.dumps({"t": text}),
                    [1, None, -3] if i % 3 else None,
                    [text, None, 'q"q', "b\\s", "{x}"],
                    text.encode() + b"\x00\xff",
                    [float("nan"), 1.5, float("inf"), -2.25e-7][i % 4],
                ),
            )
        c.execute("INSERT INTO odd (k) VALUES ('all null')")
        c.execute("CREATE TABLE nokey (x int, y text)")  # no key: snapshot rows still come
        c.execute("INSERT INTO nokey VALUES (1, 'a'), (1, 'a'), (NULL, NULL)")
        c.execute("CREATE PUBLICATION pub FOR ALL TABLES")
        c.execute("ANALYZE")


def _writer(dsn: str, stop: threading.Event, done: list[int]) -> None:
    """Inserts, updates and deletes in small transactions until told to stop."""
    i = 0
    with psycopg.connect(dsn, autocommit=True) as c:
        while not stop.is_set():
            i += 1
            with c.transaction():
                c.execute(
                    "INSERT INTO items (id, qty, note, tags, doc) VALUES (%s, 1, %s, %s, 'null')",
                    (100000 + i, f"w\t{i}\\", ["x", None]),
                )
                c.execute("UPDATE items SET qty = qty + 1, note = note || '!' WHERE id = %s", (i * 13 % 3000 + 1,))
                c.execute("DELETE FROM items WHERE id = %s", (i * 7 % 3000 + 2,))
                c.execute("UPDATE odd SET n = n + 1 WHERE k = 'all null' OR n::text <> 'NaN'")
            if i % 5 == 0:
                c.execute("UPDATE items SET id = id + 500000 WHERE id = %s", (i * 11 % 3000 + 3,))
            time.sleep(0.005)
    done.append(i)


def _expected(dsn: str) -> dict[str, dict[Any, dict[str, Any]]]:
    """The server's tables: each value as its ::text through pgrecv's text converters."""
    out: dict[str, dict[Any, dict[str, Any]]] = {}
    with psycopg.connect(dsn) as c:
        for table in ("items", "odd", "nokey"):
            cols = c.execute(
                "SELECT attname, atttypid FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
                "AND NOT attisdropped ORDER BY attnum",
                (table,),
            ).fetchall()
            convs = [text_converter(oid, type_name(oid) or "") for _, oid in cols]
            query = psql.SQL("SELECT {} FROM {}").format(
                psql.SQL(", ").join(psql.SQL("{}::text").format(psql.Identifier(n)) for n, _ in cols),
                psql.Identifier(table),
            )
            rows: dict[Any, dict[str, Any]] = {}
            for n, row in enumerate(c.execute(query)):
                image = {}
                for (name, _), conv, v in zip(cols, convs, row, strict=True):
                    value = v if v is None or conv is None else conv(v)
                    image[name] = None if value is JSON_NULL else orjson.loads(orjson.dumps(value))
                rows[_key(table, image, n)] = image
            out[table] = rows
    return out


def _key(table: str, image: dict[str, Any], n: int) -> Any:
    return {"items": image.get("id"), "odd": image.get("k")}.get(table, n)


def _replay(directory: Path) -> tuple[dict[str, dict[Any, dict[str, Any]]], dict[str, Any]]:
    """Snapshot rows as the base, then the committed changes by key; strict: an insert of a
    present key or an update/delete of a missing one fails (a row twice, or one missed)."""
    manifest_path = next(directory.glob("*.snapshot.manifest.json"))
    manifest = json.loads(manifest_path.read_text())
    listed = {f["name"] for f in manifest["files"]}
    snap_files = sorted(p.name for p in directory.glob("*.snapshot-*.jsonl"))
    assert snap_files == sorted(listed)
    state: dict[str, dict[Any, dict[str, Any]]] = {"items": {}, "odd": {}, "nokey": {}}
    cp = _lsn(manifest["snapshot_lsn"])
    nokey_n = 0
    names = sorted(p.name for p in directory.iterdir() if p.name.endswith(".jsonl"))
    assert names[: len(snap_files)] == snap_files, "snapshot files sort before change files"
    for name in names:
        with open(directory / name, "rb") as f:
            first = True
            for line in f:
                rec = orjson.loads(line)
                VALIDATOR.validate(rec)
                if name in listed:
                    assert rec["op"] == ("relation" if first else "snapshot")
                first = False
                op, table = rec["op"], rec.get("table")
                if op == "snapshot":
                    assert rec["snapshot_lsn"] == manifest["snapshot_lsn"]
                    new = _with_json_nulls(rec)
                    if table == "nokey":
                        key: Any = nokey_n
                        nokey_n += 1
                    else:
                        key = _key(table, new, 0)
                    assert key not in state[table], f"snapshot row twice: {table} {key}"
                    state[table][key] = new
                elif op in ("insert", "update", "delete"):
                    assert _lsn(rec["commit_lsn"]) >= cp, "a change the snapshot already holds"
                    rows = state[table]
                    if op == "insert":
                        new = _with_json_nulls(rec)
                        assert _key(table, new, 0) not in rows, f"insert of a present row {rec}"
                        rows[_key(table, new, 0)] = new
                    elif op == "update":
                        old_key = _key(table, rec["old"], 0) if rec["old"] else _key(table, rec["new"], 0)
                        assert old_key in rows, f"update of a missing row {rec}"
                        merged = {**rows.pop(old_key), **_with_json_nulls(rec)}
                        rows[_key(table, merged, 0)] = merged
                    else:
                        assert _key(table, rec["old"], 0) in rows, f"delete of a missing row {rec}"
                        del rows[_key(table, rec["old"], 0)]
    return state, manifest


def _with_json_nulls(rec: dict[str, Any]) -> dict[str, Any]:
    return dict(rec["new"])  # JSON null documents are null in `new` too, as in _expected


def _lsn(text: str) -> int:
    hi, lo = text.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def _slots(dsn: str) -> list[str]:
    return [r[0] for r in sql(dsn, "SELECT slot_name FROM pg_replication_slots WHERE database = current_database()")]


def _final_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))


@pytest.mark.parametrize("jobs, plugin", [(1, "pgoutput"), (2, "pgoutput"), (1, "test_decoding")])
def test_snapshot_with_concurrent_writes_then_stream_equals_source(
    db_dsn: str, tmp_path: Path, jobs: int, plugin: str
) -> None:
    _setup(db_dsn, rows=3000)
    out = tmp_path / "out"
    stop = threading.Event()
    done: list[int] = []
    writer = threading.Thread(target=_writer, args=(db_dsn, stop, done))
    writer.start()
    try:
        time.sleep(0.2)
        args = ["snapshot", "-d", db_dsn, "--slot", "snap", "--output-dir", str(out), "--jobs", str(jobs)]
        args += ["-P", plugin]
        proc = pgrecv(*args, "--range-size", "64kB", env={"PGRECV_SNAPSHOT_DELAY": "0.5"})
        time.sleep(0.3)
    finally:
        stop.set()
        writer.join()
    assert proc.returncode == 0, err(proc)
    assert done and done[0] > 5, "the writer ran during the snapshot"
    state_before = sorted(p.name for p in out.iterdir())
    manifest = json.loads(next(out.glob("*.manifest.json")).read_text())
    if jobs == 2:
        items_files = [f for f in manifest["files"] if (f["schema"], f["table"]) == ("public", "items")]
        assert len(items_files) > 1, "items was split in ctid ranges"
    proc = pgrecv("start", "-d", db_dsn, "--slot", "snap", "--output-dir", str(out), "--until-caught-up")
    assert proc.returncode == 0, err(proc)
    assert len(list(out.glob("*.jsonl"))) > len([n for n in state_before if n.endswith(".jsonl")]), "changes came"
    state, manifest = _replay(out)
    assert sorted((t["schema"], t["table"]) for t in manifest["tables"]) == [
        ("public", "items"),
        ("public", "nokey"),
        ("public", "odd"),
    ]
    assert sum(f["rows"] for f in manifest["files"]) > 3000
    expected = _expected(db_dsn)
    for table in ("items", "odd"):
        assert state[table] == expected[table], table
    assert sorted(map(orjson.dumps, state["nokey"].values())) == sorted(map(orjson.dumps, expected["nokey"].values()))


def test_table_filter_and_relation_record_matches_stream(db_dsn: str, tmp_path: Path) -> None:
    _setup(db_dsn, rows=10)
    out = tmp_path / "o"
    proc = pgrecv("snapshot", "-d", db_dsn, "--slot", "s", "--output-dir", str(out), "--table", "public.odd", "-q")
    assert proc.returncode == 0, err(proc)
    assert proc.stderr == b""
    files = sorted(out.glob("*.snapshot-*.jsonl"))
    assert len(files) == 1
    snap_relation = files[0].read_bytes().split(b"\n", 1)[0]
    sql(db_dsn, "INSERT INTO odd (k) VALUES ('new')")
    proc = pgrecv("start", "-d", db_dsn, "--slot", "s", "--output-dir", str(out), "--until-caught-up")
    assert proc.returncode == 0, err(proc)
    change_file = [p for p in sorted(out.glob("*.jsonl")) if ".snapshot" not in p.name]
    stream_relations = [ln for ln in change_file[0].read_bytes().split(b"\n") if b'"op":"relation"' in ln]
    assert stream_relations == [snap_relation]


def test_snapshot_rows_are_typed_like_inserts() -> None:
    cols = (
        ev.Column("id", 23, -1, "integer", True),
        ev.Column("j", 3802, -1, "jsonb", False),
        ev.Column("a", 1007, -1, "integer[]", False),
    )
    rel = ev.Relation(1, "public", "t", "d", cols)
    rows: list[ev.Tuple] = [("1", '{"x": [1, "a\\nb"]}', "{1,NULL}"), ("2", "null", None), ("3", None, "{}")]
    snap: list[bytes] = []
    JsonlEncoder(snap.append).snapshot_rows(rel, rows, 0x1_0000_00AB)
    ins: list[bytes] = []
    enc = JsonlEncoder(ins.append)
    enc.feed(ev.Begin(0x2_0000_0000, 0, 5))
    for row in rows:
        enc.feed(ev.Insert(rel, row))
    snap_recs = [orjson.loads(x) for x in snap]
    ins_recs = [orjson.loads(x) for x in ins if b'"op":"insert"' in x]
    assert snap[0] == ins[1]  # the same relation record
    assert len(snap_recs) == 4
    for s, i in zip(snap_recs[1:], ins_recs, strict=True):
        VALIDATOR.validate(s)
        assert s["op"] == "snapshot" and s["snapshot_lsn"] == "1/AB"
        assert {k: s[k] for k in ("new", "key", "unchanged_toast")} == {
            k: i[k] for k in ("new", "key", "unchanged_toast")
        }
        assert s.get("json_nulls") == i.get("json_nulls")
    assert snap_recs[2]["json_nulls"] == ["j"]


def _writer_task(tmp_path: Path) -> Any:
    from pgrecv.snapshot.core import Table, Task

    cols = (ev.Column("id", 23, -1, "integer", True), ev.Column("s", 25, -1, "text", False))
    rel = ev.Relation(1, "public", "t", "d", cols)
    return Task(1, Table(rel, ("id", "s"), None, 1, 1), None, None, str(tmp_path / "x.part"), "x.jsonl")


@pytest.mark.parametrize(
    ("pages", "range_pages", "jobs", "ranges"),
    [(100, 20, 2, 6), (100, 25, 2, 4), (100, 30, 3, 6), (100, 200, 2, 1), (100, 20, 1, 1), (3, 1, 8, 3)],
)
def test_plan_cuts_a_multiple_of_jobs_ranges(
    tmp_path: Path, pages: int, range_pages: int, jobs: int, ranges: int
) -> None:
    """No job is left copying a last range alone: 5 ranges on 2 jobs become 6 (but never more than pages)."""
    from pgrecv.snapshot.core import Table, _plan

    rel = ev.Relation(1, "public", "t", "d", (ev.Column("id", 23, -1, "integer", True),))
    tasks = _plan([Table(rel, ("id",), None, pages, 0)], tmp_path, 0x100, jobs, range_pages)
    assert len(tasks) == ranges
    bounds = [(t.lo, t.hi) for t in tasks]
    assert bounds[0][0] is None and bounds[-1][1] is None  # the whole table, the end open
    assert all(a[1] == b[0] for a, b in pairwise(bounds))  # no gap, no overlap
    sizes = [(hi or pages) - (lo or 0) for lo, hi in bounds]
    assert sum(sizes) == pages and max(sizes) - min(sizes) <= max(sizes) // 2 + 1


@pytest.mark.parametrize("writeback", [8 << 20, 100])
def test_block_writer_writes_every_block_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writeback: int
) -> None:
    """The encoding thread of copy_task: blocks in, JSON lines out in the same order, counted;
    also with a background sync every 100 bytes."""
    from pgrecv.snapshot import core
    from pgrecv.snapshot.core import _BlockWriter

    monkeypatch.setattr(core, "WRITEBACK", writeback)
    task = _writer_task(tmp_path)
    reported: list[int] = []
    with open(task.tmp, "wb") as f:
        w = _BlockWriter(f, task, 0x100, lambda _seq, k: reported.append(k))
        for b in range(50):  # more blocks than the queue holds
            w.put(b"".join(b"%d\tv%d\n" % (b * 10 + i, i) for i in range(10)))
        assert w.close() == 500
    lines = [orjson.loads(x) for x in Path(task.tmp).read_bytes().splitlines()]
    assert lines[0]["op"] == "relation" and sum(reported) == 500
    assert [r["new"]["id"] for r in lines[1:]] == list(range(500))


def test_block_writer_error_reaches_the_reader(tmp_path: Path) -> None:
    """A write error in the encoding thread is raised to the reading side, which stops the COPY."""
    from pgrecv.snapshot.core import _BlockWriter

    class Full:
        def __init__(self) -> None:
            self.calls = 0

        def write(self, data: bytes) -> int:
            self.calls += 1
            if self.calls > 1:  # the relation record passes, the first block fails
                raise OSError(28, "No space left on device")
            return len(data)

        def fileno(self) -> int:
            return -1

        def flush(self) -> None:
            pass

        def tell(self) -> int:
            return 0

    task = _writer_task(tmp_path)
    w = _BlockWriter(Full(), task, 0x100, lambda _seq, _k: None)
    with pytest.raises(OSError, match="No space left"):
        for _ in range(1000):  # the error arrives at a put, or at the latest at close
            w.put(b"1\tv\n" * 100)
        w.close()


def test_slot_exists(db_dsn: str, tmp_path: Path) -> None:
    _setup(db_dsn, rows=10)
    assert pgrecv("create", "-d", db_dsn, "--slot", "taken").returncode == 0
    proc = pgrecv("snapshot", "-d", db_dsn, "--slot", "taken", "--output-dir", str(tmp_path / "o"))
    assert proc.returncode == 5, err(proc)
    lines = err(proc).strip().splitlines()
    assert len(lines) == 1 and "already exists" in lines[0] and "pgrecv drop" in lines[0]
    assert _final_files(tmp_path / "o") == []


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_output_that_cannot_be_written_is_one_line_and_drops_the_slot(db_dsn: str, tmp_path: Path, jobs: str) -> None:
    """A file size limit (EFBIG) stands in for a full disk: one line naming the directory, what
    happened and what to do (it was "[Errno 27] File too large" with no path), exit 8, the new
    slot dropped and no file published; the workers (processes with -j 2) report it alike."""
    import resource

    _setup(db_dsn, rows=3000)
    out = tmp_path / "o"

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))

    args = ["snapshot", "-d", db_dsn, "--slot", "full", "--output-dir", str(out), "--jobs", jobs]
    proc = subprocess.run(
        [sys.executable, "-m", "pgrecv", *args, "--range-size", "64kB"],
        capture_output=True,
        preexec_fn=limit,
        timeout=120,
    )
    assert proc.returncode == 8, proc.stderr
    assert proc.stderr.decode() == (
        f"pgrecv: error: cannot write the snapshot in {out}: File too large; "
        "check the path, the permissions and the free space\n"
    )
    assert _final_files(out) == []
    assert sql(db_dsn, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'full'") == [(0,)]


def test_table_without_select_privilege(db_dsn: str, tmp_path: Path) -> None:
    _setup(db_dsn, rows=10)
    role = f"r{os.getpid()}_{abs(hash(db_dsn)) % 100000}"
    sql(db_dsn, f"CREATE ROLE {role} LOGIN REPLICATION")
    sql(db_dsn, f"GRANT SELECT ON items, nokey TO {role}")  # not odd
    try:
        dsn = f"{db_dsn} user={role}"
        proc = pgrecv("snapshot", "-d", dsn, "--slot", "nopriv", "--output-dir", str(tmp_path / "o"))
        assert proc.returncode == 4, err(proc)
        lines = err(proc).strip().splitlines()
        assert len(lines) == 1 and "permission denied" in lines[0] and "public.odd" in lines[0], lines
        assert _final_files(tmp_path / "o") == [] and not list((tmp_path / "o").glob(".tmp-*"))
        assert _slots(db_dsn) == []
        # leaving it out works
        proc = pgrecv("snapshot", "-d", dsn, "--slot", "nopriv", "--output-dir", str(tmp_path / "o"), "--table", "it*")
        assert proc.returncode == 0, err(proc)
    finally:
        sql(
            db_dsn,
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = current_database()",
        )
        sql(db_dsn, f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {role}")
        sql(db_dsn, f"DROP ROLE {role}")


def _start_slow(db_dsn: str, out: Path, slot: str, delay: str, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "pgrecv", "snapshot", "-d", db_dsn, "--slot", slot, "--output-dir", str(out), *extra],
        env={**os.environ, "PGRECV_SNAPSHOT_DELAY": delay},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _imported(db_dsn: str) -> bool:
    """The slot exists and a worker has imported the snapshot (and sleeps in the test hook), so
    the loss is caught by the check after the COPYs."""
    rows = sql(
        db_dsn,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'pgrecv' "
        "AND backend_type = 'client backend' AND state = 'idle in transaction' "
        "AND query LIKE 'SET TRANSACTION SNAPSHOT%%' AND state_change < now() - interval '0.3 s'",
    )
    return bool(_slots(db_dsn)) and rows[0][0] > 0


def test_exporting_connection_lost(db_dsn: str, tmp_path: Path) -> None:
    _setup(db_dsn, rows=100)
    out = tmp_path / "o"
    proc = _start_slow(db_dsn, out, "lost", "2")
    try:
        wait_for(lambda: _imported(db_dsn))
        killed = sql(
            db_dsn,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE backend_type = 'walsender' "
            "AND application_name = 'pgrecv' AND datname = current_database()",
        )
        assert killed == [(True,)]
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 3, stderr
    lines = stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "exporting the snapshot was lost" in lines[0], lines
    assert _final_files(out) == [] and not list(out.glob(".tmp-*"))
    wait_for(lambda: _slots(db_dsn) == [])


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_copy_failing_midway(db_dsn: str, tmp_path: Path, jobs: str) -> None:
    """The server fails a COPY after several blocks went through (the publication's row filter divides
    by zero at one row): a clear error, the slot dropped, no file left, final or temporary."""
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE big (id int PRIMARY KEY, pad text)")
        c.execute("INSERT INTO big SELECT g, repeat('x', 100) FROM generate_series(1, 20000) g")
        c.execute("CREATE PUBLICATION p FOR TABLE big WHERE (1000 / (id - 15000) > -2000)")
    out = tmp_path / "o"
    args = ["snapshot", "-d", db_dsn, "--slot", "fails", "--output-dir", str(out), "--jobs", jobs]
    proc = pgrecv(*args, "--range-size", "256kB", timeout=120)
    assert proc.returncode == 12, err(proc)  # the server's refusal, not a bug of pgrecv (1)
    lines = err(proc).strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err(proc), lines
    assert "copying public.big: division by zero" in lines[0] and "run pgrecv snapshot again" in lines[0]
    assert _final_files(out) == [] and not list(out.glob(".tmp-*")), list(out.iterdir())
    wait_for(lambda: _slots(db_dsn) == [])


def test_killed_snapshot_leaves_no_manifest(db_dsn: str, tmp_path: Path) -> None:
    _setup(db_dsn, rows=100)
    out = tmp_path / "o"
    proc = _start_slow(db_dsn, out, "killed", "1")
    try:
        wait_for(lambda: len(list(out.glob(".tmp-*"))) > 0)
        time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not list(out.glob("*manifest*"))
    assert _final_files(out) == []
    # the slot stays (nothing could drop it); the message for the re-run says what to do
    again = pgrecv("snapshot", "-d", db_dsn, "--slot", "killed", "--output-dir", str(out))
    assert again.returncode == 5 and "pgrecv drop" in err(again)
    assert pgrecv("drop", "-d", db_dsn, "--slot", "killed").returncode == 0
    again = pgrecv("snapshot", "-d", db_dsn, "--slot", "killed", "--output-dir", str(out))
    assert again.returncode == 0, err(again)
    assert not list(out.glob(".tmp-*")), "the interrupted run's temp files were removed"
    assert len(list(out.glob("*manifest.json"))) == 1


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with open(task / "children") as f:
            out += [int(c) for c in f.read().split()]
    return out


def test_killed_coordinator_takes_its_workers_along(db_dsn: str, tmp_path: Path) -> None:
    """kill -9 of `pgrecv snapshot --jobs 2`: its worker processes notice and exit, holding nothing."""
    _setup(db_dsn, rows=3000)
    out = tmp_path / "o"
    proc = _start_slow(db_dsn, out, "killed2", "1", "--jobs", "2", "--range-size", "64kB")
    try:
        wait_for(lambda: len(list(out.glob(".tmp-*"))) > 0)
        workers = _children(proc.pid)
        assert len(workers) == 2, workers
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def gone(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        with open(f"/proc/{pid}/stat") as f:  # an exited child reparented to a non-reaping init
            return f.read().split(") ")[1].startswith("Z")

    wait_for(lambda: all(gone(w) for w in workers), timeout=20)
    assert _final_files(out) == []
    assert pgrecv("drop", "-d", db_dsn, "--slot", "killed2").returncode == 0


def test_refuses_a_directory_with_output(db_dsn: str, tmp_path: Path) -> None:
    _setup(db_dsn, rows=10)
    out = tmp_path / "o"
    out.mkdir()
    (out / "0000000001000000-0000000001000000.jsonl").write_text("")
    proc = pgrecv("snapshot", "-d", db_dsn, "--slot", "d", "--output-dir", str(out))
    assert proc.returncode == 8, err(proc)
    assert "already holds pgrecv output" in err(proc)
    assert _slots(db_dsn) == []


def test_create_with_snapshot(db_dsn: str, tmp_path: Path) -> None:
    _setup(db_dsn, rows=20)
    out = tmp_path / "o"
    args = [
        "create",
        "-d",
        db_dsn,
        "--slot",
        "c",
        "--publication",
        "only_odd",
        "--table",
        "odd",
        "--snapshot",
        str(out),
    ]
    proc = pgrecv(*args)
    assert proc.returncode == 0, err(proc)
    assert 'created publication "only_odd"' in err(proc)
    manifest = json.loads(next(out.glob("*.manifest.json")).read_text())
    assert manifest["tables"] == [{"schema": "public", "table": "odd"}] and manifest["slot"] == "c"
    assert sum(f["rows"] for f in manifest["files"]) == len(ODD_TEXTS) + 1
    assert _slots(db_dsn) == ["c"]


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_password_is_asked_once_for_every_connection(pg_server: Any, tmp_path: Path, jobs: str) -> None:
    """A password typed at the prompt serves the coordinator, the exporting connection and every worker."""
    from psycopg.conninfo import make_conninfo

    from pgrecv.pg.server import TempServer

    hba = ["local all alice scram-sha-256", "local replication alice scram-sha-256"]
    with TempServer(pg_server.install, hba_lines=hba) as server:
        sql(server.dsn(), "CREATE ROLE alice LOGIN REPLICATION PASSWORD 'Typed-s3cret'")
        sql(server.dsn(), "CREATE TABLE t (id int PRIMARY KEY, v text)")
        sql(server.dsn(), "INSERT INTO t SELECT g, repeat('x', 50) FROM generate_series(1, 5000) g")
        sql(server.dsn(), "GRANT SELECT ON t TO alice")
        sql(server.dsn(), "CREATE PUBLICATION pub FOR ALL TABLES")
        alice = make_conninfo(server.dsn(), user="alice")
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["PGPASSFILE"] = str(tmp_path / "no-pgpass")
        out = tmp_path / "out"
        args = ["snapshot", "-d", alice, "--slot", "s", "--output-dir", str(out), "--jobs", jobs]
        term = Terminal([*args, "--range-size", "64kB"], b"Typed-s3cret", env)
        assert term.wait() == 0, term.output.decode(errors="replace")
        assert term.prompts == 1 and b"Typed-s3cret" not in term.output
        files = [f for f in _final_files(out) if ".snapshot-" in f]
        assert len(files) > (1 if jobs == "2" else 0)  # with two jobs, t was split: workers connected
        rows = [orjson.loads(x) for f in files for x in (out / f).read_bytes().splitlines()]
        assert sorted(r["new"]["id"] for r in rows if r["op"] == "snapshot") == list(range(1, 5001))


@pytest.mark.parametrize("stray", ["notes.txt", ".pgrecv-state", "subdir"])
def test_refuses_a_directory_that_is_not_empty(db_dsn: str, tmp_path: Path, stray: str) -> None:
    """Only an empty directory (but for pgrecv's lock and an interrupted run's temporary files)
    takes a snapshot: anything else is another run's output or someone's files (issue 54, L8)."""
    _setup(db_dsn, rows=10)
    out = tmp_path / "o"
    out.mkdir()
    (out / stray).mkdir() if stray == "subdir" else (out / stray).write_text("{}")
    proc = pgrecv("snapshot", "-d", db_dsn, "--slot", "d", "--output-dir", str(out))
    assert proc.returncode == 8, err(proc)
    assert err(proc) == (
        f"pgrecv: error: {out} is not empty (it holds {stray}): a snapshot starts a directory of its own; "
        "choose an empty or new one\n"
    )
    assert _slots(db_dsn) == []
    assert sorted(p.name for p in out.iterdir()) == sorted([stray, ".pgrecv.lock"])
