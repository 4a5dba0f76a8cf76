"""Where spark-apply's target is, and the state it keeps there (``TARGET/_pgrecv``): the lock that
lets one run at a time apply to it, and small state objects (the record of what it applied,
pgrecv/spark/ledger.py).

A target is a local directory (or a mount every executor shares), or a prefix of a bucket
(``s3://BUCKET/PREFIX`` on any S3-compatible store, ``gs://BUCKET/PREFIX`` on Cloud Storage). A
local target's lock is an advisory lock on ``_pgrecv/lock``, which the kernel lets go when the
process dies. An object store has no locks: there the lock is the object ``_pgrecv/lock``,
created only if there is none (S3's ``If-None-Match: *``, Cloud Storage's ``ifGenerationMatch=0``:
pgrecv/spark/objects.py) and held as a lease: the holder rewrites it every :data:`LEASE` / 4
seconds on the condition that it is still the version it last wrote, and deletes it when it
ends. A holder that died leaves it behind; another run takes it over (on the condition that it
is the version it saw: of two such runs one wins)

- at once, when the holder ran on this machine since its last boot and its process is gone;
- else once the object is older than its lease (by S3's own clock; on Cloud Storage, by this
  machine's against the object's time: objects.py).

A holder that could not renew its lease in time (someone took the lock over, or the store was
out of reach) has lost it: :meth:`Lock.check` raises before its next commit.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from pgrecv.errors import OutputError, UsageError
from pgrecv.spark.model import STATE_DIR, ApplyConfig
from pgrecv.spark.objects import Objects, Refused, objects_for
from pgrecv.spark.stores import StorePath, TargetPath, filesystem_for, seconds_from_env

LOCK: Final = "lock"
LEASE: Final = 60.0  # seconds a store lock holds without renewal (PGRECV_LOCK_LEASE_SECONDS)


def busy_message(target: object) -> str:
    return (
        f"{target}: another spark-apply run is applying to this target: wait for it to finish "
        "(runs on one target must not overlap)"
    )


class Lock:
    """A held target lock; :meth:`check` says whether it still is (a store lease can be lost)."""

    def check(self) -> None:
        """Raises OutputError when the lock was lost (nothing more may be committed)."""


class Target(ABC):
    """A target: where its tables and its state live."""

    @abstractmethod
    def lock(self) -> contextlib.AbstractContextManager[Lock]:
        """Held for a whole run: one run per target at a time."""

    @abstractmethod
    def read_state(self, name: str) -> bytes | None:
        """``_pgrecv/NAME``'s bytes (None: there is none)."""

    @abstractmethod
    def write_state(self, name: str, data: bytes, what: str) -> None:
        """Writes ``_pgrecv/NAME`` whole, or not at all (under the lock)."""


@dataclass(frozen=True)
class LocalTarget(Target):
    path: Path

    def __str__(self) -> str:
        return str(self.path)

    @contextlib.contextmanager
    def lock(self) -> Iterator[Lock]:
        """An advisory lock on ``TARGET/_pgrecv/lock``, held for the whole run; the kernel lets it
        go when the process dies. Holding it, the run also removes the staging directories of
        runs that were killed."""
        import shutil

        from pgrecv.output.files import open_lock, output_error

        work = self.path / STATE_DIR
        try:
            work.mkdir(parents=True, exist_ok=True, mode=0o700)
            # the directory itself, never through a link: its lock, staging and chmod would land in a
            # directory someone else chose
            dfd = os.open(work, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:  # a target where nothing can be made: say so before Spark starts
            if work.is_symlink():
                raise OutputError(
                    f"{work} is a symbolic link: spark-apply keeps the target's lock and change data there, in a "
                    "directory of its own; remove the link"
                ) from None
            raise output_error(exc, work, "create the target's state directory") from None
        try:
            owner = os.fstat(dfd).st_uid
            if owner != os.geteuid():
                raise OutputError(
                    f"{work} belongs to another user (uid {owner}): spark-apply keeps change data there; "
                    "remove it, or use a --target of your own"
                )
            os.fchmod(dfd, 0o700)  # change data goes in here: this user only
        finally:
            os.close(dfd)
        fd = open_lock(work / LOCK, busy=busy_message(self.path))
        try:
            for stale in work.glob("stage-*"):
                shutil.rmtree(stale, ignore_errors=True)
            yield Lock()
        finally:
            os.close(fd)

    def read_state(self, name: str) -> bytes | None:
        try:
            return (self.path / STATE_DIR / name).read_bytes()
        except OSError:
            return None

    def write_state(self, name: str, data: bytes, what: str) -> None:
        from pgrecv.output.files import write_atomic

        write_atomic(self.path / STATE_DIR / name, data, what=what)


def lease_seconds() -> float:
    """The store lock's lease: :data:`LEASE`, or ``PGRECV_LOCK_LEASE_SECONDS`` (at least 4)."""
    return seconds_from_env("PGRECV_LOCK_LEASE_SECONDS", LEASE, least=4.0)


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _started(pid: int) -> str:
    """The process's start time in clock ticks since boot ('' : no such process): with the
    boot id, what tells a live holder from a new process that got its pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rpartition(")")[2].split()[19]


class StoreLock(Lock):
    """The lease on ``_pgrecv/lock`` of a store target (see the module's docstring)."""

    def __init__(self, objects: Objects, target: StoreTarget) -> None:
        self._objects = objects
        self._target = target
        self._name = f"{STATE_DIR}/{LOCK}"
        self.lease = lease_seconds()
        pid = os.getpid()
        self._me = json.dumps(
            {
                "v": 1,
                "run": uuid.uuid4().hex,
                "host": socket.gethostname(),
                "boot": _boot_id(),
                "pid": pid,
                "started": _started(pid),
                "lease": self.lease,
            }
        ).encode()
        self._token: str | None = None
        self._lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- taking and giving back ---------------------------------------------------------------

    def acquire(self) -> None:
        for _ in range(3):  # a holder that ends while we look: look again
            seen = self._look()
            if seen is None:
                if self._put(None):
                    break
                continue
            body, token, age = seen
            if not self._dead(body, age):
                raise OutputError(self._busy(body, age))
            if self._put(token):
                break
        else:
            raise OutputError(busy_message(self._target))
        self._thread = threading.Thread(target=self._renew, name="pgrecv-target-lease", daemon=True)
        self._thread.start()

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._lost is None and self._token is not None:
            # only while it is still ours: a run that took it over keeps it
            with contextlib.suppress(Exception):
                self._objects.delete(self._name, self._token)

    def check(self) -> None:
        if self._lost is not None:
            raise OutputError(
                f"{self._target}: this run lost the target's lock ({self._lost}): it stopped before committing "
                "more; every table is at its last applied position: run spark-apply again"
            )

    # --- the lease ----------------------------------------------------------------------------

    def _renew(self) -> None:
        every = self.lease / 4
        last = time.monotonic()
        while not self._stop.wait(every):
            try:
                self._token = self._write(self._token)
                last = time.monotonic()
            except Refused:
                self._lost = "another run took it over"
                return
            except Exception as exc:  # the store out of reach: the lease runs out meanwhile
                if time.monotonic() - last > self.lease * 0.75:
                    self._lost = f"it could not be renewed: {type(exc).__name__}"
                    return

    def _put(self, token: str | None) -> bool:
        """Creates (``token`` None) or takes over the lock; False when another run was first."""
        try:
            self._token = self._write(token)
        except Refused:
            return False
        return True

    def _write(self, token: str | None) -> str:
        try:
            return self._objects.put(self._name, self._me, token)
        except Refused:
            raise
        except Exception as exc:
            raise self._fail(exc, "write") from None

    def _look(self) -> tuple[dict[str, object], str, float] | None:
        """The lock's holder, token and age in seconds; None: not held."""
        try:
            seen = self._objects.get(self._name)
        except Exception as exc:
            raise self._fail(exc, "read") from None
        if seen is None:
            return None
        try:
            body = json.loads(seen.data)
            if not isinstance(body, dict):
                raise ValueError
        except ValueError:
            body = {}
        return body, seen.token, seen.age

    def _dead(self, holder: dict[str, object], age: float) -> bool:
        """Whether the holder is gone: its lease ran out, or it ran here and its process is gone."""
        lease = holder.get("lease")
        if age > (float(lease) if isinstance(lease, int | float) else LEASE):
            return True
        if holder.get("host") == socket.gethostname() and holder.get("boot") == _boot_id() and _boot_id():
            pid = holder.get("pid")
            return not isinstance(pid, int) or _started(pid) != holder.get("started")
        return False

    def _busy(self, holder: dict[str, object], age: float) -> str:
        lease = holder.get("lease")
        left = max(0, int((float(lease) if isinstance(lease, int | float) else LEASE) - age))
        return (
            f"{busy_message(self._target)}; it is held by process {holder.get('pid')} on {holder.get('host')} "
            f"(if that run died, the lock is free in {left} s)"
        )

    def _fail(self, exc: Exception, doing: str) -> OutputError:
        return OutputError(
            f"cannot {doing} the target's lock {self._objects.where(self._name)}: {self._objects.short(exc)}; "
            f"nothing was applied: check the bucket, the credentials and {self._objects.endpoint}, and run again"
        )


@dataclass(frozen=True)
class StoreTarget(Target):
    objects: Objects

    @classmethod
    def of(cls, text: str, conf: dict[str, str] | None = None) -> StoreTarget:
        conf = conf or {}
        return cls(objects_for(StorePath.of(text, filesystem_for(text, conf, {})), conf))

    def __str__(self) -> str:
        return self.objects.where()

    @contextlib.contextmanager
    def lock(self) -> Iterator[Lock]:
        """The lease on ``_pgrecv/lock``; holding it, the run also removes what runs that were
        killed left under ``_pgrecv/`` (their staged input, a carried file half made)."""
        held = StoreLock(self.objects, self)
        held.acquire()
        try:
            self._sweep()
            yield held
        finally:
            held.release()

    def _sweep(self) -> None:
        for left in (f"{STATE_DIR}/stage-", f"{STATE_DIR}/prepared/.tmp-"):
            with contextlib.suppress(Exception):  # (best effort: the next run tries again)
                self.objects.remove_under(left)

    def read_state(self, name: str) -> bytes | None:
        try:
            seen = self.objects.get(f"{STATE_DIR}/{name}")
        except Exception as exc:
            raise OutputError(
                f"cannot read {self.objects.where(STATE_DIR + '/' + name)}: {self.objects.short(exc)}: check the "
                f"bucket, the credentials and {self.objects.endpoint}; nothing was applied"
            ) from None
        return None if seen is None else seen.data

    def write_state(self, name: str, data: bytes, what: str) -> None:
        try:
            self.objects.write(f"{STATE_DIR}/{name}", data)
        except Exception as exc:
            raise OutputError(
                f"cannot write {what} {self.objects.where(STATE_DIR + '/' + name)}: {self.objects.short(exc)}: check "
                "the bucket and the credentials; the tables are applied, and the next run reads their files again"
            ) from None


def target_of(config: ApplyConfig) -> Target:
    """The run's target: a local directory, or a prefix of a bucket."""
    t = config.target
    return StoreTarget(objects_for(t, config.conf)) if isinstance(t, StorePath) else LocalTarget(t)


def check_store(target: TargetPath, fmt: str, catalog: str | None) -> None:
    """What a target on an object store does not take yet: one line naming it, before anything runs
    (spark-apply's, and verify's of the same lake)."""
    if not isinstance(target, StorePath):
        return
    if fmt == "iceberg" and catalog is None:
        raise UsageError(
            f"--target {target}: Iceberg's Hadoop catalog cannot be on an object store (it commits by "
            "renaming a file): name an Iceberg catalog of the session whose warehouse is there "
            "(--iceberg-catalog, for example Iceberg's JDBC catalog), or use --format delta or parquet"
        )
    if fmt == "delta" and target.scheme == "gs":
        # (delta-rs, which reads a Delta table's log for the record of what was applied, does not
        # list a Cloud Storage emulator's bucket: no test could show it right)
        raise UsageError(
            f"--target {target}: --format delta is not supported on Cloud Storage yet: use --format parquet "
            "(or iceberg with --iceberg-catalog) there, or a --target on S3 or a local path"
        )
    # --delta-engine spark is taken: Delta's connector commits on S3 through its single-driver log
    # store, which the target's lock makes true for pgrecv's runs (docs/spark-apply.md names the
    # DynamoDB log store for tables other jobs write too)
