"""Whose stream an `--output-dir` holds (issue 54, M1), against real PostgreSQL.

A directory written by one slot and then given to another made the second skip, and confirm,
every change up to the first one's last file name: exit 0, the changes gone. So did a stray
non-empty file whose name lies within the server's WAL. Now the directory records its slot,
database and server (IDENTIFY_SYSTEM's system identifier) and every file before it appears: any
other stream, and a file past that record, is refused with one line and exit 17, nothing
confirmed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pgrecv.errors import ExitCode
from pgrecv.lsn import LSN
from pgrecv.pg.server import TempServer
from tests.stream.test_positions import ids_in, ids_in_dir
from tests.stream.test_start import slot_info
from tests.util import err, pgrecv, sql


def setup_db(dsn: str, *slots: str) -> None:
    sql(dsn, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    sql(dsn, "CREATE PUBLICATION pub FOR ALL TABLES")
    for slot in slots:
        assert pgrecv("create", "-d", dsn, "--slot", slot).returncode == 0


@pytest.fixture
def table(db_dsn: str) -> str:
    setup_db(db_dsn, "a", "b")
    return db_dsn


def start(dsn: str, slot: str, outdir: Path) -> Any:
    return pgrecv("start", "-d", dsn, "--slot", slot, "--output-dir", str(outdir), "--until-caught-up")


def refused(proc: Any, *, names: str) -> None:
    """Exit 17, one line without a traceback, naming what is wrong."""
    text = err(proc)
    assert proc.returncode == ExitCode.FOREIGN_OUTPUT, text
    assert text.count("\n") == 1 and text.startswith("pgrecv: error: "), text
    assert names in text and "nothing was confirmed" in text, text


def state(outdir: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((outdir / ".pgrecv-state").read_bytes())
    return doc


def test_output_dir_of_another_slot_is_refused(table: str, tmp_path: Path) -> None:
    outdir = tmp_path / "out"
    sql(table, "INSERT INTO t VALUES (1, 'both slots have it')")
    proc = start(table, "a", outdir)
    assert proc.returncode == 0, err(proc)
    assert ids_in_dir(outdir) == [1]
    sql(table, "INSERT INTO t VALUES (2, 'also')")
    before = slot_info(table, "b")["confirmed"]
    bad = start(table, "b", outdir)
    refused(bad, names='slot "a"')
    assert 'not of slot "b"' in err(bad), err(bad)
    assert slot_info(table, "b")["confirmed"] == before, "nothing confirmed for the other slot"
    assert ids_in_dir(outdir) == [1]
    ((system_identifier,),) = sql(table, "SELECT system_identifier::text FROM pg_control_system()")
    ((database,),) = sql(table, "SELECT current_database()")
    doc = state(outdir)
    assert (doc["slot"], doc["database"], doc["system_identifier"]) == ("a", database, system_identifier)
    # slot b with a directory of its own gets every change it has
    mine = tmp_path / "b"
    proc = start(table, "b", mine)
    assert proc.returncode == 0, err(proc)
    assert ids_in_dir(mine) == [1, 2]


def test_output_dir_of_another_database_is_refused(pg_server: TempServer, table: str, tmp_path: Path) -> None:
    """The same slot name, dropped and made again in another database: another stream."""
    outdir = tmp_path / "out"
    sql(table, "INSERT INTO t VALUES (1, 'x')")
    assert start(table, "a", outdir).returncode == 0
    name = "other_" + tmp_path.name[-20:].lower().replace("-", "_")
    other = pg_server.create_database(name)
    try:
        assert pgrecv("drop", "-d", table, "--slot", "a").returncode == 0
        setup_db(other, "a")
        sql(other, "INSERT INTO t VALUES (5, 'y')")
        before = slot_info(other, "a")["confirmed"]
        bad = start(other, "a", outdir)
        refused(bad, names=f'not of slot "a" of database "{name}"')
        assert slot_info(other, "a")["confirmed"] == before
    finally:
        pg_server.drop_database(name)


def test_output_dir_of_another_server_is_refused(table: str, tmp_path: Path) -> None:
    """The same slot and database names on another server: its LSNs mean other changes,
    whatever the file names say. (The test servers are copies of one cluster and share their
    system identifier, as clones do: the directory's record is edited to another one.)"""
    outdir = tmp_path / "out"
    sql(table, "INSERT INTO t VALUES (1, 'x')")
    assert start(table, "a", outdir).returncode == 0
    doc = state(outdir)
    doc["system_identifier"] = "7000000000000000001"
    data = json.dumps(doc).encode()
    (outdir / ".pgrecv-state").write_bytes(data + b" " * (511 - len(data)) + b"\n")
    sql(table, "INSERT INTO t VALUES (2, 'y')")
    before = slot_info(table, "a")["confirmed"]
    bad = start(table, "a", outdir)
    refused(bad, names="(server system identifier 7000000000000000001), not of slot")
    assert slot_info(table, "a")["confirmed"] == before


@pytest.fixture
def stray_name(table: str) -> Iterator[str]:
    """A final name within the server's WAL and past what the slot has confirmed."""
    sql(table, "INSERT INTO t VALUES (1, 'committed before')")
    ((wal,),) = sql(table, "SELECT pg_current_wal_insert_lsn()::text")
    last = int(LSN.parse(wal)) - 1
    assert last > int(slot_info(table, "a")["confirmed"])
    yield f"{last:016X}-{last:016X}.jsonl"


@pytest.mark.parametrize("recorded", [False, True], ids=["fresh-dir", "dir-with-state"])
def test_non_empty_stray_file_within_the_wal_is_refused(
    table: str, tmp_path: Path, stray_name: str, recorded: bool
) -> None:
    outdir = tmp_path / "out"
    outdir.mkdir()
    if recorded:  # a directory this slot has written (nothing in it yet)
        assert start(table, "a", outdir).returncode == 0
        for f in outdir.glob("*.jsonl"):
            f.unlink()
        sql(table, "INSERT INTO t VALUES (2, 'after the first run')")
    stray = outdir / stray_name
    stray.write_text('{"note": "not pgrecv output"}\n')
    before = slot_info(table, "a")["confirmed"]
    bad = start(table, "a", outdir)
    refused(bad, names=str(stray))
    assert slot_info(table, "a")["confirmed"] == before
    stray.unlink()
    proc = start(table, "a", outdir)
    assert proc.returncode == 0, err(proc)
    assert ids_in_dir(outdir) == ([2] if recorded else [1])


def test_file_ending_with_the_transaction_its_name_claims_is_resumed_after(table: str, tmp_path: Path) -> None:
    """A directory without a version-2 state (an earlier pgrecv's) whose newest file is pgrecv's
    own: resumed after, as before; its owner is recorded from then on."""
    outdir = tmp_path / "out"
    sql(table, "INSERT INTO t VALUES (1, 'x')")
    assert start(table, "a", outdir).returncode == 0
    (outdir / ".pgrecv-state").unlink()  # as an earlier pgrecv could leave it: a crash before its first record
    sql(table, "INSERT INTO t VALUES (2, 'y')")
    proc = start(table, "a", outdir)
    assert proc.returncode == 0, err(proc)
    assert ids_in_dir(outdir) == [1, 2]
    assert state(outdir)["slot"] == "a"


def test_snapshot_directory_belongs_to_its_slot(table: str, tmp_path: Path) -> None:
    outdir = tmp_path / "snap"
    sql(table, "INSERT INTO t VALUES (1, 'in the snapshot')")
    proc = pgrecv("snapshot", "-d", table, "--slot", "c", "--output-dir", str(outdir))
    assert proc.returncode == 0, err(proc)
    assert state(outdir)["slot"] == "c"
    sql(table, "INSERT INTO t VALUES (2, 'streamed')")
    before = slot_info(table, "a")["confirmed"]
    refused(start(table, "a", outdir), names='slot "c"')
    assert slot_info(table, "a")["confirmed"] == before
    proc = start(table, "c", outdir)
    assert proc.returncode == 0, err(proc)
    rows = [i for f in sorted(outdir.glob("*.jsonl")) if ".snapshot-" not in f.name for i in ids_in(f.read_bytes())]
    assert rows == [2]
