"""Temporary files of the sinks (`start -f`, `--output-dir`) in a shared directory (issue 11, item 3).

A world-writable sticky directory like /tmp, pgrecv running as root, and another local user
(``nobody``, as the test servers run) planting links and files under names pgrecv used to pick.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgrecv.output.sinks import DirSink, FileSink
from pgrecv.pg.server import RunAs, server_user
from tests.output.test_sinks import feed, lsns, whole_transactions

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
