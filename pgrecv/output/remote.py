"""``start --output-dir s3://BUCKET/PREFIX``: the files of a local ``--output-dir``, each uploaded once final."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pgrecv.errors import ForeignOutput, OutputError, PgrecvError
from pgrecv.lsn import LSN, lsn_str
from pgrecv.output.files import MANIFEST_SUFFIX, STATE_NAME
from pgrecv.output.sinks import (
    DIR_STATE_VERSION,
    STATE_RECORD_SIZE,
    STATE_VERSION,
    DirSink,
    Owner,
    Resume,
    final_ranges,
    parse_state,
)
from pgrecv.output.store import ObjectStore, StoreURL, is_store_url

__all__ = ["StoreDirSink", "check_empty", "is_store_url", "publish_snapshot"]

# user metadata on each uploaded file (S3 sends it as x-amz-meta-*): where the stream stands after
# the file's last unit, and whose stream it is, so that a file published after the state object
# was last written still says exactly where to resume
META_COMMIT, META_END = "pgrecv-commit-lsn", "pgrecv-end-lsn"
META_OWNER = {"slot": "pgrecv-slot", "database": "pgrecv-database", "system_identifier": "pgrecv-system-identifier"}


class StoreDirSink(DirSink):
    """The files of :class:`DirSink`, same names and bytes, published to an S3 prefix.

    Each file is written in a private local directory (``mkdtemp`` under ``$TMPDIR``: mode 0700,
    an unpredictable name), as :class:`DirSink` writes it and at the same boundaries. Publishing
    it is one conditional upload under its final name (``If-None-Match: *``; a file over 5 GiB in
    parts, completed by one conditional call), so a listing of the prefix never shows a partial
    file, and the file's position is durable, and confirmed to the server, only once its upload
    and every earlier one have succeeded. Uploads run in a thread of their own, in order, while
    the stream goes on (:class:`_Uploader`); the local copy is deleted once uploaded: at most
    the file being written and :data:`_Uploader.PENDING` finished ones are on local disk.

    Each object carries, as user metadata, the commit and end LSN of its last unit and whose
    stream it is (:class:`Owner`). ``PREFIX/.pgrecv-state`` holds the same record as a local
    directory's state: the owner from the start of the first run, the position at every
    ``--fsync-interval``; it is replaced only with ``If-Match`` on the ETag this run last saw, so
    a second writer on the prefix makes the first stop rather than interleave.

    Resume reads the prefix: the state object, and the newest final name past it, whose metadata
    must name this stream (a file past the state without it is not pgrecv's: refused, as a local
    directory refuses one). There is no lock object: PostgreSQL streams a slot to one consumer at
    a time, the owner record keeps other slots' runs out, and the conditional writes catch two
    runs that start at once.
    """

    SYNC_PARTS = False  # the upload is the durable copy, not the local part

    def __init__(
        self,
        url: str,
        rotate_size: int | None = None,
        rotate_interval: float | None = None,
        suffix: str = ".jsonl",
        *,
        store: ObjectStore | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store or ObjectStore(StoreURL.parse(url))
        # `directory` becomes the private staging directory at begin(); nothing local before that
        super().__init__(Path(tempfile.gettempdir()), rotate_size, rotate_interval, suffix, clock=clock)
        self._etag: str | None = None  # of the state object as this run last saw or wrote it
        self._uploader: _Uploader | None = None  # made with the staging directory, at begin()

    def where(self) -> tuple[str, str]:
        return str(self.store.url), self.store.where(STATE_NAME)

    # opening

    def _look(self) -> Resume:
        store = self.store
        where = str(store.url)
        state_name = store.where(STATE_NAME)
        got = store.read(STATE_NAME)
        state: dict[str, Any] | None = None
        if got is not None:
            text, self._etag = got
            state = parse_state(text, state_name, what=where, versions=(STATE_VERSION, DIR_STATE_VERSION))
        ranges = final_ranges(store.names(), where)
        newest = max(ranges, default=None, key=lambda r: r[1])
        commit, end, source = self._on_record(state, state_name)
        self._state_end = end
        if newest is not None and (commit is None or newest[1] > commit):
            end = self._vouch_object(newest[2], newest[1], state_name if state is not None else None)
            commit, source = newest[1], store.where(newest[2])
            self._final_name = newest[2]
        self._final_commit, self._final_end = commit, end
        if commit is not None:
            self._max_commit = commit
        return Resume(commit, end, source)

    def _vouch_object(self, name: str, last: int, state_name: str | None) -> int:
        """The end LSN the newest file's metadata records, once it is shown to be this stream's
        (its metadata names the commit LSN its name claims, and the state's owner if any)."""
        meta = self.store.metadata(name) or {}
        past = f"past what {state_name} records" if state_name else "not recorded (there is no state object)"
        try:
            if meta.get(META_COMMIT) is None or int(LSN.parse(meta[META_COMMIT])) != last:
                raise ValueError("no pgrecv metadata for the position its name claims")
            end = int(LSN.parse(meta[META_END]))
            values = [meta.get(key) for key in META_OWNER.values()]
            owner = Owner(*values) if all(values) else None  # type: ignore[arg-type]
        except (ValueError, KeyError) as exc:
            raise ForeignOutput(
                f"{self.store.where(name)} is {past}, and {exc}: it is not this stream's output; nothing was "
                "confirmed: move it out of the prefix and run again"
            ) from None
        if owner is not None:
            if self._owner is not None and owner != self._owner:
                raise ForeignOutput(
                    f"{self.store.where(name)} holds the output of {owner.describe()}, not of "
                    f"{self._owner.describe()} as {state_name} says; nothing was confirmed: give each slot a "
                    "prefix of its own"
                )
            self._owner = owner
        return end

    def begin(self) -> None:
        """The private staging directory made, and the first part started there."""
        self.look()
        if self._begun:
            return
        try:
            self.directory = Path(tempfile.mkdtemp(prefix="pgrecv-upload-"))
        except OSError as exc:
            raise self._raw.fail(exc, "create a staging directory in") from None
        try:
            self._new_file()
        except BaseException:
            shutil.rmtree(self.directory, ignore_errors=True)
            raise
        self._uploader = _Uploader(self.store)
        self._begun = True

    # publishing

    def _advance(self, tmp: Path | None, name: str | None) -> None:
        """The finished part handed to the uploader (with the position it completes), or the
        position alone: confirmed only once everything before it is uploaded (:meth:`durable`)."""
        if tmp is not None:
            try:
                self._fdraw.detach()
                fd, self._fdraw.fd = self._fdraw.fd, -1
                os.close(fd)
            except OSError as exc:
                raise self._raw.fail(exc, "publish") from None
        meta: dict[str, str] = {}
        if name is not None:
            meta = {META_COMMIT: lsn_str(self._max_commit), META_END: lsn_str(self._last_end or 0)}
            if self._owner is not None:
                meta.update({META_OWNER[k]: getattr(self._owner, k) for k in META_OWNER})
        self._final_commit = self._max_commit  # (names: the next file's must be newer)
        assert self._uploader is not None
        self._uploader.put(_Upload(tmp, name, self._max_commit, self._last_end or 0, meta))

    def durable(self) -> int | None:
        """As for a directory, everything complete so far: the current file finished, and the
        uploads handed over waited for (files rotated by size between two calls went up while
        the stream went on); the state object is brought up to the last."""
        self._raw.check()
        if self._first is not None:
            self._rotate_soon()
        if self._uploader is None:
            return None
        self._uploader.wait()
        done = self._uploader.done
        if done is None:
            return None
        if done.name is not None:
            self._final_name = done.name
        self._final_end = done.end
        if done.end != self._state_end:
            self._write_state(done.commit, done.end, self._final_name)
        return done.end

    def _write_state(
        self, commit: int | None, end: int | None, name: str | None, part: str | None = None, size: int = 0
    ) -> None:
        """The state object replaced, if no one else wrote it since this run last did."""
        doc: dict[str, Any] = {
            "version": DIR_STATE_VERSION,
            "commit_lsn": None if commit is None or end is None else lsn_str(commit),
            "end_lsn": None if commit is None or end is None else lsn_str(end),
            "file": name,
        }
        if self._owner is not None:
            doc.update({k: getattr(self._owner, k) for k in META_OWNER})
        data = json.dumps(doc).encode()
        data += b" " * max(0, STATE_RECORD_SIZE - 1 - len(data)) + b"\n"  # the same bytes as a local one
        self._etag = self.store.replace(STATE_NAME, data, self._etag)
        self._state_end = end

    def close(self) -> None:
        if not self._begun:
            return
        self._begun = False
        uploader = self._uploader
        assert uploader is not None
        try:
            if uploader.error is None:
                self.discard_partial()
                self._finish_file(last=True)
                uploader.wait()
                self.durable()
        finally:
            uploader.close()
            if self._fdraw.fd >= 0:
                self._fdraw.detach()
                os.close(self._fdraw.fd)
                self._fdraw.fd = -1
            self._tmp = None
            self._drain()
            shutil.rmtree(self.directory, ignore_errors=True)  # parts not uploaded: never confirmed


@dataclass(frozen=True, slots=True)
class _Upload:
    """A finished file to upload (``tmp`` None: a position reached without a file), and the
    position it completes."""

    tmp: Path | None
    name: str | None
    commit: int
    end: int
    metadata: dict[str, str]


class _Uploader:
    """Uploads finished files in stream order in a thread of its own, so that the stream goes on
    while a file goes up (measured: bench/NOTES.md). At most :data:`PENDING` wait, so local disk
    holds a bounded number of files; after a failure nothing more is uploaded (a later file on
    the store past a missing one would make a restart skip it), and the failure is raised at the
    next :meth:`check`."""

    PENDING = 2

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self.done: _Upload | None = None  # the last upload finished: its end and all before are on the store
        self.error: PgrecvError | None = None
        self._queue: queue.Queue[_Upload | None] = queue.Queue(maxsize=self.PENDING)
        self._thread = threading.Thread(target=self._run, name="pgrecv-upload", daemon=True)
        self._thread.start()

    def put(self, item: _Upload) -> None:
        self.check()
        self._queue.put(item)

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def wait(self) -> None:
        """Every upload handed over so far finished; the first failure raised."""
        self._queue.join()
        self.check()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                if self.error is not None:
                    continue
                if item.tmp is not None and item.name is not None:
                    self.store.create_from(item.name, item.tmp, item.metadata)
                    with contextlib.suppress(OSError):
                        item.tmp.unlink()
                self.done = item
            except PgrecvError as exc:
                self.error = exc
            except Exception as exc:  # an OSError reading the part, or a bug: stop here too
                self.error = OutputError(f"cannot upload {self.store.where(item.name if item else None)}: {exc}")
            finally:
                self._queue.task_done()


def check_empty(store: ObjectStore) -> None:
    """A snapshot starts a prefix of its own (checked before its slot is made), as it starts a
    directory: its files must sort before every change of its slot."""
    names = sorted(store.names())
    if names:
        raise OutputError(
            f"{store.url} is not empty (it holds {names[0]}): a snapshot starts a prefix of its own; choose an "
            "empty one"
        )


def publish_snapshot(store: ObjectStore, directory: Path) -> list[str]:
    """A finished local snapshot uploaded: its files, then its manifest, then its state last, each
    created only if the name is free. A reader (or `start`) sees a snapshot complete only once the
    manifest is there, and `start` continues it only once the state is. On failure what this call
    uploaded is removed (best effort) and the error raised. Returns the names uploaded."""
    local = sorted(p.name for p in directory.iterdir() if p.is_file() and not p.name.startswith("."))
    manifests = [n for n in local if n.endswith(MANIFEST_SUFFIX)]
    order = [n for n in local if n not in manifests] + manifests
    if (directory / STATE_NAME).exists():
        order.append(STATE_NAME)
    done: list[str] = []
    try:
        for name in order:
            store.create_from(name, directory / name, {})
            done.append(name)
    except BaseException:
        for name in reversed(done):
            with contextlib.suppress(Exception):
                store.delete(name)
        raise
    return order
