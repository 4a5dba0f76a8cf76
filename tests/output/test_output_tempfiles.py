"""Temporary files in a shared directory: another user who plants a symlink under the name pgrecv
would use gets nothing written through it and never sees it published as the output; cleaning up
removes only files pgrecv itself could have made.

The links here are planted by the test's own user: with ``fs.protected_symlinks=1`` the kernel
would refuse to follow another user's link in a sticky directory anyway, and the point is that
pgrecv must not rely on that.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg

from pgrecv.lsn import LSN
from pgrecv.output.files import manifest_name
from tests.util import err, pgrecv, sql

PRECIOUS = b"root-only data that must survive\n"


def _shared_dir(tmp_path: Path) -> tuple[Path, Path]:
    """A sticky world-writable directory (like /tmp) and a private file an attacker wants overwritten."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    victim = tmp_path / "victim"
    victim.write_bytes(PRECIOUS)
    os.chmod(victim, 0o600)
    return shared, victim


def _run_with_planted_link(link_name: str, victim: Path, args: list[str]) -> subprocess.CompletedProcess[bytes]:
    """Run pgrecv in a process that first plants ``link_name`` (``{pid}`` is its pid, which exec
    keeps): the name an attacker who watches the process table would plant."""
    code = (
        "import os, sys\n"
        f"os.symlink({str(victim)!r}, {link_name!r}.format(pid=os.getpid()))\n"
        "os.execv(sys.executable, [sys.executable, '-m', 'pgrecv', *sys.argv[1:]])\n"
    )
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, timeout=120, check=False)


def test_peek_file_ignores_a_planted_link(db_dsn: str, tmp_path: Path) -> None:
    sql(db_dsn, "CREATE TABLE t (id int PRIMARY KEY)")
    sql(db_dsn, "SELECT pg_create_logical_replication_slot('s', 'test_decoding')")
    sql(db_dsn, "INSERT INTO t VALUES (1)")
    shared, victim = _shared_dir(tmp_path)
    out = shared / "peek.jsonl"
    proc = _run_with_planted_link(
        str(shared / ".peek.jsonl.{pid}.tmp"), victim, ["peek", "-d", db_dsn, "--slot", "s", "-f", str(out)]
    )
    assert proc.returncode == 0, err(proc)
    assert victim.read_bytes() == PRECIOUS, "pgrecv wrote through the planted link"
    assert not out.is_symlink(), "the planted link was published as the output"
    assert b'"op":"insert"' in out.read_bytes()
    assert oct(out.stat().st_mode & 0o777) == oct(0o600)
    leftovers = [p.name for p in shared.iterdir() if p.name != "peek.jsonl" and not p.is_symlink()]
    assert leftovers == [], leftovers


def test_snapshot_manifest_ignores_a_planted_link(db_dsn: str, tmp_path: Path) -> None:
    """The manifest's temp name used to follow from the slot's consistent point, which anyone can
    read from pg_replication_slots while the copy runs."""
    sql(db_dsn, "CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1), (2)")
    sql(db_dsn, "CREATE PUBLICATION p FOR ALL TABLES")
    shared, victim = _shared_dir(tmp_path)
    out = shared / "snap"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgrecv", "snapshot", "-d", db_dsn, "--slot", "snap", "--output-dir", str(out)],
        env={**os.environ, "PGRECV_SNAPSHOT_DELAY": "2"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        query = "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE confirmed_flush_lsn IS NOT NULL"
        while not (rows := sql(db_dsn, query)):
            assert time.monotonic() < deadline and proc.poll() is None, "the snapshot's slot never appeared"
            time.sleep(0.05)
        cp = int(LSN.parse(rows[0][0]))
        os.symlink(victim, out / f".tmp-{manifest_name(cp)}")
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr.decode()
    assert victim.read_bytes() == PRECIOUS, "pgrecv wrote the manifest through the planted link"
    manifest = out / manifest_name(cp)
    assert not manifest.is_symlink() and b'"slot": "snap"' in manifest.read_bytes()


def test_snapshot_cleans_only_its_own_leftovers(db_dsn: str, tmp_path: Path) -> None:
    sql(db_dsn, "CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1)")
    sql(db_dsn, "CREATE PUBLICATION p FOR ALL TABLES")
    out = tmp_path / "snap"
    out.mkdir(mode=0o700)
    ours = out / ".tmp-snapshot-4242-0001.part"  # what an interrupted snapshot leaves
    ours.write_bytes(b"partial\n")
    theirs = out / ".tmp-notes.txt"  # hidden, but no name pgrecv makes
    theirs.write_bytes(b"keep me\n")
    proc = pgrecv("snapshot", "-d", db_dsn, "--slot", "snap", "--output-dir", str(out))
    # a directory holding anything of someone else's is refused (issue 54, L8), and left as it was
    assert proc.returncode == 8 and "is not empty (it holds .tmp-notes.txt)" in err(proc), err(proc)
    assert not ours.exists(), "an interrupted snapshot's part was not removed"
    assert theirs.read_bytes() == b"keep me\n", "a file pgrecv did not make was removed"
    theirs.unlink()
    proc = pgrecv("snapshot", "-d", db_dsn, "--slot", "snap", "--output-dir", str(out))
    assert proc.returncode == 0, err(proc)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot('snap')")
