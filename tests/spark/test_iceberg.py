"""Apache Iceberg through Iceberg's Spark runtime (``--format iceberg``, pgrecv/spark/tables/iceberg.py):
the runs are ``pgrecv spark-apply`` in the connector runner's session (tests/spark/connector_runner.py,
whose jars include Iceberg's runtime; the one killed mid-run is a process of its own, given
``--conf spark.jars=...`` as a user runs it); tables are read back by pyiceberg, a second reader.
PostgreSQL itself is the oracle of the types (tests/spark/test_apply_server.py, engine ``iceberg``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest

from pgrecv.lsn import LSN, lsn_str
from pgrecv.spark.model import table_dir_name
from tests.conftest import VERSIONS
from tests.spark.changegen import Gen
from tests.spark.connector_runner import Runner
from tests.spark.test_command import _rel, _row, _txn, _write, assert_busy, held_target
from tests.spark.test_delta_spark import FAST, _gen_files
from tests.spark.test_differential import _canon_value, _expected, _files, assert_history
from tests.util import pgrecv_here

pytest.importorskip("pyspark")
pyiceberg_table = pytest.importorskip("pyiceberg.table")


def _proc(connector: Runner, *args: str) -> subprocess.CompletedProcess[bytes]:
    return connector.run(["spark-apply", *args, "--format", "iceberg", "--json"], 600)


def _ok(proc: subprocess.CompletedProcess[bytes]) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-4000:]
    summary: dict[str, Any] = orjson.loads(proc.stdout)
    assert summary["engine"] == "iceberg/spark"
    return summary


def _run(connector: Runner, *args: str) -> dict[str, Any]:
    return _ok(_proc(connector, *args))


def read_iceberg(
    path: Path, metadata: str | None = None, properties: dict[str, str] | None = None
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """An Iceberg table's rows and its current snapshot's summary, as pyiceberg reads them (its
    newest metadata file, or the ``metadata`` a catalog names, read with pyiceberg's
    ``properties``; deletion vectors applied)."""
    if metadata is None:
        versions = sorted(path.glob("metadata/v*.metadata.json"), key=lambda p: int(p.name[1:].split(".")[0]))
        metadata = str(versions[-1])
    table = pyiceberg_table.StaticTable.from_metadata(metadata, properties=properties or {})
    snapshot = table.current_snapshot()
    assert snapshot is not None
    rows = table.scan().to_arrow().to_pylist()
    kept = uuids(table)
    for r in rows:  # Iceberg's uuid columns: 16 bytes each, as PostgreSQL's text
        for k, v in r.items():
            if isinstance(v, uuid.UUID) or (isinstance(v, bytes) and k in kept):
                r[k] = str(v if isinstance(v, uuid.UUID) else uuid.UUID(bytes=v))
    return rows, dict(snapshot.summary.additional_properties)


def uuids(table: Any) -> set[str]:
    """The names of an Iceberg table's columns of Iceberg's uuid type (pyiceberg's view)."""
    from pyiceberg.types import UUIDType

    return {f.name for f in table.schema().fields if isinstance(f.field_type, UUIDType)}


def _read(path: Path) -> tuple[list[dict[str, Any]], dict[str, str]]:
    rows, summary = read_iceberg(path)
    return sorted(rows, key=lambda r: r["id"]), summary


def _change(
    op: str, table: str, commit: str, lsn: str, key: dict[str, Any], values: dict[str, Any], toast: tuple[str, ...] = ()
) -> dict[str, Any]:
    """A row change of table ``s.TABLE``: a delete's old key, or the new image (``key`` and
    ``values``) with the columns whose TOASTed values it leaves unchanged."""
    rec: dict[str, Any] = {"op": op, "schema": "s", "table": table, "commit_lsn": commit, "lsn": lsn}
    if op == "delete":
        return {**rec, "old": key}
    return {**rec, "new": {**key, **values}, "unchanged_toast": list(toast)}


def canon_rows(t: Any, rows: list[dict[str, Any]]) -> list[str]:
    """A generated table's rows as the differential tests compare them (``_expected``)."""
    return sorted(repr(sorted((c["name"], _canon_value(r.get(c["name"]))) for c in t.columns)) for r in rows)


def _got(t: Any, target: Path) -> list[str]:
    path = target / table_dir_name(t.schema, t.name)
    return canon_rows(t, read_iceberg(path)[0] if path.exists() else [])


def test_two_runs_and_a_rerun(tmp_path: Path, connector: Runner) -> None:
    """A new table, then a MERGE (update, delete, insert) with the position in its snapshot's
    summary and a deletion vector instead of a rewritten file; a re-run changes nothing."""
    target = tmp_path / "lake"
    first = _write(
        tmp_path / "1.jsonl",
        [
            _rel("t"),
            *_txn("0/1000", *[_row("insert", "t", "0/1000", f"0/{0x100 + i:X}", i, f"a{i}") for i in range(100)]),
        ],
    )
    s1 = _run(connector, str(first), "--target", str(target))
    assert s1["tables"][0]["applied_lsn"] == "0/1000"
    second = _write(
        tmp_path / "2.jsonl",
        [
            _rel("t"),
            *_txn(
                "0/2000",
                _row("update", "t", "0/2000", "0/1F00", 5, "new5"),
                _row("delete", "t", "0/2000", "0/1F01", 7),
                _row("insert", "t", "0/2000", "0/1F02", 500, "ins"),
            ),
        ],
    )
    s2 = _run(connector, str(first), str(second), "--target", str(target))
    t = s2["tables"][0]
    assert (t["status"], t["inserts"], t["updates"], t["deletes"], t["applied_lsn"]) == ("applied", 1, 1, 1, "0/2000")
    rows, summary = _read(target / "s.t")
    assert summary["pgrecv.applied-lsn"] == str(0x2000)
    assert summary.get("added-dvs") == "1" and summary.get("added-data-files") == "1"
    expected = {i: f"a{i}" for i in range(100) if i != 7} | {5: "new5", 500: "ins"}
    assert {r["id"]: r["x"] for r in rows} == expected
    again = _run(connector, str(first), str(second), "--target", str(target))
    assert [r["status"] for r in again["tables"]] == ["up to date"]

    # a batch that updates 40 of the 99 rows (the one pass): one overwrite, no deletion vector
    third = _write(
        tmp_path / "3.jsonl",
        [
            _rel("t"),
            *_txn("0/3000", *[_row("update", "t", "0/3000", f"0/{0x2F00 + i:X}", i, f"c{i}") for i in range(40)]),
        ],
    )
    s3 = _run(connector, str(first), str(second), str(third), "--target", str(target))
    assert s3["tables"][0]["applied_lsn"] == "0/3000"
    rows, summary = _read(target / "s.t")
    assert summary["pgrecv.applied-lsn"] == str(0x3000) and "added-dvs" not in summary
    assert {r["id"]: r["x"] for r in rows} == expected | {i: f"c{i}" for i in range(40)}


@pytest.mark.parametrize("seed", [22])  # seed 7: test_a_killed_run_is_completed_by_the_next
def test_random_streams_equal_the_truth(tmp_path: Path, connector: Runner, seed: int) -> None:
    """The differential test's streams (six tables: keys, REPLICA IDENTITY FULL, TOAST, TRUNCATE,
    streamed and two-phase transactions), applied in two runs: the tables equal the truth."""
    gen, files = _gen_files(tmp_path / "a dir ü", seed, 22)
    target = tmp_path / "lake"
    _run(connector, str(files[0]), "--target", str(target))
    summary = _run(connector, *map(str, files), "--target", str(target))
    assert not summary["warnings"], summary["warnings"]
    truth = gen.truth()
    for t in gen.tables:
        assert _got(t, target) == _expected(t, truth[(t.schema, t.name)]), f"{t.schema}.{t.name} ({t.kind})"


def test_history_mode_equals_the_truth(tmp_path: Path, connector: Runner) -> None:
    """--mode history: the live versions are the true tables, each key's versions form one chain,
    and the table records the mode it was made with (a --mode latest run onto it is refused)."""
    gen, files = _gen_files(tmp_path / "h", 15, 105)
    target = tmp_path / "lake"
    for fs in ([files[0]], files):
        assert not _run(connector, *map(str, fs), "--target", str(target), "--mode", "history")["warnings"]
    truth = gen.truth()
    for t in gen.tables:
        path = target / table_dir_name(t.schema, t.name)
        got = read_iceberg(path)[0] if path.exists() else []
        assert all("_deleted" not in r for r in got)  # (Iceberg keeps the name: stored as _is_deleted)
        name = f"{t.schema}.{t.name} ({t.kind})"
        assert_history(t, got, truth[(t.schema, t.name)], name)
    latest = _proc(connector, *map(str, files), "--target", str(target), "--mode", "latest")
    assert latest.returncode != 0 and b"is a history-mode table: use the same --mode" in latest.stderr


def test_bad_values_null_and_text(tmp_path: Path, connector: Runner) -> None:
    """--bad-values: a numeric NaN in a numeric(10,2) column fails the table (exit 15), or is
    stored as NULL, or its column is text."""
    rel = {**_rel("n"), "columns": [
        {"name": "id", "type": "integer", "typmod": -1, "key": True},
        {"name": "x", "type": "numeric", "typmod": (10 << 16 | 2) + 4, "key": False},
    ]}  # fmt: skip
    rows = [
        {"op": "insert", "schema": "s", "table": "n", "commit_lsn": "0/100", "lsn": f"0/{i}",
         "new": {"id": i, "x": x}, "unchanged_toast": []}
        for i, x in ((1, "1.25"), (2, "NaN"))
    ]  # fmt: skip
    src = _write(tmp_path / "n.jsonl", [rel, *_txn("0/100", *rows)])
    failed = _proc(connector, str(src), "--target", str(tmp_path / "fail"))
    assert failed.returncode == 15, failed.stderr.decode()[-2000:]
    for policy, want in (("null", None), ("text", "NaN")):
        summary = _run(connector, str(src), "--target", str(tmp_path / policy), "--bad-values", policy)
        assert summary["tables"][0]["values_changed"] == 1
        got = {r["id"]: r["x"] for r in _read(tmp_path / policy / table_dir_name("s", "n"))[0]}
        assert got[2] == want
        assert str(got[1]) == "1.25"


def test_names_with_backticks_and_dots_and_the_replays_own(tmp_path: Path, connector: Runner) -> None:
    """A table and columns named with backticks, dots and the replay's own column names: created,
    then merged into (an update that leaves a TOASTed value unchanged, a delete, a key change)."""
    cols = ["i`d", "a`b", "x.y", "`", "_kind", "_k0", "_pgrecv_k0", "_pgrecv_kind", "t"]
    rel = {"op": "relation", "schema": "s", "table": "we`ird.t", "replica_identity": "default", "key": ["i`d"],
           "columns": [{"name": c, "type": "integer" if c == "i`d" else "text", "typmod": -1, "key": c == "i`d"}
                       for c in cols]}  # fmt: skip

    def row(op: str, commit: str, lsn: int, i: int, **values: str | None) -> dict[str, Any]:
        toast = tuple(c for c in cols if c != "i`d" and c not in values)
        return _change(op, "we`ird.t", commit, f"0/{lsn:X}", {"i`d": i}, values, toast)

    first = _write(tmp_path / "1.jsonl", [rel, *_txn("0/1000", *[
        row("insert", "0/1000", 0x100 + i, i, **{c: f"{c}{i}" for c in cols[1:]}) for i in range(10)
    ])])  # fmt: skip
    second = _write(tmp_path / "2.jsonl", [rel, *_txn("0/2000",
        row("update", "0/2000", 0x1F00, 3, **{c: f"new{c}" for c in cols[2:]}),  # a`b unchanged (TOAST)
        row("delete", "0/2000", 0x1F01, 4),
        row("delete", "0/2000", 0x1F02, 5),
        row("insert", "0/2000", 0x1F03, 105, **{c: f"{c}5" for c in cols[1:]}),  # 5's key changed
    )])  # fmt: skip
    target = tmp_path / "lake"
    for files in ([first], [first, second]):
        summary = _run(connector, *map(str, files), "--target", str(target))
        assert [t["status"] for t in summary["tables"]] == ["applied"]
    want = {i: {c: f"{c}{i}" for c in cols[1:]} for i in range(10) if i not in (4, 5)}
    want[3] = {"a`b": "a`b3", **{c: f"new{c}" for c in cols[2:]}}
    want[105] = {c: f"{c}5" for c in cols[1:]}
    rows, summary_props = read_iceberg(target / table_dir_name("s", "we`ird.t"))
    assert {r["i`d"]: {c: r[c] for c in cols[1:]} for r in rows} == want
    assert summary_props["pgrecv.applied-lsn"] == str(0x2000)


def test_a_second_run_on_a_busy_target_is_refused(tmp_path: Path, connector: Runner) -> None:
    """While another run holds the target, an Iceberg run says so in one line, exit 8, and
    writes nothing; once it is free, the run applies."""
    src = _write(tmp_path / "1.jsonl", [_rel("t"), *_txn("0/1000", _row("insert", "t", "0/1000", "0/100", 1, "a"))])
    target = tmp_path / "lake"
    with held_target(target):
        assert_busy(_proc(connector, str(src), "--target", str(target)))
        assert not (target / table_dir_name("s", "t")).exists()
    assert _run(connector, str(src), "--target", str(target))["tables"][0]["status"] == "applied"
    assert [(r["id"], r["x"]) for r in read_iceberg(target / table_dir_name("s", "t"))[0]] == [(1, "a")]


def test_without_the_runtime_iceberg_is_refused(tmp_path: Path, spark: Any) -> None:
    """In a session without Iceberg's jars (the test session's), --format iceberg is a usage
    error that names the jars, and nothing is written."""
    src = _write(tmp_path / "1.jsonl", [_rel("t"), *_txn("0/1000", _row("insert", "t", "0/1000", "0/100", 1, "a"))])
    proc = pgrecv_here("spark-apply", str(src), "--target", str(tmp_path / "lake"), "--format", "iceberg")
    assert proc.returncode == 2, proc.stderr
    assert b"--format iceberg: Apache Iceberg's Spark runtime is not in this Spark session" in proc.stderr
    assert b"Traceback" not in proc.stderr
    assert not (tmp_path / "lake" / "s.t").exists()


def test_a_killed_run_is_completed_by_the_next(tmp_path: Path, spark_jars_conf: str, connector: Runner) -> None:
    """SIGKILL while the second batch is being applied (once a table has a new metadata file),
    then a run to the end: the tables equal the truth, whatever the kill interrupted."""
    gen, files = _gen_files(tmp_path / "k", 7, 40)
    target = tmp_path / "lake"
    _run(connector, str(files[0]), "--target", str(target))
    cmd = [sys.executable, "-m", "pgrecv", "spark-apply", *map(str, files), "--target", str(target), "--format",
           "iceberg", *FAST, "--conf", f"spark.jars={spark_jars_conf}"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    metas = [target / table_dir_name(t.schema, t.name) / "metadata" for t in gen.tables]

    def count(d: Path) -> int:
        return len(list(d.glob("*.metadata.json"))) if d.exists() else 0

    before = {d: count(d) for d in metas}
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        if any(count(d) > before[d] for d in metas):
            break
        time.sleep(0.05)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    summary = _run(connector, *map(str, files), "--target", str(target))
    assert not summary["warnings"], summary["warnings"]
    truth = gen.truth()
    for t in gen.tables:
        assert _got(t, target) == _expected(t, truth[(t.schema, t.name)]), f"{t.schema}.{t.name} ({t.kind})"


def test_a_column_named_as_icebergs_metadata_is_held_back_alone(tmp_path: Path, connector: Runner) -> None:
    """Spark reads no column named as one of Iceberg's metadata columns (``_pos``) from an Iceberg
    table: that table is held back with what to do, the others are applied."""
    pos = {**_rel("p"), "columns": [*_rel("p")["columns"], {"name": "_pos", "type": "integer", "typmod": -1}]}
    src = _write(tmp_path / "1.jsonl", [
        _rel("t"), pos,
        *_txn("0/1000", _row("insert", "t", "0/1000", "0/100", 1, "a"), _row("insert", "p", "0/1000", "0/101", 1, "b")),
    ])  # fmt: skip
    proc = _proc(connector, str(src), "--target", str(tmp_path / "lake"))
    assert proc.returncode != 0 and b"Traceback" not in proc.stderr
    summary = orjson.loads(proc.stdout)
    got = {t["table"]: (t["status"], t.get("error") or "") for t in summary["tables"]}
    assert got["s.t"] == ("applied", "")
    assert (
        got["s.p"][0] == "held back"
        and "column _pos has the name of one of Iceberg's metadata columns" in got["s.p"][1]
    )
    assert [r["x"] for r in _read(tmp_path / "lake" / "s.t")[0]] == ["a"]


def _insert_then_merge(first: Path, second: Path) -> tuple[Path, Path]:
    """Two files of table s.t: 20 rows inserted at 0/1000, then row 5 updated and row 7 deleted at
    0/2000 (the second run's MERGE)."""
    _write(first, [
        _rel("t"), *_txn("0/1000", *[_row("insert", "t", "0/1000", f"0/{0x100 + i:X}", i, f"a{i}") for i in range(20)]),
    ])  # fmt: skip
    _write(second, [_rel("t"), *_txn(
        "0/2000", _row("update", "t", "0/2000", "0/1F00", 5, "new5"), _row("delete", "t", "0/2000", "0/1F01", 7),
    )])  # fmt: skip
    return first, second


def catalog(props: dict[str, str]) -> tuple[str, list[str]]:
    """A new name and the ``--conf`` arguments of Iceberg's ``SparkCatalog`` under it with
    ``props`` (its ``type``, ``uri``...). (A new name each time: the runner's session keeps every
    catalog it loaded.)"""
    import secrets

    name = f"lake_{secrets.token_hex(4)}"
    key = f"spark.sql.catalog.{name}"
    conf = {key: "org.apache.iceberg.spark.SparkCatalog", **{f"{key}.{k}": v for k, v in props.items()}}
    return name, [x for k, v in conf.items() for x in ("--conf", f"{k}={v}")]


def jdbc_catalog(dsn: str, warehouse: str) -> tuple[str, list[str]]:
    """:func:`catalog`: Iceberg's JDBC catalog in the PostgreSQL of ``dsn`` (over TCP: its password
    from the conninfo's passfile), its warehouse ``warehouse``."""
    url, user, password = pg_jdbc(dsn)
    return catalog({"type": "jdbc", "uri": url, "jdbc.user": user, "jdbc.password": password, "warehouse": warehouse})


def pg_jdbc(dsn: str) -> tuple[str, str, str]:
    """The JDBC URL, user and password of the PostgreSQL of a TCP ``dsn`` (its password from the
    conninfo's passfile)."""
    import psycopg

    info = psycopg.conninfo.conninfo_to_dict(dsn)
    password = Path(str(info["passfile"])).read_text().strip().rsplit(":", 1)[1]
    return f"jdbc:postgresql://127.0.0.1:{info['port']}/{info['dbname']}", str(info["user"]), password


MERGED = {i: f"a{i}" for i in range(20) if i != 7} | {5: "new5"}  # s.t after _insert_then_merge's files


def _merge_through(connector: Runner, tmp_path: Path, name: str, conf: list[str]) -> None:
    """_insert_then_merge's files through the named catalog ``name`` (its ``--conf`` arguments):
    the table made, then MERGEd into (one update, one delete), then a re-run up to date; nothing
    under --target but pgrecv's own state."""
    args = ["--iceberg-catalog", name, *conf]
    target = tmp_path / "state"
    first, second = _insert_then_merge(tmp_path / "1.jsonl", tmp_path / "2.jsonl")
    s1 = _run(connector, str(first), "--target", str(target), *args)
    assert [(t["status"], t["applied_lsn"]) for t in s1["tables"]] == [("applied", "0/1000")]
    s2 = _run(connector, str(first), str(second), "--target", str(target), *args)
    assert [(t["status"], t["updates"], t["deletes"]) for t in s2["tables"]] == [("applied", 1, 1)]
    again = _run(connector, str(first), str(second), "--target", str(target), *args)
    assert [t["status"] for t in again["tables"]] == ["up to date"]
    assert sorted(p.name for p in target.iterdir()) == ["_pgrecv"]


def test_a_jdbc_catalog_kept_in_postgresql(tmp_path: Path, connector: Runner, tcp_dsn: str) -> None:
    """--iceberg-catalog: a catalog of the session, here Iceberg's JDBC catalog with its pointers
    in PostgreSQL (over TCP, through the driver jvm/pom.xml fetches) and its warehouse a local
    directory: tables NAME.schema.table, a MERGE run and a re-run, read back by pyiceberg from the
    metadata the catalog points to; nothing under --target but pgrecv's own state. A catalog the
    session does not have, or the option with another format: exit 2."""

    import psycopg

    from pgrecv.spark.files import file_url

    name, args = jdbc_catalog(tcp_dsn, file_url(tmp_path / "warehouse"))
    _merge_through(connector, tmp_path, name, args)
    first = tmp_path / "1.jsonl"
    with psycopg.connect(tcp_dsn) as conn:
        found = conn.execute(
            "SELECT metadata_location FROM iceberg_tables WHERE catalog_name = %s AND table_namespace = 's' "
            "AND table_name = 't'",
            (name,),
        ).fetchone()
    assert found is not None
    table = pyiceberg_table.StaticTable.from_metadata(found[0])
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary.additional_properties["pgrecv.applied-lsn"] == str(0x2000)
    assert {r["id"]: r["x"] for r in table.scan().to_arrow().to_pylist()} == MERGED

    with psycopg.connect(tcp_dsn) as conn:
        newest = conn.info.server_version // 10000 == max(VERSIONS)
    if newest:  # (the catalog's race, not the server's: on one version)
        _namespace_made_meanwhile(connector, tmp_path, tcp_dsn, name, args)

    missing = _proc(connector, str(first), "--target", str(tmp_path / "x"), "--iceberg-catalog", "nosuch")
    assert missing.returncode == 2 and b"--iceberg-catalog nosuch: the Spark session has no catalog" in missing.stderr
    other = pgrecv_here("spark-apply", str(first), "--target", str(tmp_path / "y"), "--format", "delta",
                  "--iceberg-catalog", name)  # fmt: skip
    assert other.returncode == 2 and b"--iceberg-catalog" in other.stderr and b"Traceback" not in other.stderr


def _namespace_made_meanwhile(connector: Runner, tmp_path: Path, dsn: str, name: str, args: list[str]) -> None:
    """Another process makes a new table's namespace between the JDBC catalog's check and its
    insert, as when two runs make tables of one new schema at once: a trigger inserts the same row
    first, in a session of its own (dblink, committed), so the catalog's insert fails on the key.
    The run makes the namespace again (IF NOT EXISTS, which now sees it) and writes the table."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    # the trigger's own session: the test's connection with its password given (the server cannot
    # read the test's passfile); it notes each time it made the namespace
    info = {k: v for k, v in conninfo_to_dict(dsn).items() if k != "passfile"}
    other = make_conninfo(**info, password=pg_jdbc(dsn)[2])
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS dblink")
        conn.execute("CREATE TABLE pgrecv_test_race_made (namespace text)")
        conn.execute(
            "CREATE FUNCTION pgrecv_test_race() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "PERFORM dblink_exec(" + psycopg.sql.quote(other) + ", format('SET session_replication_role = replica; "
            "INSERT INTO iceberg_namespace_properties (catalog_name, namespace, property_key, property_value) "
            "VALUES (%L, %L, %L, %L); INSERT INTO pgrecv_test_race_made VALUES (%L)', NEW.catalog_name, "
            "NEW.namespace, NEW.property_key, NEW.property_value, NEW.namespace)); RETURN NEW; END $$"
        )
        conn.execute(
            "CREATE TRIGGER race BEFORE INSERT ON iceberg_namespace_properties FOR EACH ROW "
            "WHEN (NEW.namespace = 'race') EXECUTE FUNCTION pgrecv_test_race()"
        )
    rel = {**_rel("u"), "schema": "race"}
    source = _write(
        tmp_path / "race.jsonl",
        [rel, *_txn("0/3000", {**_row("insert", "u", "0/3000", "0/2F00", 1, "r"), "schema": "race"})],
    )
    summary = _run(connector, str(source), "--target", str(tmp_path / "race"), "--iceberg-catalog", name, *args)
    assert [(t["status"], t["inserts"]) for t in summary["tables"]] == [("applied", 1)]
    with psycopg.connect(dsn) as conn:
        made = conn.execute("SELECT namespace FROM pgrecv_test_race_made").fetchall()
        tables = conn.execute(
            "SELECT count(*) FROM iceberg_tables WHERE catalog_name = %s AND table_namespace = 'race'", (name,)
        ).fetchone()
    # once: the catalog's own insert met the trigger's row and failed; the retry inserted nothing
    assert made == [("race",)], "the race did not happen: this test showed nothing"
    assert tables == (1,)


def test_a_rest_catalog(tmp_path: Path, connector: Runner, iceberg_rest: str) -> None:
    """--iceberg-catalog naming a REST catalog (Iceberg's own REST server, as Iceberg's tests serve
    it): the tables are made, MERGEd into and left alone by a re-run through the catalog's HTTP
    API, the position in each snapshot's summary; pyiceberg, through its own REST client, reads
    PostgreSQL's rows and the position back. Nothing under --target but pgrecv's own state."""
    from pyiceberg.catalog.rest import RestCatalog

    name, conf = catalog({"type": "rest", "uri": iceberg_rest})
    _merge_through(connector, tmp_path, name, conf)
    table = RestCatalog("pyiceberg", uri=iceberg_rest).load_table(("s", "t"))
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary.additional_properties["pgrecv.applied-lsn"] == str(0x2000)
    assert {r["id"]: r["x"] for r in table.scan().to_arrow().to_pylist()} == MERGED


def test_a_hive_catalog(tmp_path: Path, connector: Runner, newest_tcp_dsn: str) -> None:
    """--iceberg-catalog naming a Hive catalog: Iceberg's HiveCatalog on a Hive metastore (Hive
    2.3's, the one Spark's own jars carry) whose database is PostgreSQL, as a metastore's often
    is; embedded in the session (no Thrift service to run). Its commits swap the table's
    metadata pointer with the metastore's conditional alter (lock-free, Hive 2.3.10). The tables
    are made, MERGEd into and left alone by a re-run; pyiceberg reads PostgreSQL's rows and the
    position back from the metadata the metastore points to."""
    import psycopg

    from pgrecv.spark.files import file_url

    url, user, password = pg_jdbc(newest_tcp_dsn)
    hive = {
        "javax.jdo.option.ConnectionURL": url,
        "javax.jdo.option.ConnectionDriverName": "org.postgresql.Driver",
        "javax.jdo.option.ConnectionUserName": user,
        "javax.jdo.option.ConnectionPassword": password,
        "datanucleus.schema.autoCreateAll": "true",
        "hive.metastore.schema.verification": "false",
        "iceberg.engine.hive.lock-enabled": "false",
    }
    warehouse = tmp_path / "warehouse"
    name, conf = catalog(
        {"type": "hive", "warehouse": file_url(warehouse)} | {f"hadoop.{k}": v for k, v in hive.items()}
    )
    _merge_through(connector, tmp_path, name, conf)
    with psycopg.connect(newest_tcp_dsn) as conn:  # the metastore's pointer: the table's parameter
        row = conn.execute(
            'SELECT p."PARAM_VALUE" FROM "TABLE_PARAMS" p JOIN "TBLS" t ON t."TBL_ID" = p."TBL_ID" '
            """WHERE t."TBL_NAME" = 't' AND p."PARAM_KEY" = 'metadata_location'"""
        ).fetchone()
    assert row is not None
    rows, props = read_iceberg(warehouse, row[0])
    assert props["pgrecv.applied-lsn"] == str(0x2000)
    assert {r["id"]: r["x"] for r in rows} == MERGED


def test_a_jdbc_catalog_with_its_warehouse_and_source_on_s3(
    newest_tcp_dsn: str, s3_server: Any, connector: Runner
) -> None:
    """Issue 58's PostgreSQL-truth test for Iceberg: `snapshot` and `start` write the change files
    to the S3 server, the tables' warehouse is there too (``s3a://``), the catalog Iceberg's JDBC
    one in PostgreSQL, which commits by swapping a table's metadata pointer in one SQL statement,
    so the store needs no rename. A run after the snapshot creates the table; a run after the
    stream MERGEs its updates and deletes; pyiceberg reads the table from the store as
    PostgreSQL's (a re-run through a JDBC catalog on S3: test_connect's Iceberg test). --target
    is on the store too: it holds only pgrecv's lock while a run lasts. On one PostgreSQL
    version: the other test of the JDBC catalog runs on each."""

    from tests.spark.test_s3_source import changes_to_s3

    bucket = s3_server.bucket()
    name, args = jdbc_catalog(newest_tcp_dsn, f"s3a://{bucket}/warehouse")
    client = s3_server.client()
    target = f"s3://{bucket}/state"

    def apply() -> dict[str, Any]:
        cmd = [f"s3://{bucket}/cdc", "--target", str(target), "--iceberg-catalog", name, "--table", "public.t", *args]
        return _ok(connector.run(["spark-apply", *cmd, "--format", "iceberg", "--json"], 900, env=s3_server.env))

    # (the catalog's own tables are in the same database, so in the publication too: --table)
    runs = []
    changes_to_s3(newest_tcp_dsn, s3_server, f"s3://{bucket}/cdc", after_snapshot=lambda: runs.append(apply()))
    assert_two_runs_made_postgresqls_table(
        newest_tcp_dsn, name, runs[0], apply(), f"s3a://{bucket}/warehouse/", s3_io(s3_server)
    )
    listed = client.list_objects_v2(Bucket=bucket, Prefix="state/").get("Contents", [])
    state = [o["Key"] for o in listed if not o["Key"].endswith("/")]  # (not the empty markers of prefixes)
    # the lock went with its run, no staging left; the positions are in the tables' snapshots
    assert state == [], state


def test_a_jdbc_catalog_with_its_warehouse_source_and_target_on_gcs(
    newest_tcp_dsn: str, gcs_server: Any, connector: Runner, tmp_path: Path
) -> None:
    """The same path on Cloud Storage (a real emulator): the change files, the warehouse (``gs://``,
    through Google's Hadoop connector) and --target, which holds pgrecv's lock (conditional writes
    on object generations) while a run lasts. A run after the snapshot creates the table, a run
    after the stream MERGEs into it; pyiceberg reads it from the store as PostgreSQL's table."""

    from tests.spark.test_gcs_target import keys_under
    from tests.spark.test_s3_source import changes_to_s3

    bucket = gcs_server.bucket()
    name, args = jdbc_catalog(newest_tcp_dsn, f"gs://{bucket}/warehouse")
    local = tmp_path / "cdc"

    def apply() -> dict[str, Any]:
        gcs_server.upload(bucket, "cdc", sorted(p for p in local.iterdir() if p.is_file()))
        cmd = [f"gs://{bucket}/cdc", "--target", f"gs://{bucket}/state", "--iceberg-catalog", name, *args]
        cmd += ["--table", "public.t", "--format", "iceberg", "--json"]
        return _ok(connector.run(["spark-apply", *cmd], 900, env=gcs_server.env))

    runs = []
    changes_to_s3(newest_tcp_dsn, None, str(local), after_snapshot=lambda: runs.append(apply()))
    io = {"gcs.service.host": gcs_server.env["STORAGE_EMULATOR_HOST"], "gcs.project-id": "test"}
    io |= {"gcs.oauth2.token": "emulator", "gcs.oauth2.token-expires-at": str(int(time.time() + 3600) * 1000)}
    assert_two_runs_made_postgresqls_table(newest_tcp_dsn, name, runs[0], apply(), f"gs://{bucket}/warehouse/", io)
    assert keys_under(gcs_server, bucket, "state") == []  # the lock went with its run, no staging left


def assert_two_runs_made_postgresqls_table(
    dsn: str, catalog: str, first: dict[str, Any], last: dict[str, Any], warehouse: str, io: dict[str, str]
) -> None:
    """A run after the snapshot made ``public.t`` and a later run applied the stream onto it
    (their summaries ``first`` and ``last``); the metadata the JDBC ``catalog`` points to is under
    ``warehouse``, and pyiceberg (with the store's ``io`` settings) reads PostgreSQL's table there,
    at the position the last run reported."""
    from tests.util import sql

    assert [(t["table"], t["status"]) for t in first["tables"]] == [("public.t", "applied")]
    assert [t["status"] for t in last["tables"]] == ["applied"]
    applied = last["tables"][0]["applied_lsn"]
    assert LSN.parse(first["tables"][0]["applied_lsn"]) < LSN.parse(applied)
    found = catalog_pointers(dsn, catalog).get(("public", "t"))
    assert found is not None and found.startswith(warehouse), found
    table = pyiceberg_table.StaticTable.from_metadata(found, properties=io)
    snapshot = table.current_snapshot()
    assert snapshot is not None
    assert lsn_str(int(snapshot.summary.additional_properties["pgrecv.applied-lsn"])) == applied
    rows = sorted((r["id"], r["v"]) for r in table.scan().to_arrow().to_pylist())
    assert rows == sorted(tuple(r) for r in sql(dsn, "SELECT id, v FROM t")), "not PostgreSQL's table"
    assert len(rows) > 20


def catalog_pointers(dsn: str, catalog: str) -> dict[tuple[str, str], str]:
    """Each table's current metadata file, as Iceberg's JDBC catalog ``catalog`` in the PostgreSQL
    of ``dsn`` points to it, by (namespace, table)."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        if conn.execute("SELECT to_regclass('iceberg_tables')").fetchone() == (None,):
            return {}  # (the catalog makes its tables when a run first loads it)
        got = conn.execute(
            "SELECT table_namespace, table_name, metadata_location FROM iceberg_tables WHERE catalog_name = %s",
            (catalog,),
        ).fetchall()
    return {(ns, t): loc for ns, t, loc in got}


def s3_io(s3_server: Any) -> dict[str, str]:
    """pyiceberg's settings of the tests' S3 server."""
    env = s3_server.env
    return {
        "s3.endpoint": env["AWS_ENDPOINT_URL"],
        "s3.access-key-id": env["AWS_ACCESS_KEY_ID"],
        "s3.secret-access-key": env["AWS_SECRET_ACCESS_KEY"],
        "s3.region": env["AWS_REGION"],
    }


def test_on_s3_a_killed_run_is_completed_and_a_second_run_is_refused(
    tmp_path: Path, newest_tcp_dsn: str, s3_server: Any, spark_jars_conf: str, s3a_jars_conf: str, connector: Runner
) -> None:
    """Issue 58's kill and concurrency tests for Iceberg with every path on the S3 server: SOURCE,
    the warehouse (Iceberg's JDBC catalog in PostgreSQL) and --target (pgrecv's lock). While
    another process holds the target, a run is refused in one line (exit 8) and makes nothing; a
    run SIGKILLed once it wrote its first metadata object (a table made, before or after the
    catalog points to it), then a run to the end: every table equals the truth, read by pyiceberg
    from the metadata the catalog names. (A run killed in a MERGE: the Hadoop catalog's kill test
    above; a JDBC catalog's commit is one SQL statement. A first run here as well took 347 s of CI
    beside the other tests, 2026-12-06.)"""

    gen = Gen(7, tables=3)  # (6 tables took 370 s beside another test)
    files = _files(gen.run(40), tmp_path, 40)
    bucket = s3_server.bucket()
    urls = s3_server.upload(bucket, "cdc", files)
    name, args = jdbc_catalog(newest_tcp_dsn, f"s3a://{bucket}/warehouse")
    target = f"s3://{bucket}/state"
    given = ["--target", target, "--format", "iceberg", "--json", "--iceberg-catalog", name, *args]
    cmd = [sys.executable, "-m", "pgrecv", "spark-apply", *given, *FAST,
           "--conf", f"spark.jars={spark_jars_conf},{s3a_jars_conf}"]  # fmt: skip
    env = {**os.environ, **s3_server.env}
    client = s3_server.client()

    def pointers() -> dict[tuple[str, str], str]:
        return catalog_pointers(newest_tcp_dsn, name)

    def metadata_objects() -> int:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="warehouse/")
        return sum(o["Key"].endswith(".metadata.json") for page in pages for o in page.get("Contents", []))

    with held_target(target, s3_server.env):
        busy = subprocess.run([*cmd, *urls], env=env, capture_output=True, timeout=600, check=False)
    assert_busy(busy)
    assert pointers() == {} and metadata_objects() == 0  # the refused run made nothing

    before = metadata_objects()
    proc = subprocess.Popen(
        [*cmd, *urls], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline and metadata_objects() == before:
        time.sleep(0.2)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    # the run to the end in the connectors' runner (a JVM of its own fewer)
    assert not _ok(connector.run(["spark-apply", *given, *urls], 900, env=s3_server.env))["warnings"]
    found = pointers()
    assert found and all(loc.startswith(f"s3a://{bucket}/warehouse/") for loc in found.values()), found
    truth = gen.truth()
    for t in gen.tables:
        loc = found.get((t.schema, t.name))
        rows = read_iceberg(tmp_path, loc, s3_io(s3_server))[0] if loc is not None else []
        assert canon_rows(t, rows) == _expected(t, truth[(t.schema, t.name)]), f"{t.schema}.{t.name} ({t.kind})"


@pytest.mark.parametrize("hint", ["missing", "behind"])
def test_a_version_hint_that_lags_is_read_as_iceberg_reads_it(tmp_path: Path, connector: Runner, hint: str) -> None:
    """A Hadoop-catalog commit writes its metadata file, then the version hint: a run killed in
    between leaves a table the hint does not name yet (no hint at all after the table's first
    commit). Iceberg finds the newest metadata file anyway, and so must pgrecv: else the next run
    takes the table for a new one and fails to create it (TABLE_OR_VIEW_ALREADY_EXISTS, seen in
    CI for the kill test), or replays a batch onto a table that has it."""
    target = tmp_path / "lake"
    first = _write(tmp_path / "1.jsonl", [
        _rel("t"), *_txn("0/1000", *[_row("insert", "t", "0/1000", f"0/{0x100 + i:X}", i, f"a{i}") for i in range(10)]),
    ])  # fmt: skip
    second = _write(tmp_path / "2.jsonl", [_rel("t"), *_txn("0/2000", _row("update", "t", "0/2000", "0/1F00", 5, "b"))])
    _run(connector, str(first), "--target", str(target))
    if hint == "behind":
        _run(connector, str(first), str(second), "--target", str(target))
    meta = target / "s.t" / "metadata"
    newest = max(int(p.name[1:].split(".")[0]) for p in meta.glob("v*.metadata.json"))
    if hint == "missing":
        (meta / "version-hint.text").unlink()
    else:
        (meta / "version-hint.text").write_text(str(newest - 1))
    summary = _run(connector, str(first), str(second), "--target", str(target))
    expected_status = "applied" if hint == "missing" else "up to date"
    assert [t["status"] for t in summary["tables"]] == [expected_status], summary["tables"]
    rows, props = _read(target / "s.t")
    assert props["pgrecv.applied-lsn"] == str(0x2000)
    assert {r["id"]: r["x"] for r in rows} == {i: f"a{i}" for i in range(10)} | {5: "b"}


def test_uuid_columns_are_icebergs_uuid(tmp_path: Path, connector: Runner) -> None:
    """A uuid column is of Iceberg's uuid type (exact, 16 bytes), in a new table and as a column a
    later batch adds; Spark writes and merges its PostgreSQL text, pyiceberg reads it back."""
    cols = [{"name": "id", "type": "integer", "typmod": -1, "key": True}, {"name": "u", "type": "uuid", "typmod": -1}]
    rel = {**_rel("g"), "columns": cols}
    rel2 = {**_rel("g"), "columns": [*cols, {"name": "w", "type": "uuid", "typmod": -1}]}
    ids = [str(uuid.UUID(int=(i + 1) * 0x1234567890ABCDEF)) for i in range(4)]

    def ins(commit: str, lsn: str, i: int, **values: str | None) -> dict[str, Any]:
        return _change("insert", "g", commit, lsn, {"id": i}, values)

    first = _write(tmp_path / "1.jsonl", [rel, *_txn("0/1000", ins("0/1000", "0/100", 1, u=ids[0]))])
    upd = {**ins("0/2000", "0/1F00", 1, u=ids[1], w=ids[2]), "op": "update"}
    second = _write(tmp_path / "2.jsonl", [rel2, *_txn("0/2000", upd, ins("0/2000", "0/1F01", 2, u=ids[3], w=None))])
    target = tmp_path / "lake"
    _run(connector, str(first), "--target", str(target))
    summary = _run(connector, str(first), str(second), "--target", str(target))
    assert [t["status"] for t in summary["tables"]] == ["applied"]
    path = target / table_dir_name("s", "g")
    versions = sorted(path.glob("metadata/v*.metadata.json"), key=lambda p: int(p.name[1:].split(".")[0]))
    assert uuids(pyiceberg_table.StaticTable.from_metadata(str(versions[-1]))) == {"u", "w"}
    rows, _ = _read(path)
    assert rows == [{"id": 1, "u": ids[1], "w": ids[2]}, {"id": 2, "u": ids[3], "w": None}]


def test_a_run_killed_between_making_a_uuid_table_and_writing_it(
    tmp_path: Path, spark_jars_conf: str, connector: Runner
) -> None:
    """A table with uuid columns is made by Iceberg's API, then written: a run killed in between
    (PGRECV_ICEBERG_CREATED_DELAY holds it there) leaves a table without a snapshot, and the next
    run writes it, once."""
    cols = [{"name": "id", "type": "integer", "typmod": -1, "key": True}, {"name": "u", "type": "uuid", "typmod": -1}]
    rel = {**_rel("g"), "columns": cols}
    ids = [str(uuid.UUID(int=(i + 7) * 0x1234567890ABCDEF)) for i in range(2)]
    changes = [_change("insert", "g", "0/1000", f"0/10{i}", {"id": i}, {"u": ids[i]}) for i in range(2)]
    source = _write(tmp_path / "1.jsonl", [rel, *_txn("0/1000", *changes)])
    target = tmp_path / "lake"
    cmd = [sys.executable, "-m", "pgrecv", "spark-apply", str(source), "--target", str(target), "--format",
           "iceberg", *FAST, "--conf", f"spark.jars={spark_jars_conf}"]  # fmt: skip
    env = {**os.environ, "PGRECV_ICEBERG_CREATED_DELAY": "600"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=env)
    meta = target / table_dir_name("s", "g") / "metadata"
    try:
        deadline = time.monotonic() + 300
        while not list(meta.glob("v*.metadata.json")):
            assert proc.poll() is None and time.monotonic() < deadline, "the table was never made"
            time.sleep(0.05)
        time.sleep(1)  # (a metadata file is written whole: a new name appears complete)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    made = sorted(meta.glob("v*.metadata.json"))
    assert len(made) == 1 and orjson.loads(made[0].read_bytes()).get("current-snapshot-id") in (None, -1)
    summary = _run(connector, str(source), "--target", str(target))
    assert [t["status"] for t in summary["tables"]] == ["applied"]
    rows, props = _read(target / table_dir_name("s", "g"))
    assert rows == [{"id": 0, "u": ids[0]}, {"id": 1, "u": ids[1]}]
    assert "pgrecv.applied-lsn" in props  # the position is on record with the snapshot
    assert _run(connector, str(source), "--target", str(target))["tables"][0]["status"] == "up to date"
