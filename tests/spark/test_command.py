"""`pgrecv spark-apply` as cron and people run it: its exit codes, stdout and stderr.

Hand-written JSONL (docs/event-format.md). Most runs go through the CLI's own entry point in this
process, on the test session's SparkSession (the command takes the active one, as under
spark-submit): a JVM start per run made this file the suite's slowest. What only a process of its
own shows (Spark's console noise kept off, a JVM that does not start, stdout on a full disk, no
JVM when there is nothing to read) runs as a subprocess.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from pgrecv.spark.model import table_dir_name
from tests.util import err, pgrecv
from tests.util import pgrecv_here as _here

pytest.importorskip("pyspark")
deltalake = pytest.importorskip("deltalake")
# every run here may take the session's SparkSession (started once per test process)
pytestmark = pytest.mark.usefixtures("spark")

WIDE = {"COLUMNS": "200"}


def _rel(table: str) -> dict[str, Any]:
    return {
        "op": "relation",
        "schema": "s",
        "table": table,
        "replica_identity": "default",
        "key": ["id"],
        "columns": [
            {"name": "id", "type": "integer", "typmod": -1, "key": True},
            {"name": "x", "type": "text", "typmod": -1, "key": False},
        ],
    }


def _row(op: str, table: str, commit: str, lsn: str, i: int, x: str | None = None) -> dict[str, Any]:
    rec: dict[str, Any] = {"op": op, "schema": "s", "table": table, "commit_lsn": commit, "lsn": lsn}
    if op == "delete":
        rec["old"] = {"id": i}
    else:
        rec["new"] = {"id": i, "x": x}
        rec["unchanged_toast"] = []
    return rec


def _txn(commit: str, *rows: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"op": "begin", "commit_lsn": commit}, *rows, {"op": "commit", "commit_lsn": commit}]


def _write(path: Path, records: list[dict[str, Any]], raw: dict[int, bytes] | None = None) -> Path:
    lines = [orjson.dumps({"v": 1, **r}) + b"\n" for r in records]
    for index, line in (raw or {}).items():
        lines[index] = line
    path.write_bytes(b"".join(lines))
    return path


def _first(tmp: Path) -> Path:
    return _write(
        tmp / "1.jsonl",
        [
            _rel("t"),
            _rel("u"),
            *_txn("0/100", _row("insert", "t", "0/100", "0/10", 1, "a"), _row("insert", "u", "0/100", "0/11", 1, "u1")),
            # 0/1000 after 0/200 as integers (as strings "0/1000" < "0/200")
            *_txn("0/200", _row("update", "t", "0/200", "0/150", 1, "b"), _row("insert", "t", "0/200", "0/151", 2)),
            *_txn("0/1000", _row("delete", "t", "0/1000", "0/900", 2), _row("insert", "u", "0/1000", "0/901", 2)),
        ],
    )


def _rows(target: Path, table: str) -> list[dict[str, Any]]:
    rows = deltalake.DeltaTable(str(target / table_dir_name("s", table))).to_pyarrow_table().to_pylist()
    return sorted(rows, key=lambda r: r["id"])


def _apply(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    return _here("spark-apply", *args, "--format", "delta", "--delta-engine", "delta-rs", env=env)


def test_json_summary_and_rerun_up_to_date(tmp_path: Path) -> None:
    src = _first(tmp_path)
    target = tmp_path / "lake"
    # one run as a process of its own (the JVM it starts stays quiet); the rest in this process
    delta = ("--format", "delta", "--delta-engine", "delta-rs")
    proc = pgrecv("spark-apply", str(src), "--target", str(target), "--json", *delta)
    assert proc.returncode == 0, err(proc)
    assert proc.stderr == b""
    summary = orjson.loads(proc.stdout)
    assert summary["engine"] == "delta/delta-rs+spark"
    assert (summary["files"], summary["transactions"]) == (1, 3)
    by_table = {t["table"]: t for t in summary["tables"]}
    assert set(by_table) == {"s.t", "s.u"}
    assert by_table["s.t"]["status"] == by_table["s.u"]["status"] == "applied"
    assert by_table["s.t"]["applied_lsn"] == "0/1000" and by_table["s.u"]["applied_lsn"] == "0/1000"
    # changes read from the input (key 2 is born and gone within the batch)
    assert [by_table["s.t"][k] for k in ("inserts", "updates", "deletes", "truncates")] == [2, 1, 1, 0]
    assert _rows(target, "t") == [{"id": 1, "x": "b"}]
    assert _rows(target, "u") == [{"id": 1, "x": "u1"}, {"id": 2, "x": None}]

    again = _apply(str(src), "--target", str(target), "--json")
    assert again.returncode == 0, err(again)
    tables = orjson.loads(again.stdout)["tables"]
    assert {t["status"] for t in tables} == {"up to date"}
    assert [t["version"] for t in tables] == [by_table[t["table"]]["version"] for t in tables]
    human = _apply(str(src), "--target", str(target), env=WIDE)
    assert human.returncode == 0, err(human)
    out = human.stdout.decode()
    assert out.count("up to date") == 2 and "0/1000" in out and "applied position" in out


def test_table_filter(tmp_path: Path) -> None:
    src = _first(tmp_path)
    target = tmp_path / "lake"
    proc = _apply(str(src), "--target", str(target), "--table", "s.u", "--json")
    assert proc.returncode == 0, err(proc)
    assert [t["table"] for t in orjson.loads(proc.stdout)["tables"]] == ["s.u"]
    assert not (target / table_dir_name("s", "t")).exists()
    proc = _apply(str(src), "--target", str(target), "--table", "nomatch.*", env=WIDE)
    assert proc.returncode == 0, err(proc)
    assert "nothing new" in proc.stdout.decode()
    proc = _apply(str(src), "--target", str(target), "--table", "s.[tu]", "--json")
    assert {t["table"]: t["status"] for t in orjson.loads(proc.stdout)["tables"]} == {
        "s.t": "applied",
        "s.u": "up to date",
    }


def test_corrupt_line_is_named_and_nothing_applied(tmp_path: Path) -> None:
    target = tmp_path / "lake"
    assert _apply(str(_first(tmp_path)), "--target", str(target)).returncode == 0
    before = (_rows(target, "t"), _rows(target, "u"))
    records = [_rel("t"), _rel("u"), *_txn("0/2000", _row("insert", "t", "0/2000", "0/1900", 5, "new"))]
    records += _txn("0/3000", _row("insert", "u", "0/3000", "0/2900", 6, "new"))
    truncated = orjson.dumps({"v": 1, **records[6]})[:-9] + b"\n"  # the insert into u, cut short
    bad = _write(tmp_path / "2.jsonl", records, raw={6: truncated})
    proc = _apply(str(bad), "--target", str(target))
    assert proc.returncode == 9, err(proc)
    assert f"{bad}:7:" in err(proc)
    assert "Traceback" not in err(proc) and len(err(proc).splitlines()) == 1
    assert (_rows(target, "t"), _rows(target, "u")) == before


def test_colons_in_file_directory_and_table_names(tmp_path: Path) -> None:
    """Hadoop cannot read a file whose name holds ':' (its checksum file's name does not parse as
    a URI): such inputs are read through a link, and messages still name the real file."""
    src = tmp_path / "in:put"
    src.mkdir()
    rows = [_rel("a:b"), *_txn("0/100", _row("insert", "a:b", "0/100", "0/10", 1, "x"))]
    first = src / "changes.jsonl"  # a link whose target's name holds ':' (Spark is given the target)
    first.symlink_to(_write(src / "ch:anges.jsonl", rows))
    target = tmp_path / "la:ke"
    proc = _apply(str(first), "--target", str(target), "--json")
    assert proc.returncode == 0, err(proc)
    assert orjson.loads(proc.stdout)["tables"][0]["table"] == "s.a:b"
    assert _rows(target, "a:b") == [{"id": 1, "x": "x"}]
    records = [_rel("a:b"), *_txn("0/200", _row("insert", "a:b", "0/200", "0/150", 2, "y"))]
    bad = _write(src / "more:changes.jsonl", records, raw={2: b'{"v":1,"op":"insert","sch\n'})
    proc = _apply(str(bad), "--target", str(target))
    assert proc.returncode == 9, err(proc)
    assert f"error: {bad}:3: not a valid JSON record" in err(proc) and len(err(proc).splitlines()) == 1
    assert not list((target / "_pgrecv").glob("*-inputs"))  # the links are gone with the run


def _bad_value_run(tmp_path: Path, value: object) -> tuple[Any, Path, Path]:
    target = tmp_path / "lake"
    assert _apply(str(_first(tmp_path)), "--target", str(target)).returncode == 0
    bad_row = {**_row("insert", "u", "0/3000", "0/2900", 0), "new": {"id": value, "x": "y"}}
    records = [_rel("t"), _rel("u"), *_txn("0/3000", _row("insert", "u", "0/3000", "0/2899", 9, "ok"), bad_row)]
    bad = _write(tmp_path / "2.jsonl", records)
    return _apply(str(bad), "--target", str(target)), bad, target


@pytest.mark.parametrize("value", ["seven", 2**40])
def test_bad_value_fails_and_its_table_is_not_applied(tmp_path: Path, value: object) -> None:
    proc, bad, target = _bad_value_run(tmp_path, value)
    assert proc.returncode == 15, err(proc)  # partly applied: that table is held back (the only one here)
    assert f"{bad}:5:" in err(proc) and "column id" in err(proc) and "Traceback" not in err(proc)
    assert _rows(target, "u") == [{"id": 1, "x": "u1"}, {"id": 2, "x": None}]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--target", "{tmp}/no/such/dir"], "parent directory does not exist"),
        (["--target", "{tmp}/1.jsonl"], "not a directory"),
        (["--target", "{tmp}/lake", "--no-such-option"], "No such option"),
        (["--target", "{tmp}/lake", "--conf", "novalue"], "expected key=value"),
        (["--target", "{tmp}/lake", "--mode", "sideways"], "Invalid value"),
        (["--target", "{tmp}/lake", "--key", "orders=id"], "the table must be SCHEMA.TABLE"),
        (["--target", "{tmp}/lake", "--key", "public.t=a", "--key", "public.t=b"], "has another --key"),
    ],
)
def test_usage_errors_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    src = _first(tmp_path)
    proc = _apply(str(src), *(a.replace("{tmp}", str(tmp_path)) for a in args))
    assert proc.returncode == 2, err(proc)
    assert message in err(proc) and "Traceback" not in err(proc)
    assert proc.stdout == b""
    assert not (tmp_path / "no").exists() and not (tmp_path / "lake").exists()


def test_missing_source_exits_9(tmp_path: Path) -> None:
    proc = _apply(str(tmp_path / "nothere.jsonl"), "--target", str(tmp_path / "lake"))
    assert proc.returncode == 9, err(proc)
    assert "nothere.jsonl" in err(proc) and "Traceback" not in err(proc)


def test_parquet_run_keeps_spark_quiet(tmp_path: Path) -> None:
    """A JVM starts here: its banners and log lines must not reach the user's stderr."""
    src = _first(tmp_path)
    target = tmp_path / "lake"
    proc = pgrecv("spark-apply", str(src), "--target", str(target), "--format", "parquet", "--master", "local[1]")
    assert proc.returncode == 0, err(proc)
    assert proc.stderr == b"", err(proc)
    assert "applied" in proc.stdout.decode()
    import pyarrow.parquet as pq

    rows = pq.read_table(target / table_dir_name("s", "u") / "current").to_pylist()
    assert sorted(rows, key=lambda r: r["id"]) == [{"id": 1, "x": "u1"}, {"id": 2, "x": None}]


@contextlib.contextmanager
def held_target(target: Path | str, env: dict[str, str] | None = None) -> Iterator[int]:
    """``target``'s lock held by another process (as a run holds it) while the block runs: a
    local directory, or an ``s3://`` or ``gs://`` URL (the store found through ``env``); yields its pid."""
    hold = (
        "import sys, pathlib\n"
        "from pgrecv.spark.targets import LocalTarget, StoreTarget\n"
        "where = sys.argv[1]\n"
        "target = StoreTarget.of(where) if '://' in where else LocalTarget(pathlib.Path(where))\n"
        "with target.lock():\n"
        "    print('held', flush=True)\n"
        "    sys.stdin.read()\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", hold, str(target)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=None if env is None else {**os.environ, **env},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        yield holder.pid
    finally:
        holder.communicate(b"")


def assert_busy(proc: subprocess.CompletedProcess[bytes]) -> None:
    """A run refused because another holds its target: one line, exit 8."""
    assert proc.returncode == 8, err(proc)
    lines = proc.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "another spark-apply run is applying to this target" in lines[0], lines


def test_second_run_on_a_busy_target_is_refused(tmp_path: Path) -> None:
    """Two runs on one target would both apply the same changes (``--append-only`` appended them
    twice): while one holds the target, another says so in one line, exit 8, and writes nothing."""
    src = _first(tmp_path)
    target = tmp_path / "lake"
    with held_target(target):
        assert_busy(_apply(str(src), "--target", str(target)))
        assert not (target / table_dir_name("s", "t")).exists()
    # the holder is gone: the lock went with it (also when a run is killed)
    proc = _apply(str(src), "--target", str(target))
    assert proc.returncode == 0, err(proc)
    assert _rows(target, "t") == [{"id": 1, "x": "b"}]
    assert oct((target / "_pgrecv").stat().st_mode & 0o777) == "0o700"
    assert oct((target / "_pgrecv" / "lock").stat().st_mode & 0o777) == "0o600"


# Delta --append-only only: a second run would append every change again, and the lock is the same
# for every format (the Parquet case took 77 s of CI, 2026-12-06)
@pytest.mark.parametrize(("fmt", "extra"), [("delta", ("--append-only",))])
def test_two_runs_started_at_once_under_load(tmp_path: Path, fmt: str, extra: tuple[str, ...]) -> None:
    """Two runs started together on one target while busy loops load every core (issue 54 saw a
    traceback from one of them on a loaded machine): each ends with exit 0 or the one-line
    refusal (exit 8), never a traceback, and the table holds each change once."""
    src = _first(tmp_path)
    target = tmp_path / "lake"
    # a busy loop per core (two per core took the machine as fully, for 14 s more: 131 against 103 CPU-s)
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        cmd = [sys.executable, "-m", "pgrecv", "spark-apply", str(src), "--target", str(target), "--format", fmt]
        runs = [subprocess.Popen([*cmd, *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
        done = [(r.wait(timeout=600), r.communicate()[1].decode()) for r in runs]
    finally:
        for b in burners:
            b.kill()
            b.wait()
    assert all(code in (0, 8) and "Traceback" not in stderr for code, stderr in done), done
    assert 0 in [code for code, _ in done], done
    for code, stderr in done:
        if code == 8:
            assert "another spark-apply run is applying to this target" in stderr and len(stderr.splitlines()) == 1
    # the table one run alone makes (in this process: the race is over)
    alone = tmp_path / "alone"
    proc = _here(*cmd[3:6], str(alone), *cmd[7:], *extra)
    assert proc.returncode == 0, err(proc)
    for table in ("t", "u"):
        if fmt == "delta":
            assert _rows(target, table) == _rows(alone, table)
        else:
            import pyarrow.parquet as pq

            def rows(lake: Path, table: str = table) -> list[dict[str, Any]]:
                got = pq.read_table(lake / table_dir_name("s", table) / "current").to_pylist()
                return sorted(got, key=lambda r: r["id"])

            assert rows(target) == rows(alone)


@pytest.mark.parametrize(
    ("args", "env", "reason"),
    [
        (["--master", "bogus://x"], {}, "Master must either be yarn or start with spark, k8s, or local"),
        (["--conf", "spark.driver.memory=lots"], {}, "Invalid maximum heap size: -Xmxlots"),
        ([], {"JAVA_HOME": "/nonexistent"}, "/nonexistent/bin/java: No such file or directory"),
    ],
    ids=["master", "conf", "no-java"],
)
def test_spark_that_does_not_start_is_one_line_exit_16(
    tmp_path: Path, args: list[str], env: dict[str, str], reason: str
) -> None:
    """The JVM's launcher fails before pyspark hears why (its error: "Java gateway process exited"):
    the reason is taken from what the launcher printed, and nothing of the target is touched."""
    src = _first(tmp_path)
    target = tmp_path / "lake"
    proc = pgrecv("spark-apply", str(src), "--target", str(target), "--format", "parquet", *args, env=env)
    assert proc.returncode == 16, err(proc)
    assert err(proc).splitlines() == [
        f"pgrecv: error: Spark did not start (master {'bogus://x' if args[:1] == ['--master'] else 'local[*]'}): "
        f"{reason}; check --master, --conf and that Java (17 or newer) is installed"
    ]
    assert not (target / table_dir_name("s", "t")).exists()


def test_target_where_nothing_can_be_made_exits_8(tmp_path: Path) -> None:
    """A target whose state directory cannot be made (here a file has its name): one line, exit 8,
    before Spark starts."""
    target = tmp_path / "lake"
    target.mkdir()
    (target / "_pgrecv").write_text("not a directory")
    proc = _apply(str(_first(tmp_path)), "--target", str(target))
    assert proc.returncode == 8, err(proc)
    assert err(proc).startswith(f"pgrecv: error: cannot create the target's state directory {target / '_pgrecv'}: ")
    assert err(proc).count("\n") == 1 and "Traceback" not in err(proc)


@pytest.mark.parametrize(("made", "given"), [("parquet", "delta"), ("delta", "parquet")])
def test_a_table_of_the_other_format_is_refused_untouched(tmp_path: Path, made: str, given: str) -> None:
    """--format that differs from the target's tables: one line, exit 2, the table untouched. (It
    used to write the other format's table into the same directory: two tables in one.)"""
    src = _first(tmp_path)
    target = tmp_path / "lake"
    first = _here("spark-apply", str(src), "--target", str(target), "--format", made)
    assert first.returncode == 0, err(first)
    table = target / table_dir_name("s", "t")
    before = sorted(str(p.relative_to(table)) for p in table.rglob("*"))
    proc = _here("spark-apply", str(src), "--target", str(target), "--format", given)
    assert proc.returncode == 2, err(proc)
    name = "a Delta table" if made == "delta" else "a Parquet table of spark-apply's"
    assert err(proc) == f"pgrecv: error: {table} is {name}: use --format {made} with this target, or another --target\n"
    assert sorted(str(p.relative_to(table)) for p in table.rglob("*")) == before


@pytest.mark.parametrize("args", [[], ["--json"]], ids=["table", "json"])
def test_summary_onto_a_full_disk_is_one_line_exit_8(tmp_path: Path, args: list[str]) -> None:
    """The tables are applied; the summary that cannot be written is one line, exit 8, where
    --json's buffered write let ENOSPC through as a traceback (exit 1)."""
    target = tmp_path / "lake"
    cmd = [sys.executable, "-m", "pgrecv", "spark-apply", str(_first(tmp_path)), "--target", str(target)]
    with open("/dev/full", "wb") as full:
        cmd += ["--format", "delta", *args]
        proc = subprocess.run(cmd, stdout=full, stderr=subprocess.PIPE, timeout=300)
    stderr = proc.stderr.decode()
    assert proc.returncode == 8, stderr
    assert stderr.count("\n") == 1 and stderr.startswith(
        "pgrecv: error: cannot write standard output: No space left on device; the file system is full"
    ), stderr
    assert _rows(target, "t") == [{"id": 1, "x": "b"}]


def test_a_directory_without_finished_files_starts_no_spark_and_names_what_it_did_not_take(tmp_path: Path) -> None:
    """A cron run before the stream's first file has nothing to read: it starts no JVM (here none
    could start) and exits 0. A .jsonl file that a directory does not take (not named by `pgrecv
    start --output-dir`) is named in a warning, not passed over in silence."""
    src = tmp_path / "in"
    src.mkdir()
    _first(src).rename(src / "changes.jsonl")
    (src / ".tmp-abc.part").write_bytes(b"{}")  # a file being written: not taken, not named
    target = tmp_path / "lake"
    proc = pgrecv(
        "spark-apply", str(src), "--target", str(target), "--format", "parquet", "--json",
        env={"JAVA_HOME": "/nonexistent"},
    )  # fmt: skip
    assert proc.returncode == 0, err(proc)
    summary = orjson.loads(proc.stdout)
    assert summary["files"] == 0 and summary["tables"] == []
    assert len(summary["warnings"]) == 1, summary["warnings"]
    assert "1 file(s) not taken (changes.jsonl)" in summary["warnings"][0]
    assert "FIRST-LAST.jsonl" in summary["warnings"][0]


def test_the_in_driver_replay_is_gone_and_replay_is_a_deprecated_no_op(tmp_path: Path) -> None:
    """--replay left the help (spark-apply replays in Spark only); ``--replay driver`` is refused
    before anything is read or started, ``--replay spark`` warns and applies."""
    help_text = _here("spark-apply", "--help").stdout.decode()
    assert "--replay" not in help_text and "driver" not in help_text
    src = _first(tmp_path)
    target = tmp_path / "lake"
    gone = _here("spark-apply", str(src), "--target", str(target), "--format", "delta", "--replay", "driver")
    assert gone.returncode == 2 and not target.exists()
    assert err(gone) == (
        "pgrecv: error: --replay driver: the in-driver replay is gone (spark-apply replays in Spark): leave it out\n"
    )
    proc = _here("spark-apply", str(src), "--target", str(target), "--format", "delta", "--replay", "spark")
    assert proc.returncode == 0, err(proc)
    assert "warning: --replay is deprecated and does nothing" in err(proc)
    assert _rows(target, "t") == [{"id": 1, "x": "b"}]


def _random_rows(path: Path, rows: int, width: int) -> None:
    """A relation and one transaction of ``rows`` inserts of incompressible text."""
    import os

    rel = {"v": 1, "op": "relation", "schema": "public", "table": "t", "replica_identity": "default", "key": ["id"]}
    rel["columns"] = [
        {"name": "id", "type": "integer", "typmod": -1, "key": True},
        {"name": "x", "type": "text", "typmod": -1, "key": False},
    ]
    env = {"xid": 1, "commit_lsn": "0/F0000000", "commit_time": None}
    lines = [orjson.dumps(rel), orjson.dumps({"v": 1, "op": "begin", **env})]
    for i in range(rows):
        change = {"v": 1, "op": "insert", "schema": "public", "table": "t", "xid": 1, "commit_lsn": "0/F0000000"}
        change |= {"lsn": f"0/{i + 16:X}", "key": ["id"], "new": {"id": i, "x": os.urandom(width).hex()}}
        lines.append(orjson.dumps({**change, "unchanged_toast": []}))
    lines.append(orjson.dumps({"v": 1, "op": "commit", **env, "end_lsn": "0/F0000010"}))
    path.write_bytes(b"\n".join(lines) + b"\n")


def test_a_full_target_device_is_one_line_and_exit_8(tmp_path: Path) -> None:
    """A target on a full device (a 1 MB tmpfs, mounted as root) ends the run with one line and
    exit 8, not a Java and Python stack and exit 1 (issue 54, L2); nothing is applied."""
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(tiny)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (as root, CI can): {mounted.stderr.decode().strip()}")
    try:
        src = tmp_path / "big.jsonl"
        _random_rows(src, 3000, 600)  # ~3.6 MB of random text: more than the device holds
        proc = _here("spark-apply", str(src), "--target", str(tiny / "lake"), "--format", "parquet")
        assert proc.returncode == 8, err(proc)
        lines = err(proc).strip().splitlines()
        assert "Traceback" not in err(proc) and len(lines) == 1, err(proc)
        assert lines[0] == (
            f"pgrecv: error: {tiny / 'lake'}: no space left on a device this run writes to (the target, or Spark's "
            "scratch space): free some and run spark-apply again (every table is at its last applied position)"
        )
        assert not (tiny / "lake" / table_dir_name("public", "t") / "_pgrecv_table.json").exists()
    finally:
        subprocess.run(["umount", str(tiny)], check=False)


def test_an_unreadable_source_is_one_line_and_exit_9(tmp_path: Path) -> None:
    """A SOURCE file or directory the user cannot read: one line naming it, exit 9, before Spark
    starts (issue 54, L2: a Java stack and exit 1). As root, run as another user (daemon)."""
    import os
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="pgrecv-test-"))  # /tmp: another user can reach it
    try:
        src = base / "in"
        src.mkdir()
        secret = src / "0000000000000010-0000000000000020.jsonl"
        secret.write_text("{}\n")
        secret.chmod(0o000)
        locked = base / "locked"
        locked.mkdir(mode=0o000)
        target = base / "lake"
        prefix: list[str] = []
        if os.geteuid() == 0:
            for p in (base, src, secret, locked):
                os.chown(p, 1, 1)  # daemon
            base.chmod(0o755)
            prefix = ["setpriv", "--reuid=1", "--regid=1", "--clear-groups"]
        for source, what in ((str(src), f"{secret}: cannot read it"), (str(locked), f"{locked}: cannot list it")):
            proc = subprocess.run(
                [
                    *prefix,
                    sys.executable,
                    "-m",
                    "pgrecv",
                    "spark-apply",
                    source,
                    "--target",
                    str(target),
                    "--format",
                    "delta",
                ],
                capture_output=True,
                timeout=120,
                env={**os.environ, "HOME": str(base)},
            )
            assert proc.returncode == 9, err(proc)
            assert err(proc).strip().splitlines() == [
                f"pgrecv: error: {what} (Permission denied): give spark-apply a SOURCE it can read"
            ]
    finally:
        shutil.rmtree(base, ignore_errors=True)
