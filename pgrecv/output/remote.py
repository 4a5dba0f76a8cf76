"""``start --output-dir s3://BUCKET/PREFIX``: the files of a local ``--output-dir``, each uploaded once final."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pgrecv.errors import ForeignOutput, OutputError
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
    file, and the file's position is durable, and confirmed to the server, only once the upload
    has succeeded. The local copy is then deleted: at most the file being written and the one
    being uploaded are on local disk.

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
        self._staged = False

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
        commit: int | None = None
        end: int | None = None
        source: str | None = None
        if state is not None:
            self._owner = state.get("owner")
            if state["commit_lsn"] is not None:
                commit, end, source = state["commit_lsn"], state["end_lsn"], state_name
                self._final_name = state.get("file")
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
        found = self.store.metadata(name)
        meta = found[1] if found is not None else {}
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
        self._staged = True
        self._new_file()
        self._begun = True

    # publishing

    def _publish(self, tmp: Path, name: str) -> None:
        try:
            self._fdraw.detach()
            fd, self._fdraw.fd = self._fdraw.fd, -1
            os.close(fd)
        except OSError as exc:
            raise self._raw.fail(exc, "publish") from None
        meta = {META_COMMIT: lsn_str(self._max_commit), META_END: lsn_str(self._last_end or 0)}
        if self._owner is not None:
            meta.update({META_OWNER[k]: getattr(self._owner, k) for k in META_OWNER})
        self.store.create_from(name, tmp, meta)
        with contextlib.suppress(OSError):
            tmp.unlink()

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
        try:
            self.discard_partial()
            self._finish_file(last=True)
            self.durable()
        finally:
            if self._fdraw.fd >= 0:
                self._fdraw.detach()
                os.close(self._fdraw.fd)
                self._fdraw.fd = -1
            self._tmp = None
            self._drain()
            if self._staged:
                shutil.rmtree(self.directory, ignore_errors=True)  # a part not published: never confirmed
                self._staged = False


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
