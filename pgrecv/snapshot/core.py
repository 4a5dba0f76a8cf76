"""`pgrecv snapshot`: a new slot plus a consistent copy of the rows that exist when it starts.

The slot is created over a replication connection with an exported snapshot
(``CREATE_REPLICATION_SLOT ... (SNAPSHOT 'export')``). That connection stays open and idle while
worker connections import the snapshot (``SET TRANSACTION SNAPSHOT``) and ``COPY`` every table
out. Rows committed before the slot's consistent point (CP) are in the snapshot; every later
commit is in the slot's stream: nothing is missed and nothing comes twice.

Files (the contract with spark-apply, docs/event-format.md): in ``--output-dir``,
``0000000000000000-<CP-1>.snapshot-<NNNN>.jsonl``, one per table or ctid range of a table, each
starting with the table's relation record. They sort before every change file
``<first commit>-<last commit>.jsonl`` of ``pgrecv start --output-dir``, whose resume reads CP-1
from these names and so starts at CP (the slot's confirmed position is CP anyway). Workers write
hidden ``.tmp-`` files; only after every COPY finished *and* the exporting connection is still
alive are they renamed, and then, last, the manifest is written atomically. A snapshot without
its manifest is incomplete.

Failure (a table that cannot be read, the exporting connection lost, an interrupt): the temp
files are removed, nothing is published, and the slot this run created is dropped so that a
re-run starts over. A ``kill -9`` cannot clean up: it leaves no manifest (and usually no final
files), but the slot stays: drop it with ``pgrecv drop`` before running again.

Workers are processes when ``--jobs`` > 1: what turning rows into JSON still does in Python
would serialise on the GIL in threads. With one job the copy runs in this process.

Rows go from COPY text to JSON lines in blocks (:mod:`pgrecv.snapshot.fast`), byte for byte what
:func:`copy_task_reference` (psycopg's row parser + the JSONL encoder) writes, with
several times less CPU per row (bench/snapshot.py measures both).
"""

from __future__ import annotations

import contextlib
import json
import math
import multiprocessing as mp
import os
import queue
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from itertools import islice, pairwise
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from pgrecv import events as ev
from pgrecv import failpoints
from pgrecv.errors import (
    ConnectionFailed,
    OutputError,
    PgrecvError,
    ServerConfigError,
    ServerError,
    SlotError,
    UsageError,
)
from pgrecv.filters import table_filter
from pgrecv.lsn import LSN, lsn_str
from pgrecv.output.files import (
    DIR_MODE,
    FILE_MODE,
    FINAL_RE,
    LOCK_NAME,
    MANIFEST_VERSION,
    TMP_PREFIX,
    Syncer,
    fsync_dir,
    manifest_name,
    open_lock,
    output_error,
    remove_leftovers,
    snapshot_file_name,
    snapshot_part_name,
    write_atomic,
)
from pgrecv.output.sinks import Owner, write_dir_state
from pgrecv.pg.conn import ConnOptions, connect, server_major, server_message, translate, with_typed_password
from pgrecv.pg.types import type_name as builtin_type_name

BATCH = 4096  # rows between progress reports (and parent-alive checks) on the reference path
WRITEBACK = 8 << 20  # bytes between background fdatasyncs of a snapshot file (files.Syncer)
DEFAULT_RANGE_SIZE = 64 * 1024 * 1024
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_EXCL_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
_REPLIDENT: dict[str, ev.ReplicaIdentity] = {"d": "d", "n": "n", "f": "f", "i": "i"}


class SnapshotLost(ConnectionFailed):
    """The connection exporting the snapshot went away before the copy was finished."""


@dataclass(frozen=True, slots=True)
class Table:
    relation: ev.Relation
    columns: tuple[str, ...]  # published columns, in the relation's order
    rowfilter: str | None  # the publication's row filter (PostgreSQL 15+), as SQL
    pages: int
    estimate: int  # pg_class.reltuples; -1 when never analysed
    partitioned: bool = False  # a partitioned root (publish_via_partition_root): read through it
    generated: bool = False  # publishes a generated column (18+), which COPY's column list refuses

    @property
    def qualified(self) -> str:
        return f"{self.relation.namespace}.{self.relation.name}"


@dataclass(frozen=True, slots=True)
class Task:
    seq: int  # NNNN of the file name
    table: Table
    lo: int | None  # first block (inclusive) or None: from the start
    hi: int | None  # last block (exclusive) or None: to the end (rows appended later included)
    tmp: str
    name: str
    debezium: tuple[str, str, bool] | None = None  # --format debezium: (database, server, schemas)

    def query(self) -> sql.Composed:
        rel = self.table.relation
        target = sql.Identifier(rel.namespace, rel.name)
        cols = sql.SQL(", ").join(sql.Identifier(c) for c in self.table.columns)
        conds: list[sql.Composable] = []
        if self.table.rowfilter:
            conds.append(sql.SQL("(" + self.table.rowfilter.replace("%", "%%") + ")"))
        if self.lo is not None:
            conds.append(sql.SQL("ctid >= {}::tid").format(sql.Literal(f"({self.lo},0)")))
        if self.hi is not None:
            conds.append(sql.SQL("ctid < {}::tid").format(sql.Literal(f"({self.hi},0)")))
        if self.table.partitioned:  # every partition's rows, through the root
            where = sql.SQL(" AND ").join(conds) if conds else sql.SQL("true")
            return sql.SQL("COPY (SELECT {} FROM {} WHERE {}) TO STDOUT").format(cols, target, where)
        if not conds and not self.table.generated:
            return sql.SQL("COPY {} ({}) TO STDOUT").format(target, cols)
        if not conds:
            conds.append(sql.SQL("true"))
        where = sql.SQL(" AND ").join(conds)
        return sql.SQL("COPY (SELECT {} FROM ONLY {} WHERE {}) TO STDOUT").format(cols, target, where)


@dataclass
class SnapshotResult:
    slot: str
    snapshot_lsn: int
    directory: Path
    files: list[dict[str, Any]] = field(default_factory=list)
    tables: list[dict[str, str]] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return sum(int(f["rows"]) for f in self.files)


# --- the run ---------------------------------------------------------------------------------


def run_snapshot(
    opts: ConnOptions,
    slot: str,
    output_dir: str | os.PathLike[str],
    *,
    plugin: str = "pgoutput",
    publication: str | None = None,
    tables: Sequence[str] = (),
    jobs: int = 1,
    range_size: int = DEFAULT_RANGE_SIZE,
    two_phase: bool = False,
    failover: bool = False,
    progress: bool = False,
    log: Callable[[str], None] = lambda _m: None,
    debezium: tuple[str, str, bool] | None = None,
) -> SnapshotResult:
    """Create ``slot`` with an exported snapshot and write every table's rows to ``output_dir``
    (as Debezium ``op: "r"`` envelopes with ``debezium`` = (database, server name, schemas))."""
    if jobs < 1:
        raise UsageError("--jobs must be at least 1")
    if plugin not in ("pgoutput", "test_decoding"):
        raise UsageError(f"pgrecv snapshot writes slots for pgoutput or test_decoding, not {plugin}")
    if publication and plugin != "pgoutput":
        raise UsageError("--publication applies to the pgoutput plugin only")
    directory = Path(output_dir)
    lock_fd = _prepare_dir(directory)
    try:
        workers = _Workers(jobs)  # before any connection is open: worker processes fork
        try:
            return _run(
                opts,
                slot=slot,
                directory=directory,
                plugin=plugin,
                publication=publication,
                globs=tables,
                jobs=jobs,
                range_size=range_size,
                two_phase=two_phase,
                failover=failover,
                progress=progress,
                log=log,
                workers=workers,
                debezium=debezium,
            )
        finally:
            workers.close()
    finally:
        os.close(lock_fd)


def _run(
    opts: ConnOptions,
    *,
    slot: str,
    directory: Path,
    plugin: str,
    publication: str | None,
    globs: Sequence[str],
    jobs: int,
    range_size: int,
    two_phase: bool,
    failover: bool,
    progress: bool,
    log: Callable[[str], None],
    workers: _Workers,
    debezium: tuple[str, str, bool] | None,
) -> SnapshotResult:
    """:func:`run_snapshot` once the directory is locked and the workers started (``globs`` is
    its ``tables``). Keyword-only: thirteen settings in a row are too easy to misplace."""
    from pgrecv.pg.slots import create_slot_command, get_slot, resolve_publication

    with connect(opts) as meta:
        if plugin == "pgoutput":
            publication = resolve_publication(meta, publication)
        block_size = int(meta.execute("SELECT current_setting('block_size')").fetchone()[0])  # type: ignore[index]
    rconn = connect(opts, replication=True)
    created = False
    tmp_paths: list[Path] = []
    final_paths: list[Path] = []
    try:
        major = server_major(rconn)
        if get_slot(rconn, slot) is not None:
            raise SlotError(
                f'replication slot "{slot}" already exists: a snapshot needs a new slot; drop it with '
                f"'pgrecv drop --slot {slot}' (e.g. after an interrupted snapshot) or choose another name"
            )
        try:
            command = create_slot_command(slot, plugin, major, export=True, two_phase=two_phase, failover=failover)
            row = rconn.execute(command).fetchone()
        except psycopg.Error as exc:
            raise translate(exc, slot=slot) from None
        assert row is not None
        created = True
        cp = int(LSN.parse(row[1]))
        snapshot_name = str(row[2])
        log(f'created slot "{slot}" at {lsn_str(cp)}, exported snapshot {snapshot_name}')
        with connect(opts) as meta:
            import_snapshot(meta, snapshot_name)
            table_list = list_tables(meta, plugin, publication, major, globs, block_size)
            meta.execute("ROLLBACK")
        tasks = _plan(table_list, directory, cp, jobs, max(1, range_size // block_size))
        if debezium is not None:
            tasks = [replace(t, debezium=debezium) for t in tasks]
        tmp_paths = [Path(t.tmp) for t in tasks]
        log(f"{len(table_list)} tables, {len(tasks)} files, {jobs} job(s)")
        rows = workers.run(with_typed_password(opts), snapshot_name, cp, tasks, progress)
        # The snapshot counts only if the exporting connection outlived every import and COPY.
        try:
            (system_identifier, _, _, database), *_ = rconn.execute("IDENTIFY_SYSTEM").fetchall()
        except psycopg.Error:
            raise SnapshotLost(
                "the connection exporting the snapshot was lost before the copy finished: the snapshot "
                f'is not trustworthy; nothing was published and slot "{slot}" was dropped: run pgrecv snapshot again'
            ) from None
        result = SnapshotResult(slot, cp, directory, tables=[_named(t.relation) for t in table_list])
        for t in tasks:
            final = directory / t.name
            os.rename(t.tmp, final)
            final_paths.append(final)
            result.files.append({"name": t.name, **_named(t.table.relation), "rows": rows[t.seq]})
        tmp_paths = []
        fsync_dir(directory)
        manifest = directory / manifest_name(cp)
        _write_manifest(manifest, result)
        final_paths.append(manifest)
        # last: the stream these files start (pgrecv start refuses the directory to any other),
        # and where it goes on: the slot's consistent point
        owner = Owner(slot, str(database), str(system_identifier))
        write_dir_state(directory, owner, max(cp - 1, 0), cp, manifest.name)
        return result
    except BaseException as exc:
        for p in tmp_paths + final_paths:
            with contextlib.suppress(OSError):
                p.unlink()
        with contextlib.suppress(Exception):
            rconn.close()
        if created:
            _drop_slot(opts, slot, log)
        if isinstance(exc, OSError):
            raise output_error(exc, directory, "write the snapshot in") from None
        if isinstance(exc, psycopg.Error):
            raise translate(exc, slot=slot) from None
        raise
    finally:
        with contextlib.suppress(Exception):
            rconn.close()


def _drop_slot(opts: ConnOptions, slot: str, log: Callable[[str], None]) -> None:
    """Drop the slot this run created (its walsender may need a moment to let go of it)."""
    from pgrecv.pg.slots import drop_slot

    for attempt in range(20):
        try:
            drop_slot(opts, slot, if_exists=True)
            log(f'dropped slot "{slot}"')
            return
        except PgrecvError as exc:
            if attempt == 19:
                log(f'could not drop slot "{slot}": {exc}; drop it with pgrecv drop --slot {slot}')
            time.sleep(0.1)


def import_snapshot(conn: psycopg.Connection[Any], snapshot_name: str) -> None:
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
    try:
        conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot_name)))
    except (psycopg.errors.InvalidParameterValue, psycopg.errors.UndefinedObject):
        # 15: "invalid snapshot identifier"; 18: "snapshot ... does not exist"
        raise SnapshotLost(
            "the connection exporting the snapshot was lost before every worker imported it: nothing was "
            "published and the slot was dropped: run pgrecv snapshot again"
        ) from None


# --- tables ------------------------------------------------------------------------------------

_TABLES_PUB = """
SELECT c.oid, n.nspname, c.relname, c.relreplident, c.relkind, pg_relation_size(c.oid) AS bytes,
       c.reltuples::bigint, {attnames} AS attnames, {rowfilter} AS rowfilter
  FROM pg_publication_tables p
  JOIN pg_namespace n ON n.nspname = p.schemaname
  JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = p.tablename
 WHERE p.pubname = %s
 ORDER BY n.nspname, c.relname
"""
_TABLES_ALL = """
SELECT c.oid, n.nspname, c.relname, c.relreplident, c.relkind, pg_relation_size(c.oid) AS bytes,
       c.reltuples::bigint, NULL::text[] AS attnames, NULL::text AS rowfilter
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
   AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%%'
 ORDER BY n.nspname, c.relname
"""
_COLUMNS = """
SELECT a.attname, a.atttypid, a.atttypmod, tn.nspname, t.typname, a.attgenerated <> '' AS generated,
       has_column_privilege(a.attrelid, a.attnum, 'SELECT') AS readable,
       a.attnum = ANY (COALESCE(
         CASE c.relreplident
           WHEN 'd' THEN (SELECT i.indkey::int2[] FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary)
           WHEN 'i' THEN (SELECT i.indkey::int2[] FROM pg_index i WHERE i.indrelid = c.oid AND i.indisreplident)
         END, '{}')) OR c.relreplident = 'f' AS key
  FROM pg_attribute a
  JOIN pg_class c ON c.oid = a.attrelid
  JOIN pg_type t ON t.oid = a.atttypid
  JOIN pg_namespace tn ON tn.oid = t.typnamespace
 WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
 ORDER BY a.attnum
"""


def list_tables(
    conn: psycopg.Connection[Any],
    plugin: str,
    publication: str | None,
    major: int,
    globs: Sequence[str],
    block_size: int,
) -> list[Table]:
    """The tables to copy as the snapshot sees them, with what pgoutput would publish of each."""
    if plugin == "pgoutput":
        query = _TABLES_PUB.format(
            attnames="p.attnames" if major >= 15 else "NULL::text[]",
            rowfilter="p.rowfilter" if major >= 15 else "NULL::text",
        )
        rows = conn.execute(query, (publication,)).fetchall()
    else:
        rows = conn.execute(_TABLES_ALL).fetchall()
    keep = table_filter(globs, ())  # the same globs as `start --table`
    out: list[Table] = []
    for oid, schema, name, replident, relkind, size, reltuples, attnames, rowfilter in rows:
        if keep is not None and not keep(schema, name):
            continue
        if not conn.execute("SELECT has_table_privilege(%s, 'SELECT')", (oid,)).fetchone()[0]:  # type: ignore[index]
            raise ServerConfigError(
                f"permission denied for table {schema}.{name}: GRANT SELECT ON it to this role, "
                "or leave it out with --table"
            )
        columns: list[ev.Column] = []
        has_generated = False
        for attname, typoid, typmod, tnsp, tname, generated, readable, key in conn.execute(_COLUMNS, (oid,)):
            if attnames is not None:
                if attname not in attnames:
                    continue
            elif generated:
                continue  # pgoutput leaves generated columns out (unless the publication lists them, 18+)
            has_generated = has_generated or bool(generated)
            if not readable:
                raise ServerConfigError(
                    f"permission denied for column {attname} of table {schema}.{name}: grant SELECT on it, "
                    "or leave the table out with --table"
                )
            tn = builtin_type_name(typoid) or (tname if tnsp == "pg_catalog" else f"{tnsp}.{tname}")
            columns.append(ev.Column(attname, int(typoid), int(typmod), tn, bool(key) and replident != "n"))
        rel = ev.Relation(int(oid), schema, name, _REPLIDENT.get(replident, "?"), tuple(columns))
        out.append(
            Table(
                rel,
                tuple(c.name for c in columns),
                rowfilter,
                int(size) // block_size,
                int(reltuples),
                relkind == "p",
                has_generated,
            )
        )
    if globs and not out:
        raise UsageError(f"no published table matches --table {' '.join(globs)}")
    return out


def _plan(tables: list[Table], directory: Path, cp: int, jobs: int, range_pages: int) -> list[Task]:
    """One task per table, or per ctid range of a table bigger than a range (with --jobs > 1).

    Ranges come from the size now; the last range is open-ended, so pages added since are read too
    (their rows are newer than the snapshot and invisible anyway, but nothing depends on that).
    A table is cut into a multiple of ``jobs`` ranges, so that no job is left copying a last
    range alone while the others wait (5 ranges on 2 jobs took 3/5 of the time, 4 take 1/2).
    """
    tasks: list[Task] = []
    token = secrets.token_hex(8)  # temp names nobody can guess (and plant a link under) in advance
    for table in tables:
        pages = table.pages
        bounds: list[tuple[int | None, int | None]] = [(None, None)]
        if jobs > 1 and pages > range_pages and not table.partitioned:
            n = min(math.ceil(min(math.ceil(pages / range_pages), 1000) / jobs) * jobs, pages)
            step = math.ceil(pages / n)
            edges = [i * step for i in range(1, n)]
            bounds = [(None, edges[0])]
            bounds += [(a, b) for a, b in pairwise(edges)]
            bounds.append((edges[-1], None))
        for lo, hi in bounds:
            seq = len(tasks) + 1
            name = snapshot_file_name(cp, seq)
            tmp = str(directory / snapshot_part_name(token, seq))
            tasks.append(Task(seq, table, lo, hi, tmp, name))
    return tasks


# --- copying ---------------------------------------------------------------------------------


def copy_task(
    conn: psycopg.Connection[Any],
    task: Task,
    cp: int,
    report: Callable[[int, int], None],
    coordinator: int | None = None,
) -> int:
    """COPY one table or range into its temp file as snapshot records; returns the row count.

    Blocks of COPY text go through :class:`pgrecv.snapshot.fast.BlockEncoder`; a block it declines
    goes through the reference encoder (which also raises conversion errors). Reading and encoding
    run in two threads: the reader waits for the server part of the time (the GIL released in poll
    and in the C reader), and the encoder uses that time, so the client keeps up with the server's COPY.
    """
    from pgrecv.snapshot.fast import read_blocks

    if conn.info.encoding != "utf-8" or task.debezium is not None:  # the block encoder writes JSONL only
        return copy_task_reference(conn, task, cp, report, coordinator)

    def check() -> None:
        _exit_if_orphaned(coordinator)

    fd = os.open(task.tmp, _EXCL_FLAGS, FILE_MODE)
    with open(fd, "wb", buffering=1 << 17) as f:
        writer = _BlockWriter(f, task, cp, report, server_major(conn))
        try:
            with conn.cursor().copy(task.query()):
                for block in read_blocks(conn, check):
                    writer.put(block)
                    check()
        except BaseException:
            writer.abort()
            raise
        return writer.close()


class _BlockWriter:
    """The encoding half of :func:`copy_task`: a thread that encodes blocks and writes them.

    A bounded queue keeps memory to a few blocks; an error in the thread is raised to the reader
    at its next ``put`` or at ``close`` (the reader then leaves the COPY, which ends the task).
    """

    DEPTH = 8

    def __init__(
        self, f: Any, task: Task, cp: int, report: Callable[[int, int], None], major: int | None = None
    ) -> None:
        self._f = f
        self._major = major
        self._task = task
        self._cp = cp
        self._report = report
        self._q: queue.Queue[bytes | None] = queue.Queue(self.DEPTH)
        self._error: BaseException | None = None
        self._aborted = False
        self._rows = 0
        self._thread = threading.Thread(target=self._run, name=f"snapshot-encode-{task.seq}", daemon=True)
        self._thread.start()

    def put(self, block: bytes) -> None:
        while True:
            if self._error is not None:
                self._thread.join()
                raise self._error
            try:
                self._q.put(block, timeout=0.5)
                return
            except queue.Full:
                continue

    def close(self) -> int:
        """Wait for every block to be written and fsync'd; returns the row count."""
        if self._error is None:
            self._q.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._rows

    def abort(self) -> None:
        """The reading side failed: stop the thread without writing the rest (the file is discarded)."""
        self._aborted = True
        with contextlib.suppress(queue.Empty):
            while True:
                self._q.get_nowait()
        self._q.put(None)
        self._thread.join()

    def _run(self) -> None:
        from pgrecv.output.jsonl import JsonlEncoder
        from pgrecv.snapshot.fast import BlockEncoder, Buffer, parse_block

        f, task, cp = self._f, self._task, self._cp
        try:
            write: Callable[[Buffer], Any] = f.write
            enc = JsonlEncoder(write)
            rel = task.table.relation
            fast = BlockEncoder(rel, cp, self._major)
            fd = f.fileno()
            written = flushed = 0
            enc.snapshot_rows(rel, (), cp)  # the relation record, even for an empty table
            syncer = Syncer(fd, f"snapshot-sync-{task.seq}", drop=True)

            def counted(data: Buffer) -> None:
                nonlocal written
                write(data)
                written += len(data)

            try:
                while (block := self._q.get()) is not None and not self._aborted:
                    k = fast.write_to(block, counted)
                    if k is None:
                        k = enc.snapshot_rows(rel, parse_block(block), cp)
                    elif written - flushed >= WRITEBACK:  # sync what is written meanwhile: the final fsync is short
                        f.flush()
                        syncer.kick(f.tell())
                        flushed = written
                    self._rows += k
                    self._report(task.seq, k)
            finally:
                syncer.close()  # raises a failed sync's error: the final fsync may not report it again
            if not self._aborted:
                f.flush()
                os.fsync(fd)
        except BaseException as exc:  # handed to the reader thread, which raises it
            self._error = exc
            with contextlib.suppress(queue.Empty):
                while True:  # unblock a reader waiting on a full queue
                    self._q.get_nowait()


def copy_task_reference(
    conn: psycopg.Connection[Any],
    task: Task,
    cp: int,
    report: Callable[[int, int], None],
    coordinator: int | None = None,
) -> int:
    """copy_task through psycopg's row parser and the JSONL encoder: the reference that the fast
    path must match byte for byte, and the path for a client encoding other than UTF-8 (and for Debezium envelopes)."""
    from pgrecv.output.debezium import DebeziumEncoder
    from pgrecv.output.jsonl import JsonlEncoder

    fd = os.open(task.tmp, _EXCL_FLAGS, FILE_MODE)
    with open(fd, "wb", buffering=1 << 17) as f:
        write: Callable[[bytes], Any] = f.write
        enc: JsonlEncoder | DebeziumEncoder = JsonlEncoder(write)
        if task.debezium is not None:
            database, server, schemas = task.debezium
            enc = DebeziumEncoder(write, database=database, server=server, schemas=schemas)
        rel = task.table.relation
        n = 0
        with conn.cursor().copy(task.query()) as copy:
            copy.set_types(["text"] * len(task.table.columns))
            rows = copy.rows()
            enc.snapshot_rows(rel, (), cp)  # the relation record, even for an empty table
            while True:
                batch = list(islice(rows, BATCH))
                if not batch:
                    break
                n += enc.snapshot_rows(rel, batch, cp)
                report(task.seq, len(batch))
                _exit_if_orphaned(coordinator)
        f.flush()
        os.fsync(f.fileno())
    return n


def _exit_if_orphaned(coordinator: int | None) -> None:
    """A worker process whose coordinator died (kill -9) stops: nobody would publish its files."""
    if coordinator is not None and os.getppid() != coordinator:
        os._exit(1)


# What a worker is given: how to connect (with the password typed at the coordinator's prompt,
# if any), the snapshot to import, the consistent point, the task.
_Item = tuple[ConnOptions, str, int, Task]


def _next_task(tasks: Any, coordinator: int | None) -> _Item | None:
    """The next (snapshot name, CP, task) or the sentinel, checking the coordinator while waiting."""
    while True:
        try:
            item: _Item | None = tasks.get(timeout=1.0)
            return item
        except queue.Empty:
            _exit_if_orphaned(coordinator)


def _worker_loop(tasks: Any, results: Any, coordinator: int | None) -> None:
    """A worker: copy tasks until the sentinel, importing the snapshot before its first task."""
    task: Task | None = None
    try:
        delay = failpoints.snapshot_delay()
        item = _next_task(tasks, coordinator)
        if item is None:
            results.put(("exit", None, None))
            return
        opts, snapshot_name, cp, task = item
        with connect(opts) as conn:
            import_snapshot(conn, snapshot_name)
            if delay:
                time.sleep(delay)
            while True:

                def report(seq: int, k: int) -> None:
                    results.put(("progress", seq, k))

                try:
                    rows = copy_task(conn, task, cp, report, coordinator)
                except psycopg.errors.InsufficientPrivilege as exc:
                    raise ServerConfigError(
                        f"{exc.diag.message_primary}: GRANT SELECT to this role, or leave the table out with --table"
                    ) from None
                except psycopg.Error as exc:
                    err = translate(exc)
                    if not isinstance(err, ServerError):
                        raise err from None
                    raise ServerError(
                        f"the server failed copying {task.table.qualified}: {server_message(exc)}; fix the cause "
                        "(the publication's row filter runs in the copy too), or leave the table out with --table, "
                        "and run pgrecv snapshot again",
                        detail=err.detail,
                    ) from None
                results.put(("done", task.seq, rows))
                if delay:
                    time.sleep(delay)
                item = _next_task(tasks, coordinator)
                if item is None:
                    break
                *_, task = item
            conn.execute("ROLLBACK")
        results.put(("exit", None, None))
    except PgrecvError as exc:
        results.put(("error", type(exc).__name__, exc.message))
    except psycopg.Error as exc:
        err = translate(exc)
        results.put(("error", type(err).__name__, err.message))
    except OSError as exc:
        where = os.path.dirname(exc.filename or (task.tmp if task is not None else "")) or "its directory"
        results.put(("error", "OutputError", output_error(exc, where, "write the snapshot in").message))


class _Workers:
    """The copy workers: processes for ``--jobs`` > 1 (encoding JSON is CPU work), else a thread.

    Started before anything else: forked where the platform can and no other thread runs (no
    connection exists yet, so nothing is shared that should not be), which costs milliseconds where a
    spawned interpreter re-importing psycopg costs ~0.3 s. Workers wait for tasks; a worker that
    gets the sentinel first exits without connecting.
    """

    def __init__(self, jobs: int) -> None:
        self._procs: list[Any]
        if jobs > 1:
            forkable = "fork" in mp.get_all_start_methods() and threading.active_count() == 1
            ctx: Any = mp.get_context("fork" if forkable else "spawn")
            self._tasks: Any = ctx.Queue()
            self._results: Any = ctx.Queue()
            self._procs = [
                ctx.Process(target=_worker_loop, args=(self._tasks, self._results, os.getpid()), daemon=True)
                for _ in range(jobs)
            ]
        else:
            self._tasks = queue.Queue()
            self._results = queue.Queue()
            self._procs = [threading.Thread(target=_worker_loop, args=(self._tasks, self._results, None), daemon=True)]
        self._sent_end = self._finished = False
        for p in self._procs:
            p.start()

    def _end(self) -> None:
        if not self._sent_end:
            self._sent_end = True
            for _ in self._procs:
                self._tasks.put(None)

    def close(self) -> None:
        """Stop every worker (those still waiting get the sentinel; a process still copying is killed)."""
        self._end()
        if not self._finished:  # an error: a process still copying is stopped at once
            for p in self._procs:
                if isinstance(p, mp.process.BaseProcess) and p.is_alive():
                    p.terminate()
        for p in self._procs:
            p.join(timeout=5)

    def run(self, opts: ConnOptions, snapshot_name: str, cp: int, tasks: list[Task], progress: bool) -> dict[int, int]:
        """Run the tasks; returns rows per task seq. Raises the first error."""
        # biggest first, so that the long ones do not start last
        for t in sorted(tasks, key=lambda t: -(t.table.pages if t.lo is None and t.hi is None else 0)):
            self._tasks.put((opts, snapshot_name, cp, t))
        self._end()
        bar = _Progress(tasks) if progress else None
        rows: dict[int, int] = {}
        running = len(self._procs)
        try:
            while running:
                try:
                    kind, a, b = self._results.get(timeout=0.2)
                except queue.Empty:
                    if not any(p.is_alive() for p in self._procs):
                        raise PgrecvError("a snapshot worker died without a word; run pgrecv snapshot again") from None
                    if bar is not None:
                        bar.refresh()
                    continue
                if kind == "progress":
                    if bar is not None:
                        bar.advance(a, b)
                elif kind == "done":
                    rows[a] = b
                    if bar is not None:
                        bar.finish(a)
                elif kind == "exit":
                    running -= 1
                else:
                    raise _error_class(a)(b)
        except BaseException:
            self.close()  # before the caller removes the temp files: no worker may start another one
            raise
        finally:
            if bar is not None:
                bar.stop()
        self._finished = True
        return rows


def _error_class(name: str) -> type[PgrecvError]:
    from pgrecv import errors

    cls = getattr(errors, name, None)
    if name == "SnapshotLost":
        return SnapshotLost
    return cls if isinstance(cls, type) and issubclass(cls, PgrecvError) else PgrecvError


class _Progress:
    """A rich progress bar on stderr: one line per table, rows and rows per second."""

    def __init__(self, tasks: list[Task]) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._p = Progress(
            TextColumn("{task.description}", markup=False),  # a table's name, not markup
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]} rows/s"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            auto_refresh=False,
        )
        self._ids: dict[int, Any] = {}
        self._left: dict[Any, int] = {}
        self._start: dict[Any, float] = {}
        by_table: dict[str, Any] = {}
        for t in tasks:
            q = t.table.qualified
            if q not in by_table:
                total = t.table.estimate if t.table.estimate > 0 else None
                by_table[q] = self._p.add_task(q, total=total, rate="-")
                self._left[by_table[q]] = 0
            self._ids[t.seq] = by_table[q]
            self._left[by_table[q]] += 1
        self._p.start()

    def advance(self, seq: int, k: int) -> None:
        tid = self._ids[seq]
        now = time.monotonic()
        start = self._start.setdefault(tid, now)
        task = self._p.tasks[tid]
        done = task.completed + k
        rate = f"{done / (now - start):,.0f}" if now > start else "-"
        self._p.update(tid, advance=k, rate=rate)
        self.refresh()

    def finish(self, seq: int) -> None:
        tid = self._ids[seq]
        self._left[tid] -= 1
        if self._left[tid] == 0:
            done = self._p.tasks[tid].completed
            self._p.update(tid, total=done)
        self.refresh()

    def refresh(self) -> None:
        self._p.refresh()

    def stop(self) -> None:
        self._p.stop()


# --- the directory -------------------------------------------------------------------------


def _prepare_dir(directory: Path) -> int:
    """Create or check the output directory and lock it like `pgrecv start` does; returns the lock fd."""
    try:
        directory.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot use {directory} for the snapshot: {exc.strerror or exc}") from None
    fd = open_lock(
        directory / LOCK_NAME,
        busy=f"{directory} is in use by another pgrecv process: stop it, or choose another directory",
    )
    try:
        remove_leftovers(directory)  # an interrupted snapshot's (or stream's) temporary files
        # What else may be there: the lock, which every pgrecv leaves. Anything more is another
        # run's output or someone's files: the snapshot's files must sort before every change of
        # its slot, and `start` would resume after whatever a stray name claims.
        for entry in sorted(os.scandir(directory), key=lambda e: e.name):
            if entry.name == LOCK_NAME:
                continue
            if FINAL_RE.fullmatch(entry.name):
                raise OutputError(
                    f"{directory} already holds pgrecv output ({entry.name}): a snapshot starts a new "
                    "directory; choose an empty one"
                )
            raise OutputError(
                f"{directory} is not empty (it holds {entry.name}): a snapshot starts a directory of its "
                "own; choose an empty or new one"
            )
    except OSError as exc:
        os.close(fd)
        raise OutputError(f"cannot use {directory} for the snapshot: {exc.strerror or exc}") from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _named(rel: ev.Relation) -> dict[str, str]:
    """A table in the manifest: schema and name apart, as either may hold a "." (manifest v2)."""
    return {"schema": rel.namespace, "table": rel.name}


def _write_manifest(path: Path, result: SnapshotResult) -> None:
    """Write the manifest so that a crash leaves it whole or absent (temp, fsync, rename, dir fsync)."""
    doc = {
        "v": MANIFEST_VERSION,
        "slot": result.slot,
        "snapshot_lsn": lsn_str(result.snapshot_lsn),
        "files": result.files,
        "tables": result.tables,
    }
    data = json.dumps(doc, indent=1).encode() + b"\n"
    write_atomic(path, data, what="the manifest", prefix=f"{TMP_PREFIX}{path.name}.", suffix="")
