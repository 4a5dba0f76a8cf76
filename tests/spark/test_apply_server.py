"""The oracle is PostgreSQL: random workload → `pgrecv peek` JSONL → spark-apply → tables equal SELECT *."""

from __future__ import annotations

import functools
import itertools
import json
import random
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgrecv.spark.model import table_dir_name
from tests.spark.oracle import ApplyConfig, run_apply
from tests.util import err, pgrecv

pytest.importorskip("pyspark")
pytest.importorskip("deltalake")

SCHEMA = """
CREATE TABLE wide (
    id integer PRIMARY KEY, i2 smallint, i8 bigint, n numeric(12,3), nu numeric, f4 real, f8 double precision,
    b boolean, t text, vc varchar(20), d date, ts timestamp, tstz timestamptz, by bytea, j jsonb, u uuid,
    ia integer[], ta text[], iv interval);
ALTER TABLE wide ALTER COLUMN t SET STORAGE EXTERNAL;
CREATE TABLE full_t (a integer, b text, c numeric(8,2));
ALTER TABLE full_t REPLICA IDENTITY FULL;
CREATE TABLE comp (k1 text, k2 integer, v text, PRIMARY KEY (k1, k2));
"""

# Columns compared as PostgreSQL's text (the mapping keeps them as strings) or via a canonical form.
ORACLE = {
    "wide": "SELECT id, i2, i8, n, nu, f4::float8 AS f4, f8, b, t, vc, d, ts, tstz, by, j::text AS j, u::text AS u, "
    "ia, ta, iv::text AS iv FROM wide",
    "full_t": "SELECT a, b, c FROM full_t",
    "comp": "SELECT k1, k2, v FROM comp",
}


def _workload(dsn: str, rng: random.Random, steps: int) -> None:
    ids: set[int] = set()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(steps):
            with conn.transaction():
                for _ in range(rng.randint(1, 4)):
                    r = rng.random()
                    if r < 0.4 or not ids:
                        i = rng.randint(1, 60)
                        big = "".join(rng.choice("abcdefgh") for _ in range(rng.choice([5, 3000]))) * rng.choice([1, 4])
                        conn.execute(
                            "INSERT INTO wide VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
                            "gen_random_uuid(), %s, %s, %s) ON CONFLICT (id) DO UPDATE SET i2 = EXCLUDED.i2",
                            (
                                i,
                                rng.randint(-300, 300),
                                rng.randint(-(2**62), 2**62),
                                Decimal(rng.randint(-(10**8), 10**8)) / 1000,
                                rng.choice([None, Decimal("1.5"), Decimal("-0.000001"), Decimal("123456789.123")]),
                                rng.choice([1.5, -0.25, float("inf"), float("nan"), None]),
                                rng.random() * 1e6,
                                rng.choice([True, False, None]),
                                big,
                                rng.choice(["x", "ä€😀", None]),
                                rng.choice(["2024-02-29", "1999-12-31", None]),
                                rng.choice(["2024-02-29 12:34:56.789", None]),
                                rng.choice(["2024-02-29 12:34:56.789+02", None]),
                                rng.choice([b"\x00\x01\xff", None]),
                                json.dumps(rng.choice([{"a": [1, "b"]}, None, 3])) if rng.random() < 0.9 else "null",
                                rng.choice([[1, None, 3], [], None]),
                                rng.choice([["a", "b c", None, '"q"'], None]),
                                rng.choice(["1 day 02:00:00", "-3 mons", None]),
                            ),
                        )
                        ids.add(i)
                    elif r < 0.6:
                        conn.execute(
                            "UPDATE wide SET i2 = %s, vc = 'upd' WHERE id = %s",
                            (rng.randint(0, 9), rng.choice(sorted(ids))),
                        )
                    elif r < 0.7:
                        i = rng.choice(sorted(ids))
                        new = i + 100 if i < 100 else i - 100
                        if new not in ids:
                            conn.execute("UPDATE wide SET id = %s WHERE id = %s", (new, i))
                            ids.discard(i)
                            ids.add(new)
                    elif r < 0.8:
                        i = rng.choice(sorted(ids))
                        conn.execute("DELETE FROM wide WHERE id = %s", (i,))
                        ids.discard(i)
                    elif r < 0.9:
                        a = rng.randint(1, 10**6)
                        conn.execute(
                            "INSERT INTO full_t VALUES (%s, %s, %s)",
                            (a, rng.choice(["p", None]), Decimal(a % 1000) / 100),
                        )
                        conn.execute("UPDATE full_t SET b = 'u' WHERE a = (SELECT min(a) FROM full_t)")
                        if rng.random() < 0.3:
                            conn.execute("DELETE FROM full_t WHERE a = (SELECT max(a) FROM full_t)")
                    elif r < 0.98:
                        conn.execute(
                            "INSERT INTO comp VALUES (%s, %s, %s) ON CONFLICT (k1, k2) DO UPDATE SET v = 'again'",
                            (rng.choice("ab"), rng.randint(1, 5), "v"),
                        )
                    else:
                        conn.execute("TRUNCATE comp")


def _pg_rows(dsn: str, table: str) -> list[dict[str, Any]]:
    with psycopg.connect(dsn) as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        return list(cur.execute(ORACLE[table]).fetchall())


def _norm(row: dict[str, Any]) -> tuple[Any, ...]:
    out = []
    for k in sorted(row):
        v = row[k]
        if k == "j" and v is not None:
            v = json.loads(v)
            v = json.dumps(v, sort_keys=True)
        if isinstance(v, float) and v != v:
            v = "NaN"
        if isinstance(v, Decimal):
            v = v.normalize() if v != 0 else Decimal(0)  # decimal(38,18) pads the scale
        if isinstance(v, datetime) and v.tzinfo is not None:
            v = v.astimezone(UTC)
        if isinstance(v, memoryview):
            v = bytes(v)
        if isinstance(v, float):
            v = float(f"{v:.6g}") if k == "f4" else v
        out.append((k, repr(v)))
    return tuple(out)


def _read(path: Path, fmt: str, spark: Any) -> list[dict[str, Any]]:
    if fmt == "iceberg":
        from tests.spark.test_iceberg import read_iceberg

        rows = read_iceberg(path)[0]  # (uuid columns, of Iceberg's uuid type, as text)
        for r in rows:  # history mode's _deleted, as Iceberg stores it
            if "_is_deleted" in r:
                r["_deleted"] = r.pop("_is_deleted")
    elif fmt == "delta":
        from deltalake import DeltaTable, QueryBuilder

        dt = DeltaTable(str(path))
        if "deletionVectors" in (dt.protocol().reader_features or []):  # Delta's Spark connector wrote it
            import pyarrow as pa

            rows = pa.table(QueryBuilder().register("t", dt).execute("SELECT * FROM t").read_all()).to_pylist()
        else:
            rows = dt.to_pyarrow_table().to_pylist()
    else:
        rows = [r.asDict(recursive=True) for r in spark.read.parquet(str(path / "current")).collect()]
        for r in rows:  # Spark hands timestamptz back as naive UTC
            if r.get("tstz") is not None:
                r["tstz"] = r["tstz"].replace(tzinfo=UTC)
    for r in rows:
        if "f4" in r and r["f4"] is not None:
            r["f4"] = float(r["f4"])
    return rows


def _assert_equal(
    dsn: str, target: Path, fmt: str, spark: Any, history: bool = False, tables: tuple[str, ...] = tuple(ORACLE)
) -> None:
    for table in tables:
        want = sorted(map(_norm, _pg_rows(dsn, table)))
        path = target / table_dir_name("public", table)
        got_rows = _read(path, fmt, spark) if path.exists() else []
        if history:
            got_rows = [r for r in got_rows if r["_current"] and not r["_deleted"]]
        cols = {k for r in _pg_rows(dsn, table)[:1] for k in r}
        got = sorted(_norm({k: v for k, v in r.items() if k in cols}) for r in got_rows)
        assert got == want, f"{table} differs ({fmt})"


def _peek(dsn: str, out: Path) -> None:
    proc = pgrecv("peek", "-d", dsn, "--slot", "s", "--format", "jsonl", "-f", str(out))
    assert proc.returncode == 0, err(proc)


# the driver's replay on each server (the version's check); the Spark replay and the connectors on
# the newest only: their subject is the writer, the server only makes the input (the Spark cases
# took 146-162 s each on PG 15 in CI, 2026-12-06)
@pytest.mark.parametrize(
    "engine",
    [
        "delta-rs",
        pytest.param("spark", marks=pytest.mark.newest_server),
        pytest.param("spark-replay", marks=pytest.mark.newest_server),
        pytest.param("iceberg", marks=pytest.mark.newest_server),
    ],
)
def test_random_workload_matches_postgres(
    db_dsn: str, tmp_path: Path, spark: Any, engine: str, request: pytest.FixtureRequest
) -> None:
    """The oracle: PostgreSQL's own tables. Delta through delta-rs (and Parquet), and Delta through
    Delta Lake's Spark connector: ``pgrecv spark-apply`` in a session given the jars Maven fetched
    (jvm/jars, fetched by .ci/run; the ``connector`` fixture), since the connector's extension is
    fixed when a JVM starts; Iceberg through Iceberg's Spark runtime in that session, read back
    by pyiceberg."""
    if engine in ("spark", "iceberg"):
        apply: Any = functools.partial(_connector_run, request.getfixturevalue("connector"))
    else:
        apply = run_apply
    fmts = {"spark": ("delta",), "iceberg": ("iceberg",)}.get(engine, ("parquet", "delta"))
    replay = "driver"
    if engine == "spark-replay":  # the whole job in Spark tasks (the default), Delta through delta-rs
        engine, replay = "delta-rs", "spark"
    seed = 1
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
    assert pgrecv("create", "-d", db_dsn, "--slot", "s", "--publication", "p").returncode == 0
    rng = random.Random(seed)
    _workload(db_dsn, rng, 40)
    first = tmp_path / "a.jsonl"
    _peek(db_dsn, first)
    pgrecv("peek", "-d", db_dsn, "--slot", "s", "--consume", "-f", str(tmp_path / "consumed.jsonl"))
    # stop halfway: first batch applied; then more changes in a second file
    for fmt in fmts:
        apply(ApplyConfig((str(first),), tmp_path / fmt, fmt=fmt, engine=engine, replay=replay), spark=spark)
    _workload(db_dsn, rng, 40)
    second = tmp_path / "b.jsonl"
    _peek(db_dsn, second)
    for fmt in fmts:
        target = tmp_path / fmt
        summary = apply(
            ApplyConfig((str(first), str(second)), target, fmt=fmt, engine=engine, replay=replay), spark=spark
        )
        assert any(t.status == "applied" for t in summary.tables)
        if replay == "spark":  # a server's plain transactions take the direct read (pgrecv/spark/direct.py)
            assert summary.input_read == "direct"
        _assert_equal(db_dsn, target, fmt, spark)
        again = apply(
            ApplyConfig((str(first), str(second)), target, fmt=fmt, engine=engine, replay=replay), spark=spark
        )
        assert all(t.status == "up to date" for t in again.tables)
        assert [t.version for t in again.tables] == [t.version for t in summary.tables]
    # history mode in one go from both files: current, non-deleted versions equal the source (the
    # connectors' history: test_delta_spark's and test_iceberg's history tests, CI's time)
    for fmt in fmts if engine not in ("spark", "iceberg") else ():
        target = tmp_path / f"h-{fmt}"
        for srcs in ((str(first),), (str(first), str(second))):
            cfg = ApplyConfig(srcs, target, fmt=fmt, mode="history", engine=engine, replay=replay)
            apply(cfg, spark=spark)
        _assert_equal(db_dsn, target, fmt, spark, history=True)


def _connector_run(connector: Any, config: Any, spark: Any = None) -> Any:
    """``run_apply`` of a config through ``pgrecv spark-apply`` in the session that has the connectors' jars
    (the ``connector`` fixture): Delta through its connector, or Iceberg; its ``--json`` summary with
    attributes."""
    from types import SimpleNamespace

    import orjson

    cmd = ["spark-apply", *config.sources, "--target", str(config.target)]
    cmd += ["--format", config.fmt, "--mode", config.mode, "--json"]
    if config.fmt == "delta":
        cmd += ["--delta-engine", "spark"]
    proc = connector.run(cmd, 900)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-4000:]
    data = orjson.loads(proc.stdout)
    assert data["engine"] == f"{config.fmt}/spark"
    data["tables"] = [SimpleNamespace(**t) for t in data["tables"]]
    return SimpleNamespace(**data)


def _prepared(dsn: str, gid: str, values: list[tuple[str, int]], outcome: str | None) -> None:
    """A two-phase transaction on comp; ``outcome`` COMMIT or ROLLBACK PREPARED, or None: pending."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("BEGIN")
        for k1, k2 in values:
            conn.execute(
                "INSERT INTO comp VALUES (%s, %s, 'prep') ON CONFLICT (k1, k2) DO UPDATE SET v = 'prep'", (k1, k2)
            )
        conn.execute(f"PREPARE TRANSACTION '{gid}'")
        if outcome:
            conn.execute(f"{outcome} PREPARED '{gid}'")


# one format per server (server_fmt): the subject is each server's input, the formats' writers are
# shared by the reads (each case applied both formats, 60-130 s a case in CI, 2026-12-07)
@pytest.mark.parametrize("kind", ["test_decoding", "two-phase"])
def test_server_inputs_outside_the_direct_read_match_postgres(
    db_dsn: str, tmp_path: Path, spark: Any, kind: str, server_fmt: str
) -> None:
    """Inputs of a real server besides pgoutput's plain transactions: test_decoding's changes (read
    through the SQL interface, each with its LSN: the direct read takes them) and pgoutput's
    two-phase transactions (the staged read; one prepared and left pending across runs, so that
    it is carried over and applied by the run that sees its COMMIT PREPARED). Both give
    PostgreSQL's tables, but for test_decoding's comp: its lines never name its key (no delete, no
    key change, no REPLICA IDENTITY FULL), so it is held back, with the reason, not guessed, until
    --key names it."""
    fmt = server_fmt
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
    if kind == "test_decoding":
        made = pgrecv("create", "-d", db_dsn, "--slot", "s", "--plugin", "test_decoding")
    else:
        made = pgrecv("create", "-d", db_dsn, "--slot", "s", "--publication", "p", "--two-phase")
    assert made.returncode == 0, err(made)
    read = "direct" if kind == "test_decoding" else "staged"
    rng = random.Random(7)
    _workload(db_dsn, rng, 30)
    if kind == "two-phase":
        _prepared(db_dsn, "g_commit", [("p", 1), ("p", 2)], "COMMIT")
        _prepared(db_dsn, "g_rollback", [("r", 1)], "ROLLBACK")
        _prepared(db_dsn, "g_pending", [("q", 1), ("q", 2)], None)
    first = tmp_path / "a.jsonl"
    _peek(db_dsn, first)
    pgrecv("peek", "-d", db_dsn, "--slot", "s", "--consume", "-f", str(tmp_path / "consumed.jsonl"))
    summary = run_apply(ApplyConfig((str(first),), tmp_path / fmt, fmt=fmt), spark=spark)
    assert summary.input_read == read
    if kind == "two-phase":
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            conn.execute("COMMIT PREPARED 'g_pending'")
    _workload(db_dsn, rng, 30)
    second = tmp_path / "b.jsonl"
    _peek(db_dsn, second)
    text = first.read_text() + second.read_text()
    if kind == "two-phase":  # the input is what the test means it to be
        assert '"op":"commit_prepared"' in text and '"op":"rollback_prepared"' in text
        assert '"g_pending"' in second.read_text() and '"begin_prepare"' not in second.read_text()
    else:
        assert '"replica_identity":"unknown"' in text and '"op":"update"' in text and '"op":"delete"' in text
    target = tmp_path / fmt
    summary = run_apply(ApplyConfig((str(second),), target, fmt=fmt), spark=spark)
    assert summary.input_read == read
    status = {t.table: t.status for t in summary.tables}
    if kind == "test_decoding":
        assert status.pop("public.comp") == "held back"
        held = next(t for t in summary.tables if t.table == "public.comp")
        assert "the input names no key for it (test_decoding" in str(held.error)
        assert "--key public.comp=COLUMN" in str(held.error)
    assert set(status.values()) == {"applied"}
    _assert_equal(db_dsn, target, fmt, spark, tables=tuple(t.split(".")[1] for t in status))
    if kind == "test_decoding":  # its key named: applied from both files, the others up to date
        keys: dict[tuple[str, str], tuple[str, ...]] = {("public", "comp"): ("k1", "k2")}
        again = run_apply(ApplyConfig((str(first), str(second)), target, fmt=fmt, keys=keys), spark=spark)
        status = {t.table: t.status for t in again.tables}
        assert status == {"public.comp": "applied", "public.wide": "up to date", "public.full_t": "up to date"}
        _assert_equal(db_dsn, target, fmt, spark)
    if kind == "test_decoding":  # a key the input contradicts holds that table back, named
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            conn.execute("DELETE FROM wide WHERE id = (SELECT min(id) FROM wide)")  # its old key: id
        third = tmp_path / "c.jsonl"
        _peek(db_dsn, third)
        wrong: dict[tuple[str, str], tuple[str, ...]] = {("public", "comp"): ("k1", "k2"), ("public", "wide"): ("i2",)}
        res = run_apply(ApplyConfig((str(third),), tmp_path / fmt, fmt=fmt, keys=wrong), spark=spark)
        errors = {t.table: t.error for t in res.tables if t.status == "held back"}
        assert list(errors) == ["public.wide"]
        assert "the input names the key of table public.wide as (id)" in str(errors["public.wide"])


def test_test_decoding_after_a_snapshot(db_dsn: str, tmp_path: Path, spark: Any) -> None:
    """`pgrecv snapshot --plugin test_decoding`, then `pgrecv start --output-dir` into the same
    directory: the snapshot's relation records come from the catalog, so a table with a primary
    key is applied by it (test_decoding's own lines name none), and a table without any key is
    held back as keyless, until --append-only or --key. Compared with PostgreSQL's tables."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE c (k text PRIMARY KEY, v int)")
        conn.execute("CREATE TABLE nk (a int, b text)")
        conn.execute("INSERT INTO c VALUES ('a', 1), ('b', 2)")
        conn.execute("INSERT INTO nk VALUES (1, 'x')")
    out = tmp_path / "out"
    out.mkdir()
    made = pgrecv("snapshot", "-d", db_dsn, "--slot", "td", "--plugin", "test_decoding", "--output-dir", str(out), "-q")
    assert made.returncode == 0, err(made)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("UPDATE c SET v = 10 WHERE k = 'a'")
        conn.execute("INSERT INTO c VALUES ('z', 26)")
        conn.execute("INSERT INTO nk VALUES (2, 'y')")
        end = str(conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0])  # type: ignore[index]
    got = pgrecv("start", "-d", db_dsn, "--slot", "td", "-E", end, "--output-dir", str(out), "--no-loop", "-q")
    assert got.returncode == 0, err(got)

    def rows(target: Path, table: str) -> list[tuple[Any, ...]]:
        return sorted(
            tuple(r) for r in spark.read.parquet(str(target / table_dir_name("public", table) / "current")).collect()
        )

    with psycopg.connect(db_dsn) as conn:
        want = {t: sorted(conn.execute(f"SELECT * FROM {t}").fetchall()) for t in ("c", "nk")}
    target = tmp_path / "lake"
    summary = run_apply(ApplyConfig((str(out),), target, fmt="parquet"), spark=spark)
    status = {t.table: (t.status, t.error) for t in summary.tables}
    assert status["public.c"] == ("applied", None)
    assert status["public.nk"][0] == "held back"
    assert "has no primary key or replica identity" in str(status["public.nk"][1])
    assert rows(target, "c") == want["c"]
    for cfg in (
        ApplyConfig((str(out),), tmp_path / "append", fmt="parquet", append_only=True),
        ApplyConfig((str(out),), tmp_path / "key", fmt="parquet", keys={("public", "nk"): ("a",)}),
    ):
        t = cfg.target
        summary = run_apply(cfg, spark=spark)
        assert {s.table: s.status for s in summary.tables} == {"public.c": "applied", "public.nk": "applied"}
        assert rows(t, "c") == want["c"] and rows(t, "nk") == want["nk"]


def test_a_named_key_on_a_full_identity_table(db_dsn: str, tmp_path: Path, spark: Any) -> None:
    """--key on a REPLICA IDENTITY FULL table keeps FULL's rules: an update that leaves a TOASTed
    value alone takes it from the old row, even when neither the batch nor the target holds the
    row (only the second file is applied here)."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE ft (id int NOT NULL, v int, big text)")
        conn.execute("ALTER TABLE ft ALTER COLUMN big SET STORAGE EXTERNAL")
        conn.execute("ALTER TABLE ft REPLICA IDENTITY FULL")
    made = pgrecv("create", "-d", db_dsn, "--slot", "s", "--publication", "p")
    assert made.returncode == 0, err(made)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO ft SELECT g, g, repeat(chr(65 + g % 26), 4000) FROM generate_series(1, 20) g")
    first = tmp_path / "a.jsonl"
    _peek(db_dsn, first)
    pgrecv("peek", "-d", db_dsn, "--slot", "s", "--consume", "-f", str(tmp_path / "consumed.jsonl"))
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("UPDATE ft SET v = v * 10 WHERE id <= 10")
        conn.execute("DELETE FROM ft WHERE id = 3")
    second = tmp_path / "b.jsonl"
    _peek(db_dsn, second)
    # the value comes in the new row already (issue 60): pgrecv took it from the old row
    assert '"unchanged_toast":[],"toast_from_old":["big"]' in second.read_text()
    with psycopg.connect(db_dsn) as conn:
        want = sorted(conn.execute("SELECT id, v, big FROM ft WHERE id <= 10").fetchall())
    for fmt in ("parquet", "delta"):
        target = tmp_path / fmt
        cfg = ApplyConfig((str(second),), target, fmt=fmt, keys={("public", "ft"): ("id",)})
        summary = run_apply(cfg, spark=spark)
        assert [(t.table, t.status, t.error) for t in summary.tables] == [("public.ft", "applied", None)]
        got = sorted((r["id"], r["v"], r["big"]) for r in _read(target / table_dir_name("public", "ft"), fmt, spark))
        assert got == want


def test_one_server_table_through_the_lean_read_matches_postgres(
    db_dsn: str, tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real server's stream of one table (inserts, updates, primary-key changes, deletes, over
    two batches) through the lean read (pgrecv/spark/direct.py; its size threshold lowered): the
    tables PostgreSQL has, in both formats."""
    from pgrecv.spark.read import direct

    monkeypatch.setattr(direct, "LEAN_MIN_BYTES", 0)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE one (id integer PRIMARY KEY, v text, n numeric(10,2), j jsonb, ts timestamptz)")
    made = pgrecv("create", "-d", db_dsn, "--slot", "s", "--publication", "p", "--table", "public.one")
    assert made.returncode == 0, err(made)
    rng = random.Random(11)
    files = []
    for batch in range(2):
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            for _ in range(30):
                with conn.transaction():
                    i = rng.randint(1, 40)
                    conn.execute(
                        "INSERT INTO one VALUES (%s, %s, %s, %s, now()) ON CONFLICT (id) DO UPDATE SET v = EXCLUDED.v",
                        (i, rng.choice(["a", "ä€", None]), Decimal(rng.randint(-9999, 9999)) / 100, '{"k":[1,2.50]}'),
                    )
                    conn.execute("UPDATE one SET n = n + 1 WHERE id = %s", (rng.randint(1, 40),))
                    conn.execute(
                        "UPDATE one SET id = id + 100 WHERE id = %s AND NOT EXISTS (SELECT FROM one WHERE id = %s)",
                        (i, i + 100),
                    )
                    conn.execute("DELETE FROM one WHERE id = %s", (rng.randint(1, 140),))
        files.append(tmp_path / f"{batch}.jsonl")
        _peek(db_dsn, files[-1])
        pgrecv("peek", "-d", db_dsn, "--slot", "s", "--consume", "-f", str(tmp_path / f"consumed{batch}.jsonl"))
    # pgrecv's row changes are what the structural pass skips by their first bytes
    heads = {line.split(b'"schema"')[0] for f in files for line in f.read_bytes().splitlines() if b'"new"' in line}
    assert heads == {b'{"v":1,"op":"insert",', b'{"v":1,"op":"update",'}, heads
    with psycopg.connect(db_dsn) as conn:
        want = sorted(conn.execute("SELECT id, v, n, j::text, ts FROM one").fetchall())
    for fmt in ("parquet", "delta"):
        target = tmp_path / fmt
        for srcs in (files[:1], files):
            summary = run_apply(ApplyConfig(tuple(map(str, srcs)), target, fmt=fmt), spark=spark)
            assert summary.input_read == "lean", (fmt, srcs)
            assert [t.status for t in summary.tables] == ["applied"]
        rows = _read(target / table_dir_name("public", "one"), fmt, spark)
        utc = [r["ts"].replace(tzinfo=UTC) if r["ts"].tzinfo is None else r["ts"] for r in rows]  # Spark: naive UTC
        got = sorted((r["id"], r["v"], r["n"], r["j"], ts.astimezone(UTC)) for r, ts in zip(rows, utc, strict=True))
        assert got == [(i, v, n, j, ts.astimezone(UTC)) for i, v, n, j, ts in want]


def test_rows_of_one_copy_share_a_position_and_all_arrive(
    db_dsn: str, tmp_path: Path, spark: Any, server_fmt: str
) -> None:
    """COPY writes its rows as one WAL record: PostgreSQL sends each of them with the same LSN (and
    commit LSN), so (commit LSN, LSN) does not name a change. Every row arrives, through the direct
    read, with unchanged TOAST values in the batch (whose lookup along each key needs the copies of
    a redelivery removed first), and a redelivery is still applied once. (One format a server.)"""
    fmt = server_fmt
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE c (id integer PRIMARY KEY, v text, big text)")
        conn.execute("ALTER TABLE c ALTER COLUMN big SET STORAGE EXTERNAL")
        conn.execute("INSERT INTO c VALUES (1000, 'before')")
    made = pgrecv("create", "-d", db_dsn, "--slot", "s", "--publication", "p", "--table", "public.c")
    assert made.returncode == 0, err(made)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        with conn.cursor().copy("COPY c FROM STDIN") as copy:
            for i in range(50):
                copy.write_row((i, f"v{i}", f"{i}" * 3000))
        conn.execute("UPDATE c SET v = 'u' WHERE id < 5")  # big: an unchanged TOAST value
    out = tmp_path / "a.jsonl"
    _peek(db_dsn, out)
    lsns = [json.loads(line)["lsn"] for line in out.read_text().splitlines() if '"op":"insert"' in line]
    assert len(lsns) == 50 and len(set(lsns)) < 50, "COPY's rows no longer share an LSN: this test shows nothing"
    twice = tmp_path / "twice.jsonl"
    twice.write_text(out.read_text() * 2)  # at-least-once: the same transactions again
    with psycopg.connect(db_dsn) as conn:
        want = sorted(conn.execute("SELECT id, v, big FROM c WHERE id < 1000").fetchall())
    for src, replay in itertools.product((out, twice), ("spark", "driver")):  # the product, and the oracle
        target = tmp_path / f"{fmt}-{src.stem}-{replay}"
        summary = run_apply(ApplyConfig((str(src),), target, fmt=fmt, replay=replay), spark=spark)
        # (the product counts change records, a redelivered one again; the oracle, the changes kept)
        inserts = 100 if src == twice and replay == "spark" else 50
        assert [(t.status, t.inserts) for t in summary.tables] == [("applied", inserts)], (replay, summary.tables)
        rows = _read(target / table_dir_name("public", "c"), fmt, spark)
        assert sorted((r["id"], r["v"], r["big"]) for r in rows) == want


def test_a_column_added_between_runs_is_seen_by_readers(
    db_dsn: str, tmp_path: Path, spark: Any, server_fmt: str
) -> None:
    """ALTER TABLE … ADD COLUMN between two runs: the second run's relation record adds the column,
    and a reader of the table sees it with its values (the delta-rs writer committed the new files
    under the log's old schema, so Delta's readers did not see the column at all). (One format a
    server.)"""
    fmt = server_fmt
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE grow (id integer PRIMARY KEY, v text)")
    made = pgrecv("create", "-d", db_dsn, "--slot", "s", "--publication", "p", "--table", "public.grow")
    assert made.returncode == 0, err(made)
    target = tmp_path / fmt
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO grow VALUES (1, 'a'), (2, 'b')")
    _peek(db_dsn, tmp_path / "1.jsonl")
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE grow ADD COLUMN n integer")
        conn.execute("UPDATE grow SET n = 7, v = 'c' WHERE id = 2")
        conn.execute("INSERT INTO grow VALUES (3, 'd', 9)")
    _peek(db_dsn, tmp_path / "2.jsonl")
    for upto in (1, 2):
        srcs = tuple(str(tmp_path / f"{i}.jsonl") for i in range(1, upto + 1))
        summary = run_apply(ApplyConfig(srcs, target, fmt=fmt), spark=spark)
        assert [t.status for t in summary.tables] == ["applied"], summary.tables
    rows = _read(target / table_dir_name("public", "grow"), fmt, spark)
    assert sorted((r["id"], r["v"], r.get("n")) for r in rows) == [(1, "a", None), (2, "c", 7), (3, "d", 9)]


@pytest.mark.newest_server  # the subject is the replay's rounds; the server makes the input
def test_chained_key_changes_with_unchanged_toast_values_match_postgres(
    db_dsn: str, tmp_path: Path, spark: Any
) -> None:
    """Key changes that keep an unchanged TOAST value take it from the old key's row, round by
    round along a chain of them (1 -> 11 -> 12 -> 13 in one transaction, then a plain update of
    another row); a single key change in a second table. Both modes give PostgreSQL's rows."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        for t in ("chain", "one"):
            conn.execute(f"CREATE TABLE {t} (id integer PRIMARY KEY, v text, big text)")
            conn.execute(f"ALTER TABLE {t} ALTER COLUMN big SET STORAGE EXTERNAL")
    made = pgrecv("create", "-d", db_dsn, "--slot", "s", "--publication", "p")
    assert made.returncode == 0, err(made)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        for t in ("chain", "one"):
            conn.execute(f"INSERT INTO {t} SELECT i, 'v', repeat(i::text, 3000) FROM generate_series(1, 3) i")
    first = tmp_path / "a.jsonl"
    _peek(db_dsn, first)
    pgrecv("peek", "-d", db_dsn, "--slot", "s", "--consume", "-f", str(tmp_path / "consumed.jsonl"))
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        with conn.transaction():
            conn.execute("UPDATE chain SET id = 11, v = 'a' WHERE id = 1")
            conn.execute("UPDATE chain SET id = 12, v = 'b' WHERE id = 11")
            conn.execute("UPDATE chain SET id = 13, v = 'c' WHERE id = 12")
            conn.execute("UPDATE one SET id = 11, v = 'a' WHERE id = 1")
        conn.execute("UPDATE chain SET v = 'd' WHERE id = 2")
    second = tmp_path / "b.jsonl"
    _peek(db_dsn, second)
    assert '"unchanged_toast":["big"]' in second.read_text(), "no unchanged TOAST value: this test shows nothing"
    for mode, fmt in (("latest", "parquet"), ("history", "delta")):
        for table in ("chain", "one"):
            target = tmp_path / f"{mode}-{table}"
            for srcs in ((str(first),), (str(first), str(second))):
                cfg = ApplyConfig(srcs, target, fmt=fmt, mode=mode, tables=(f"public.{table}",))
                summary = run_apply(cfg, spark=spark)
                assert [t.status for t in summary.tables] == ["applied"], summary.tables
            with psycopg.connect(db_dsn) as conn:
                want = sorted(conn.execute(f"SELECT id, v, big FROM {table}").fetchall())
            rows = _read(target / table_dir_name("public", table), fmt, spark)
            if mode == "history":
                rows = [r for r in rows if r["_current"] and not r["_deleted"]]
            assert sorted((r["id"], r["v"], r["big"]) for r in rows) == want, (mode, table)
