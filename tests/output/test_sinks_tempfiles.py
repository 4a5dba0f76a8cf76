"""Temporary files of the sinks (`start -f`, `--output-dir`) in a shared directory (issue 11, item 3).

A world-writable sticky directory like /tmp, pgrecv running as root, and another local user
(``nobody``, as the test servers run) planting links and files under names pgrecv used to pick.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgrecv.errors import ExitCode, OutputError
from pgrecv.output.sinks import DirSink, FileSink
from pgrecv.pg.server import RunAs, server_user
from tests.output.test_sinks import feed, lsns, whole_transactions
from tests.util import err, pgrecv, sql

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to act as another user too")

SECRET = b"root's own data\n"


@pytest.fixture
def other() -> RunAs:
    who = server_user()
    assert who is not None
    return who


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory like /tmp: world-writable and sticky, owned by root."""
    d = Path(tempfile.mkdtemp(prefix="pgrecv-shared-", dir="/tmp"))
    d.chmod(0o1777)
    yield d
    shutil.rmtree(d)


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A file only root may write, which the other user would like overwritten."""
    path = tmp_path / "secret"
    path.write_bytes(SECRET)
    path.chmod(0o600)
    return path


def as_user(who: RunAs, *argv: str) -> None:
    subprocess.run(argv, check=True, user=who.uid, group=who.gid, extra_groups=[], timeout=30)


def plant_link(who: RunAs, target: Path, link: Path) -> None:
    as_user(who, "ln", "-s", str(target), str(link))
    assert link.is_symlink() and link.lstat().st_uid == who.uid


def assert_regular_and_ours(path: Path) -> None:
    st = path.lstat()
    assert stat.S_ISREG(st.st_mode), f"{path.name} is not a regular file (the attacker's link?)"
    assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o600


def test_file_state_is_not_written_through_a_planted_link(shared: Path, secret: Path, other: RunAs) -> None:
    link = shared / ".out.jsonl.pgrecv-state.tmp"  # the name pgrecv used to write the state through
    plant_link(other, secret, link)
    sink = FileSink(shared / "out.jsonl")
    sink.open()
    feed(sink, 1)
    assert sink.durable() == lsns(1)[1]
    sink.close()
    assert secret.read_bytes() == SECRET
    assert_regular_and_ours(shared / ".out.jsonl.pgrecv-state")
    assert link.is_symlink(), "another user's link is not ours to delete"
    assert whole_transactions((shared / "out.jsonl").read_bytes()) == [1]
    assert sorted(p.name for p in shared.iterdir()) == sorted([link.name, "out.jsonl", ".out.jsonl.pgrecv-state"]), (
        "no temporary file left behind"
    )


def test_dir_state_is_not_written_through_a_link_planted_while_running(
    shared: Path, secret: Path, other: RunAs
) -> None:
    sink = DirSink(shared)
    sink.open()
    plant_link(other, secret, shared / ".pgrecv-state.tmp")
    feed(sink, 1)
    assert sink.durable() == lsns(1)[1]
    sink.close()
    assert secret.read_bytes() == SECRET
    assert_regular_and_ours(shared / ".pgrecv-state")
    assert (shared / ".pgrecv-state.tmp").is_symlink()


def test_recovery_deletes_only_temporary_files_pgrecv_made(shared: Path, secret: Path, other: RunAs) -> None:
    """A crash's leftovers go; what another user put there under look-alike names stays."""
    d = shared
    theirs = [".tmp-1234-1.part", ".tmp-abcdefgh.part", ".pgrecv-state.tmp", ".pgrecv-state.abcdefgh.tmp"]
    theirs += [".tmp-snapshot-9-0001.part"]  # a name pgrecv makes, but not our file
    for name in theirs:
        as_user(other, "touch", str(d / name))
    plant_link(other, secret, d / ".tmp-linkedto.part")
    ours = [
        tempfile.mkstemp(prefix=".tmp-", suffix=".part", dir=d),
        tempfile.mkstemp(prefix=".pgrecv-state.", suffix=".tmp", dir=d),
        tempfile.mkstemp(prefix=".out.jsonl.pgrecv-state.", suffix=".tmp", dir=d),
        tempfile.mkstemp(prefix=".tmp-snapshot-1234-", suffix=".part", dir=d),  # see below
    ]
    os.rename(ours[-1][1], d / ".tmp-snapshot-1234-0001.part")  # a killed `pgrecv snapshot`'s
    ours[-1] = (ours[-1][0], str(d / ".tmp-snapshot-1234-0001.part"))
    for fd, _ in ours:
        os.close(fd)
    sink = DirSink(d)
    sink.open()
    sink.close()
    FileSink(d / "out.jsonl").open()
    left = {p.name for p in d.iterdir()}
    assert {*theirs, ".tmp-linkedto.part"} <= left
    assert not {Path(name).name for _, name in ours} & left
    assert secret.read_bytes() == SECRET


# --- the output and its state, planted by another user (issue 54, M2) ---------------------------

VICTIM = b"another user's precious data\n" * 10


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file of a third user (``daemon``), which the attacker would like pgrecv, run as root,
    to truncate."""
    path = tmp_path / "victim" / "data"
    path.parent.mkdir()
    path.write_bytes(VICTIM)
    daemon = pwd.getpwnam("daemon")
    os.chown(path, daemon.pw_uid, daemon.pw_gid)
    return path


def plant_state(who: RunAs, path: Path, offset: int = 0) -> None:
    doc = {"version": 1, "offset": offset, "commit_lsn": "0/1", "end_lsn": "0/2"}
    as_user(who, "sh", "-c", f"printf '%s' '{json.dumps(doc)}' > {path}")
    assert path.lstat().st_uid == who.uid


def test_start_file_never_truncates_another_users_file_through_a_planted_link(
    db_dsn: str, shared: Path, victim: Path, other: RunAs
) -> None:
    """The issue's case, through the command line: a link at FILE to a third user's file and a
    state file saying offset 0, both planted in a shared sticky directory. pgrecv refuses before
    touching anything: one line, exit 8, the victim's file whole, the slot untouched."""
    sql(db_dsn, "CREATE TABLE t (id int PRIMARY KEY)")
    sql(db_dsn, "CREATE PUBLICATION pub FOR ALL TABLES")
    assert pgrecv("create", "-d", db_dsn, "--slot", "s").returncode == 0
    sql(db_dsn, "INSERT INTO t VALUES (1)")
    out = shared / "out.jsonl"
    plant_link(other, victim, out)
    plant_state(other, shared / ".out.jsonl.pgrecv-state")
    ((before,),) = sql(db_dsn, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 's'")
    proc = pgrecv("start", "-d", db_dsn, "--slot", "s", "-f", str(out), "--until-caught-up")
    text = err(proc)
    assert victim.read_bytes() == VICTIM, "the victim's file was truncated"
    assert proc.returncode == ExitCode.OUTPUT, text
    assert text.count("\n") == 1 and text.startswith("pgrecv: error: ") and "symbolic link" in text, text
    assert sql(db_dsn, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 's'") == [
        (before,)
    ]
    assert out.is_symlink(), "another user's link is not ours to delete"


def test_file_of_another_user_is_refused_not_truncated(shared: Path, victim: Path) -> None:
    """A regular file of another user at FILE (here: a hard link would do as well) with a state of
    our own saying offset 0: pgrecv did not create it and does not truncate it."""
    out = shared / "out.jsonl"
    os.link(victim, out)
    doc = {"version": 1, "offset": 0, "commit_lsn": "0/1", "end_lsn": "0/2"}
    (shared / ".out.jsonl.pgrecv-state").write_text(json.dumps(doc))
    with pytest.raises(OutputError, match=r"out\.jsonl belongs to another user \(uid 1\).*run as its owner"):
        FileSink(out).open()
    assert victim.read_bytes() == VICTIM


def test_state_file_of_another_user_is_refused(shared: Path, other: RunAs) -> None:
    """Our own output, and a state file planted by another user that says offset 0: trusting it
    would cut our output to nothing."""
    out = shared / "out.jsonl"
    out.write_bytes(SECRET)
    plant_state(other, shared / ".out.jsonl.pgrecv-state")
    with pytest.raises(OutputError, match=r"\.out\.jsonl\.pgrecv-state belongs to another user .*a state file"):
        FileSink(out).open()
    assert out.read_bytes() == SECRET


def test_state_file_through_a_link_is_refused(shared: Path, secret: Path, other: RunAs) -> None:
    out = shared / "out.jsonl"
    out.write_bytes(SECRET)
    plant_link(other, secret, shared / ".out.jsonl.pgrecv-state")
    with pytest.raises(OutputError, match=r"pgrecv-state is a symbolic link, not pgrecv's state file"):
        FileSink(out).open()
    assert out.read_bytes() == SECRET and secret.read_bytes() == SECRET


def test_dangling_link_at_file_creates_nothing_at_its_target(shared: Path, tmp_path: Path, other: RunAs) -> None:
    """O_CREAT through a link would create the file wherever the link points."""
    target = tmp_path / "cron.d-like" / "job"
    target.parent.mkdir()
    plant_link(other, target, shared / "out.jsonl")
    with pytest.raises(OutputError, match="is a symbolic link"):
        FileSink(shared / "out.jsonl").open()
    assert not target.exists()


def test_a_link_to_a_device_is_still_followed(shared: Path) -> None:
    """-f /dev/stdout and friends: links to what is not a regular file are written through (nothing
    is truncated there, and no state is kept)."""
    link = shared / "devnull"
    link.symlink_to("/dev/null")
    sink = FileSink(link)
    sink.open()
    feed(sink, 1)
    assert sink.durable() == lsns(1)[1]
    sink.close()
    assert not (shared / ".devnull.pgrecv-state").exists()
