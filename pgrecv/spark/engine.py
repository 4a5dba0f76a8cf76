"""spark-apply as a Spark job (latest mode): the driver lists files, collects the relation records
and a few counts, and plans; Spark tasks read, replay and write. The driver never holds rows, so
its memory does not grow with the input, and ``--master spark://…`` moves the work to a cluster.

Per table, a failure (a value the target type cannot hold, a change without its key, a TOAST value
with nowhere to come from) holds back that table alone: it keeps its position, is reported with
file:line, column and value, and the other tables are applied (exit code 15, partly applied).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from pgrecv.errors import InputError, UsageError
from pgrecv.output.format import FORMAT_VERSION
from pgrecv.spark import direct
from pgrecv.spark import replay as rp
from pgrecv.spark.keys import identity
from pgrecv.spark.lake import one_pass_failed
from pgrecv.spark.source import check_input, file_url, find_line, literal_read, read_records
from pgrecv.spark.types import ColumnType, column_type, same_type

SAMPLE = 5  # poison values named per table
TABLE_THREADS = 4  # tables applied side by side (each a few Spark jobs)
# a batch of at most this many changes onto a table of one file is applied by one task
# (single_task); ``PGRECV_SPARK_SINGLE_TASK=0`` turns that off (for comparing the two)
SINGLE_TASK_CHANGES = 50_000
SINGLE_TASK = os.environ.get("PGRECV_SPARK_SINGLE_TASK", "1") != "0"


PUSHDOWN = "spark.sql.json.filterPushdown.enabled"


def _lean_fits(config: Any, files: list[Path]) -> bool:
    """Whether a run may try the lean read (:func:`direct.read_lean`): latest mode, the one pass's
    policy, and an input large enough that the first pass's facts would not choose one task. Not
    where ``--conf`` sets the JSON reader's filter pushdown, which the lean read turns off so that
    its main job sees every line."""
    return (
        PUSHDOWN not in config.conf
        and config.mode == "latest"
        and not config.append_only
        and getattr(config, "bad_values", "fail") == "fail"
        and ONE_PASS
        and _bytes(files) >= direct.LEAN_MIN_BYTES
    )


def run_frames(
    config: Any,
    spark: Any,
    files: list[Path],
    manifests: dict[Path, dict[str, Any]],
    state: Path,
    progress: Any,
    after_table: Callable[[str], None] | None,
    lean: bool | None = None,
) -> Any:
    """The run; ``lean``: whether it may take the lean read (None: it tries, where the lean read
    may apply, and if that declines, runs again without it)."""
    if lean is None:
        args = (config, spark, files, manifests, state, progress, after_table)
        try:
            return run_frames(*args, lean=direct.ENABLED and direct.LEAN)
        except direct.LeanDeclined:  # nothing was committed: the ordinary way applies it or names what it is
            return run_frames(*args, lean=False)
    from pyspark.sql import functions as F

    from pgrecv.spark.apply import Summary, TableResult, _lsn_text, table_dir_name
    from pgrecv.spark.lake import FrameDeltaRsTarget, FrameParquetTarget
    from pgrecv.spark.read import parse_lsn
    from pgrecv.stream.pipeline import table_filter

    started = time.monotonic()
    carried = sorted(state.glob("*.jsonl")) if state.is_dir() else []
    summary = Summary(
        engine=f"{config.fmt}/spark" if config.fmt == "parquet" else "delta/delta-rs+spark",
        files=len(files) + len(carried),
    )
    progress.files(len(files) + len(carried))
    if not files and not carried:
        summary.seconds = time.monotonic() - started
        return summary
    # the parsed input, staged once as Parquet beside the run's state (raw change data: 0700)
    work = state.parent  # made 0700 by run_apply's target lock
    stage = work / f"stage-{uuid.uuid4().hex}"
    by_table = stage.with_name(f"{stage.name}-changes")
    links = stage.with_name(f"{stage.name}-inputs")  # links to inputs Spark cannot name (source._urls)
    restores = [_size_shuffles(spark, config, [*files, *carried])]  # the session's conf, given back
    # PostgreSQL's names are case-sensitive: columns "a" and "A" are two columns (Spark's default
    # would take them as one, and fail as ambiguous)
    restores.append(_for_run(spark, config, "spark.sql.caseSensitive", "true"))
    try:
        plain = None
        if direct.ENABLED and not carried and not manifests and direct.looks_plain(files):
            restores.append(_size_reads(spark, config, files))
            if lean and _lean_fits(config, files):
                plain = direct.read_lean(spark, files, links)
                if plain is not None:
                    # the main job parses every line, which the JSON reader's filter pushdown would skip
                    restores.append(_for_run(spark, config, PUSHDOWN, "false"))
            if plain is None:
                plain = direct.read_plain(spark, files, links)
            if plain is None:
                restores.pop()()
                shutil.rmtree(links, ignore_errors=True)  # the staged read makes its own
        keep = None  # the direct read's committed changes as a filter, when it can say them so
        if plain is not None:
            df, st, keep, any_truncate = None, plain.structure, plain.keep(), plain.truncates > 0
            commits = plain.commit_keys() if keep is None else None
            summary.input_read = "lean" if plain.lean_begins is not None else "direct"
        else:
            records = read_records(spark, files, carried, stage, links)
            restores.append(_size_reads(spark, config, list(stage.rglob("*.parquet"))))
            df, commits, any_truncate = records.frame, None, True  # (not counted: maybe)
            check_input(records)
            st = rp.structure(df)
            summary.input_read = "staged"
        summary.transactions, summary.incomplete, summary.rolled_back = st.transactions, st.incomplete, st.rolled_back
        match = table_filter(config.tables, ())
        snap: list[tuple[str, str, int]] = []
        for mpath, manifest in manifests.items():
            try:
                pos = parse_lsn(manifest["snapshot_lsn"]) - 1
                for entry in manifest.get("tables") or [f["table"] for f in manifest["files"]]:
                    schema, _, table = (
                        str(entry).partition(".")
                        if not isinstance(entry, dict)
                        else (entry["schema"], "", entry["table"])
                    )
                    snap.append((schema, table, pos))
            except (KeyError, TypeError, ValueError) as exc:
                raise InputError(f"{mpath}: bad snapshot manifest ({exc!r}): re-run `pgrecv snapshot`") from None
        # every table's changes follow its relation record (pgoutput and pgrecv's test_decoding reader)
        names = sorted({k for k in st.relations} | {(s, t) for s, t, _ in snap})
        wanted = [n for n in names if match is None or match(*n)]
        targets: dict[tuple[str, str], Any] = {}
        for s, t in wanted:
            # absolute: data files are matched against the paths Spark reports
            path = config.target.resolve() / table_dir_name(s, t)
            app_id = f"pgrecv:{s}.{t}"
            target = (
                FrameParquetTarget(path, app_id, spark)
                if config.fmt == "parquet"
                else FrameDeltaRsTarget(path, app_id, spark)
            )
            if path.exists():
                target.open()
            targets[(s, t)] = target
        lean_table = None
        if plain is not None and plain.lean_begins is not None:
            if len(wanted) != 1 or not _lean_one_pass(plain, targets[wanted[0]], files):
                raise direct.LeanDeclined
            last, at = plain.last_commit, targets[wanted[0]].applied
            if last is None or (at is not None and last <= at):
                raise direct.LeanDeclined  # nothing new: the first pass's counts say so exactly
            lean_table = wanted[0]
        if plain is not None:
            at = targets[lean_table].applied if lean_table is not None else None
            df = plain.records(_image_type(wanted, st, targets, config), applied=at)
        changes, pending = rp.committed(df, snap, st, commits, keep)
        # a TRUNCATE concerns every table it lists: one row per table
        if any_truncate:
            trunc = (
                changes.where("op = 'truncate'")
                .select(*[c for c in changes.columns if c not in ("schema", "table")], F.explode("tables").alias("_t"))
                .select("*", F.col("_t.schema").alias("schema"), F.col("_t.table").alias("table"))
                .drop("_t")
            )
            changes = changes.where("op <> 'truncate'").unionByName(trunc.select(*changes.columns))
        # The committed changes of the wanted tables, staged once more, partitioned by table: each
        # table's passes then read its own rows only, instead of every table's jobs reading the
        # whole input and joining it to its commits again.
        if len(wanted) == 1:  # a filter: no broadcast (a job of its own) and no lookup per row
            s0, t0 = wanted[0]
            changes = changes.where((F.col("schema") == s0) & (F.col("table") == t0)).withColumn("_tid", F.lit(0))
        else:
            ids = spark.createDataFrame(
                [(s, t, i) for i, (s, t) in enumerate(wanted)] or [("", "", -1)],
                "schema string, `table` string, _tid int",
            )
            changes = changes.join(F.broadcast(ids), ["schema", "table"])
        # each table's rows in files of its own: several tables, the staged rules, or commits too
        # many to broadcast to a join (each pass would sort and merge the input with them again)
        joined = keep is None and not rp.broadcasts_commits(st)
        own_files = len(wanted) > 1 or st.chunked or st.prepared or joined
        if own_files:
            shape = changes.schema
            changes.write.partitionBy("_tid").parquet(file_url(by_table))
            changes = literal_read(spark).schema(shape).parquet(file_url(by_table))
        # else one table of plain transactions: its few passes each redo a cheap filter (or a
        # semi-join to the broadcast commits) over the input, less work than writing every change
        # once more
        summary.lines = st.lines
        summary.pending_prepared, carry_file = _carry_pending(pending, st, state, spark)

        history = config.mode == "history"
        applied = {k: v.applied for k, v in targets.items()}
        facts = None
        if lean_table is not None:
            assert plain is not None
            facts = {lean_table: _lean_facts(plain)}
        elif plain is not None:
            facts = _plain_facts(plain, applied)
        if facts is None:
            facts = _table_facts(changes, applied, spark)
        todo = [k for k in wanted if facts.get(k, {}).get("n_all", 0) > 0]
        progress.tables(len(todo))
        failures: list[str] = []
        warnings: list[str] = []
        lock = threading.Lock()
        stop = threading.Event()  # after_table raised: start no other table

        def one(key: tuple[str, str]) -> TableResult | None:
            if stop.is_set():
                return None
            s, t = key
            target = targets[key]
            own = changes.where(F.col("_tid") == wanted.index(key))  # partition pruning: its rows only
            result = TableResult(f"{s}.{t}", str(target.path), "up to date", version=target.version)
            if target.applied is not None:
                result.applied_lsn = _lsn_text(target.applied)
            f = facts[key]
            lean_one = key == lean_table  # the lean read's table: its counts come with its write
            result.inserts, result.updates, result.deletes, result.truncates = (
                f["insert"],
                f["update"],
                f["delete"],
                f["truncate"],
            )
            # each thread's jobs are its own group in Spark's UI (and its description in logs)
            spark.sparkContext.setJobDescription(f"pgrecv spark-apply {s}.{t}")
            try:
                # checked even when nothing is left to apply: a wrong --mode fails on the first run
                if target.schema is not None and ("_current" in target.schema.names) != history:
                    raise UsageError(
                        f"{target.path} is a {'latest' if history else 'history'}-mode table: "
                        "use the same --mode as before"
                    )
                if not f["n"]:  # every change of the input is applied already
                    progress.table_done(f"{s}.{t}")
                    return result
                plan = _plan(
                    s, t, st.relations.get(key, []), target.schema, config.append_only, history, config.keys.get(key)
                )
                if config.fmt == "delta":
                    _delta_names(plan)
                single = not lean_one and single_task(f, target)
                if single:
                    # its own files are few: one task reads them; else one shuffle of its rows
                    # (a coalesce would read the whole input in that task)
                    own = own.coalesce(1) if own_files else own.repartition(1)
                if history:
                    batch = _history_batch(own, plan, target, f, spark, result, config)
                else:
                    batch = _batch(own, plan, target, f, spark, result, config, one_pass=True)
                    batch.upserts_at_most = None if lean_one else f["insert"] + f["update"]
                batch.single = single
                if lean_one:
                    assert plain is not None
                    batch.settle = _lean_settle(plain, batch, result)
                target.path.parent.mkdir(parents=True, exist_ok=True)
                try:
                    result.bytes_written = target.write_frames(batch)
                except Exception as exc:
                    if lean_one:  # a line or a change the lean read does not take: nothing was committed
                        raise direct.LeanDeclined from exc
                    if batch.final is None or not one_pass_failed(exc):
                        raise
                    # a problem the one pass cannot name: step by step, it is reported or handled
                    batch = _batch(own, plan, target, f, spark, result, config)
                    batch.upserts_at_most = f["insert"] + f["update"]
                    batch.single = single
                    result.bytes_written = target.write_frames(batch)
                result.status = "applied"
                result.version = target.version
                result.applied_lsn = _lsn_text(batch.position)
                if result.values_changed:
                    with lock:
                        warnings.append(
                            f"{s}.{t}: {result.values_changed} value(s) the target type cannot hold stored as "
                            f"{'NULL' if config.bad_values == 'null' else 'text'} (--bad-values {config.bad_values}) "
                            f"in column(s) {', '.join(result.changed_columns)}"
                        )
            except (InputError, UsageError) as exc:
                if lean_one:  # the ordinary way holds it back, with its counts
                    raise direct.LeanDeclined from exc
                result.status = "held back"
                result.error = exc.message
                with lock:
                    failures.append(f"{s}.{t}: {exc.message}")
            progress.table_done(f"{s}.{t}")
            if after_table is not None:
                try:
                    after_table(f"{s}.{t}")
                except BaseException:
                    stop.set()
                    raise
            return result

        # Tables are independent: their (mostly small) jobs run side by side, so a run over many
        # tables is not a queue of job latencies. Each table still commits atomically on its own.
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=max(1, min(TABLE_THREADS, len(todo)))) as pool:
            futures = [pool.submit(one, key) for key in todo]
            outcomes = [fu.exception() or fu.result() for fu in futures]
        for o in outcomes:
            if isinstance(o, BaseException):
                raise o
        summary.tables.extend(o for o in outcomes if isinstance(o, TableResult))
        if plain is not None and plain.counts is not None:  # the lean read's row changes
            summary.lines += plain.counts["rows"]
        summary.warnings.extend(warnings)
        if not failures:  # a held-back table may still need carried rows that this run committed
            _finish_carried(carried, carry_file)
        summary.warnings.extend(failures)
        summary.seconds = time.monotonic() - started
        return summary
    finally:
        for restore in reversed(restores):
            restore()
        spark.catalog.clearCache()  # the run's persisted frames (changes, final events)
        shutil.rmtree(stage, ignore_errors=True)
        shutil.rmtree(by_table, ignore_errors=True)
        shutil.rmtree(links, ignore_errors=True)


def _lean_facts(plain: direct.Plain) -> dict[str, Any]:
    """The facts of the lean read's one table before its main job (a transaction past its applied
    position was committed); its counts are taken by that job (:func:`_lean_settle`)."""
    facts: dict[str, Any] = {o: 0 for o in (*rp.ROW_OPS, "truncate", "n_toast", "moves")}
    facts.update(n_all=1, n=1, position=plain.last_commit, truncate_at=None, toast=[], lean=True)
    return facts


def _lean_one_pass(plain: direct.Plain, target: Any, files: list[Path]) -> bool:
    """:func:`_one_pass_fits` for the lean read, from the input's size (an over-count of its
    changes) instead of their counts: otherwise the step-by-step write, which needs them."""
    if target.version is None:
        return True
    most = _bytes(files) // direct.LEAN_LINE_BYTES * ONE_PASS_SHARE
    return bool(most >= target.row_count(above=most))


def _lean_settle(plain: direct.Plain, batch: Any, result: Any) -> Callable[[], None]:
    """What the writer calls after the lean main job and before its commit: the table's counts
    and position from that job. No live change (a transaction past the applied position without
    one of this table's), or other lines than the structural pass's (appended meanwhile, or a
    line it took for a row change that is not one): the ordinary way decides."""

    def settle() -> None:
        got = plain.observed()
        if got["position"] is None or got["others"] != plain.structure.lines:
            raise direct.LeanDeclined
        plain.counts = got
        batch.position = got["position"]
        result.inserts, result.updates, result.deletes = (got[o] for o in rp.ROW_OPS)

    return settle


def single_task(facts: dict[str, Any], target: Any) -> bool:
    """Whether a table's batch is replayed and written by one task: few changes (at most
    :data:`SINGLE_TASK_CHANGES`) onto a table that stays within one file. Each shuffle between the
    replay and the write is a Spark job of its own, with its tasks, files and planning, which is
    what a small table's apply is made of (bench/NOTES.md, many small tables); one partition
    from the input on needs none of them."""
    from pgrecv.spark import lake

    if not SINGLE_TASK or facts["n"] > SINGLE_TASK_CHANGES:
        return False
    return lake.fits_one_file(facts["insert"] + facts["update"], target.data_files())


def _image_type(wanted: list[tuple[str, str]], st: rp.Structure, targets: dict[Any, Any], config: Any) -> str | None:
    """The row images' type for a direct read (:meth:`direct.Plain.records`): the one wanted
    table's columns as texts, if it has no json column (whose value must stay the exact text the
    server sent). None: the images stay texts, parsed by the replay."""
    if len(wanted) != 1:
        return None
    (s, t), target = wanted[0], targets[wanted[0]]
    try:
        plan = _plan(s, t, st.relations.get((s, t), []), target.schema, config.append_only, config.mode == "history")
    except (InputError, UsageError):
        return None  # the table's own pass reports it
    if any(ct.is_json for ct in plan.columns.values()):
        return None
    return rp.texts_type(plan)


SHUFFLE_INPUT_BYTES = 64 << 20  # of JSONL input per shuffle partition


def _size_shuffles(spark: Any, config: Any, files: list[Path]) -> Callable[[], None]:
    """Sets this run's shuffle partitions from the input's size; returns what restores the old value.

    A fixed count makes each partition grow with the input: at 10M distinct keys (2.4 GB of
    JSONL) four partitions made tasks that sort and cache ~600 MB each, and local[2] with Spark's
    default 1 GB heap died of OutOfMemoryError. One partition per 64 MB of input (at least one per
    core) keeps a task's share constant; adaptive execution still merges the small ones."""
    key = "spark.sql.shuffle.partitions"
    parallel = spark.sparkContext.defaultParallelism
    return _for_run(spark, config, key, max(_int_conf(spark, key), parallel, -(-_bytes(files) // SHUFFLE_INPUT_BYTES)))


def _size_reads(spark: Any, config: Any, inputs: list[Path]) -> Callable[[], None]:
    """Reads of the input (the staged copy, or the JSON itself) split into as many partitions as
    the shuffles have; returns what restores the old split size.

    The staged Parquet is about 8x smaller than its JSONL, so Spark's default 128 MB splits put
    millions of rows in one task. A task that sorts its rows before the shuffle (the partial
    window of the last change per key) then needs more than local[2]'s default heap: 2M distinct
    keys under a 512 MB heap killed the JVM."""
    parts = max(1, _int_conf(spark, "spark.sql.shuffle.partitions"))
    size = _bytes(inputs)
    return _for_run(spark, config, "spark.sql.files.maxPartitionBytes", max(1 << 20, -(-size // parts)))


def _for_run(spark: Any, config: Any, key: str, value: int | str) -> Callable[[], None]:
    """Sets a session conf for this run unless the user gave it (``--conf`` wins); returns what
    restores the session's value."""
    if key in config.conf:
        return lambda: None
    old = spark.conf.get(key)
    spark.conf.set(key, str(value))
    return lambda: spark.conf.set(key, old)


def _bytes(files: list[Path]) -> int:
    size = 0
    for f in files:
        with contextlib.suppress(OSError):
            size += f.stat().st_size
    return size


def _int_conf(spark: Any, key: str) -> int:
    """A count from the session's conf; a value that is not a plain integer (some platforms
    accept ``auto``) counts as one partition per core."""
    try:
        return int(spark.conf.get(key))
    except (TypeError, ValueError):
        return int(spark.sparkContext.defaultParallelism)


def _table_facts(
    changes: Any, applied: dict[tuple[str, str], int | None], spark: Any
) -> dict[tuple[str, str], dict[str, Any]]:
    """Per table: counts by op past its applied position, the position, the last TRUNCATE, and
    the columns with unchanged TOAST values (a small aggregate for all tables, and a second over
    the rows with TRUNCATEs or unchanged TOAST values if there are any).

    What reaches the driver is bounded by the number of tables and columns, whatever the input
    size: one row per table, lists of column names only. (History mode's list of every TRUNCATE
    stays in Spark: see _history_batch.)"""
    from pyspark.sql import functions as F

    every = changes.join(F.broadcast(_applied_frame(spark, applied)), ["schema", "table"])
    live = F.col("c") > F.col("_applied")
    has_toast = live & (F.size("unchanged_toast") > 0)
    # counts and positions only: a hash aggregate. The lists (TRUNCATEs, unchanged-TOAST columns)
    # need an aggregate that sorts its input; it runs only if some table has such rows, over those
    # rows alone (1M events, warm: 1.49 s as one aggregate of everything, 1.24-1.32 s as the counts).
    agg = every.groupBy("schema", "table").agg(
        F.count(F.lit(1)).alias("n_all"),
        F.sum(F.when(live, 1).otherwise(0)).alias("n"),
        *[
            F.sum(F.when(live & (F.col("op") == op), 1).otherwise(0)).alias(op)
            for op in ("insert", "update", "delete", "truncate")
        ],
        F.max(F.when(live, F.col("c"))).alias("position"),
        F.sum(F.when(has_toast, 1).otherwise(0)).alias("n_toast"),
    )
    out = _fact_dicts(agg)
    if any(d["truncate"] or d["n_toast"] for d in out.values()):
        order = rp.order_col()
        lists = (
            every.where(live & ((F.col("op") == "truncate") | (F.size("unchanged_toast") > 0)))
            .groupBy("schema", "table")
            .agg(
                F.max(F.when(F.col("op") == "truncate", order)).alias("truncate_at"),
                F.array_distinct(F.flatten(F.collect_set(F.col("unchanged_toast")))).alias("toast"),
                # updates with an old image and unchanged TOAST values: maybe key changes to follow
                F.count(F.when((F.col("op") == "update") & F.col("old").isNotNull(), 1)).alias("moves"),
            )
        )
        for r in lists.collect():
            d = out[(r["schema"], r["table"])]
            ta = r["truncate_at"]
            d["truncate_at"] = tuple(ta) if ta is not None else None
            d["toast"] = sorted(r["toast"] or [])
            d["moves"] = r["moves"]
    return out


def _plain_facts(plain: direct.Plain, applied: dict[tuple[str, str], int | None]) -> dict[Any, Any] | None:
    """:func:`_table_facts` from the direct read's cached counts, without reading the input again;
    None when the input has TRUNCATEs or unchanged TOAST values (whose facts are lists that the
    counts do not hold: :func:`_table_facts` finds them), or uncommitted changes too many to list
    and commits too many to broadcast (the cached rows, two per transaction, would be sorted and
    merged with them; the per-table copy of the committed changes needs no join to be counted)."""
    from pyspark.sql import functions as F

    rows = None if plain.truncates or plain.toast else plain.committed_counts()
    if rows is None:
        return None
    rows = rows.join(F.broadcast(_applied_frame(plain.spark, applied)), ["schema", "table"])
    live = F.col("k") > F.col("_applied")
    n = sum((F.col(o) for o in rp.ROW_OPS[1:]), F.col(rp.ROW_OPS[0]))
    return _fact_dicts(
        rows.groupBy("schema", "table").agg(
            F.sum(n).alias("n_all"),
            F.sum(F.when(live, n).otherwise(0)).alias("n"),
            *[F.sum(F.when(live, F.col(o)).otherwise(0)).alias(o) for o in rp.ROW_OPS],
            F.lit(0).alias("truncate"),
            F.max(F.when(live, F.col("k"))).alias("position"),
            F.lit(0).alias("n_toast"),
        )
    )


def _applied_frame(spark: Any, applied: dict[tuple[str, str], int | None]) -> Any:
    """Each wanted table's applied position (-1: none yet), to join to its changes."""
    return spark.createDataFrame(
        [(s, t, a if a is not None else -1) for (s, t), a in applied.items()] or [("", "", -1)],
        "schema string, `table` string, _applied long",
    )


def _fact_dicts(agg: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """The facts per table from an aggregate of one row per table, with the list facts (last
    TRUNCATE, unchanged-TOAST columns, key changes) empty until a pass finds them."""
    out = {}
    for r in agg.collect():  # one row per table
        d = r.asDict()
        d.update(truncate_at=None, toast=[], moves=0)
        out[(r["schema"], r["table"])] = d
    return out


def _plan(
    schema: str,
    table: str,
    relations: list[dict[str, Any]],
    existing: pa.Schema | None,
    append_only: bool,
    history: bool = False,
    named: tuple[str, ...] | None = None,
) -> rp.TablePlan:
    from pgrecv.spark.writers import HISTORY_NAMES

    name = f"{schema}.{table}"
    cols: dict[str, ColumnType] = {}
    if existing is not None:
        for f in existing:
            if not (history and f.name in HISTORY_NAMES):
                cols[f.name] = ColumnType("(target)", f.type, None)
    pg_columns: list[str] = []
    for rel in relations:
        pg_columns = [c["name"] for c in rel["columns"]]
        for c in rel["columns"]:
            ct = column_type(c.get("type"), int(c.get("typmod") if c.get("typmod") is not None else -1))
            have = cols.get(c["name"])
            if have is not None and pa.types.is_string(have.arrow) and not pa.types.is_string(ct.arrow):
                # a string column in the target (--bad-values text made it) keeps the values' text
                ct = ColumnType(ct.pg_type, pa.string(), None, ct.is_json, ct.vector)
            if have is not None and not same_type(have.arrow, ct.arrow):
                raise InputError(
                    f"table {name}: column {c['name']} changed type from {have.arrow} to {ct.arrow} ({ct.pg_type}): "
                    "spark-apply does not rewrite tables; re-create the target table from a snapshot"
                )
            if have is None or have.pg_type == "(target)":
                cols[c["name"]] = ColumnType(
                    ct.pg_type, have.arrow if have else ct.arrow, ct.convert, ct.is_json, ct.vector
                )
    for n, ct in list(cols.items()):
        if ct.pg_type == "(target)":  # a column PostgreSQL no longer sends: keep its type, store NULL
            cols[n] = ColumnType("text" if pa.types.is_string(ct.arrow) else "(target)", ct.arrow, None)
    key, full, append = identity(schema, table, relations, append_only, named)
    for k in key:
        if k not in cols:
            raise InputError(f"table {name}: key column {k} is not among its columns")
    return rp.TablePlan(schema, table, cols, key, full, append, pg_columns)


def _delta_names(plan: rp.TablePlan) -> None:
    """Delta takes column names case-insensitively: a table with columns that differ only in case
    (``"a"`` and ``"A"``, two columns to PostgreSQL) cannot be a Delta table."""
    seen: dict[str, str] = {}
    for n in plan.columns:
        other = seen.setdefault(n.lower(), n)
        if other != n:
            raise InputError(
                f"table {plan.name}: columns {other!r} and {n!r} differ only in case, and Delta takes column names "
                "case-insensitively: apply this table with --format parquet"
            )


# A batch whose updates and deletes number at least 1/ONE_PASS_SHARE of the table's rows is
# applied in one pass (lake._Rewrite._one_pass): it would touch most data files anyway.
# ``PGRECV_SPARK_ONE_PASS=0`` turns it off (for comparing the two).
ONE_PASS_SHARE = 4
ONE_PASS = os.environ.get("PGRECV_SPARK_ONE_PASS", "1") != "0"


def _one_pass_fits(facts: dict[str, Any], target: Any, config: Any, toast: list[str]) -> bool:
    """Whether a latest-mode batch can be applied in one pass. Not with unchanged TOAST values
    (their lookups need passes of their own), nor under ``--bad-values null`` or ``text`` (whose
    counts need the probe); and not for a batch of mostly new keys, whose step-by-step write
    leaves the table's files alone."""
    if not ONE_PASS or toast or getattr(config, "bad_values", "fail") != "fail":
        return False
    if facts.get("lean"):
        return True  # chosen by _lean_one_pass
    if facts["truncate_at"] is not None or target.version is None:
        return True  # no current row survives, or there is none
    most = (facts["update"] + facts["delete"]) * ONE_PASS_SHARE
    return bool(most >= target.row_count(above=most))


def _batch(
    changes: Any,
    plan: rp.TablePlan,
    target: Any,
    facts: dict[str, Any],
    spark: Any,
    result: Any,
    config: Any,
    one_pass: bool = False,
) -> Any:
    """The table's batch. ``one_pass``: where it fits (:func:`_one_pass_fits`), the final events
    unpersisted and unprobed, for the writer's one job; what the probe would find fails that job
    (lake.ONE_PASS_FAILED), and the caller then calls again without ``one_pass``."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from pgrecv.spark.lake import ONE_PASS_FAILED, FrameBatch

    names = list(plan.columns)
    schema = pa.schema([(n, plan.columns[n].arrow) for n in names])
    truncate = facts["truncate_at"] is not None
    if plan.append_only:
        rows = changes.where((F.col("schema") == plan.schema) & (F.col("table") == plan.table))
        if target.applied is not None:
            rows = rows.where(F.col("c") > target.applied)
        if truncate:
            rows = rows.where(rp.order_col() > rp.order_lit(facts["truncate_at"]))
        bad = rows.where("op NOT IN ('insert', 'truncate')").select("op", "_path", "lsn").limit(1).collect()
        if bad:
            where = find_line(bad[0]["_path"], {"op": bad[0]["op"], "lsn": bad[0]["lsn"]})
            raise InputError(
                f"{where}: {bad[0]['op']} on a table without a key in --append-only mode: only inserts can be appended"
            )
        texts = rp.image_texts("new", plan, F.col("json_nulls"))
        ev = (
            rp.parse_images(rows.where("op = 'insert'"), plan, ("new",))
            .select(F.struct(*[texts[n].cast("string").alias(n) for n in names]).alias("v"), "_path", "lsn")
            .persist(StorageLevel.MEMORY_AND_DISK)
        )
        ev, plan = _apply_policy(_typed(ev, plan), plan, target, config, result)
        schema = pa.schema([(n, plan.columns[n].arrow) for n in names])
        return FrameBatch(schema, [], False, truncate, ev.select("tv.*"), None, facts["position"], append_only=True)
    toast = [c for c in facts["toast"] if c in plan.columns]
    events = rp.table_changes(changes, plan, target.applied, facts["truncate_at"], dedupe=bool(toast))
    if one_pass and _one_pass_fits(facts, target, config, toast):
        # typed and checked in one select and one filter (each DataFrame step is analysed on the
        # driver, per table: bench/NOTES.md, many small tables)
        values, oks = rp.typed({n: F.col(f"v.`{n}`") for n in names}, plan)
        bad = F.col("_problem").isNotNull() | ~rp.all_of([oks[n] for n in names])
        flat = rp.key_columns(plan) or {}
        if flat:
            events = events.withColumns(flat)
        final = (
            rp.final_changes(events, plan, [], moves=False, by=tuple(F.col(c) for c in flat) or None)
            .select(
                *flat,
                F.col("kind").alias("_kind"),
                F.col("key").alias("_k"),
                F.struct(*[values[n].alias(n) for n in names]).alias("_v"),
                bad.alias("_bad"),
            )
            .where(F.when(F.col("_bad"), F.raise_error(F.lit(ONE_PASS_FAILED))).otherwise(F.lit(True)))
        )
        return FrameBatch(
            schema, plan.key_cols, plan.full, truncate, None, None, facts["position"], final=final, flat_key=bool(flat)
        )
    final = rp.final_changes(events, plan, toast, moves=bool(facts["moves"])).persist(StorageLevel.MEMORY_AND_DISK)
    final = _typed(final, plan)
    # one pass for the three things that stop the table or need more work
    upserts = final.where("kind = 'U'")
    is_u = F.col("kind") == "U"
    probe = final.agg(
        F.max(F.col("_problem").isNotNull()).alias("problem"),
        F.max(~_all_ok(names)).alias("bad"),
        F.max(is_u & (F.size("need") > 0)).alias("need"),
    ).first()
    assert probe is not None
    if probe["problem"]:
        _no_identity(final)
    if probe["bad"]:
        final, plan = _apply_policy(final, plan, target, config, result)
        schema = pa.schema([(n, plan.columns[n].arrow) for n in names])
        upserts = final.where("kind = 'U'")
    rows = upserts.select("tv.*", F.col("need").alias(NEED), F.col("root").alias(ROOT))
    if probe["need"]:
        rows = _fill_from_target(rows, plan, None if truncate else target.frame())
    else:
        rows = rows.drop(NEED, ROOT)
    keys = final.select("key.*")
    return FrameBatch(
        schema,
        plan.key_cols,
        plan.full,
        truncate,
        rows.select(*[F.col(f"`{n}`") for n in names]),
        keys,
        facts["position"],
    )


def _no_identity(rows: Any) -> None:
    """A change without the row image that identifies its row: the table is held back."""
    problem = rows.where("_problem IS NOT NULL").select("_problem", "op", "_path", "lsn").limit(1).collect()
    if problem:
        p = problem[0]
        where = find_line(p["_path"], {"op": p["op"], "lsn": p["lsn"]})
        if p["_problem"] == rp.NOT_OBJECT:
            raise InputError(f"{where}: {p['op']} {p['_problem']}: the file is corrupt")
        raise InputError(
            f"{where}: {p['op']} {p['_problem']}: cannot identify the row; "
            "give the table a primary key or REPLICA IDENTITY FULL"
        )


def _history_batch(
    changes: Any, plan: rp.TablePlan, target: Any, facts: dict[str, Any], spark: Any, result: Any, config: Any
) -> Any:
    """``--mode history`` (SCD type 2): every event is a version row, ending where the next version
    of its key starts (``lead()`` over the key); a TRUNCATE adds a deleted version for each key
    live at that point (those of the target too, at the batch's first TRUNCATE); the target's
    current version of each touched key is closed by the key's first new version."""
    from pyspark import StorageLevel
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from pgrecv.spark.lake import FrameBatch
    from pgrecv.spark.sparkops import spark_schema
    from pgrecv.spark.writers import HISTORY_COLS

    if plan.append_only:
        raise UsageError(
            f"table {plan.name} has no key: --mode history cannot tell its rows' versions apart; "
            "apply it with --mode latest --append-only, or give it a primary key"
        )
    names = list(plan.columns)
    keys = plan.key_cols
    events = rp.table_changes(changes, plan, target.applied, None, history=True)
    toast = [c for c in facts["toast"] if c in plan.columns]
    ev = _typed(rp.fill_toast(events, toast, moves=bool(facts["moves"])), plan).persist(StorageLevel.MEMORY_AND_DISK)
    probe = ev.agg(
        F.max(F.col("_problem").isNotNull()).alias("problem"),
        F.max(~_all_ok(names)).alias("bad"),
        F.max((F.col("kind") == "U") & (F.size("need") > 0)).alias("need"),
    ).first()
    assert probe is not None
    if probe["problem"]:
        _no_identity(ev)
    if probe["bad"]:
        ev, plan = _apply_policy(ev, plan, target, config, result)
    schema = pa.schema([(n, plan.columns[n].arrow) for n in names] + HISTORY_COLS)
    cur = target.frame()
    if cur is not None:
        cur = cur.where("_current")
    # the replay's own columns travel in one struct beside the table's (whatever their names)
    e = F.struct("kind", "key", *rp.ORDER, "commit_time").alias(EXTRA)
    rows = ev.select("tv.*", F.col("need").alias(NEED), F.col("root").alias(ROOT), e)
    rows = _fill_from_target(rows, plan, cur) if probe["need"] else rows.drop(NEED, ROOT)
    n_truncates = facts["truncate"]
    if n_truncates:
        # the keys live at each TRUNCATE get a deleted version there: those whose last event since
        # the TRUNCATE before it is an upsert (and, at the first, the target's live keys untouched
        # before it). Its row holds the key only, as the driver-side replay's does.
        types = {f.name: f.dataType for f in spark_schema(pa.schema([(n, plan.columns[n].arrow) for n in names]))}
        # Every TRUNCATE of the batch, in order, as one row that stays in Spark (broadcast to the
        # tasks): the driver never holds the list, which grows with the input.
        truncates = changes.where(
            (F.col("schema") == plan.schema) & (F.col("table") == plan.table) & (F.col("op") == "truncate")
        )
        if target.applied is not None:
            truncates = truncates.where(F.col("c") > target.applied)
        mark = F.struct(rp.order_col().alias("o"), "commit_time")
        marks = F.broadcast(truncates.agg(F.sort_array(F.collect_list(mark)).alias("_marks")))
        seg = F.size(F.filter(F.col("_marks"), lambda x: x["o"] < rp.order_col()))
        segs = events.crossJoin(marks).select("key", "kind", *rp.ORDER, seg.alias("_seg"))
        last = Window.partitionBy(*rp.by_key(), "_seg").orderBy(*[F.col(c).desc() for c in rp.ORDER])
        live = (
            segs.withColumn("_n", F.row_number().over(last))
            .where(f"_n = 1 AND kind = 'U' AND _seg < {int(n_truncates)}")
            .select("key", "_seg")
        )
        if cur is not None:
            first = segs.where("_seg = 0").select(F.col("key").alias("_k"))
            tk = cur.where("NOT _deleted").select(F.struct(*[F.col(f"`{k}`").alias(k) for k in keys]).alias("key"))
            untouched = tk.join(first, F.col("key").eqNullSafe(F.col("_k")), "left_anti")
            live = live.unionByName(untouched.select("key", F.lit(0).alias("_seg")))
        at = marks.select(F.posexplode("_marks").alias("_seg", "_t")).select(
            "_seg", *[F.col(f"_t.o.{c}").alias(c) for c in rp.ORDER], F.col("_t.commit_time").alias("commit_time")
        )
        tomb = live.join(F.broadcast(at), "_seg").select(
            *[F.col(f"key.`{n}`").alias(n) if n in keys else F.lit(None).cast(types[n]).alias(n) for n in names],
            F.struct(F.lit("D").alias("kind"), "key", *rp.ORDER, "commit_time").alias(EXTRA),
        )
        rows = rows.unionByName(tomb)
    x = {c: F.col(f"{EXTRA}.{c}") for c in ("kind", "key", *rp.ORDER, "commit_time")}
    w = Window.partitionBy(*rp.by_key(x["key"])).orderBy(*[x[c] for c in rp.ORDER])
    start_time = x["commit_time"].cast("timestamp")
    versions = rows.select(
        *[F.col(f"`{n}`") for n in names],
        x["key"].alias("_pgrecv_key"),
        x["c"].alias("_start_lsn"),
        x["l"].alias("_start_change_lsn"),
        F.lead(x["c"]).over(w).alias("_end_lsn"),
        F.lead(x["l"]).over(w).alias("_end_change_lsn"),
        start_time.alias("_start_time"),
        F.lead(start_time).over(w).alias("_end_time"),
        F.lead(x["c"]).over(w).isNull().alias("_current"),
        (x["kind"] == "D").alias("_deleted"),
        (F.row_number().over(w) == 1).alias("_pgrecv_first"),
    ).persist(StorageLevel.MEMORY_AND_DISK)
    closes = versions.where("_pgrecv_first").select(
        *[F.col(f"_pgrecv_key.`{k}`").alias(k) for k in keys],
        F.col("_start_lsn").alias("_end_lsn"),
        F.col("_start_change_lsn").alias("_end_change_lsn"),
        F.col("_start_time").alias("_end_time"),
    )
    return FrameBatch(
        schema,
        keys,
        plan.full,
        False,
        versions.select(*[F.col(f"`{n}`") for n in schema.names]),
        closes.select(*[F.col(f"`{k}`") for k in keys]),
        facts["position"],
        history=True,
        closes=closes,
    )


def _typed(rows: Any, plan: rp.TablePlan) -> Any:
    """Rows whose values ``v`` are JSON texts, with ``tv`` (typed values) and ``ok`` (whether each
    value fits its type: a value that does not is NULL in ``tv``) and ``raw`` (the texts)."""
    from pyspark.sql import functions as F

    names = list(plan.columns)
    values, oks = rp.typed({n: F.col(f"v.`{n}`") for n in names}, plan)
    return rows.select(
        *[c for c in rows.columns if c not in ("tv", "ok", "raw")],
        F.struct(*[values[n].alias(n) for n in names]).alias("tv"),
        F.struct(*[oks[n].alias(n) for n in names]).alias("ok"),
        F.col("v").alias("raw"),
    )


def _apply_policy(rows: Any, plan: rp.TablePlan, target: Any, config: Any, result: Any) -> tuple[Any, rp.TablePlan]:
    """Values the target type cannot hold, by ``--bad-values``: ``fail`` holds the table back
    (the first few named), ``null`` stores NULL, ``text`` makes the column a string column holding
    the value's text (only where the column is new). Key values are never changed: they fail.
    Every value changed is counted. Returns the rows (``tv`` updated) and the plan."""
    from pyspark.sql import functions as F

    names = list(plan.columns)
    policy = getattr(config, "bad_values", "fail")
    if policy == "fail":
        _check_values(rows, plan, names)
        return rows, plan
    counts = rows.agg(*[F.count(F.when(~F.col(f"ok.`{n}`"), 1)).alias(n) for n in names]).first()
    assert counts is not None
    bad = {n: int(counts[n]) for n in names if counts[n]}
    if not bad:
        return rows, plan
    keys = [n for n in bad if n in plan.key_cols]
    if keys:  # a key must stay exact: the row could not be found again
        _check_values(rows.where(~_all_ok(keys)), plan, keys, note="key values are never changed by --bad-values")
    if policy == "text":
        typed_in_target = [
            n
            for n in bad
            if target.schema is not None
            and n in target.schema.names
            and not pa.types.is_string(target.schema.field(n).type)
        ]
        if typed_in_target:
            n = typed_in_target[0]
            _check_values(
                rows.where(~F.col(f"ok.`{n}`")),
                plan,
                [n],
                note=f"--bad-values text cannot turn the existing {target.schema.field(n).type} column {n} into "
                "text: use --bad-values null, or re-create the table",
            )
        columns = dict(plan.columns)
        for n in bad:
            ct = columns[n]
            columns[n] = ColumnType(ct.pg_type, pa.string(), None, ct.is_json, ct.vector)
        plan = replace(plan, columns=columns)
        rows = _typed(rows, plan)
    result.values_changed += sum(bad.values())
    result.changed_columns = sorted(bad)
    return rows, plan


def _all_ok(names: list[str]) -> Any:
    from pyspark.sql import functions as F

    return rp.all_of([F.col(f"ok.`{n}`") for n in names])


def _check_values(rows: Any, plan: rp.TablePlan, names: list[str], note: str = "") -> None:
    """Values the target type cannot hold: the table is held back, the first few named."""
    from pyspark.sql import functions as F

    bad_any = F.lit(False)
    for n in names:
        bad_any = bad_any | ~F.col(f"ok.`{n}`")
    bad = rows.where(bad_any).select("ok", "raw", "_path", "lsn").limit(SAMPLE).collect()
    if not bad:
        return
    r = bad[0]
    col = next(n for n in names if not r["ok"][n])
    value = r["raw"][col]
    ct = plan.columns[col]
    where = find_line(r["_path"], {"lsn": r["lsn"], "table": plan.table})
    more = f" (and {len(bad) - 1}+ more)" if len(bad) > 1 else ""
    raise InputError(
        f"{where}: value {value!r} of column {col} ({ct.pg_type}) cannot be stored as {ct.arrow}{more}: "
        + (note or "the table is held back; --bad-values null or text stores it (see docs/spark-apply.md)")
    )


NEED, ROOT, EXTRA = "_pgrecv_need", "_pgrecv_root", "_pgrecv_e"  # beside a table's columns: no clash


def _fill_from_target(rows: Any, plan: rp.TablePlan, cur: Any) -> Any:
    """Unchanged-TOAST columns the batch could not supply (``NEED``): the target's row (``cur``:
    its current rows, None after a TRUNCATE) of the key ``ROOT``. Other columns of ``rows`` stay."""
    from pyspark.sql import functions as F

    need = rows.where(F.size(NEED) > 0)
    other = [c for c in rows.columns if c not in plan.columns and c not in (NEED, ROOT)]

    def fail(cols: list[str]) -> None:
        raise InputError(
            f"table {plan.name}: unchanged TOAST column(s) {', '.join(cols)}, but the target has no row to "
            "keep them from: apply the earlier changes or a snapshot (pgrecv snapshot) first"
        )

    if cur is None:
        fail(need.select(NEED).limit(1).collect()[0][NEED])
    have = [c for c in plan.columns if c in cur.columns]
    t = cur.select(
        F.struct(*[F.col(f"`{k}`").alias(k) for k in plan.key_cols]).alias("_pgrecv_tk"),
        *[F.col(f"`{c}`").alias(f"_pgrecv_t{i}") for i, c in enumerate(have)],
    )
    j = need.join(t, F.col(ROOT) == F.col("_pgrecv_tk"), "left")
    missing = j.where(F.col("_pgrecv_tk").isNull()).select(NEED).limit(1).collect()
    if missing:
        fail(missing[0][NEED])
    index = {c: i for i, c in enumerate(have)}
    out = j.select(
        *[
            F.when(F.array_contains(NEED, c), F.col(f"_pgrecv_t{index[c]}")).otherwise(F.col(f"`{c}`")).alias(c)
            if c in index
            else F.col(f"`{c}`")
            for c in plan.columns
        ],
        *[F.col(f"`{c}`") for c in other],
    )
    return rows.where(F.size(NEED) == 0).drop(NEED, ROOT).unionByName(out)


def _carry_pending(pending: Any, st: rp.Structure, state: Path, spark: Any) -> tuple[int, Path | None]:
    """Prepared transactions whose outcome is not in the input: their records (and their tables'
    relation records) are written, by Spark, to one 0600 file under ``state`` for the next run.
    Returns (how many, the file)."""
    import orjson
    from pyspark.sql import functions as F

    from pgrecv.output.files import fsync_dir

    if pending is None:
        return 0, None
    count = pending.select("gid", "xid").distinct().count()
    if not count:
        return 0, None
    # the tables of its row changes, and those its TRUNCATEs list (their records name no table)
    named = pending.where(F.col("table").isNotNull()).select("schema", "table")
    truncated = pending.where(F.col("tables").isNotNull()).select(F.inline("tables"))
    tables = {(r["schema"], r["table"]) for r in named.unionByName(truncated).distinct().collect()}
    rel_lines = [
        orjson.dumps({"v": FORMAT_VERSION, "op": "relation", **rel}).decode()
        for k in sorted(tables)
        for rel in st.relations.get(k, [])[-1:]
    ]

    def field(name: str, expr: Any) -> Any:
        return F.concat(F.lit(f',"{name}":'), F.coalesce(expr, F.lit("null")))

    # built field by field: the row images stay their exact raw JSON text
    parts = [F.lit('{"v":1')]
    parts += [field(c, _json_string(F.col(c))) for c in ("op", "schema", "table", "gid", "lsn", "commit_time")]
    parts += [field("xid", F.col("xid").cast("string")), field("commit_lsn", F.lit(None)), field("new", F.col("new"))]
    parts += [field("old", F.col("old")), field("tables", F.to_json(F.col("tables")))]
    parts += [
        field(c, F.to_json(F.col(c)))
        for c in ("unchanged_toast", "old_unchanged_toast", "json_nulls", "old_json_nulls")
    ]
    parts.append(F.lit("}"))
    lines = pending.select(F.concat(*parts).alias("value"), F.lit(1).alias("_first"), *rp.POS)
    if rel_lines:  # the relation records first, then the rows in input order
        rels = spark.createDataFrame([(x,) for x in rel_lines], "value string")
        lines = rels.select(
            "value",
            F.lit(0).alias("_first"),
            *[F.lit(0).cast(t).alias(c) for c, t in zip(rp.POS, ("int", "bigint", "bigint"), strict=True)],
        ).unionByName(lines)
    lines = lines.repartition(1).sortWithinPartitions("_first", *rp.POS).select("value")
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(state, 0o700)  # raw change data: this user only (also for a directory an older run made)
    tmp = state / f".tmp-{uuid.uuid4().hex}"
    lines.write.text(file_url(tmp))
    part = next(p for p in tmp.iterdir() if p.name.startswith("part-"))
    os.chmod(part, 0o600)
    fd = os.open(part, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    final = state / f"{uuid.uuid4().hex}.jsonl"
    os.replace(part, final)
    shutil.rmtree(tmp, ignore_errors=True)
    fsync_dir(state)
    return count, final


def _json_string(col: Any) -> Any:
    """A string column as JSON text (NULL stays NULL)."""
    from pyspark.sql import functions as F

    return F.when(col.isNotNull(), F.regexp_extract(F.to_json(F.struct(col.alias("x"))), r'^\{"x":(.*)\}$', 1))


def _finish_carried(carried: list[Path], written: Path | None) -> None:
    """Files carried by earlier runs, once every table is applied: what is still pending is in
    this run's new file."""
    for p in carried:
        if p != written:
            p.unlink(missing_ok=True)
