"""pgrecv.output.files' lock: one flock helper for every directory or file pgrecv writes."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path

import pytest

from pgrecv.errors import ExitCode, OutputError
from pgrecv.output.files import LOCK_NAME, lock_fd, open_lock
from pgrecv.output.sinks import DirSink
from pgrecv.snapshot.core import _prepare_dir


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


def test_lock_fd_goes_on_where_the_file_system_has_no_locks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
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
