"""Start and resume positions that cannot be trusted (issue 11, item 2), against real PostgreSQL.

Each case used to move the slot's confirmed_flush_lsn past changes nobody had received, so they
were never delivered. Now: one line, exit code 13, the slot untouched, and the next proper run
delivers everything.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pgrecv.errors import ExitCode
from pgrecv.lsn import LSN
from tests.stream.test_start import committed, records, slot_info, spawn
from tests.util import err, pgrecv, sql, wait_for


@pytest.fixture
def table(db_dsn: str) -> str:
    sql(db_dsn, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    sql(db_dsn, "CREATE PUBLICATION pub FOR ALL TABLES")
    assert pgrecv("create", "-d", db_dsn, "--slot", "s").returncode == 0
    return db_dsn


def ids_in(data: bytes) -> list[int]:
    return [r["new"]["id"] for t in committed(records(data)) for r in t]


def ids_in_dir(d: Path) -> list[int]:
    return [i for f in sorted(d.glob("*.jsonl")) for i in ids_in(f.read_bytes())]


def refused(proc: object, *, names: str) -> None:
    """Exit 13, one line without a traceback, naming what is wrong."""
    text = err(proc)  # type: ignore[arg-type]
    assert proc.returncode == ExitCode.POSITION, text  # type: ignore[attr-defined]
    assert text.count("\n") == 1 and text.startswith("pgrecv: error: "), text
    assert names in text and "nothing was confirmed" in text, text


def test_startpos_ahead_of_the_server_is_refused(table: str, tmp_path: Path) -> None:
    sql(table, "INSERT INTO t VALUES (1, 'before')")
    before = slot_info(table, "s")["confirmed"]
    bad = pgrecv("start", "-d", table, "--slot", "s", "-I", "5/0", "--until-caught-up", "-f", str(tmp_path / "x"))
    refused(bad, names="-I/--startpos 5/0 is ahead of the server's WAL")
    assert slot_info(table, "s")["confirmed"] == before
    sql(table, "INSERT INTO t VALUES (2, 'after')")
    out = tmp_path / "good.jsonl"
    proc = pgrecv("start", "-d", table, "--slot", "s", "--until-caught-up", "-f", str(out))
    assert proc.returncode == 0, err(proc)
    assert ids_in(out.read_bytes()) == [1, 2]


def test_stray_file_name_in_the_output_dir_is_refused(table: str, tmp_path: Path) -> None:
    outdir = tmp_path / "out"
    outdir.mkdir()
    stray = outdir / "0000000100000000-0000000100000000.jsonl"
    stray.write_text("")
    sql(table, "INSERT INTO t VALUES (1, 'committed before')")
    before = slot_info(table, "s")["confirmed"]
    bad = pgrecv("start", "-d", table, "--slot", "s", "--output-dir", str(outdir), "--until-caught-up")
    refused(bad, names=str(stray))
    assert slot_info(table, "s")["confirmed"] == before
    stray.unlink()
    sql(table, "INSERT INTO t VALUES (2, 'after')")
    proc = pgrecv("start", "-d", table, "--slot", "s", "--output-dir", str(outdir), "--until-caught-up")
    assert proc.returncode == 0, err(proc)
    assert ids_in_dir(outdir) == [1, 2]


def test_empty_stray_file_past_the_slot_but_within_the_servers_wal_is_refused(table: str, tmp_path: Path) -> None:
    """On a server whose WAL is past a stray name (any server with some history), "ahead of the
    server" does not catch it: its LAST is past what the slot confirmed and the file holds nothing
    (pgrecv never publishes an empty file), so it would make the run skip committed rows."""
    outdir = tmp_path / "out"
    outdir.mkdir()
    sql(table, "INSERT INTO t VALUES (1, 'committed before')")
    before = slot_info(table, "s")["confirmed"]
    ((wal,),) = sql(table, "SELECT pg_current_wal_insert_lsn()::text")
    last = int(LSN.parse(wal)) - 1  # within the server's WAL, past row 1's commit
    assert last > int(before)
    stray = outdir / f"{last:016X}-{last:016X}.jsonl"
    stray.write_text("")
    bad = pgrecv("start", "-d", table, "--slot", "s", "--output-dir", str(outdir), "--until-caught-up")
    refused(bad, names=str(stray))
    assert "is empty" in err(bad), err(bad)
    assert slot_info(table, "s")["confirmed"] == before
    stray.unlink()
    sql(table, "INSERT INTO t VALUES (2, 'after')")
    proc = pgrecv("start", "-d", table, "--slot", "s", "--output-dir", str(outdir), "--until-caught-up")
    assert proc.returncode == 0, err(proc)
    assert ids_in_dir(outdir) == [1, 2]
    # an empty file whose name the slot has already confirmed moves nothing: accepted
    confirmed = int(slot_info(table, "s")["confirmed"])
    (outdir / f"{confirmed - 1:016X}-{confirmed - 1:016X}.jsonl").write_text("")
    proc = pgrecv("start", "-d", table, "--slot", "s", "--output-dir", str(outdir), "--until-caught-up")
    assert proc.returncode == 0, err(proc)


def test_state_file_ahead_of_the_server_is_refused_and_slots_still_lists(table: str, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_bytes(b"")
    state = tmp_path / ".out.jsonl.pgrecv-state"
    doc = {"version": 1, "offset": 0, "commit_lsn": "FFFFFFFF/FFFFFF00", "end_lsn": "FFFFFFFF/FFFFFFFF"}
    state.write_text(json.dumps(doc))
    sql(table, "INSERT INTO t VALUES (1, 'committed before')")
    before = slot_info(table, "s")["confirmed"]
    bad = pgrecv("start", "-d", table, "--slot", "s", "-f", str(out), "--until-caught-up")
    refused(bad, names=str(state))
    assert slot_info(table, "s")["confirmed"] == before
    listed = pgrecv("slots", "-d", table)
    assert listed.returncode == 0, err(listed)
    state.unlink()
    sql(table, "INSERT INTO t VALUES (2, 'after')")
    proc = pgrecv("start", "-d", table, "--slot", "s", "-f", str(out), "--until-caught-up")
    assert proc.returncode == 0, err(proc)
    assert ids_in(out.read_bytes()) == [1, 2]


def test_overlapping_file_names_are_refused_before_connecting(table: str, tmp_path: Path) -> None:
    outdir = tmp_path / "out"
    assert pgrecv("start", "-d", table, "--slot", "s", "--output-dir", str(outdir), "--until-caught-up").returncode == 0
    sql(table, "INSERT INTO t VALUES (1, 'x')")
    before = slot_info(table, "s")["confirmed"]
    (outdir / "0000000000000001-00000000000000FF.jsonl").write_text("")
    (outdir / "0000000000000010-0000000000000020.jsonl").write_text("")
    proc = pgrecv("start", "-d", table, "--slot", "s", "--output-dir", str(outdir), "--until-caught-up")
    assert proc.returncode == ExitCode.OUTPUT and "overlap" in err(proc) and err(proc).count("\n") == 1, err(proc)
    assert slot_info(table, "s")["confirmed"] == before


def test_a_trusted_resume_still_resumes(table: str, tmp_path: Path) -> None:
    """The checks leave an ordinary resume alone: the record is within the server's WAL, the run
    resumes after it and the slot moves on with what this run received."""
    out = tmp_path / "out.jsonl"
    sql(table, "INSERT INTO t VALUES (1, 'a')")
    assert pgrecv("start", "-d", table, "--slot", "s", "-f", str(out), "--until-caught-up").returncode == 0
    confirmed = slot_info(table, "s")["confirmed"]
    state = tmp_path / ".out.jsonl.pgrecv-state"
    doc = json.loads(state.read_text())
    assert doc["end_lsn"] == str(confirmed)
    sql(table, "INSERT INTO t VALUES (2, 'b')")
    proc = pgrecv("start", "-d", table, "--slot", "s", "-f", str(out), "--until-caught-up")
    assert proc.returncode == 0, err(proc)
    assert ids_in(out.read_bytes()) == [1, 2]
    assert slot_info(table, "s")["confirmed"] > confirmed


def test_startpos_of_an_asynchronous_commit_is_accepted(pg_server: object, tmp_path: Path) -> None:
    """With synchronous_commit=off a commit lies past the flushed WAL (IDENTIFY_SYSTEM's position)
    for up to wal_writer_delay: the check uses the insert position, so its LSN is not refused."""
    from pgrecv.pg.server import TempServer

    settings = {"synchronous_commit": "off", "wal_writer_delay": "10s"}
    with TempServer(pg_server.install, settings=settings) as server:  # type: ignore[attr-defined]
        dsn = server.dsn()
        sql(dsn, "CREATE TABLE t (id int PRIMARY KEY, v text); CREATE PUBLICATION pub FOR ALL TABLES")
        assert pgrecv("create", "-d", dsn, "--slot", "s").returncode == 0
        sql(dsn, "CHECKPOINT")  # everything so far flushed; the WAL writer now sleeps 10 s
        sql(dsn, "INSERT INTO t VALUES (1, 'async')")
        (insert_lsn, flush_lsn), *_ = sql(
            dsn, "SELECT pg_current_wal_insert_lsn()::text, pg_current_wal_flush_lsn()::text"
        )
        assert LSN.parse(insert_lsn) > LSN.parse(flush_lsn), "the commit is not flushed yet"
        out = tmp_path / "o.jsonl"
        proc = pgrecv("start", "-d", dsn, "--slot", "s", "-I", insert_lsn, "--until-caught-up", "-f", str(out))
        assert proc.returncode == 0, err(proc)


@pytest.mark.parametrize("output", ["file", "dir", "existing-dir"])
def test_a_refused_start_creates_nothing(table: str, tmp_path: Path, output: str) -> None:
    """-I ahead of the server is refused (exit 13) before the output is created: no empty file, no
    state file, no directory, nothing new in an existing one (issue 54, L8)."""
    if output == "existing-dir":
        outdir = tmp_path / "out"
        sql(table, "INSERT INTO t VALUES (1, 'x')")
        assert (
            pgrecv("start", "-d", table, "--slot", "s", "--output-dir", str(outdir), "--until-caught-up").returncode
            == 0
        )
        sql(table, "INSERT INTO t VALUES (2, 'y')")
    before = {p: p.read_bytes() if p.is_file() else None for p in tmp_path.rglob("*")}
    where = ["-f", str(tmp_path / "new.jsonl")] if output == "file" else ["--output-dir", str(tmp_path / "out")]
    bad = pgrecv("start", "-d", table, "--slot", "s", "-I", "5/0", "--until-caught-up", *where)
    refused(bad, names="-I/--startpos 5/0 is ahead of the server's WAL")
    assert {p: p.read_bytes() if p.is_file() else None for p in tmp_path.rglob("*")} == before


@pytest.mark.parametrize("output", ["file", "dir"])
def test_a_state_file_that_is_a_directory_is_named_as_such(table: str, tmp_path: Path, output: str) -> None:
    """Not the hint for an output path that is a directory ("give a file name, or use
    --output-dir"): the state's name is pgrecv's, and what to do is to move it away (issue 54, L8)."""
    if output == "file":
        state, where = tmp_path / ".out.jsonl.pgrecv-state", ["-f", str(tmp_path / "out.jsonl")]
    else:
        state, where = tmp_path / "out" / ".pgrecv-state", ["--output-dir", str(tmp_path / "out")]
    state.mkdir(parents=True)
    proc = pgrecv("start", "-d", table, "--slot", "s", "--until-caught-up", *where)
    text = err(proc)
    assert proc.returncode == ExitCode.OUTPUT, text
    assert text == (
        f"pgrecv: error: {state} is a directory, not pgrecv's state file (pgrecv keeps where the output ends "
        "in a file of that name): move it out of the way, and run again\n"
    )


def test_a_start_the_server_refuses_creates_nothing(table: str, tmp_path: Path) -> None:
    """The output is made once START_REPLICATION is taken: a slot in use elsewhere (exit 5) leaves
    no empty file or directory behind either."""
    busy = spawn("start", "-d", table, "--slot", "s", "-f", str(tmp_path.parent / f"{tmp_path.name}-first.jsonl"))
    try:
        wait_for(lambda: slot_info(table, "s")["active_pid"] is not None, what="the first consumer")
        out = tmp_path / "second"
        for where in (["-f", str(out / "new.jsonl")], ["--output-dir", str(out / "dir")]):
            out.mkdir(exist_ok=True)
            proc = pgrecv("start", "-d", table, "--slot", "s", "--until-caught-up", *where)
            assert proc.returncode == ExitCode.SLOT, err(proc)
            assert list(out.iterdir()) == [], "a refused start created its output"
    finally:
        busy.kill()
        busy.wait()
