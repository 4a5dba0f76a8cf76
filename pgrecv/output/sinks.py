"""Long-running outputs of `pgrecv start`, and when what they hold counts as durable.

First :meth:`Sink.look` (what the output holds, read without creating anything), then, once the
start checks have passed, :meth:`Sink.begin` (the file or directory made): a refused start leaves
nothing behind. Then the streamer calls, in stream order: :meth:`Sink.write` for each record,
:meth:`Sink.boundary` after the last record of each unit (a transaction, a PREPARE, a
COMMIT/ROLLBACK PREPARED, a non-transactional message), :meth:`Sink.durable` every
``--fsync-interval`` and at a clean stop, and :meth:`Sink.tick` on every loop wake-up. A position
is confirmed to the server only once ``durable()`` has returned it, so "durable" is the whole
contract:

* standard output (:class:`StdoutSink`): written to the pipe or terminal, like pg_recvlogical;
* one file (:class:`FileSink`): fsync'd, then recorded in a state file beside it (JSONL at every
  boundary: one fsync, the record left to writeback, see :class:`FileSink`);
* a directory (:class:`DirSink`): fsync'd, renamed to its final name, directory fsync'd.

Where a run resumes (:class:`Resume`) comes from that same record: the state file for
``--file``, the final file names and a state file for ``--output-dir``. Nothing is read back
from the output itself, so raw and pretty output resume as well as JSONL; the one exception is
``-f`` JSONL made durable at every boundary, whose record may lag the lines it is followed by.

``write`` is the hot path. It is the bound ``write`` of an :class:`io.BufferedWriter` (C code, no
Python frame), over a small raw layer of ours that turns ``OSError`` into :class:`OutputError`
and whose descriptor can be swapped at a boundary, so that the runner may keep the bound method
across rotations. No syscall happens per record; one does per buffer-full.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import json
import os
import stat
import sys
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, cast

from pgrecv.errors import ForeignOutput, OutputError, UsageError
from pgrecv.lsn import LSN, lsn_str
from pgrecv.output.files import (
    DIR_MODE,
    FILE_MODE,
    FINAL_RE,
    LEFTOVER_RE,
    LOCK_NAME,
    LOOKS_FINAL_RE,
    MANIFEST_SUFFIX,
    SNAPSHOT_FILE_RE,
    STATE_NAME,
    TMP_PREFIX,
    TMP_SUFFIX,
    Syncer,
    fsync_dir,
    lock_fd,
    open_lock,
    output_error,
    remove_leftovers,
    temp_name_re,
    write_atomic,
)

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

BUFFER_SIZE = 1 << 17
STATE_VERSION = 1
# `--output-dir`'s state from version 2 on records whose stream the directory holds (:class:`Owner`)
# and each file before it is published, so that a file past the record is never pgrecv's.
# Version 1 (no owner, files recorded after publishing) is still read: :meth:`DirSink._recover`.
DIR_STATE_VERSION = 2
# `-f`'s state file is one record padded to this size and rewritten in place (pwrite + fdatasync):
# within one disk sector, as PostgreSQL's own pg_control is, so a crash leaves the old record or
# the new one. Replacing the file by rename cost three fsyncs and a directory fsync per update.
STATE_RECORD_SIZE = 512
# A record left to writeback (``"tail"``) is synced when it is this old (seconds): it bounds the
# lines that a restart after a machine crash scans.
STATE_SYNC_AGE = 1.0
# Every this many bytes written to a regular file, a thread of its own fdatasyncs it (files.Syncer),
# so that the sink's own fdatasync waits for the last few MiB rather than for all since the one
# before: at the end of a 313 MB stream that wait was 0.1-0.4 s with the kernel merely asked to
# start the writeback (sync_file_range), 3 ms with the syncs (bench/NOTES.md).
WRITEBACK_BYTES = 4 << 20
TAILS = ("jsonl",)  # output formats whose whole units a restart can find by reading the lines
_OPEN_FLAGS = os.O_WRONLY | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)


@dataclass(frozen=True, slots=True)
class Owner:
    """The stream an output directory holds: the slot, its database and the server's system
    identifier (IDENTIFY_SYSTEM; a promoted standby keeps its primary's). Recorded in
    ``DIR/.pgrecv-state``: a directory shared by two slots made the second skip, and confirm,
    changes it never wrote."""

    slot: str
    database: str
    system_identifier: str

    def describe(self) -> str:
        return f'slot "{self.slot}" of database "{self.database}" (server system identifier {self.system_identifier})'


@dataclass(frozen=True, slots=True)
class Resume:
    """What the output already holds, as far as its durable record says.

    ``last_commit_lsn``: transactions whose commit LSN is at or below it are in the output
    (skip them: delivery is at-least-once). ``last_end_lsn``: the end LSN of that last unit,
    when known (a directory whose state file lags its file names knows only the commit LSN).
    """

    last_commit_lsn: int | None = None
    last_end_lsn: int | None = None
    source: str | None = field(default=None, compare=False)  # the file that says so, for messages
    # the claim comes from an output file that holds nothing (pgrecv never publishes one): trusted
    # only where the slot has confirmed it already (see Streamer._check_positions)
    empty_source: bool = field(default=False, compare=False)

    @property
    def furthest(self) -> int:
        """The highest WAL position the output claims to hold (0: none)."""
        return max(self.last_commit_lsn or 0, self.last_end_lsn or 0)

    @property
    def start_lsn(self) -> int:
        """A START_REPLICATION position that misses nothing the output lacks: the server sends
        every transaction whose commit record starts at or after it."""
        if self.last_end_lsn is not None:
            return self.last_end_lsn
        if self.last_commit_lsn is not None:
            return self.last_commit_lsn + 1
        return 0


# --- raw layers under the BufferedWriter ---------------------------------------------------


class _Raw(io.RawIOBase):
    """Base of our raw layers: tracks the position and remembers the first failure.

    ``closed`` is a plain attribute: BufferedWriter checks ``raw.closed`` on every write, and
    IOBase's property is a sizeable part of a write (bench/NOTES.md). After a failure has been raised once, writes
    are dropped silently (so a later flush by the garbage collector prints nothing); the sink
    re-raises ``failure`` wherever it would claim durability.
    """

    closed = False

    def __init__(self, label: str) -> None:
        super().__init__()
        self.label = label
        self.pos = 0
        self.total = 0  # bytes handed to the kernel since the start, across files (for metrics)
        self.failure: OutputError | None = None

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return self.pos

    def check(self) -> None:
        if self.failure is not None:
            raise self.failure

    def fail(self, exc: OSError, doing: str) -> OutputError:
        self.failure = output_error(exc, self.label, doing)
        return self.failure


class _FdRaw(_Raw):
    """A file descriptor that can be swapped at a transaction boundary (rotation, SIGHUP).

    A regular file is synced in the background as it grows (:class:`Syncer`, started at its
    first :data:`WRITEBACK_BYTES`): the sink's own fdatasync then calls :meth:`settle`, and
    :meth:`detach` stops the syncer before the descriptor is closed or swapped.
    """

    def __init__(self, label: str) -> None:
        super().__init__(label)
        self.fd = -1
        self.syncer: Syncer | None = None
        self.unsynced: int | None = None  # where the bytes no sync was asked for begin (None: a file not synced)

    def attach(self, fd: int, pos: int, label: str, *, sync: bool = True) -> None:
        """Write to ``fd`` from now on (the previous one detached); ``sync``: a regular file."""
        self.fd, self.pos, self.label = fd, pos, label
        self.unsynced = pos if sync else None

    def detach(self) -> None:
        """Stop the background syncs of the descriptor, which the caller is about to close. A
        failed sync's error is kept (:meth:`check` raises it)."""
        syncer, self.syncer = self.syncer, None
        if syncer is not None:
            try:
                syncer.close()
            except OSError as exc:
                if self.failure is None:
                    self.fail(exc, "fsync")

    def settle(self) -> None:
        """After the sink's own fdatasync: raise the error of a background sync that failed (the
        kernel may report it to that one only)."""
        if self.syncer is not None:
            try:
                self.syncer.settle()
            except OSError as exc:
                raise self.fail(exc, "fsync") from None

    def cut(self, offset: int) -> None:
        """Drop what was written past ``offset`` (a unit cut short: it will come again whole)."""
        if self.pos > offset:
            try:
                os.ftruncate(self.fd, offset)
            except OSError as exc:
                raise self.fail(exc, "truncate") from None
            self.pos = offset
            if self.unsynced is not None:
                self.unsynced = min(self.unsynced, offset)

    def close(self) -> None:
        """Only ever called by the garbage collector (through the BufferedWriter): the sinks
        close their descriptors themselves."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            self.detach()
            os.close(fd)

    def write(self, b: ReadableBuffer) -> int:
        if self.failure is not None:
            return len(memoryview(b))
        try:
            n = os.write(self.fd, b)
        except OSError as exc:
            raise self.fail(exc, "write") from None
        self.pos += n
        self.total += n
        if self.unsynced is not None and self.pos - self.unsynced >= WRITEBACK_BYTES:
            # not a durability step (the sink's fdatasync is): it only keeps that one short
            if self.syncer is None:
                self.syncer = Syncer(self.fd, "pgrecv-sync")
            self.syncer.kick(self.pos)
            self.unsynced = self.pos
        return n


class _StreamRaw(_Raw):
    def __init__(self, stream: BinaryIO, label: str) -> None:
        super().__init__(label)
        self.stream = stream

    def write(self, b: ReadableBuffer) -> int:
        if self.failure is not None:
            return len(memoryview(b))
        try:
            n = self.stream.write(b)
        except OSError as exc:
            raise self.fail(exc, "write") from None
        n = len(memoryview(b)) if n is None else n
        self.pos += n
        self.total += n
        return n


# --- the interface --------------------------------------------------------------------------


class Sink(ABC):
    """Where `pgrecv start` writes records; see the module docstring for the call order.

    ``file_started`` counts output files begun since :meth:`open` (rotation, SIGHUP onto a new
    file); it stays 0 for standard output. Rotation happens only at a boundary, so a runner that
    compares it with the value it last saw, before the first record of each unit, knows when to
    repeat the relation records a self-describing file needs.

    ``warning`` is set by :meth:`open` when the output may already repeat what is coming (a
    file without pgrecv state), for the runner to print.
    """

    write: Callable[[bytes], None]
    """Append one record (bytes or any buffer). Buffered: no syscall per call. (It is the
    buffer's own ``write``, which returns a count; callers ignore it.)"""

    def __init__(self) -> None:
        self.file_started = 0
        self.warning: str | None = None

    @abstractmethod
    def open(self) -> Resume:
        """Prepare the output; say what it already holds. (:meth:`look`, then :meth:`begin`.)"""

    def look(self) -> Resume:
        """What the output already holds, read without creating or changing anything: the checks
        that may refuse to start (positions, owner) come between this and :meth:`begin`, and a
        refused run must leave nothing behind. A sink that cannot look without opening opens."""
        return self.open()

    def begin(self) -> None:  # noqa: B027 - optional hook
        """Create and prepare what :meth:`look` only read (the file, the directory, the state)."""

    @abstractmethod
    def boundary(self, commit_lsn: int, end_lsn: int) -> None:
        """The records written since the previous boundary form one complete unit."""

    @abstractmethod
    def durable(self) -> int | None:
        """Make everything up to the last boundary durable; the end LSN of the last unit written
        *since open()* that now is (None: none yet). Never a position merely read back from an
        earlier run's record: that one is what :class:`Resume` reports, for the runner to check."""

    @property
    def bytes_written(self) -> int:
        """Bytes written out since :meth:`open`, across files (buffered ones not yet)."""
        return 0

    def tick(self, now: float) -> None:  # noqa: B027 - optional hook
        """Periodic and cheap; ``now`` is ``time.monotonic()``."""

    def check_owner(self, owner: Owner) -> None:  # noqa: B027 - optional hook
        """Refuse an output that holds another stream's records (:class:`ForeignOutput`); called
        once connected, before the slot is touched. Only ``--output-dir`` records its owner."""

    def record_owner(self) -> None:  # noqa: B027 - optional hook
        """Record the owner :meth:`check_owner` accepted, once the start positions are checked."""

    def reopen(self) -> None:  # noqa: B027 - optional hook
        """SIGHUP."""

    def discard_partial(self) -> None:  # noqa: B027 - optional hook
        """Drop records written after the last boundary: their unit will be sent again in full."""

    @abstractmethod
    def close(self) -> None:
        """Durable, then closed. Records after the last boundary are dropped."""


class _BufferedSink(Sink):
    def __init__(self, raw: _Raw) -> None:
        super().__init__()
        self._raw = raw
        self._bw = io.BufferedWriter(raw, BUFFER_SIZE)
        self.write = cast("Callable[[bytes], None]", self._bw.write)
        self._tell = self._bw.tell

    def _flush(self) -> None:
        self._raw.check()
        self._bw.flush()

    @property
    def bytes_written(self) -> int:
        return self._raw.total

    def _drain(self) -> None:
        """Empty the buffer into nowhere (after the descriptor is gone or has failed)."""
        failure = self._raw.failure
        self._raw.failure = OutputError("output closed")
        with contextlib.suppress(Exception):
            self._bw.flush()
        self._raw.failure = failure


# --- standard output -------------------------------------------------------------------------


class StdoutSink(_BufferedSink):
    """A pipe or terminal: durable means written, as pg_recvlogical has it.

    Nothing can be read back from a pipe, so :meth:`open` knows nothing (the runner de-duplicates
    across reconnects within the process). :meth:`tick` flushes, so a terminal or a downstream
    reader sees each transaction as soon as the loop has nothing more to read. A unit cut by a
    lost connection has already gone out; it comes again in full after the reconnect.
    """

    def __init__(self, stream: BinaryIO | None = None) -> None:
        self._stream = stream if stream is not None else sys.stdout.buffer
        super().__init__(_StreamRaw(self._stream, "standard output"))
        self._last_end: int | None = None
        self._durable_end: int | None = None

    def open(self) -> Resume:
        return Resume()

    def boundary(self, commit_lsn: int, end_lsn: int) -> None:
        self._last_end = end_lsn

    def _flush(self) -> None:
        super()._flush()
        try:
            self._stream.flush()
        except OSError as exc:
            raise self._raw.fail(exc, "write") from None

    def durable(self) -> int | None:
        self._flush()
        self._durable_end = self._last_end
        return self._durable_end

    def tick(self, now: float) -> None:
        self._flush()

    def close(self) -> None:
        try:
            self._flush()
        finally:
            self._drain()


# --- one file ------------------------------------------------------------------------------


class FileSink(_BufferedSink):
    """``-f FILE``: appended to (created 0600), fsync'd, with its position in a state file beside it.

    The state file ``.FILE.pgrecv-state`` holds ``{"version": 1, "offset": N, "commit_lsn":
    "X/X", "end_lsn": "X/X"}``: the file's first N bytes are whole units, the last of which
    ended at ``end_lsn``. It is made whole once per open (temporary file, fsync, rename,
    directory fsync) and then rewritten in place, one sector (:class:`_StateRecord`), and only
    after the data's fdatasync, so it never claims more than the disk holds.
    :meth:`open` truncates the file back to N: a unit half-written before a crash is cut off, and
    comes again in full from the server. Writing the state at open means a crash before the first
    fsync still leaves a record to truncate to.

    SIGHUP (:meth:`reopen`) reopens the path, like pg_recvlogical, for rotation by rename; if a
    unit is half-written it waits for that unit's boundary, so no unit is split across files.
    An advisory lock on the file keeps a second pgrecv from appending to it.

    A path that is not a regular file (``/dev/null``, a FIFO, ``/dev/stdout``) is treated like
    standard output: durable means written; no state file, no fsync, no truncation.

    ``tail="jsonl"`` (``--synchronous`` or ``-F 0`` into JSONL) halves the fsyncs per boundary:
    the record is rewritten after the data's fdatasync but left to writeback (synced at the first
    :meth:`tick` once :data:`STATE_SYNC_AGE` old, and at close; one about a new file at once), and
    says ``"tail": "jsonl"``. After a machine crash it may lag what the disk holds and what the
    server was told; :meth:`open` then reads the lines past its offset and keeps every whole unit
    they hold (:func:`pgrecv.output.jsonl.last_unit_end`), so nothing confirmed is cut. A record
    is written only after the data it describes is durable, so it never points past the disk.
    """

    def __init__(self, path: str | os.PathLike[str], tail: str | None = None) -> None:
        if tail is not None and tail not in TAILS:
            raise ValueError(f"tail {tail!r}")
        self._tail = tail
        self.path = Path(path)
        super().__init__(_FdRaw(str(self.path)))
        self._fdraw: _FdRaw = self._raw  # type: ignore[assignment]
        self.state_path = self.path.with_name(f".{self.path.name}.pgrecv-state")
        self._b_off = 0  # file offset just after the last boundary
        self._b_commit: int | None = None
        self._b_end: int | None = None
        self._dirty = False  # a boundary since the state was last written
        self._durable_end: int | None = None
        self._reopen_wanted = False
        self._ident: tuple[int, int] | None = None
        self._regular = True
        self._state = _StateRecord(self.state_path)
        self._looked: Resume | None = None
        self._pending_fd = -1  # the file, opened (and locked) by look(), until begin() takes it
        self._size = 0  # its size when looked at: begin() cuts it back to _b_off

    def open(self) -> Resume:
        resume = self.look()
        self.begin()
        return resume

    def look(self) -> Resume:
        if self._looked is None:
            self._looked = self._look()
        return self._looked

    def _look(self) -> Resume:
        """The file (if it exists: opened to append and locked, nothing cut) and its state."""
        existed = os.path.lexists(self.path)
        if not existed:  # created by begin(): its directory must be one
            try:
                if not stat.S_ISDIR(os.stat(self.path.parent).st_mode):
                    raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
            except OSError as exc:
                raise output_error(exc, self.path, "open") from None
        fd, size = self._open_file(0) if existed else (-1, 0)
        self._pending_fd, self._size = fd, size
        if not self._regular:
            return Resume()
        commit: int | None = None
        end: int | None = None
        try:
            state = _read_state(self.state_path, what=self.path, has_offset=True)
            if state is not None:
                offset, commit, end = state["offset"], state["commit_lsn"], state["end_lsn"]
                if not existed:
                    offset = 0
                    if end is not None:
                        self.warning = (
                            f"{self.path} is missing: starting it anew after {lsn_str(end)}, "
                            f"where {self.state_path.name} says the old one ended"
                        )
                elif offset > size:
                    raise OutputError(
                        f"{self.path} has {size} bytes but {self.state_path.name} says {offset} were written: "
                        f"it was truncated or replaced; restore it, or delete {self.state_path} to append "
                        "without resuming (transactions may then repeat)"
                    )
                elif offset < size and state.get("tail") is not None:
                    offset, commit, end = self._scan_tail(fd, offset, commit, end)
            else:
                offset = size
                if size:
                    self.warning = (
                        f"{self.path} has no pgrecv state: appending; transactions already in it may be repeated"
                    )
        except OSError as exc:
            self._close_pending()
            raise output_error(exc, self.path, "read") from None
        except OutputError:
            self._close_pending()
            raise
        self._b_off, self._b_commit, self._b_end = offset, commit, end
        return Resume(commit, end, str(self.state_path))

    def begin(self) -> None:
        """The file created if missing (O_EXCL: it did not exist when looked at), cut back to the
        state's offset (a unit a crash cut short comes again whole), and the state written."""
        self.look()
        if self._fdraw.fd >= 0:
            return
        fd, self._pending_fd = self._pending_fd, -1
        if fd < 0:
            fd, self._size = self._open_file(os.O_CREAT | os.O_EXCL)
        if not self._regular:
            self._fdraw.attach(fd, 0, str(self.path), sync=False)
            return
        with contextlib.suppress(OSError):  # a directory we may write in but not list: leftovers stay
            remove_leftovers(self.path.parent, temp_name_re(self.state_path.name))
        if self._b_off < self._size:
            try:
                os.ftruncate(fd, self._b_off)
            except OSError as exc:
                os.close(fd)
                raise output_error(exc, self.path, "truncate") from None
        self._fdraw.attach(fd, self._b_off, str(self.path))
        self._write_state()
        self._durable_end = None  # nothing of this run yet: the old end is the runner's to check

    def _close_pending(self) -> None:
        fd, self._pending_fd = self._pending_fd, -1
        if fd >= 0:
            os.close(fd)

    def _scan_tail(
        self, fd: int, offset: int, commit: int | None, end: int | None
    ) -> tuple[int, int | None, int | None]:
        """Whole units past a record that may lag them (see the class docstring)."""
        from pgrecv.output.jsonl import last_unit_end

        # our descriptor is write-only: read through the path, checked to be the file we locked
        rfd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        with open(rfd, "rb") as f:
            mine, theirs = os.fstat(fd), os.fstat(rfd)
            if (mine.st_dev, mine.st_ino) != (theirs.st_dev, theirs.st_ino):
                raise OSError(errno.ESTALE, "the file was replaced while being opened")
            f.seek(offset)
            found = last_unit_end(f)
        if found is None:
            return offset, commit, end
        size, commit, end = found
        return offset + size, commit, end

    def _open_file(self, create: int) -> tuple[int, int]:
        """The output, opened to append (``create``: O_CREAT, and O_EXCL, as wanted; 0600). A
        regular file only by its own name (O_NOFOLLOW) and only of the effective user: the file
        is truncated back to the state's offset at a restart, and in a shared directory a planted
        link or file could make that another user's file. A link to a device or FIFO
        (/dev/stdout) is followed: nothing is truncated there."""
        via_link = False
        try:
            fd = os.open(self.path, _OPEN_FLAGS | create | os.O_NOFOLLOW, FILE_MODE)
        except OSError as exc:
            # a link: ELOOP, EEXIST with O_EXCL, or EACCES where the kernel protects links in
            # sticky directories
            if not (exc.errno in (errno.ELOOP, errno.EACCES, errno.EEXIST) and os.path.islink(self.path)):
                if exc.errno == errno.EEXIST:
                    raise OutputError(
                        f"cannot create {self.path}: it appeared while pgrecv was starting; is another "
                        "program writing it? run again"
                    ) from None
                raise output_error(exc, self.path, "open") from None
            via_link = True
            fd = self._open_link()
        try:
            st = os.fstat(fd)
            self._regular = stat.S_ISREG(st.st_mode)
            if self._regular:
                if via_link:
                    raise _link_refused(self.path)
                _check_ours(st, self.path, "an output file")
                lock_fd(fd, self.path, busy=_busy(self.path))
        except BaseException:
            os.close(fd)
            raise
        self._ident = (st.st_dev, st.st_ino)
        return fd, st.st_size if self._regular else 0

    def _open_link(self) -> int:
        """FILE is a symbolic link: followed only to what is not a regular file (nor missing)."""
        try:
            target = os.stat(self.path)
        except OSError:
            raise _link_refused(self.path) from None
        if stat.S_ISREG(target.st_mode) or stat.S_ISDIR(target.st_mode):
            raise _link_refused(self.path)
        try:
            return os.open(self.path, os.O_WRONLY | os.O_APPEND | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise output_error(exc, self.path, "open") from None

    def _write_state(self, sync: bool = True) -> None:
        doc: dict[str, Any] = {
            "version": STATE_VERSION,
            "offset": self._b_off,
            "commit_lsn": None if self._b_commit is None else lsn_str(self._b_commit),
            "end_lsn": None if self._b_end is None else lsn_str(self._b_end),
        }
        if self._tail is not None:
            doc["tail"] = self._tail
        self._state.write(doc, sync=sync)
        self._dirty = False

    def boundary(self, commit_lsn: int, end_lsn: int) -> None:
        self._b_off = self._tell()
        self._b_commit = commit_lsn
        self._b_end = end_lsn
        self._dirty = True
        if self._reopen_wanted:
            self._reopen_now()

    def durable(self) -> int | None:
        self._raw.check()
        if not self._regular:
            self._flush()
            self._durable_end = self._b_end
        elif self._dirty:
            self._flush()
            try:
                os.fdatasync(self._fdraw.fd)  # the data and the file's size: what a reader needs
            except OSError as exc:
                raise self._raw.fail(exc, "fsync") from None
            self._fdraw.settle()
            self._write_state(sync=self._tail is None)
            self._durable_end = self._b_end
        return self._durable_end

    def tick(self, now: float) -> None:
        """Hand buffered records to the kernel, so that `tail -f` shows them (no fsync); sync a
        state record left to writeback once it is :data:`STATE_SYNC_AGE` old."""
        self._bw.flush()
        since = self._state.unsynced_since
        if since is not None and now - since >= STATE_SYNC_AGE:
            self._state.sync()

    def discard_partial(self) -> None:
        self._flush()
        if self._regular:
            self._fdraw.cut(self._b_off)

    def reopen(self) -> None:
        if self._tell() == self._b_off:
            self._reopen_now()
        else:
            self._reopen_wanted = True  # at the boundary of the unit being written

    def _reopen_now(self) -> None:
        self._reopen_wanted = False
        self.durable()
        old = self._ident
        self._close_fd()
        fd, size = self._open_file(os.O_CREAT)
        self._fdraw.attach(fd, size, str(self.path), sync=self._regular)
        self._b_off = size
        if self._regular:
            self._write_state()  # now about the new file: a crash must not truncate it to the old offset
        if self._ident != old:
            self.file_started += 1

    def _close_fd(self) -> None:
        fd = self._fdraw.fd
        if fd >= 0:
            self._fdraw.detach()
            self._fdraw.fd = -1
            os.close(fd)

    def close(self) -> None:
        self._close_pending()  # looked at, never begun (a refused start): nothing to write
        if self._fdraw.fd < 0:
            return
        try:
            self.discard_partial()
            self.durable()
            self._state.sync()
        finally:
            self._close_fd()
            self._state.close()
            self._drain()


# --- a directory of rotated files ----------------------------------------------------------


class DirSink(_BufferedSink):
    """``--output-dir DIR``: files that appear complete or not at all, named to sort by LSN.

    Records go to a hidden temporary file (``.tmp-XXXXXXXX.part``, from mkstemp: O_EXCL, O_NOFOLLOW,
    an unpredictable name, as the directory may be shared). A file is finished only at a
    unit boundary: flushed, fsync'd, renamed to ``FIRST-LAST.jsonl`` and the directory fsync'd;
    FIRST and LAST are commit LSNs as 16 upper-case hex digits (the file's first unit and the
    highest in it), so names sort lexically in stream order. A reader listing DIR never sees a
    partial file under a final name, and never an empty one.

    A file is finished at the first boundary at which it has reached ``rotate_size`` bytes or
    is ``rotate_interval`` seconds old (counted from its first unit), and also on every
    :meth:`durable` call, i.e. every ``--fsync-interval``. That last choice bounds what the slot
    keeps: nothing in an open file may be confirmed to the server (a crash deletes it), so
    keeping a file open across fsync intervals would make the server retain WAL for as long as
    the file stays open; with only ``--rotate-size`` on a quiet stream, without limit. Files are
    therefore at most one fsync interval old; for fewer, larger files raise ``--fsync-interval``
    too, and accept that the slot holds that much more WAL. When :meth:`durable` (or
    :meth:`tick`, or SIGHUP) finds a unit half-written, the file is finished at that unit's
    boundary instead, never split.

    Resume: the state file ``DIR/.pgrecv-state`` (version 2): whose stream the directory holds
    (:class:`Owner`, checked by :meth:`check_owner`: a directory shared by two slots would make the
    second skip what the first wrote) and the commit and end LSN of the last finished file. It is
    rewritten *before* each rename, naming the file and its temporary name, so a file that
    appears under a final name is always on record; a crash between the two is completed at the
    next :meth:`open` (the rename is done then). Consumers may take files away: the state stays.
    So a non-empty file whose name reaches past the state is not this stream's, and is refused
    (:class:`ForeignOutput`) rather than resumed after. A version-1 state (earlier pgrecv, no
    owner, files recorded after the rename) or none: the greatest LAST among final names counts
    too, and the newest file must then end with the unit its name claims (pgrecv's JSONL), or be
    a snapshot its manifest vouches for. A final name must parse, and no two files' LSN ranges
    may overlap: anything else is an error naming the file. Temporary files left by a crash are
    deleted at :meth:`open` (only names pgrecv makes, only regular files of ours); what they held
    was never confirmed. An advisory lock on ``DIR/.pgrecv.lock`` keeps a second pgrecv out.
    """

    STATE_NAME = STATE_NAME
    LOCK_NAME = LOCK_NAME
    SYNC_PARTS = True  # parts are synced as they grow (the file itself is the durable copy)

    def __init__(
        self,
        directory: str | os.PathLike[str],
        rotate_size: int | None = None,
        rotate_interval: float | None = None,
        suffix: str = ".jsonl",
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory = Path(directory)
        super().__init__(_FdRaw(str(self.directory)))
        self._fdraw: _FdRaw = self._raw  # type: ignore[assignment]
        self.rotate_size = rotate_size
        self.rotate_interval = rotate_interval
        self.suffix = suffix
        self._clock = clock
        self._lock_fd = -1
        self._tmp: Path | None = None
        self._state = _StateRecord(self.directory / self.STATE_NAME)
        # the file being written
        self._b_off = 0
        self._first: int | None = None  # commit part of the name; None: no complete unit yet
        self._started = 0.0
        self._last_end: int | None = None
        self._want_rotate = False
        # the stream so far
        self._max_commit = -1  # running maximum, so that names never go backwards
        self._final_commit: int | None = None  # LAST of the newest final file (or resumed)
        self._final_end: int | None = None
        self._final_name: str | None = None
        self._state_end: int | None = None  # end LSN last written to the state file
        self._run_end: int | None = None  # end LSN of the last unit this run made final
        # whose stream this is: as recorded in the state, as vouched by a snapshot's manifest, as given
        self._owner: Owner | None = None
        self._manifest: tuple[Path, str] | None = None  # (manifest, its slot) of a snapshot without a v2 state
        self._claimed: Owner | None = None
        self._looked: Resume | None = None
        self._begun = False

    # opening

    def open(self) -> Resume:
        resume = self.look()
        self.begin()
        return resume

    def look(self) -> Resume:
        if self._looked is None:
            self._looked = self._look()
        return self._looked

    def _look(self) -> Resume:
        """The directory read, under its lock if a pgrecv ever wrote there; nothing created,
        renamed or removed. A directory that does not exist holds nothing."""
        d = self.directory
        if not os.path.lexists(d):
            return Resume()
        if not d.is_dir():
            exists = OSError(errno.EEXIST, os.strerror(errno.EEXIST))
            raise output_error(exists, d, "create the output directory")
        if os.path.lexists(d / self.LOCK_NAME):
            self._lock_fd = open_lock(d / self.LOCK_NAME, busy=_busy(d))
        try:
            return self._recover(tidy=False)
        except BaseException:
            self._unlock()
            raise

    def begin(self) -> None:
        """The directory created if missing and locked, a crash's leftovers dealt with (a rename
        on record completed, temporary files removed), and the first temporary file started."""
        looked = self.look()
        if self._begun:
            return
        d = self.directory
        try:
            if not d.is_dir():
                d.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
                fsync_dir(d.parent)
        except OSError as exc:
            raise output_error(exc, d, "create the output directory") from None
        if self._lock_fd < 0:
            self._lock_fd = open_lock(d / self.LOCK_NAME, busy=_busy(d))
        try:
            if self._recover(tidy=True) != looked:  # read again under the lock: the same, or refused
                raise OutputError(f"{d} changed while pgrecv was starting: is another program writing it? run again")
            self._new_file()
        except BaseException:
            self._unlock()
            raise
        self._begun = True

    def _unlock(self) -> None:
        fd, self._lock_fd = self._lock_fd, -1
        if fd >= 0:
            os.close(fd)

    def _recover(self, *, tidy: bool) -> Resume:
        """What the directory holds (see the class docstring); ``tidy``: also complete a rename
        the state has on record and remove a crash's temporary files (neither moves the result)."""
        d = self.directory
        state_path = d / self.STATE_NAME
        state = _read_state(state_path, what=d, has_offset=False, versions=(STATE_VERSION, DIR_STATE_VERSION))
        recorded = state is not None and state["version"] == DIR_STATE_VERSION  # every file on record
        try:
            if recorded and tidy:
                assert state is not None
                self._complete_rename(state)
            if tidy:
                remove_leftovers(d)  # a crash's (this sink's or pgrecv snapshot's), never confirmed
            ranges = _final_ranges(d)
        except OSError as exc:
            raise output_error(exc, d, "read the output directory") from None
        newest = max(ranges, default=None, key=lambda r: r[1])
        commit, end, source = self._on_record(state, str(state_path))
        empty = False
        if newest is not None and (commit is None or newest[1] > commit):
            path = d / newest[2]
            try:
                empty = path.lstat().st_size == 0
            except OSError as exc:
                raise output_error(exc, path, "read") from None
            if not empty:  # an empty one is judged against the slot (Streamer._check_positions)
                if recorded:
                    on_record = f"what {state_path} records ({lsn_str(commit)})" if commit is not None else None
                    raise ForeignOutput(
                        f"{path} reaches past {on_record or f'the start of the stream {state_path} records'}; "
                        "pgrecv records each file there before publishing it, so this one is not from this "
                        "stream; nothing was confirmed: move it out of the directory and run again"
                    )
                self._vouch(path, newest[1], on_record=state is not None)
            commit, end = newest[1], None  # finished after the state was last written: end unknown
            self._final_name, source = newest[2], str(path)
        if commit is not None and end is None:
            # known from a name only: a state recording it says where to start, commit + 1 (written
            # with the owner, once the positions are checked: never by a run that was refused)
            self._final_end = commit + 1
        else:
            self._final_end = end
        self._final_commit, self._state_end = commit, self._final_end
        if commit is not None:
            self._max_commit = commit
        return Resume(commit, end, source, empty_source=empty)

    def _on_record(self, state: dict[str, Any] | None, where: str) -> tuple[int | None, int | None, str | None]:
        """What a state record (read from ``where``) says: whose stream it is (kept), and the
        commit and end LSN of the last unit on record, with where that comes from."""
        if state is None:
            return None, None, None
        self._owner = state.get("owner")
        if state["commit_lsn"] is None:
            return None, None, None
        self._final_name = state.get("file")
        return state["commit_lsn"], state["end_lsn"], where

    def _complete_rename(self, state: dict[str, Any]) -> None:
        """A crash between recording a file (its temporary name, its size) and renaming it: the
        state already counts it, so the rename is done now. The file may also be gone because a
        consumer took it, or the temporary name reused by a newer part: then nothing is done."""
        part, name, size = state.get("part"), state.get("file"), state.get("size")
        if part is None or name is None:
            return
        tmp, final = self.directory / part, self.directory / name
        try:
            st = tmp.lstat()
        except FileNotFoundError:
            return
        if not (stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and st.st_size == size):
            return
        if os.path.lexists(final):
            return
        os.rename(tmp, final)
        fsync_dir(self.directory)

    def _vouch(self, path: Path, last: int, *, on_record: bool) -> None:
        """The newest file of a directory without a version-2 state must be what its name says:
        a snapshot whose manifest names it (its slot is checked by :meth:`check_owner`), or
        pgrecv JSONL ending with the unit whose commit LSN its name claims. Anything else (a
        stray file, another format that cannot be read back) would move the resume position by
        a name alone."""
        name = path.name
        why: str
        if name.endswith(MANIFEST_SUFFIX) or SNAPSHOT_FILE_RE.fullmatch(name):
            manifest = path.with_name(name[: 2 * 16 + 1] + MANIFEST_SUFFIX)
            slot = _manifest_slot(manifest, last)
            if slot is not None:
                self._manifest = (manifest, slot)
                return
            why = f"no manifest {manifest.name} for that position vouches for it (an incomplete snapshot?)"
        elif FINAL_RE.fullmatch(name) and name.endswith(".jsonl") and name.count(".") == 1:
            from pgrecv.output.jsonl import unit_end

            try:
                found = unit_end(_last_line(path))
            except OSError as exc:
                raise output_error(exc, path, "read") from None
            if found is not None and found[0] == last:
                return
            claimed = lsn_str(last)
            why = f"it does not end with the transaction its name claims ({claimed})"
        else:
            why = "pgrecv cannot read back that its last unit is the one its name claims"
        state = self.directory / self.STATE_NAME
        unrecorded = f"past what {state} records" if on_record else f"not recorded ({state} is missing)"
        raise ForeignOutput(
            f"{path} is {unrecorded} and {why}: it is not this stream's output; nothing was "
            "confirmed: move it out of the directory and run again"
        )

    def where(self) -> tuple[str, str]:
        """The output and its state record, as messages name them."""
        return str(self.directory), str(self.directory / self.STATE_NAME)

    def check_owner(self, owner: Owner) -> None:
        output, state = self.where()
        if self._owner is not None and self._owner != owner:
            raise ForeignOutput(
                f"{state} says {output} holds the output of {self._owner.describe()}, not of "
                f"{owner.describe()}: resuming there would skip changes; nothing was confirmed: "
                "give each slot an --output-dir of its own"
            )
        if self._manifest is not None and self._manifest[1] != owner.slot:
            raise ForeignOutput(
                f'{self._manifest[0]} is a snapshot for slot "{self._manifest[1]}", not "{owner.slot}": '
                "resuming there would skip changes; nothing was confirmed: give each slot an --output-dir of its own"
            )
        self._claimed = owner

    def record_owner(self) -> None:
        owner = self._claimed
        if owner is None or owner == self._owner:
            return
        self._owner = owner
        self._write_state(self._final_commit, self._final_end, self._final_name)

    def _new_file(self) -> None:
        try:
            fd, name = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=TMP_SUFFIX, dir=self.directory)
            # appends: a write after discard_partial's ftruncate lands at the new end, not past a hole
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)
        except OSError as exc:
            raise self._raw.fail(exc, "create") from None
        tmp = Path(name)
        self._tmp = tmp
        self._fdraw.attach(fd, 0, str(self.directory), sync=self.SYNC_PARTS)
        self._b_off = 0
        self._first = None
        self._last_end = None

    # streaming

    def boundary(self, commit_lsn: int, end_lsn: int) -> None:
        self._b_off = self._tell()
        if commit_lsn > self._max_commit:
            self._max_commit = commit_lsn
        if self._first is None:
            self._first = self._max_commit
            self._started = self._clock()
        self._last_end = end_lsn
        if (
            self._want_rotate
            or (self.rotate_size is not None and self._b_off >= self.rotate_size)
            or (self.rotate_interval is not None and self._clock() - self._started >= self.rotate_interval)
        ):
            self._finish_file()

    def tick(self, now: float) -> None:
        if (
            self.rotate_interval is not None
            and self._first is not None
            and not self._want_rotate
            and now - self._started >= self.rotate_interval
        ):
            self._rotate_soon()

    def durable(self) -> int | None:
        self._raw.check()
        if self._first is not None:
            self._rotate_soon()
        if self._final_end is not None and self._final_end != self._state_end:
            self._write_state(self._final_commit or 0, self._final_end, self._final_name)
        return self._run_end

    def _write_state(
        self, commit: int | None, end: int | None, name: str | None, part: str | None = None, size: int = 0
    ) -> None:
        """The state, made durable: where the output ends, the last file (``part``: the temporary
        name it is about to be renamed from, and its ``size``) and whose stream it is."""
        doc: dict[str, Any] = {
            "version": DIR_STATE_VERSION,
            "commit_lsn": None if commit is None or end is None else lsn_str(commit),
            "end_lsn": None if commit is None or end is None else lsn_str(end),
            "file": name,
        }
        if part is not None:
            doc["part"], doc["size"] = part, size
        if self._owner is not None:
            doc.update(_owner_doc(self._owner))
        self._state.write(doc)
        self._state_end = end

    def reopen(self) -> None:
        """SIGHUP: finish the current file (at once, or at the boundary of the unit being written)."""
        if self._first is not None:
            self._rotate_soon()

    def discard_partial(self) -> None:
        self._flush()
        self._fdraw.cut(self._b_off)

    def _rotate_soon(self) -> None:
        if self._tell() == self._b_off:
            self._finish_file()
        else:
            self._want_rotate = True

    def _finish_file(self, *, last: bool = False) -> None:
        """Publish the current file (no partial unit in it) and start the next."""
        self._want_rotate = False
        first = self._first
        if first is None:
            return
        if self._final_commit is not None and self._max_commit <= self._final_commit:
            return  # nothing with a newer commit LSN (a lone ROLLBACK PREPARED): its name would clash
        if self._b_off == 0:  # complete units that wrote nothing: the position moves, no file
            self._advance(None, None)
            self._first = None
            return
        name = f"{first:016X}-{self._max_commit:016X}{self.suffix}"
        tmp = self._tmp
        assert tmp is not None
        self._flush()
        self._advance(tmp, name)
        self._tmp = None
        self._first = None
        if not last:
            self._new_file()
            self.file_started += 1

    def _advance(self, tmp: Path | None, name: str | None) -> None:
        """The stream's position moves to the last complete unit: with the finished part ``tmp``
        published as the file ``name``, or (None, None) without a file."""
        if tmp is not None and name is not None:
            self._publish(tmp, name)
            self._final_name = name
        self._final_commit, self._final_end = self._max_commit, self._last_end
        self._run_end = self._last_end

    def _publish(self, tmp: Path, name: str) -> None:
        """The finished part (flushed, no partial unit) made the file ``name``, durably: fsync'd,
        on record in the state, renamed, the directory fsync'd."""
        final = self.directory / name
        try:
            os.fsync(self._fdraw.fd)
            self._fdraw.settle()
            self._fdraw.detach()
            fd, self._fdraw.fd = self._fdraw.fd, -1
            size = os.fstat(fd).st_size
            os.close(fd)
            if final.exists():
                raise OutputError(
                    f"cannot publish {final}: it already exists; is another program writing {self.directory}?"
                )
            # on record before it appears (see the class docstring); a crash before the rename
            # leaves the part, which the next open() renames
            self._write_state(self._max_commit, self._last_end, name, tmp.name, size)
            os.rename(tmp, final)
            fsync_dir(self.directory)
        except OSError as exc:
            raise self._raw.fail(exc, "publish") from None

    def close(self) -> None:
        if not self._begun:  # looked at, never begun (a refused start): nothing to write
            self._unlock()
            return
        if self._lock_fd < 0:
            return
        try:
            self.discard_partial()
            self._finish_file(last=True)
            self.durable()
        finally:
            if self._fdraw.fd >= 0:
                self._fdraw.detach()
                os.close(self._fdraw.fd)
                self._fdraw.fd = -1
            if self._tmp is not None:
                with contextlib.suppress(OSError):
                    self._tmp.unlink()  # no complete unit, or one not to be published
                self._tmp = None
            self._drain()
            self._state.close()
            os.close(self._lock_fd)
            self._lock_fd = -1


# --- factory and helpers -------------------------------------------------------------------


def make_sink(
    target: str | None,
    output_dir: str | None,
    rotate_size: int | None = None,
    rotate_interval: float | None = None,
    suffix: str = ".jsonl",
    tail: str | None = None,
) -> Sink:
    """The sink for ``-f``/``--output-dir``: ``-`` or nothing is standard output. ``tail``: see
    :class:`FileSink` (only ``-f`` uses it)."""
    if output_dir is not None:
        if target is not None:
            raise UsageError("--file and --output-dir exclude each other: pick one")
        if rotate_size is not None and rotate_size <= 0:
            raise UsageError("--rotate-size must be positive")
        if rotate_interval is not None and rotate_interval <= 0:
            raise UsageError("--rotate-interval must be positive")
        return DirSink(output_dir, rotate_size, rotate_interval, suffix)
    if rotate_size is not None or rotate_interval is not None:
        raise UsageError("--rotate-size and --rotate-interval need --output-dir")
    if target is None or target == "-":
        return StdoutSink(sys.stdout.buffer)
    return FileSink(target, tail)


def _busy(path: Path) -> str:
    return f"{path} is in use by another process (it holds the lock): stop it, or choose another output"


def _final_ranges(directory: Path) -> list[tuple[int, int, str]]:
    """(FIRST, LAST, name) of the final files, checked: names parse, ranges do not overlap."""
    with os.scandir(directory) as it:
        return final_ranges([entry.name for entry in it], str(directory))


def final_ranges(names: list[str], where: str) -> list[tuple[int, int, str]]:
    """(FIRST, LAST, name) of the final names among ``names`` (of the directory or prefix
    ``where``), checked: names parse, ranges do not overlap."""
    ranges: list[tuple[int, int, str]] = []
    for name in names:
        m = FINAL_RE.fullmatch(name)
        if m is None:
            if LOOKS_FINAL_RE.fullmatch(name) is not None:
                raise OutputError(
                    f"cannot resume from {where}: {name} looks like an output file but does not "
                    "parse (FIRST-LAST, 16 upper-case hexadecimal digits each, then a suffix of letters, "
                    "digits, '.', '_' or '-'): rename or move it out of the directory"
                )
            continue
        first, last = int(m.group(1), 16), int(m.group(2), 16)
        if first > last:
            raise OutputError(
                f"cannot resume from {where}: {name} starts after it ends; "
                "it is not pgrecv's: move it out of the directory"
            )
        ranges.append((first, last, name))
    ranges.sort()
    top: tuple[int, int, str] | None = None  # the range reaching furthest so far
    for r in ranges:
        if top is not None and r[0] < top[1] and r[:2] != top[:2]:  # an identical range is a copy
            raise OutputError(
                f"cannot resume from {where}: the LSN ranges of {top[2]} and {r[2]} overlap, so one "
                "of them is not from this stream: move it out of the directory"
            )
        if top is None or r[1] > top[1]:
            top = r
    return ranges


class _StateRecord:
    """A state file made whole once (temporary name, fsync, rename, directory fsync) and then
    rewritten in place: the JSON padded to :data:`STATE_RECORD_SIZE` bytes, one pwrite at offset 0
    and an fdatasync, on the descriptor mkstemp gave (no later path lookup can be redirected)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = -1
        self.unsynced_since: float | None = None  # monotonic time of the oldest record not yet synced

    def write(self, doc: dict[str, Any], *, sync: bool = True) -> None:
        """``sync=False`` leaves the record to the kernel's writeback (or :meth:`sync`): only for
        a record whose output can be scanned past it (``"tail"``), so a stale one loses nothing."""
        data = json.dumps(doc).encode()
        data += b" " * (STATE_RECORD_SIZE - 1 - len(data)) + b"\n"  # JSON allows the padding
        assert len(data) == STATE_RECORD_SIZE
        if self.fd < 0:
            self.fd = write_atomic(self.path, data, what="the state file", keep_open=True)
            self.unsynced_since = None
            return
        try:
            if os.pwrite(self.fd, data, 0) != len(data):
                raise OSError(errno.EIO, "short write")
        except OSError as exc:
            raise output_error(exc, self.path, "write the state file") from None
        if sync:
            self.sync()
        elif self.unsynced_since is None:
            self.unsynced_since = time.monotonic()

    def sync(self) -> None:
        if self.fd < 0:
            return
        try:
            os.fdatasync(self.fd)
        except OSError as exc:
            raise output_error(exc, self.path, "write the state file") from None
        self.unsynced_since = None

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


_OWNER_KEYS = ("slot", "database", "system_identifier")


def _owner_doc(owner: Owner) -> dict[str, str]:
    return {"slot": owner.slot, "database": owner.database, "system_identifier": owner.system_identifier}


def write_dir_state(directory: Path, owner: Owner, commit_lsn: int, end_lsn: int, file: str) -> None:
    """A directory's state written whole by another writer than :class:`DirSink` (``pgrecv
    snapshot``: its files are on record, and so is the stream they start)."""
    doc = {
        "version": DIR_STATE_VERSION,
        "commit_lsn": lsn_str(commit_lsn),
        "end_lsn": lsn_str(end_lsn),
        "file": file,
        **_owner_doc(owner),
    }
    data = json.dumps(doc).encode()
    data += b" " * max(0, STATE_RECORD_SIZE - 1 - len(data)) + b"\n"  # as DirSink rewrites it in place
    write_atomic(directory / STATE_NAME, data, what="the state file")


def _manifest_slot(manifest: Path, last: int) -> str | None:
    """The slot of a snapshot manifest written for the position ``last`` (CP - 1), or None."""
    try:
        doc = json.loads(manifest.read_bytes())
        if not isinstance(doc, dict) or not isinstance(doc.get("slot"), str):
            return None
        if max(int(LSN.parse(doc["snapshot_lsn"])) - 1, 0) != last:
            return None
        return str(doc["slot"])
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _last_line(path: Path) -> bytes:
    """The file's last line (without its newline; b"" if the file does not end with one), read
    from the end: the file may be large, its last record is not."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    try:
        size = os.fstat(fd).st_size
        if size == 0 or os.pread(fd, 1, size - 1) != b"\n":
            return b""
        chunks: list[bytes] = []
        pos = size - 1  # the last line ends here
        while pos > 0:
            step = min(pos, 1 << 16)
            pos -= step
            chunk = os.pread(fd, step, pos)
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                chunks.append(chunk[cut + 1 :])
                break
            chunks.append(chunk)
        return b"".join(reversed(chunks))
    finally:
        os.close(fd)


def _read_state(
    path: Path, *, what: Path, has_offset: bool, versions: tuple[int, ...] = (STATE_VERSION,)
) -> dict[str, Any] | None:
    """The state file, LSNs parsed to ints (and, from version 2, ``owner`` an :class:`Owner` or
    None); None when there is none."""
    text = _read_own_state(path)
    if text is None:
        return None
    return parse_state(text, str(path), what=str(what), has_offset=has_offset, versions=versions)


def parse_state(
    text: bytes, path: str, *, what: str, has_offset: bool = False, versions: tuple[int, ...] = (STATE_VERSION,)
) -> dict[str, Any]:
    """A state record's JSON (of the file or object ``path``, recording where ``what`` ends),
    checked; see :func:`_read_state`."""
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict) or doc.get("version") not in versions:
            known = " or ".join(str(v) for v in versions)
            raise ValueError(f"version {doc.get('version') if isinstance(doc, dict) else '?'} is not {known}")
        for key in ("commit_lsn", "end_lsn"):
            value = doc.get(key)
            doc[key] = None if value is None else int(LSN.parse(value))
        if (doc["commit_lsn"] is None) != (doc["end_lsn"] is None):
            raise ValueError("commit_lsn and end_lsn go together")
        if doc["commit_lsn"] is not None and doc["commit_lsn"] > doc["end_lsn"]:
            raise ValueError(f"commit_lsn {lsn_str(doc['commit_lsn'])} is after end_lsn {lsn_str(doc['end_lsn'])}")
        if doc.get("tail") not in (None, *TAILS):
            raise ValueError(f"unknown tail {doc.get('tail')!r}")
        if has_offset:
            offset = doc.get("offset")
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
                raise ValueError(f"bad offset {offset!r}")
        if doc["version"] >= DIR_STATE_VERSION:
            _check_dir_state(doc)
    except (ValueError, TypeError, AttributeError) as exc:
        raise OutputError(
            f"cannot use {path}: {exc}; it records where {what} ends: restore it, or delete it to start "
            "without resuming (transactions may then repeat)"
        ) from None
    return doc


def _link_refused(path: Path) -> OutputError:
    return OutputError(
        f"{path} is a symbolic link: pgrecv writes a file only by its own name, never through a link "
        "(in a shared directory one can point at another user's file, which a restart truncates): "
        "give the file's real path, or '-' for standard output"
    )


def _check_ours(st: os.stat_result, path: Path, what: str) -> None:
    """A file pgrecv may write, truncate or trust belongs to the effective user."""
    if st.st_uid != os.geteuid():
        raise OutputError(
            f"{path} belongs to another user (uid {st.st_uid}): pgrecv uses only {what} of its own "
            "user (it truncates the output to what the state file says at a restart): move it out of "
            "the way, choose another path, or run as its owner"
        )


def _read_own_state(path: Path) -> bytes | None:
    """A state file's bytes; None when there is none. Only a regular file of the effective user,
    by its own name: a planted state (a link, another user's file saying offset 0) would make
    pgrecv truncate what it does not own; a directory or FIFO there is named as such."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OutputError(
                f"{path} is a symbolic link, not pgrecv's state file (pgrecv never writes one through a "
                "link): remove it, and run again"
            ) from None
        raise output_error(exc, path, "read") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
            raise OutputError(
                f"{path} is {kind}, not pgrecv's state file (pgrecv keeps where the output ends in a file "
                "of that name): move it out of the way, and run again"
            )
        _check_ours(st, path, "a state file")
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise output_error(exc, path, "read") from None
    finally:
        os.close(fd)


def _check_dir_state(doc: dict[str, Any]) -> None:
    """The version-2 fields: the owner (all three or none), the last file and its temporary name."""
    given = [k for k in _OWNER_KEYS if doc.get(k) is not None]
    if given and len(given) != len(_OWNER_KEYS):
        raise ValueError(f"{', '.join(_OWNER_KEYS)} go together")
    if not all(isinstance(doc.get(k), str) for k in given):
        raise ValueError(f"{', '.join(_OWNER_KEYS)} must be strings")
    doc["owner"] = Owner(*(doc[k] for k in _OWNER_KEYS)) if given else None
    name, part, size = doc.get("file"), doc.get("part"), doc.get("size")
    if name is not None and not (isinstance(name, str) and FINAL_RE.fullmatch(name)):
        raise ValueError(f"bad file {name!r}")
    if part is not None:
        if not (isinstance(part, str) and LEFTOVER_RE.fullmatch(part) and part.startswith(TMP_PREFIX)):
            raise ValueError(f"bad part {part!r}")
        if name is None or not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ValueError("part needs file and size")
