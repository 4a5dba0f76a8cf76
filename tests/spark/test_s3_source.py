"""``spark-apply s3://BUCKET/PREFIX``: change files read from a real S3-compatible server (moto's,
on 127.0.0.1): the driver lists and reads through pyarrow's S3 file system, Spark's tasks through
Hadoop's S3A connector (jvm/s3a/pom.xml). The tables equal PostgreSQL's, and a local run's."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from pgrecv.errors import ExitCode
from tests.conftest import ApplyHere, S3Server
from tests.stream.test_start import insert_txns
from tests.util import err, pgrecv, sql

pytest.importorskip("pyspark")
SEED = 5151
FAST = ("--conf", "spark.sql.shuffle.partitions=2", "--master", "local[2]")


def apply_s3(s3: S3Server, jars: str, sources: list[str], target: Path | str, *extra: str) -> Any:
    return pgrecv(
        "spark-apply", *sources, "--target", str(target), *FAST, "--conf", f"spark.jars={jars}", "--json", *extra,
        env=s3.env, timeout=900,
    )  # fmt: skip


def changes_to_s3(
    db_dsn: str, s3: S3Server | None, url: str, after_snapshot: Callable[[], object] | None = None
) -> None:
    """Table ``t`` made, changed and streamed to ``url`` (on ``s3``, or a local directory when it
    is None) by the real tool: `snapshot` (then ``after_snapshot``, if given), then inserts,
    updates and deletes, then `start --until-caught-up` in files of about 1 kB."""
    env = s3.env if s3 is not None else {}
    sql(db_dsn, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    sql(db_dsn, "CREATE PUBLICATION pub FOR ALL TABLES")
    insert_txns(db_dsn, 1, 4)
    proc = pgrecv("snapshot", "-d", db_dsn, "--slot", "s", "--output-dir", url, env=env)
    assert proc.returncode == 0, err(proc)
    if after_snapshot is not None:
        after_snapshot()
    insert_txns(db_dsn, 5, 6)
    sql(db_dsn, "UPDATE t SET v = 'changed' WHERE id % 4 = 0")
    sql(db_dsn, "DELETE FROM t WHERE id % 5 = 0")
    proc = pgrecv(
        "start", "-d", db_dsn, "--slot", "s", "--output-dir", url, "--until-caught-up", "--rotate-size", "1kB",
        env=env,
    )  # fmt: skip
    assert proc.returncode == 0, err(proc)


# PostgreSQL to S3 to tables: tests/spark/test_s3_target.py (the tables on S3 as well).


# The generated stream read from S3 (keys URIs quote) is tests/spark/test_s3_target.py's, written onto S3.


def test_a_bad_line_is_named_by_its_object_and_line(s3_server: S3Server, s3_here: ApplyHere, tmp_path: Path) -> None:
    bucket = s3_server.bucket()
    good = b'{"v":1,"op":"begin","xid":1,"lsn":"0/10","commit_lsn":"0/20"}\n'
    bad = tmp_path / "0000000000000010-0000000000000020.jsonl"
    bad.write_bytes(good + b"{not json\n")
    s3_server.upload(bucket, "p", [bad])
    proc = s3_here([f"s3://{bucket}/p"], tmp_path / "lake", "--format", "parquet")
    assert proc.returncode == ExitCode.INPUT, err(proc)
    assert f"s3://{bucket}/p/{bad.name}:2" in err(proc), err(proc)
    assert "Traceback" not in err(proc)


@pytest.mark.parametrize("case", ["no-bucket", "no-prefix", "no-match", "other-scheme", "no-s3a-jars"])
def test_what_cannot_be_read_is_one_line(s3_server: S3Server, tmp_path: Path, case: str) -> None:
    bucket = s3_server.bucket()
    f = tmp_path / "0000000000000010-0000000000000020.jsonl"
    f.write_bytes(
        b'{"v":1,"op":"begin","xid":1,"lsn":"0/10","commit_lsn":"0/20"}\n{"v":1,"op":"commit","xid":1,"lsn":"0/20"}\n'
    )
    s3_server.upload(bucket, "p", [f])
    source = {
        "no-bucket": "s3://pgrecv-no-such-bucket/p",
        "no-prefix": f"s3://{bucket}/nothing-here",
        "no-match": f"s3://{bucket}/p/*.json",
        "other-scheme": "abfss://container@account.dfs.core.windows.net/p",
        "no-s3a-jars": f"s3://{bucket}/p",
    }[case]
    proc = pgrecv(
        "spark-apply", source, "--target", str(tmp_path / "lake"), "--format", "parquet", *FAST, env=s3_server.env
    )
    expected = ExitCode.USAGE if case in ("other-scheme", "no-s3a-jars") else ExitCode.INPUT
    assert proc.returncode == expected, err(proc)
    text = err(proc)
    assert len(text.strip().splitlines()) == 1 and "Traceback" not in text, text
    assert s3_server.env["AWS_SECRET_ACCESS_KEY"] not in text
    if case == "no-s3a-jars":
        assert "S3A" in text and "jvm/s3a/pom.xml" in text
    else:
        assert source in text


def test_a_prefix_with_files_it_does_not_take_warns(s3_server: S3Server, tmp_path: Path) -> None:
    """A prefix holding only a `changes.jsonl` (not a name `start` gives): nothing to apply, and the
    run says which files it left, as it does for a local directory."""
    bucket = s3_server.bucket()
    f = tmp_path / "changes.jsonl"
    f.write_bytes(b'{"v":1,"op":"begin","xid":1,"lsn":"0/10","commit_lsn":"0/20"}\n')
    s3_server.upload(bucket, "p", [f])
    proc = pgrecv(
        "spark-apply", f"s3://{bucket}/p", "--target", str(tmp_path / "lake"), "--format", "parquet", "--json",
        env=s3_server.env,
    )  # fmt: skip
    assert proc.returncode == 0, err(proc)
    summary = orjson.loads(proc.stdout)
    assert summary["files"] == 0
    assert any(f"s3://{bucket}/p: 1 file(s) not taken (changes.jsonl)" in w for w in summary["warnings"]), summary
