"""pgrecv.output.files' lock: one flock helper for every directory or file pgrecv writes."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from pathlib import Path

import pytest

from pgrecv.errors import ExitCode, OutputError
from pgrecv.output.files import LOCK_NAME, Syncer, lock_fd, open_lock
from pgrecv.output.sinks import DirSink
from pgrecv.snapshot.core import _prepare_dir
from tests.util import spy_fdatasync


def test_open_lock_creates_0600_and_refuses_a_second_holder(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    fd = open_lock(path, busy="busy: wait")
    try:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        with pytest.raises(OutputError, match=r"^busy: wait$") as info:
            open_lock(path, busy="busy: wait")
        assert info.value.exit_code == ExitCode.OUTPUT
    finally:
        os.close(fd)
    os.close(open_lock(path, busy="busy: wait"))  # closing the descriptor released it


def test_open_lock_refuses_a_link_or_a_directory(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("")
    (tmp_path / "link.lock").symlink_to(target)
    with pytest.raises(OutputError, match=r"cannot open the lock file .*/link\.lock: .*remove it"):
        open_lock(tmp_path / "link.lock", busy="busy")
    (tmp_path / "dir.lock").mkdir()
    with pytest.raises(OutputError, match=r"cannot open the lock file .*/dir\.lock: .*remove it"):
        open_lock(tmp_path / "dir.lock", busy="busy")
    with pytest.raises(OutputError, match=r"cannot open the lock file .*/missing/x\.lock: .*does not exist"):
        open_lock(tmp_path / "missing" / "x.lock", busy="busy")


def test_lock_fd_goes_on_where_the_file_system_has_no_locks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_locks(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    os.close(open_lock(tmp_path / "x.lock", busy="busy"))

    def broken(fd: int, op: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(fcntl, "flock", broken)
    with open(tmp_path / "f", "wb") as f, pytest.raises(OutputError, match=r"cannot lock .*/f: .*I/O error"):
        lock_fd(f.fileno(), tmp_path / "f", busy="busy")


def test_snapshot_and_start_exclude_each_other(tmp_path: Path) -> None:
    """`snapshot` and `start --output-dir` take the same lock, through the same helper."""
    sink = DirSink(tmp_path)
    sink.open()
    try:
        with pytest.raises(OutputError, match="is in use by another pgrecv process: stop it"):
            _prepare_dir(tmp_path)
    finally:
        sink.close()
    fd = _prepare_dir(tmp_path)
    try:
        assert (tmp_path / LOCK_NAME).is_file()
        with pytest.raises(OutputError, match=r"in use by another process \(it holds the lock\)"):
            DirSink(tmp_path).open()
    finally:
        os.close(fd)


# --- Syncer: a growing file fdatasync'd in a thread of its own -------------------------------


def test_syncer_keeps_a_failed_sync_for_settle_and_close(tmp_path: Path) -> None:
    """The background fdatasync's error is raised by settle() and close() (the caller's own fsync
    may not see it again); here the kernel's own EINVAL for a pipe."""
    for finish in ("settle", "close"):
        r, w = os.pipe()
        try:
            syncer = Syncer(w, "test-sync")
            syncer.kick(0)
            deadline = time.monotonic() + 10
            while syncer._error is None and time.monotonic() < deadline:
                time.sleep(0.01)
            with pytest.raises(OSError) as info:
                getattr(syncer, finish)()
            assert info.value.errno == errno.EINVAL
            with pytest.raises(OSError):
                syncer.close()
            assert not syncer._thread.is_alive()
        finally:
            os.close(r)
            os.close(w)


def test_syncer_syncs_a_file_and_stops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = spy_fdatasync(monkeypatch)
    with open(tmp_path / "f", "wb") as f:
        syncer = Syncer(f.fileno(), "test-sync", drop=True)
        for i in range(20):
            f.write(b"x" * 1000)
            f.flush()
            syncer.kick((i + 1) * 1000)
        deadline = time.monotonic() + 10
        while not calls and time.monotonic() < deadline:
            time.sleep(0.01)
        os.fdatasync(f.fileno())
        syncer.settle()  # waits for a sync under way, drops one not started
        after = len(calls)
        syncer.close()
        assert not syncer._thread.is_alive()
        assert len(calls) == after  # nothing ran after settle() but what close() joined
    assert any(name == "test-sync" for name, _ in calls)
