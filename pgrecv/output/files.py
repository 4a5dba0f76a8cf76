"""The on-disk contract of pgrecv's outputs: file names, temporary names, the lock, fsync, atomic writes.

Names (docs/event-format.md; spark-apply reads them):

* a change file of ``start --output-dir``: ``<FIRST>-<LAST><suffix>``, the commit LSNs of its first
  and last transaction as 16 upper-case hexadecimal digits each (:data:`FINAL_RE`);
* a snapshot file: ``0000000000000000-<CP-1>.snapshot-<NNNN>.jsonl`` and its manifest
  ``0000000000000000-<CP-1>.snapshot.manifest.json``, sorting before every change file;
* temporary files: hidden, under names only pgrecv makes (:data:`LEFTOVER_RE`), so that a crash's
  leftovers can be told from anything else and removed at the next start;
* ``.pgrecv.lock`` (:data:`LOCK_NAME`): the advisory lock every pgrecv writing a directory takes
  (:func:`open_lock`).

Durability: a file is fsync'd, renamed, and its directory fsync'd (:func:`fsync_dir`);
:func:`write_atomic` does all of it for a small file replaced whole. A large file is synced by a
thread of its own as it grows (:class:`Syncer`), so that its final fsync is short.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
import sys
import tempfile
import threading
from pathlib import Path
from typing import Final

from pgrecv.errors import OutputError

FILE_MODE: Final = 0o600  # like pg_recvlogical: change data is often sensitive
DIR_MODE: Final = 0o700
LOCK_NAME: Final = ".pgrecv.lock"
STATE_NAME: Final = ".pgrecv-state"  # `start --output-dir`'s record of where the output ends
TMP_PREFIX: Final = ".tmp-"  # hidden and without the suffix: neither `ls *.jsonl` nor Path.glob sees it
TMP_SUFFIX: Final = ".part"
MKSTEMP_RANDOM: Final = r"[a-z0-9_]{8}"  # tempfile.mkstemp's random part: recovery deletes only such names
MANIFEST_VERSION: Final = 2  # the manifest's "v" (docs/event-format.md); the records' is jsonl_format's

# a final output file: FIRST-LAST (commit LSNs), then a suffix
FINAL_RE: Final = re.compile(r"([0-9A-F]{16})-([0-9A-F]{16})(?:\.[\w.-]*)?")
# what a final name looks like to a careless eye (lower-case hex, other suffixes): refused, not ignored
LOOKS_FINAL_RE: Final = re.compile(r"([0-9A-Fa-f]{16})-([0-9A-Fa-f]{16})(?:\..*)?", re.DOTALL)


def temp_name_re(name: str) -> re.Pattern[str]:
    """The names :func:`write_atomic` gives the temporary files for ``name``."""
    return re.compile(rf"{re.escape(name)}\.{MKSTEMP_RANDOM}\.tmp")


# Temporary names pgrecv makes (or made: the pid-numbered parts of earlier versions) in an output
# directory: `start --output-dir`'s parts and state file, `snapshot`'s parts and manifest.
LEFTOVER_RE: Final = re.compile(
    rf"{re.escape(TMP_PREFIX)}(?:{MKSTEMP_RANDOM}|snapshot-[0-9a-f]+-\d{{4}}|\d+-\d+){re.escape(TMP_SUFFIX)}"
    rf"|{re.escape(TMP_PREFIX)}[0-9A-F]{{16}}-[0-9A-F]{{16}}\.snapshot\.manifest\.json(?:\.{MKSTEMP_RANDOM})?"
    rf"|{temp_name_re(STATE_NAME).pattern}"
)


# a snapshot file (its FIRST-LAST prefix names its manifest: prefix + MANIFEST_SUFFIX)
SNAPSHOT_FILE_RE: Final = re.compile(r"(?P<prefix>[0-9A-F]{16}-[0-9A-F]{16})\.snapshot-\d+\.jsonl")
MANIFEST_SUFFIX: Final = ".snapshot.manifest.json"


def is_record_file(name: str) -> bool:
    """A finished file of records that a reader of a directory takes: a change or snapshot file."""
    return name.endswith(".jsonl") and FINAL_RE.fullmatch(name) is not None


def named_last(name: str) -> int | None:
    """The LAST commit LSN that a record file's name claims (None: not a record file)."""
    m = FINAL_RE.fullmatch(name)
    return int(m.group(2), 16) if m is not None and name.endswith(".jsonl") else None


def snapshot_file_name(cp: int, seq: int) -> str:
    return f"{0:016X}-{max(cp - 1, 0):016X}.snapshot-{seq:04d}.jsonl"


def snapshot_part_name(token: str, seq: int) -> str:
    """The temporary name of a snapshot file while a worker writes it."""
    return f"{TMP_PREFIX}snapshot-{token}-{seq:04d}{TMP_SUFFIX}"


def manifest_name(cp: int) -> str:
    return f"{0:016X}-{max(cp - 1, 0):016X}{MANIFEST_SUFFIX}"


# --- errors --------------------------------------------------------------------------------

_HINTS = {
    errno.ENOSPC: "the file system is full: free space, then run again (nothing unwritten was confirmed)",
    errno.EDQUOT: "the disk quota is exhausted: free space, then run again (nothing unwritten was confirmed)",
    errno.EACCES: "permission denied: fix the permissions or choose another path",
    errno.EPERM: "operation not permitted: fix the permissions or choose another path",
    errno.ENOENT: "the directory does not exist: create it or fix the path",
    errno.ENOTDIR: "a component of the path is not a directory: fix the path",
    errno.EISDIR: "it is a directory: give a file name, or use --output-dir",
    errno.EEXIST: "something that is not a directory has that name: choose another path",
    errno.EROFS: "the file system is read-only: choose another path",
    errno.EPIPE: "the reader of the output went away",
    errno.EIO: "I/O error: check the disk and its kernel log",
}


def output_error(exc: OSError, what: str | os.PathLike[str], doing: str) -> OutputError:
    """One line: what failed on which path, why, and what to do."""
    hint = _HINTS.get(exc.errno or 0, "check the path, the permissions and the free space")
    return OutputError(f"cannot {doing} {os.fspath(what)}: {exc.strerror or exc}; {hint}")


def write_stdout(data: bytes) -> None:
    """Bytes to standard output, flushed. A failed write (a full disk, an I/O error) is an
    OutputError naming it, not a traceback; a broken pipe stays a BrokenPipeError, which the CLI
    reports as the reader going away."""
    try:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise output_error(exc, "standard output", "write") from None


# --- locks ---------------------------------------------------------------------------------

_NO_LOCKS: Final = (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL)  # a file system without flock


def lock_fd(fd: int, path: str | os.PathLike[str], *, busy: str) -> None:
    """Take an exclusive advisory lock on the open ``fd`` without waiting; the kernel releases it
    when ``fd`` is closed or the process dies.

    Held by another process: :class:`OutputError` with ``busy``, the whole message (it should name
    the path and say what to do). A file system without locks (ENOLCK, EOPNOTSUPP, EINVAL): no
    lock, and no error. Any other failure: :func:`output_error` naming ``path``.
    """
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise OutputError(busy) from None
    except OSError as exc:
        if exc.errno not in _NO_LOCKS:
            raise output_error(exc, path, "lock") from None


def open_lock(path: str | os.PathLike[str], *, busy: str) -> int:
    """Open (creating it, mode 0600) the lock file ``path`` and lock it with :func:`lock_fd`;
    returns the descriptor, whose closing releases the lock.

    The name of a lock file is fixed (every process must find it), so a link there is refused
    (O_NOFOLLOW), never followed: in a shared directory it could point at another user's file.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EISDIR):
            raise OutputError(
                f"cannot open the lock file {os.fspath(path)}: {exc.strerror}; something that is not a regular file "
                "(a link, a directory) has its name: remove it, or choose another directory"
            ) from None
        raise output_error(exc, path, "open the lock file") from None
    try:
        lock_fd(fd, path, busy=busy)
    except BaseException:
        os.close(fd)
        raise
    return fd


# --- durability ----------------------------------------------------------------------------


class Syncer:
    """fdatasync of a growing file in a thread of its own, so that the final fsync waits for the
    last few MiB only. Asking the kernel to start the writeback instead (posix_fadvise,
    sync_file_range) still left 0.2-0.5 s for the final fsync of a 313-318 MB file on this kind
    of machine; syncing as it grows, 3-70 ms (bench/NOTES.md).

    Only the caller's own fsync makes anything durable: these syncs shorten it. But Linux reports
    a failed writeback to one fsync of the file only, so the caller's could succeed after one of
    these failed: the first error is kept, and :meth:`settle` and :meth:`close` raise it. Stop
    the syncer (:meth:`close`) before closing the descriptor, which it must not outlive.
    ``drop``: once synced, the file's pages leave the page cache (for a file nobody reads soon).
    """

    def __init__(self, fd: int, name: str, *, drop: bool = False) -> None:
        self._fd = fd
        self._drop = drop
        self._pos = 0
        self._cond = threading.Condition()
        self._wanted = False  # a sync was asked for and has not started
        self._running = False
        self._closing = False
        self._error: OSError | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def kick(self, pos: int) -> None:
        """Sync the file (its first ``pos`` bytes are written); no wait. One sync at a time: kicks
        during a sync make one more after it."""
        with self._cond:
            self._pos = pos
            self._wanted = True
            self._cond.notify()

    def settle(self) -> None:
        """After the caller's own fsync: wait for a sync under way (one not started is moot), then
        raise the error of a failed one, if any."""
        with self._cond:
            self._wanted = False
            while self._running:
                self._cond.wait()
            if self._error is not None:
                raise self._error

    def close(self) -> None:
        """Stop the thread (after the sync under way, if any); raise a failed sync's error."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join()
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._wanted and not self._closing:
                    self._cond.wait()
                if self._closing:
                    return
                self._wanted, self._running, pos = False, True, self._pos
            error: OSError | None = None
            try:
                os.fdatasync(self._fd)
            except OSError as exc:
                error = exc
            if error is None and self._drop:
                with contextlib.suppress(OSError, AttributeError):
                    os.posix_fadvise(self._fd, 0, pos, os.POSIX_FADV_DONTNEED)
            with self._cond:
                self._running = False
                self._error = error
                self._cond.notify_all()
            if error is not None:
                return  # kept for settle() and close(); syncing on would gain nothing


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (a rename, a new file) durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(
    path: Path,
    data: bytes,
    *,
    what: str,
    mode: int = FILE_MODE,
    keep_open: bool = False,
    prefix: str | None = None,
    suffix: str = ".tmp",
) -> int:
    """Replace ``path`` with ``data`` so that a crash leaves the old or the new one, whole.

    The temporary file (``<prefix><random><suffix>``, by default ``<name>.<random>.tmp``) comes
    from mkstemp (O_EXCL, O_NOFOLLOW, an unpredictable name, 0600): in a shared directory another
    user's link under a name we would pick cannot redirect the write. With ``keep_open`` the
    descriptor (read-write, now ``path``'s) is returned open; else -1.
    """
    tmp: str | None = None
    fd = -1
    done = False
    try:
        fd, tmp = tempfile.mkstemp(prefix=f"{path.name}." if prefix is None else prefix, suffix=suffix, dir=path.parent)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
        if mode != FILE_MODE:
            os.fchmod(fd, mode)
        os.replace(tmp, path)
        tmp = None
        fsync_dir(path.parent)
        done = True
    except OSError as exc:
        raise output_error(exc, path, f"write {what}") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        if fd >= 0 and not (done and keep_open):
            os.close(fd)
    return fd if keep_open else -1


def remove_leftovers(directory: Path, names: re.Pattern[str] = LEFTOVER_RE) -> None:
    """Delete a crash's temporary files: only names we make, only regular files we own (the
    directory may be shared: another user's file or link there is none of our business)."""
    uid = os.geteuid()
    with os.scandir(directory) as it:
        for entry in it:
            if names.fullmatch(entry.name) is None:
                continue
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and st.st_uid == uid:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
