"""Delta through Delta Lake's Spark connector (``--delta-engine spark``), with the jars Maven
fetched (jvm/pom.xml; .ci/run fetches them, so nothing here skips for want of them).

The runs are ``pgrecv spark-apply``'s own command in one process that holds a session with the
connector, started as a user's spark-submit would start it (tests/spark/connector_runner.py: a JVM
start with the jars costs half a minute); the one killed mid-run is a process of its own, given
``--conf spark.jars=...`` as a user runs it. The test session's shared SparkSession has neither
jars nor extension, so that the other tests keep delta-rs. Tables are read back by delta-rs (its
DataFusion reader, which applies deletion vectors) and by DuckDB's delta extension, not by the connector.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest

from pgrecv.spark.jars import connector_jars, session_conf
from pgrecv.spark.model import table_dir_name
from tests.spark.changegen import Gen
from tests.spark.connector_runner import Runner
from tests.spark.test_command import _first, _rel, _row, _txn, _write, assert_busy, held_target
from tests.spark.test_differential import _canon_value, _expected, _files, assert_history
from tests.util import pgrecv_here

pytest.importorskip("pyspark")
deltalake = pytest.importorskip("deltalake")

FAST = (
    "--master", "local[2]", "--conf", "spark.sql.shuffle.partitions=2", "--conf", "spark.ui.enabled=false",
    "--conf", "spark.databricks.delta.snapshotPartitions=2",
)  # fmt: skip


def _run(
    connector: Runner, *args: str, engine: str | None = "spark", timeout: float = 600
) -> subprocess.CompletedProcess[bytes]:
    """``pgrecv spark-apply ARGS --format delta --json`` in the runner's session (its master and
    jars are the session's)."""
    cmd = ["spark-apply", *args, "--format", "delta", "--json"]
    if engine is not None:
        cmd += ["--delta-engine", engine]
    return connector.run(cmd, timeout)


def _ok(proc: subprocess.CompletedProcess[bytes]) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-4000:]
    summary: dict[str, Any] = orjson.loads(proc.stdout)
    assert summary["engine"] == "delta/spark"
    return summary


def _read(path: Path) -> list[dict[str, Any]]:
    """A Delta table's rows as delta-rs reads them (deletion vectors applied)."""
    dt = deltalake.DeltaTable(str(path))
    reader = deltalake.QueryBuilder().register("t", dt).execute("SELECT * FROM t")
    return list(pa.table(reader.read_all()).to_pylist())


def _read_duckdb(path: Path) -> list[dict[str, Any]]:
    """A Delta table's rows as DuckDB's delta extension reads them (from its PyPI package: no
    download at run time), deletion vectors applied."""
    import duckdb
    import duckdb_extension_delta

    ext = next(Path(duckdb_extension_delta.__path__[0]).glob("extensions/*/delta.duckdb_extension"))
    con = duckdb.connect()
    try:
        con.execute(f"LOAD '{ext}'")
        return list(con.execute("SELECT * FROM delta_scan(?)", [str(path)]).to_arrow_table().to_pylist())
    finally:
        con.close()


def _log(path: Path) -> list[dict[str, Any]]:
    out = []
    for f in sorted((path / "_delta_log").glob("*.json")):
        out.extend(orjson.loads(line) for line in f.read_bytes().splitlines())
    return out


def test_session_conf_adds_the_extension_only_with_the_connector() -> None:
    jar = {"spark.jars": "/x/delta-spark_4.1_2.13-4.4.0.jar"}
    conf = session_conf(jar, "delta", "auto")
    assert conf["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    assert conf["spark.sql.catalog.spark_catalog"] == "org.apache.spark.sql.delta.catalog.DeltaCatalog"
    mine = session_conf({**jar, "spark.sql.extensions": "a.B"}, "delta", "auto")
    assert mine["spark.sql.extensions"] == "a.B,io.delta.sql.DeltaSparkSessionExtension"
    assert session_conf(jar, "delta", "delta-rs") == jar
    assert session_conf(jar, "parquet", "auto") == jar
    assert session_conf({}, "delta", "auto") == {}
    assert "spark.sql.extensions" in session_conf({}, "delta", "spark")
    assert any(p.name.startswith("delta-spark_4.1_2.13-") for p in connector_jars())
    assert any(p.name.startswith("iceberg-spark-runtime-4.1_2.13-") for p in connector_jars())


def test_without_the_connector_spark_engine_is_refused(tmp_path: Path, spark: Any) -> None:
    """In a session without the jars (the test session's), ``--delta-engine spark`` is a usage error."""
    proc = pgrecv_here("spark-apply", str(_first(tmp_path)), "--target", str(tmp_path / "lake"), "--format", "delta",
                 "--delta-engine", "spark")  # fmt: skip
    assert proc.returncode == 2
    assert b"--delta-engine spark: Delta Lake's Spark connector is not in this Spark session" in proc.stderr
    assert not (tmp_path / "lake" / "s.t").exists()


def test_merge_rerun_schema_evolution_toast_and_deletion_vectors(tmp_path: Path, connector: Runner, spark: Any) -> None:
    """auto takes the connector when its jars are given; a sparse delete and update leave the
    files in place (deletion vectors); added columns, a key change, an unchanged TOAST value; a
    re-run changes nothing; delta-rs reads every version, and refuses to write these tables."""
    target = tmp_path / "lake"
    first = _first(tmp_path)
    s1 = _ok(_run(connector, str(first), "--target", str(target), engine=None))  # auto
    t, u = target / table_dir_name("s", "t"), target / table_dir_name("s", "u")
    assert sorted(_read(t), key=lambda r: r["id"]) == [{"id": 1, "x": "b"}]
    assert sorted(_read(u), key=lambda r: r["id"]) == [{"id": 1, "x": "u1"}, {"id": 2, "x": None}]
    meta = [a["metaData"] for a in _log(u) if "metaData" in a]
    assert meta[0]["configuration"]["delta.enableDeletionVectors"] == "true"
    # the position, and the mode the table is made with (tables.MODE_APP_ID)
    txns = [(a["txn"]["appId"], a["txn"]["version"]) for a in _log(u) if "txn" in a]
    assert txns == [("pgrecv:s.u", 0x1000), ("pgrecv:mode:latest", 1)]

    # 100 rows in one file, then a sparse batch: one delete, one update, one key change, one TOAST
    # value unchanged, one added column
    rel_u = _rel("u")
    wide = {**_rel("u"), "columns": [*rel_u["columns"], {"name": "y", "type": "bigint", "typmod": -1, "key": False}]}
    fill = [_row("insert", "u", "0/2000", f"0/{0x1100 + i:X}", i, f"v{i}") for i in range(3, 103)]
    second = _write(tmp_path / "2.jsonl", [rel_u, *_txn("0/2000", *fill)])
    toast = _row("update", "u", "0/3000", "0/2F01", 5)
    toast["new"] = {"id": 5}
    toast["unchanged_toast"] = ["x"]
    move = {"op": "update", "schema": "s", "table": "u", "commit_lsn": "0/3000", "lsn": "0/2F02",
            "old": {"id": 6}, "new": {"id": 1006, "x": "moved", "y": 6}, "unchanged_toast": []}  # fmt: skip
    third = _write(
        tmp_path / "3.jsonl",
        [
            wide,
            *_txn(
                "0/3000",
                _row("delete", "u", "0/3000", "0/2F00", 4),
                toast,
                move,
                {**_row("update", "u", "0/3000", "0/2F03", 7, "seven"), "new": {"id": 7, "x": "seven", "y": 77}},
            ),
        ],
    )
    _ok(_run(connector, str(first), str(second), "--target", str(target)))
    inputs = [str(first), str(second), str(third)]
    s2 = _ok(_run(connector, *inputs, "--target", str(target)))
    by = {r["id"]: r for r in _read(u)}
    assert len(by) == 102 - 1  # ids 1, 2, 3..102 less 4; 6 became 1006
    assert 4 not in by and 6 not in by
    assert by[5] == {"id": 5, "x": "v5", "y": None}  # unchanged TOAST: the target's value
    assert by[1006] == {"id": 1006, "x": "moved", "y": 6}
    assert by[7] == {"id": 7, "x": "seven", "y": 77}
    assert by[8] == {"id": 8, "x": "v8", "y": None}
    assert sorted(_read_duckdb(u), key=lambda r: r["id"]) == sorted(by.values(), key=lambda r: r["id"])
    last = max(int(p.stem) for p in (u / "_delta_log").glob("*.json"))
    actions = [orjson.loads(line) for line in (u / "_delta_log" / f"{last:020d}.json").read_bytes().splitlines()]
    # the file holding the touched rows stays: re-added with a deletion vector, not rewritten
    removed = {a["remove"]["path"] for a in actions if "remove" in a}
    marked = {a["add"]["path"] for a in actions if "add" in a and a["add"].get("deletionVector")}
    assert removed and removed <= marked, actions
    assert [a["txn"]["version"] for a in actions if "txn" in a] == [0x3000]
    tables = {r["table"]: r for r in s2["tables"]}
    assert tables["s.u"]["applied_lsn"] == "0/3000" and tables["s.u"]["bytes_written"] > 0
    # what the batch wrote: its new files and deletion vectors, not the marked file added again
    adds = [a["add"] for a in actions if "add" in a]
    new_files = sum(a["size"] for a in adds if a["path"] not in removed)
    vectors = sum((a.get("deletionVector") or {}).get("sizeInBytes", 0) for a in adds)
    assert new_files < tables["s.u"]["bytes_written"] <= new_files + vectors < sum(a["size"] for a in adds)

    again = _ok(_run(connector, *inputs, "--target", str(target)))
    assert {r["status"] for r in again["tables"]} == {"up to date"}
    assert {r["table"]: r["version"] for r in again["tables"]} == {r["table"]: r["version"] for r in s2["tables"]}
    assert s1["tables"][0]["status"] == "applied"

    # delta-rs must not write a table whose files hold rows deleted by deletion vectors
    refused = pgrecv_here(
        "spark-apply", *inputs, "--target", str(target), "--format", "delta", "--delta-engine", "delta-rs"
    )
    assert refused.returncode == 2
    assert b"has deletion vectors" in refused.stderr


def _gen_files(where: Path, seed: int, cut: int) -> tuple[Gen, list[Path]]:
    where.mkdir(parents=True)
    gen = Gen(seed)
    return gen, _files(gen.run(50), where, cut)


def _got(t: Any, target: Path) -> list[str]:
    path = target / table_dir_name(t.schema, t.name)
    rows = _read(path) if path.exists() else []
    return sorted(repr(sorted((c["name"], _canon_value(r.get(c["name"]))) for c in t.columns)) for r in rows)


@pytest.mark.parametrize("seed", [22])  # seed 7: test_a_killed_run_is_completed_by_the_next
def test_random_streams_equal_the_truth(tmp_path: Path, connector: Runner, seed: int) -> None:
    """The differential test's streams (six tables: keys, REPLICA IDENTITY FULL, TOAST, TRUNCATE,
    streamed and two-phase transactions), applied in two runs: the tables equal the truth."""
    gen, files = _gen_files(tmp_path / "a dir ü", seed, 22)
    target = tmp_path / "lake"
    _ok(_run(connector, str(files[0]), "--target", str(target)))
    summary = _ok(_run(connector, *map(str, files), "--target", str(target)))
    assert not summary["warnings"], summary["warnings"]
    truth = gen.truth()
    for t in gen.tables:
        assert _got(t, target) == _expected(t, truth[(t.schema, t.name)]), f"{t.schema}.{t.name} ({t.kind})"


def test_history_mode_equals_the_truth(tmp_path: Path, connector: Runner) -> None:
    """--mode history through the connector: the live versions are the true tables and each key's
    versions form one chain."""
    gen, files = _gen_files(tmp_path / "h", 15, 105)
    target = tmp_path / "lake"
    for fs in ([files[0]], files):
        assert not _ok(_run(connector, *map(str, fs), "--target", str(target), "--mode", "history"))["warnings"]
    truth = gen.truth()
    for t in gen.tables:
        path = target / table_dir_name(t.schema, t.name)
        got = _read(path) if path.exists() else []
        name = f"{t.schema}.{t.name} ({t.kind})"
        assert_history(t, got, truth[(t.schema, t.name)], name)


def test_a_second_run_on_a_busy_target_is_refused(tmp_path: Path, connector: Runner) -> None:
    """While another run holds the target, a run through the connector says so in one line,
    exit 8, and writes nothing; once it is free, the run applies."""
    src = _first(tmp_path)
    target = tmp_path / "lake"
    with held_target(target):
        assert_busy(_run(connector, str(src), "--target", str(target)))
        assert not (target / table_dir_name("s", "t")).exists()
    assert _ok(_run(connector, str(src), "--target", str(target)))["tables"][0]["status"] == "applied"
    assert [(r["id"], r["x"]) for r in _read(target / table_dir_name("s", "t"))] == [(1, "b")]


def test_bad_values_null_and_text(tmp_path: Path, connector: Runner) -> None:
    """--bad-values through the connector: a numeric NaN in a numeric(10,2) column."""
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
    failed = _run(connector, str(src), "--target", str(tmp_path / "fail"))
    assert failed.returncode == 15, failed.stderr.decode()[-2000:]
    for policy, want in (("null", None), ("text", "NaN")):
        summary = _ok(_run(connector, str(src), "--target", str(tmp_path / policy), "--bad-values", policy))
        assert summary["tables"][0]["values_changed"] == 1
        got = {r["id"]: r["x"] for r in _read(tmp_path / policy / table_dir_name("s", "n"))}
        assert got[2] == want
        assert str(got[1]) == "1.25"


def test_a_killed_run_is_completed_by_the_next(tmp_path: Path, spark_jars_conf: str, connector: Runner) -> None:
    """SIGKILL while the second batch is being applied (after the JVM is up), then a run to the
    end: the tables equal the truth, whatever the kill interrupted."""
    gen, files = _gen_files(tmp_path / "k", 7, 40)
    target = tmp_path / "lake"
    _ok(_run(connector, str(files[0]), "--target", str(target)))
    cmd = [sys.executable, "-m", "pgrecv", "spark-apply", *map(str, files), "--target", str(target), "--format",
           "delta", "--delta-engine", "spark", *FAST, "--conf", f"spark.jars={spark_jars_conf}"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    # killed once a table of the second run has committed (or when the run would have ended)
    logs = [target / table_dir_name(t.schema, t.name) / "_delta_log" for t in gen.tables]
    before = {d: len(list(d.glob("*.json"))) if d.exists() else 0 for d in logs}
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        if any((len(list(d.glob("*.json"))) if d.exists() else 0) > before[d] for d in logs):
            break
        time.sleep(0.05)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    summary = _ok(_run(connector, *map(str, files), "--target", str(target)))
    assert not summary["warnings"], summary["warnings"]
    truth = gen.truth()
    for t in gen.tables:
        assert _got(t, target) == _expected(t, truth[(t.schema, t.name)]), f"{t.schema}.{t.name} ({t.kind})"


def test_a_large_batch_read_lean_replaces_the_table_in_one_commit(tmp_path: Path, connector: Runner) -> None:
    """A batch that updates most of a table (here every row, many times, and deletes some) is one
    overwrite commit of the table's new rows instead of a MERGE; an input large enough for the
    lean read (over 32 MB) is read lean, its counts settled (the final events kept in Spark)
    before that commit. A re-run is up to date."""
    target = tmp_path / "lake"
    base = [
        _rel("u"),
        *_txn("0/10000", *[_row("insert", "u", "0/10000", f"0/{0x1000 + i:X}", i, "a") for i in range(1000)]),
    ]
    _ok(_run(connector, str(_write(tmp_path / "1.jsonl", base)), "--target", str(target)))
    pad = "y" * 100
    records: list[dict[str, Any]] = [_rel("u")]
    last: dict[int, str | None] = {}
    for t in range(300):
        c = 0x100000 + t * 0x10000
        rows = [
            _row("update", "u", f"0/{c:X}", f"0/{c - 0x1000 + j:X}", (t * 500 + j) % 1000, f"{t}-{j}{pad}")
            for j in range(500)
        ]
        records += _txn(f"0/{c:X}", *rows)
        last.update({(t * 500 + j) % 1000: f"{t}-{j}{pad}" for j in range(500)})
    end = f"0/{0x100000 + 300 * 0x10000:X}"
    records += _txn(
        end, *[_row("delete", "u", end, f"0/{0x100000 + 300 * 0x10000 - 0x100 + i:X}", i) for i in range(10)]
    )
    second = _write(tmp_path / "2.jsonl", records)
    assert second.stat().st_size > 32 << 20
    s2 = _ok(_run(connector, str(second), "--target", str(target)))
    assert s2["input_read"] == "lean"
    assert s2["tables"][0]["applied_lsn"] == end
    assert (s2["tables"][0]["inserts"], s2["tables"][0]["updates"], s2["tables"][0]["deletes"]) == (0, 150_000, 10)
    u = target / table_dir_name("s", "u")
    assert {r["id"]: r["x"] for r in _read(u)} == {i: x for i, x in last.items() if i >= 10}
    assert {r["id"]: r["x"] for r in _read_duckdb(u)} == {i: x for i, x in last.items() if i >= 10}
    commits = sorted((u / "_delta_log").glob("*.json"))
    actions = [orjson.loads(line) for line in commits[-1].read_bytes().splitlines()]
    assert [a["commitInfo"]["operation"] for a in actions if "commitInfo" in a] == ["WRITE"]
    assert [a["txn"]["version"] for a in actions if "txn" in a] == [0x100000 + 300 * 0x10000]
    again = _ok(_run(connector, str(second), "--target", str(target)))
    assert [r["status"] for r in again["tables"]] == ["up to date"]
