"""Bad option values are one-line usage errors (exit 2) decided before anything touches the
server or the disk: no traceback, no cut-down name, no filter that silently drops every row."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pgrecv.errors import ExitCode
from tests.util import sql

LONG = "s" * 64  # NAMEDATALEN-1 is 63: the server would cut this to 63 characters


def run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pgrecv", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        timeout=60,
        check=False,
    )


@pytest.fixture
def slot_dsn(db_dsn: str) -> str:
    """A database with a pgoutput slot that has one pending row."""
    sql(db_dsn, "CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION p FOR ALL TABLES")
    sql(db_dsn, "SELECT pg_create_logical_replication_slot('sp', 'pgoutput')")
    sql(db_dsn, "INSERT INTO t VALUES (1)")
    return db_dsn


def confirmed(dsn: str) -> object:
    return sql(dsn, "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'sp'")


CATCH_UP = ["start", "-S", "sp", "--until-caught-up", "-f", "out.jsonl"]
BAD = {
    "rotate-size-overflow": ["start", "-S", "sp", "--until-caught-up", "--output-dir", "d", "--rotate-size", "1e400"],
    "rotate-size-zero": ["start", "-S", "sp", "--until-caught-up", "--output-dir", "d", "--rotate-size", "0"],
    "rotate-interval-zero": ["start", "-S", "sp", "--until-caught-up", "--output-dir", "d", "--rotate-interval", "0s"],
    "range-size-zero": ["snapshot", "-S", "snap", "--output-dir", "snap", "-j", "2", "--range-size", "0"],
    "wait-overflow": [*CATCH_UP, "-F", "1e10", "-s", "1e10"],
    "duration-nan": [*CATCH_UP, "-s", "nan"],
    "proto-version-text": ["peek", "-S", "sp", "-o", "proto_version=abc"],
    "start-proto-version-text": [*CATCH_UP, "-o", "proto_version=abc"],
    "start-empty-file": ["start", "-S", "sp", "--until-caught-up", "-f", ""],
    "peek-empty-file": ["peek", "-S", "sp", "-f", ""],
    "upto-nchanges-int4": ["peek", "-S", "sp", "--upto-nchanges", "2147483648"],
    "op-comma": [*CATCH_UP, "--op", ","],
    "op-empty": [*CATCH_UP, "--op", ""],
    "output-dir-empty": ["start", "-S", "sp", "--until-caught-up", "--output-dir", ""],
    "snapshot-output-dir-empty": ["snapshot", "-S", "snap", "--output-dir", ""],
    "create-snapshot-empty": ["create", "-S", "snap", "--snapshot", ""],
    "create-long-slot": ["create", "-S", LONG, "-P", "test_decoding"],
    "create-long-publication": ["create", "-S", "s2", "--publication", "p" * 64],
    "start-long-slot": ["start", "-S", LONG, "--until-caught-up", "-f", "out.jsonl"],
    "start-create-long-slot": ["start", "--create", "-S", LONG, "--until-caught-up", "-f", "out.jsonl"],
    "peek-long-slot": ["peek", "-S", LONG],
    "drop-long-slot": ["drop", "-S", LONG],
    "snapshot-long-slot": ["snapshot", "-S", LONG, "--output-dir", "snap"],
    "start-long-publication": [*CATCH_UP, "--publication", "p" * 64],
    "peek-long-publication": ["peek", "-S", "sp", "--publication", "p" * 64],
    # issue 54, L8: names the server refuses (it used to: exit 12) and ports libpq refuses (exit 3)
    "create-invalid-slot": ["create", "-S", "Bad-Name"],
    "create-upper-case-slot": ["create", "-S", "Upper", "-P", "test_decoding"],
    "start-create-invalid-slot": ["start", "--create", "-S", "a.b", "--until-caught-up", "-f", "out.jsonl"],
    "snapshot-invalid-slot": ["snapshot", "-S", "snap shot", "--output-dir", "snap"],
    "slots-invalid-slot": ["slots", "-S", "sp;", "--check"],
    "port-too-large": [*CATCH_UP, "-p", "99999999999"],
    "port-zero": ["peek", "-S", "sp", "-p", "0"],
    "port-text": ["slots", "-p", "postgres"],
    "port-list-with-a-bad-one": ["slots", "-p", "5432,65536"],
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_values_are_usage_errors(slot_dsn: str, tmp_path: Path, case: str) -> None:
    before = confirmed(slot_dsn)
    slots_before = sql(slot_dsn, "SELECT slot_name FROM pg_replication_slots ORDER BY 1")
    pubs_before = sql(slot_dsn, "SELECT pubname FROM pg_publication ORDER BY 1")
    proc = run(tmp_path, *BAD[case], "-d", slot_dsn)
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert list(tmp_path.iterdir()) == [], "nothing may be written for a refused command line"
    assert confirmed(slot_dsn) == before, "the slot must not move"
    assert sql(slot_dsn, "SELECT slot_name FROM pg_replication_slots ORDER BY 1") == slots_before
    assert sql(slot_dsn, "SELECT pubname FROM pg_publication ORDER BY 1") == pubs_before


def test_one_line_messages_say_what_to_do(slot_dsn: str, tmp_path: Path) -> None:
    proc = run(tmp_path, "create", "-S", LONG, "-d", slot_dsn)
    assert proc.stderr.count("\n") == 1 and "63 bytes" in proc.stderr, proc.stderr
    proc = run(tmp_path, *CATCH_UP, "--op", ",", "-d", slot_dsn)
    assert proc.stderr.count("\n") == 1 and "insert" in proc.stderr, proc.stderr
    proc = run(tmp_path, *CATCH_UP, "-F", "1e10", "-d", slot_dsn)
    assert proc.stderr.count("\n") == 1 and "at most" in proc.stderr, proc.stderr
    proc = run(tmp_path, "snapshot", "-S", "snap", "--output-dir", "snap", "--range-size", "0kB", "-d", slot_dsn)
    assert proc.stderr == "pgrecv: error: --range-size '0kB' must be more than 0: write it like 64MB or 1GiB\n"


def test_slot_names_and_ports_are_checked_before_connecting(tmp_path: Path) -> None:
    """PostgreSQL's rule for slot names (lower-case letters, digits, underscores) and the range of
    ports, applied before any connection: with no server to reach, still exit 2, one line."""
    nowhere = ["-h", str(tmp_path / "no-server-here")]
    proc = run(tmp_path, "create", "-S", "Bad-Name", *nowhere)
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    assert proc.stderr == (
        "pgrecv: error: --slot 'Bad-Name' is not a replication slot name (it has '-BN'): slot names may "
        "only contain lower-case letters, digits and underscores (e.g. 'bad_name')\n"
    )
    proc = run(tmp_path, "start", "-S", "ok", "-p", "99999999999", *nowhere)
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    assert proc.stderr == (
        "pgrecv: error: -p/--port '99999999999' is not a port number: give one from 1 to 65535 "
        "(or a comma-separated list of them, one per -h host)\n"
    )
    assert run(tmp_path, "slots", "-p", "5432", *nowhere).returncode == ExitCode.CONNECTION, "a good port connects"


def test_name_of_63_bytes_is_fine(slot_dsn: str, tmp_path: Path) -> None:
    name = "n" * 63
    proc = run(tmp_path, "create", "-S", name, "-P", "test_decoding", "-d", slot_dsn)
    assert proc.returncode == 0, proc.stderr
    assert sql(slot_dsn, "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (name,)) == [(1,)]
    multibyte = "é" * 32  # 64 bytes in 32 characters
    proc = run(tmp_path, "create", "-S", multibyte, "-P", "test_decoding", "-d", slot_dsn)
    assert proc.returncode == ExitCode.USAGE and "64 bytes" in proc.stderr, proc.stderr
