"""``spark-apply --remote sc://…``: the same job on a real Spark Connect server (the pyspark
wheel's, local[2], on 127.0.0.1), which gives the same tables as local mode; what Spark Connect
cannot do is refused in one line."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgrecv.errors import ExitCode
from pgrecv.lsn import lsn_str
from pgrecv.spark.files import java_raw_path
from pgrecv.spark.model import table_dir_name
from tests.conftest import ConnectServer, S3Server, _free_port
from tests.spark.changegen import Gen
from tests.spark.test_differential import _expected, _files, _got
from tests.util import err, pgrecv, sql

pytest.importorskip("pyspark")
SEED = 1111


@pytest.fixture(scope="module")
def stream(tmp_path_factory: pytest.TempPathFactory) -> tuple[Gen, list[Path]]:
    where = tmp_path_factory.mktemp("connect-stream")
    gen = Gen(SEED)
    return gen, _files(gen.run(40), where, SEED)


def apply_remote(connect: ConnectServer, files: list[Path], target: Path, *extra: str) -> Any:
    return pgrecv(
        "spark-apply", *map(str, files), "--target", str(target), *extra, "--json", "--remote", connect.url, timeout=900
    )


@pytest.mark.parametrize("fmt", ["parquet", "delta"])
def test_connect_on_s3_equals_local(
    spark_connect: ConnectServer,
    s3_server: S3Server,
    stream: tuple[Gen, list[Path]],
    tmp_path: Path,
    fmt: str,
) -> None:
    """Every path on the S3 server: pgrecv lists and stages the input, the Spark Connect server's
    tasks read the objects and write the tables' files, pgrecv commits them (delta-rs; Parquet's
    pointer object); the same tables as local mode (the truth, which local mode's tables equal
    in test_differential; a local run here took 20-60 s of CI a format), and a second run
    through the server changes nothing. (Local paths through the server: the tests below.)"""
    from tests.spark.test_s3_target import download

    gen, files = stream
    bucket = s3_server.bucket()
    urls = s3_server.upload(bucket, "cdc", files)

    def apply() -> Any:
        return pgrecv(
            "spark-apply", *urls, "--target", f"s3://{bucket}/lake", "--format", fmt,
            "--json", "--remote", spark_connect.url, env=s3_server.env, timeout=900,
        )  # fmt: skip

    started = time.monotonic()
    proc = apply()
    seconds = time.monotonic() - started
    assert proc.returncode == 0, f"{err(proc)}\n{spark_connect.log.read_text()[-3000:]}"
    summary = orjson.loads(proc.stdout)
    assert not summary["warnings"], summary["warnings"]
    assert summary["engine"] != "delta/spark"
    remote = tmp_path / "remote"
    download(s3_server, bucket, "lake", remote)
    truth = gen.truth()  # (local mode's tables are the truth: tests/spark/test_differential.py)
    rows = 0
    for t in gen.tables:
        got = _got(t, remote, fmt)
        assert got == _expected(t, truth[(t.schema, t.name)]), f"{t.schema}.{t.name} ({t.kind})"
        rows += len(got)
    assert rows > 0, "the stream left no rows: the comparison proves nothing"
    again = apply()
    assert again.returncode == 0, err(again)
    assert {t["status"] for t in orjson.loads(again.stdout)["tables"]} == {"up to date"}, again.stdout
    print(f"{fmt}: Spark Connect on S3 {seconds:.0f} s, {rows} rows")


def test_connect_writes_iceberg_on_s3(
    spark_connect: ConnectServer,
    s3_server: S3Server,
    newest_tcp_dsn: str,
    stream: tuple[Gen, list[Path]],
    tmp_path: Path,
) -> None:
    """Iceberg through the server (its runtime, S3A and PostgreSQL's JDBC driver on the server's
    class path), every path on the S3 server: the warehouse of Iceberg's JDBC catalog (in
    PostgreSQL, set through the run's ``--conf`` at run time), SOURCE and --target. Each MERGE's
    snapshot records the applied position through the session setting Iceberg reads, so the
    tables are the truth, a re-run changes nothing, and pyiceberg reads the position back from
    the metadata the catalog names."""
    from tests.spark.test_iceberg import canon_rows, catalog_pointers, jdbc_catalog, read_iceberg, s3_io

    gen, files = stream
    bucket = s3_server.bucket()
    urls = s3_server.upload(bucket, "cdc", files)
    name, args = jdbc_catalog(newest_tcp_dsn, f"s3a://{bucket}/warehouse")

    def apply(inputs: list[str]) -> Any:
        proc = pgrecv(
            "spark-apply", *inputs, "--target", f"s3://{bucket}/state", "--format", "iceberg", "--iceberg-catalog",
            name, *args, "--json", "--remote", spark_connect.url, env=s3_server.env, timeout=900,
        )  # fmt: skip
        assert proc.returncode == 0, f"{err(proc)}\n{spark_connect.log.read_text()[-3000:]}"
        return orjson.loads(proc.stdout)

    apply(urls[:1])  # a first run creates the tables; the second merges into them
    summary = apply(urls)
    assert summary["engine"] == "iceberg/spark"
    pointers = {f"{ns}.{t}": loc for (ns, t), loc in catalog_pointers(newest_tcp_dsn, name).items()}
    truth = gen.truth()
    rows = 0
    for t in gen.tables:
        loc = pointers.get(f"{t.schema}.{t.name}")
        got = read_iceberg(tmp_path, loc, s3_io(s3_server))[0] if loc is not None else []
        assert canon_rows(t, got) == _expected(t, truth[(t.schema, t.name)]), f"{t.schema}.{t.name} ({t.kind})"
        rows += len(got)
    assert rows > 0
    merged = [t for t in summary["tables"] if t["status"] == "applied" and t["updates"] + t["deletes"] > 0]
    assert merged, summary["tables"]  # (the second run merged into tables the first made)
    for t in merged:
        loc = pointers[t["table"]]
        assert loc.startswith(f"s3a://{bucket}/warehouse/"), loc
        _, props = read_iceberg(tmp_path, loc, s3_io(s3_server))
        assert lsn_str(int(props["pgrecv.applied-lsn"])) == t["applied_lsn"], (t, props)
    assert {t["status"] for t in apply(urls)["tables"]} == {"up to date"}


def test_connect_writes_delta_with_the_connector_on_s3(
    spark_connect: ConnectServer, s3_server: S3Server, stream: tuple[Gen, list[Path]], tmp_path: Path
) -> None:
    """--delta-engine spark through a server set up with Delta's connector, every path on the S3
    server: each MERGE (SQL, its app transaction in the session's conf, one at a time) records the
    applied position in the commit (through Delta's S3 log store), so the tables are the truth
    (read with their deletion vectors) and a re-run changes nothing."""
    from deltalake import DeltaTable

    from pgrecv.lsn import LSN
    from pgrecv.spark.model import app_id
    from tests.spark.test_delta_spark import _got as delta_rows
    from tests.spark.test_s3_target import download

    gen, files = stream
    bucket = s3_server.bucket()
    urls = s3_server.upload(bucket, "cdc", files)

    def apply(inputs: list[str]) -> Any:
        return pgrecv(
            "spark-apply", *inputs, "--target", f"s3://{bucket}/lake", "--format", "delta", "--delta-engine", "spark",
            "--json", "--remote", spark_connect.url, env=s3_server.env, timeout=900,
        )  # fmt: skip

    for inputs in (urls[:1], urls):  # a first run creates the tables; the second merges into them
        proc = apply(inputs)
        assert proc.returncode == 0, f"{err(proc)}\n{spark_connect.log.read_text()[-3000:]}"
    summary = orjson.loads(proc.stdout)
    assert summary["engine"] == "delta/spark"
    target = tmp_path / "lake"
    download(s3_server, bucket, "lake", target)
    truth = gen.truth()
    for t in gen.tables:
        assert delta_rows(t, target) == _expected(t, truth[(t.schema, t.name)]), f"{t.schema}.{t.name} ({t.kind})"
    merged = [t for t in summary["tables"] if t["status"] == "applied" and t["updates"] + t["deletes"] > 0]
    assert merged, summary["tables"]
    for t in merged:
        recorded = DeltaTable(str(target / Path(t["path"]).name)).transaction_version(app_id(t["table"]))
        assert recorded == int(LSN.parse(t["applied_lsn"])), (t, recorded)
    again = apply(urls)
    assert again.returncode == 0, err(again)
    assert {t["status"] for t in orjson.loads(again.stdout)["tables"]} == {"up to date"}


def test_connect_history_mode(spark_connect: ConnectServer, stream: tuple[Gen, list[Path]], tmp_path: Path) -> None:
    """--mode history through the server with Delta's connector: the MERGE that closes versions and
    inserts new ones is SQL text there (frames.history_merge_sql, which Iceberg's MERGE runs in
    every mode: tests/spark/test_iceberg.py); the live versions are the truth and each key's
    versions form one chain."""
    from tests.spark.test_delta_spark import _read as read_delta
    from tests.spark.test_differential import assert_history

    writer = ("delta", "--delta-engine", "spark")

    gen, files = stream
    target = tmp_path / "lake"
    for inputs in ([files[0]], files):
        proc = apply_remote(spark_connect, inputs, target, "--format", *writer, "--mode", "history")
        assert proc.returncode == 0, f"{err(proc)}\n{spark_connect.log.read_text()[-3000:]}"
    truth = gen.truth()
    for t in gen.tables:
        path = target / table_dir_name(t.schema, t.name)
        got = read_delta(path) if path.exists() else []
        assert_history(t, got, truth[(t.schema, t.name)], f"{t.schema}.{t.name} ({t.kind})")


def test_connect_holds_back_an_iceberg_table_with_uuid_columns(spark_connect: ConnectServer, tmp_path: Path) -> None:
    """Iceberg's uuid type is made through Iceberg's Java API, which Spark Connect does not
    offer: that table alone is held back in one line (exit 15), the other one is applied."""
    from tests.spark.test_command import _rel, _row, _txn, _write
    from tests.spark.test_iceberg import _change

    cols = [{"name": "id", "type": "integer", "typmod": -1, "key": True}, {"name": "u", "type": "uuid", "typmod": -1}]
    u = "0b9c5f4e-2a51-4a6e-9d2c-3f1e7a8b6c5d"
    f = _write(tmp_path / "1.jsonl", [
        _rel("t"), {**_rel("g"), "columns": cols},
        *_txn("0/1000", _row("insert", "t", "0/1000", "0/100", 1, "a"),
              _change("insert", "g", "0/1000", "0/101", {"id": 1}, {"u": u})),
    ])  # fmt: skip
    proc = apply_remote(spark_connect, [f], tmp_path / "lake", "--format", "iceberg")
    assert proc.returncode == ExitCode.PARTLY_APPLIED, err(proc)
    assert "uuid column(s) u" in err(proc) and "Traceback" not in err(proc), err(proc)
    status = {t["table"]: t["status"] for t in orjson.loads(proc.stdout)["tables"]}
    assert status == {"s.t": "applied", "s.g": "held back"}, status


@pytest.mark.newest_server  # the subject is Spark Connect; verify's cases on both servers are tests/verify's
@pytest.mark.parametrize("fmt", ["parquet", "delta", "iceberg"])
def test_verify_through_connect(spark_connect: ConnectServer, db_dsn: str, tmp_path: Path, fmt: str) -> None:
    """``pgrecv verify --remote``: the lake's side (its tables read, their rows hashed per key range,
    the rows of differing ranges) and the catch-up's apply run on the server. Changes not applied
    are found by key; caught up, the lake is equal; --master with SPARK_REMOTE is one line."""
    sql(db_dsn, "CREATE TABLE b (id bigint PRIMARY KEY, v text); CREATE TABLE c (id int PRIMARY KEY, n numeric(6,1))")
    sql(db_dsn, "CREATE PUBLICATION pub FOR ALL TABLES")
    sql(db_dsn, "INSERT INTO b SELECT i, 'b' || i FROM generate_series(1, 90) i")
    sql(db_dsn, "INSERT INTO c SELECT i, i / 10.0 FROM generate_series(1, 30) i")
    src, lake = tmp_path / "cdc", tmp_path / "lake"
    proc = pgrecv("snapshot", "-d", db_dsn, "--slot", "s", "--output-dir", str(src))
    assert proc.returncode == 0, err(proc)
    sql(db_dsn, "UPDATE b SET v = NULL WHERE id = 2")
    proc = pgrecv("start", "-d", db_dsn, "--slot", "s", "--output-dir", str(src), "--until-caught-up")
    assert proc.returncode == 0, err(proc)
    proc = apply_remote(spark_connect, [src], lake, "--format", fmt)
    assert proc.returncode == 0, f"{err(proc)}\n{spark_connect.log.read_text()[-3000:]}"
    sql(db_dsn, "UPDATE b SET v = 'later' WHERE id = 3; DELETE FROM b WHERE id = 4; INSERT INTO b VALUES (1000, 'x')")
    args = ("verify", "-d", db_dsn, "--slot", "s", "--target", str(lake), "--format", fmt, "--source", str(src))

    def verify(*extra: str) -> tuple[int, dict[str, Any]]:
        proc = pgrecv(*args, "--json", "--remote", spark_connect.url, *extra, timeout=600)
        assert "Traceback" not in err(proc), err(proc)
        return proc.returncode, orjson.loads(proc.stdout) if proc.stdout.strip() else {}

    code, doc = verify("--no-catch-up")
    assert code == ExitCode.DIFFERENT, doc
    tables = {t["table"]: t for t in doc["tables"]}
    assert (tables["public.b"]["missing_keys"], tables["public.b"]["extra_keys"]) == (["id=1000"], ["id=4"]), doc
    assert tables["public.b"]["changed_rows"] == [{"key": "id=3", "columns": ["v"]}], doc
    assert tables["public.c"]["status"] == "equal", doc
    code, doc = verify()  # streamed up to the snapshot, applied through the server, compared there
    assert code == 0, doc
    assert doc["caught_up"] and [t["status"] for t in doc["tables"]] == ["equal", "equal"], doc
    proc = pgrecv(*args, "--master", "local[1]", env={"SPARK_REMOTE": spark_connect.url})
    assert proc.returncode == ExitCode.USAGE and "exclude each other" in err(proc), err(proc)


@pytest.mark.parametrize(
    "extra,says",
    [
        (("--format", "parquet", "--conf", "spark.jars=/nowhere.jar"), "--conf spark.jars"),
    ],
)
def test_what_spark_connect_cannot_do_is_one_line(
    spark_connect: ConnectServer, stream: tuple[Gen, list[Path]], tmp_path: Path, extra: tuple[str, ...], says: str
) -> None:
    _, files = stream
    proc = apply_remote(spark_connect, files, tmp_path / "t", *extra)
    assert proc.returncode == ExitCode.USAGE, err(proc)
    assert says in err(proc) and len(err(proc).strip().splitlines()) == 1 and "Traceback" not in err(proc)
    assert not (tmp_path / "t").exists() or not any(p for p in (tmp_path / "t").iterdir() if p.name != "_pgrecv")


def test_no_server_and_both_masters_are_one_line(stream: tuple[Gen, list[Path]], tmp_path: Path) -> None:
    _, files = stream
    nobody = f"sc://127.0.0.1:{_free_port()}"
    args = ("spark-apply", *map(str, files), "--target", str(tmp_path / "t"), "--format", "parquet")
    proc = pgrecv(*args, "--remote", nobody, timeout=300)
    assert proc.returncode == ExitCode.SPARK, err(proc)
    assert nobody in err(proc) and len(err(proc).strip().splitlines()) == 1
    proc = pgrecv(*args, "--master", "local[1]", env={"SPARK_REMOTE": nobody})
    assert proc.returncode == ExitCode.USAGE and "exclude each other" in err(proc)


NAMES = ["a b", "a%20b", "a+b", "ü/é", "a#b", "a?b", "[x]", "{y}", "a;b=c,d", "@~!$&'()*", "tab\tx", "nbsp\u00a0x"]


@pytest.mark.parametrize("name", NAMES)
def test_spelling_without_the_jvm_is_hadoops(spark: Any, name: str) -> None:
    """`_metadata.file_path` is matched against pgrecv's spelling of each file; under Spark
    Connect it cannot ask Hadoop's Path, so it spells it as java.net.URI does: the same text."""
    assert java_raw_path(f"/d/{name}") == _hadoop(spark, f"/d/{name}")


# a file's name: not "." or "..", which name a directory (Hadoop's Path drops and resolves them;
# pgrecv spells only files it listed)
@settings(max_examples=200, deadline=None)
@given(
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00/"), min_size=1, max_size=12).filter(
        lambda n: n not in (".", "..")
    )
)
def test_spelling_property(spark: Any, name: str) -> None:
    assert java_raw_path(f"/d/{name}") == _hadoop(spark, f"/d/{name}")


def _hadoop(spark: Any, path: str) -> str:
    return str(spark._jvm.org.apache.hadoop.fs.Path("file://" + path).toUri().getRawPath())
