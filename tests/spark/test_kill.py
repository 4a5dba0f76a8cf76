"""`spark-apply` killed at random moments (SIGKILL, JVM included) and run again ends with `SELECT *`.

The workload and JSONL come from the real tool (tests/spark/test_apply_server.py's helpers); the kills
land while the target is being written: each run is killed a random delay after its first write to
the target, or at a random moment of the whole run.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.spark.oracle import ApplyConfig, run_apply
from tests.spark.test_apply_server import SCHEMA, _assert_equal, _peek, _workload
from tests.util import err, pgrecv

pytest.importorskip("pyspark")
pytest.importorskip("deltalake")


def _tree(path: Path) -> frozenset[tuple[str, int]]:
    """The files under ``path`` that hold tables or their state (not the run's lock or staging)."""
    out = set()
    for root, _dirs, files in os.walk(path):
        if "/_pgrecv/stage-" in root + "/":
            continue
        for f in files:
            p = os.path.join(root, f)
            if p.endswith("/_pgrecv/lock"):
                continue
            with contextlib.suppress(FileNotFoundError):
                out.add((p, os.stat(p).st_mtime_ns))
    return frozenset(out)


def _killed_run(args: list[str], target: Path, rng: random.Random, after_write: bool, span: float) -> float | None:
    """Start the CLI in its own process group; SIGKILL the group (the JVM too) a random delay within
    ``span`` seconds after its first write to the target (``after_write``) or after its start.

    Returns None when killed, else how long it ran (from its first write when ``after_write``)."""
    before = _tree(target)
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgrecv", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = started + 120
    if after_write:  # wait for the first change under the target
        while proc.poll() is None and _tree(target) == before and time.monotonic() < deadline:
            time.sleep(0.01)
        started = time.monotonic()
    try:
        proc.wait(timeout=rng.uniform(0.0, span))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        assert proc.stderr is not None
        proc.stderr.close()
        return None
    assert proc.stderr is not None
    stderr = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.returncode == 0, stderr
    return time.monotonic() - started


@pytest.fixture
def workload_files(db_dsn: str, tmp_path: Path) -> tuple[Path, Path]:
    return make_workload_files(db_dsn, tmp_path)


def make_workload_files(db_dsn: str, tmp_path: Path) -> tuple[Path, Path]:
    """Two JSONL files of the real tool: `a` (first half) and `b` (second half) of a random workload."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
    proc = pgrecv("create", "-d", db_dsn, "--slot", "s", "--publication", "p")
    assert proc.returncode == 0, err(proc)
    rng = random.Random(7)
    _workload(db_dsn, rng, 40)
    first = tmp_path / "a.jsonl"
    _peek(db_dsn, first)
    proc = pgrecv("peek", "-d", db_dsn, "--slot", "s", "--consume", "-f", str(tmp_path / "consumed.jsonl"))
    assert proc.returncode == 0, err(proc)
    _workload(db_dsn, rng, 60)
    second = tmp_path / "b.jsonl"
    _peek(db_dsn, second)
    return first, second


# The Spark replay (the default) in both formats; the older driver replay through delta-rs only (its
# Parquet runs start a JVM each, and CI's time is better spent on the default)
REPLAYS = [("parquet", "spark"), ("delta", "spark")]


@pytest.mark.newest_server  # the subject is the writers' atomicity, not the server
@pytest.mark.parametrize(("fmt", "replay"), REPLAYS)
def test_killed_and_rerun_gives_the_exact_tables(
    db_dsn: str, tmp_path: Path, spark: Any, workload_files: tuple[Path, Path], fmt: str, replay: str
) -> None:
    first, second = workload_files
    target = tmp_path / fmt
    cfg = {"fmt": fmt, "engine": "delta-rs", "replay": replay}
    run_apply(ApplyConfig((str(first),), target, **cfg), spark=spark)  # an existing state
    base = tmp_path / f"{fmt}-base"
    shutil.copytree(target, base, symlinks=True)
    args = ["spark-apply", str(first), str(second), "--target", str(target), "--format", fmt]
    args += ["--delta-engine", "delta-rs", "--master", "local[1]"]
    rng = random.Random(f"{fmt}-{replay}-{db_dsn}")
    kills = attempt = 0
    # delays learnt: a run that finishes before its kill sets the span below its time
    jvm = fmt == "parquet" or replay == "spark"  # a run that starts a JVM is slow
    spans = {True: 2.0, False: 6.0} if jvm else {True: 0.3, False: 1.5}
    runs, needed = (2, 1) if jvm else (5, 2)
    # at least `runs` attempts; more (up to 3x) while fewer than `needed` were killed: a delta-rs
    # run lasts ~0.5 s, so a random delay often falls after its end (5 attempts once gave 1 kill)
    while attempt < runs or (kills < needed and attempt < 3 * runs):
        after_write = attempt % 3 != 2  # mostly while writing, sometimes anywhere
        attempt += 1
        took = _killed_run(args, target, rng, after_write, spans[after_write])
        if took is None:
            kills += 1
        else:  # finished: start again from the old state so that the next kill lands in a write
            spans[after_write] = took * 0.8
            shutil.rmtree(target)
            shutil.copytree(base, target, symlinks=True)
    assert kills >= needed, f"only {kills} of {attempt} runs were killed: delays do not fit this machine"
    # run to completion: what is there now is the old or the new state of each table, never a mix
    summary = run_apply(ApplyConfig((str(first), str(second)), target, **cfg), spark=spark)
    _assert_equal(db_dsn, target, fmt, spark)
    again = run_apply(ApplyConfig((str(first), str(second)), target, **cfg), spark=spark)
    assert all(t.status == "up to date" for t in again.tables)
    assert [t.version for t in again.tables] == [t.version for t in summary.tables]
    if fmt == "parquet":  # the kill debris (temp versions, temp pointers) is cleaned up
        leftovers = [p for p in target.rglob(".tmp-*")]
        assert leftovers == []


class Injected(Exception):
    pass


@pytest.mark.newest_server  # the subject is the writers' atomicity, not the server
@pytest.mark.parametrize(("fmt", "replay"), REPLAYS)
def test_failure_between_tables_then_rerun(
    db_dsn: str, tmp_path: Path, spark: Any, workload_files: tuple[Path, Path], fmt: str, replay: str
) -> None:
    first, second = workload_files
    target = tmp_path / f"inj-{fmt}"
    config = ApplyConfig((str(first), str(second)), target, fmt=fmt, engine="delta-rs", replay=replay)
    done: list[str] = []

    def fail_after_first(name: str) -> None:
        done.append(name)
        raise Injected(name)

    with pytest.raises(Injected):
        run_apply(config, spark=spark, after_table=fail_after_first)
    # the Spark replay applies tables side by side: those already running when the first one
    # failed finish (each atomically); no other table starts
    assert len(done) == 1 if replay == "driver" else len(done) >= 1
    summary = run_apply(config, spark=spark)
    status = {t.table: t.status for t in summary.tables}
    for name in done:  # a table applied before the failure is not applied twice
        assert status.pop(name) == "up to date", name
    assert set(status.values()) <= {"applied"}
    assert status or replay == "spark"
    _assert_equal(db_dsn, target, fmt, spark)


def test_parquet_open_sweeps_what_a_killed_run_left(tmp_path: Path) -> None:
    """A run killed mid-write leaves temp versions and pointers; the next run removes them even when
    that table has nothing new to write (found by the kill test: a temp version outlived the re-run)."""
    from pgrecv.spark.tables.parquet import ParquetTable as ParquetTarget

    table = tmp_path / "s.t"
    (table / "_versions" / ".tmp-v000002-dead").mkdir(parents=True)
    (table / "_versions" / ".tmp-v000002-dead" / "part-0.parquet").write_bytes(b"half")
    (table / ".tmp-current-123").symlink_to("_versions/v000001")
    (table / ".tmp-_pgrecv_table.json-123").write_bytes(b"{")
    ParquetTarget(table, "pgrecv:s.t", spark=None).open()
    assert sorted(p.name for p in table.rglob("*")) == ["_versions"]
