"""spark-apply as a Spark job: the driver lists files, collects the relation records and a few
counts, and plans; Spark tasks read, replay and write. The driver never holds rows, so its memory
does not grow with the input, and ``--master spark://…`` moves the work to a cluster.

Per table, a failure (a value the target type cannot hold, a change without its key, a TOAST value
with nowhere to come from) holds back that table alone: it keeps its position, is reported with
file:line, column and value, and the other tables are applied (exit code 15, partly applied).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pgrecv.errors import InputError, PgrecvError, UsageError
from pgrecv.filters import table_filter
from pgrecv.lsn import lsn_str
from pgrecv.spark.engine import together
from pgrecv.spark.engine.batch import build_batch, history_batch
from pgrecv.spark.engine.carry import carry_pending, finish_carried
from pgrecv.spark.engine.facts import (
    image_type,
    lean_facts,
    lean_fits,
    lean_one_pass,
    lean_settle,
    plain_facts,
    single_task,
    table_facts,
)
from pgrecv.spark.engine.tuning import (
    PUSHDOWN,
    for_run,
    input_bytes,
    size_delta_snapshots,
    size_reads,
    size_shuffles,
)
from pgrecv.spark.files import file_url, literal_read
from pgrecv.spark.inputs import snapshot_tables
from pgrecv.spark.model import ApplyConfig, Progress, Summary, TableResult, Tuning, app_id, table_dir_name
from pgrecv.spark.read import direct
from pgrecv.spark.read import lean as lean_read
from pgrecv.spark.read.staged import check_input, read_records
from pgrecv.spark.replay import committed as rp
from pgrecv.spark.schema import delta_names
from pgrecv.spark.schema import plan as table_plan
from pgrecv.spark.sparkops import exception_line, is_connect, no_space, spark_failure
from pgrecv.spark.stores import SourceFile, StorePath, TargetPath, as_source, remove_tree
from pgrecv.spark.tables import Table, mode_of, writer_of
from pgrecv.spark.tables.delta import DeltaRsTable
from pgrecv.spark.tables.delta_spark import DeltaSparkTable
from pgrecv.spark.tables.parquet import ParquetStoreTable, ParquetTable
from pgrecv.spark.tables.rewrite import one_pass_failed

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


TABLE_THREADS = 4  # tables applied side by side (each a few Spark jobs)


_ENGINES = {
    ParquetTable: "parquet/spark",
    ParquetStoreTable: "parquet/spark",
    DeltaRsTable: "delta/delta-rs+spark",
    DeltaSparkTable: "delta/spark",
}


def _its_own(exc: Exception) -> bool:
    """Whether a failure is one table's alone (a data file removed behind pgrecv's back, its
    catalog refusing a commit): that table is held back and the others are applied. pgrecv's own
    errors (a lost lock) and a full device are the run's (apply.run_apply)."""
    return not isinstance(exc, PgrecvError) and not no_space(exc)


def run_together(
    changes: DataFrame,
    todo: list[tuple[str, str]],
    tids: dict[tuple[str, str], int],
    targets: dict[tuple[str, str], Table],
    facts: dict[Any, Any],
    st: rp.Structure,
    config: ApplyConfig,
    progress: Progress,
    after_table: Callable[[str], None] | None,
) -> list[TableResult]:
    """The small tables of ``todo`` applied as groups (:mod:`pgrecv.spark.engine.together`);
    returns their results. A table it does not take, or whose events show a problem, is left to
    the per-table replay."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyspark.sql.types import StringType

    if not all(isinstance(changes.schema[i].dataType, StringType) for i in ("new", "old")):
        return []
    members = []
    for key in todo:
        f = facts[key]
        target = targets[key]
        try:
            plan = table_plan(
                *key, st.relations.get(key, []), target.schema, config.append_only, False, config.keys.get(key)
            )
            if config.fmt == "delta":
                delta_names(plan)
        except (InputError, UsageError):
            continue  # the per-table replay reports it
        try:
            fits = together.fits(plan, target, f, config)
        except Exception as exc:
            if not _its_own(exc):
                raise
            continue  # (its current files unreadable, say): the per-table replay applies it or says why
        if fits:
            members.append(together.Member(key, tids[key], plan, target, f))
    results = []
    chunks = (
        c for g in (together.groups(members) if len(members) > 1 else []) for c in together.final_events(changes, g)
    )
    by_tid = {m.tid: m for m in members}
    for events, types in chunks:
        of = events.column("_tid")
        for tid in sorted(set(of.to_pylist())):
            m = by_tid[tid]
            schema = pa.schema([(n, ct.arrow) for n, ct in m.plan.columns.items()])
            s, t = m.key
            target = m.target
            result = TableResult(f"{s}.{t}", str(target.path), "applied")
            result.inserts, result.updates, result.deletes = (m.facts[o] for o in rp.ROW_OPS)
            try:
                rows = together.merged(m, events.filter(pc.equal(of, m.tid)), types, schema)
                if rows is None:
                    continue
                target.path.parent.mkdir(parents=True, exist_ok=True)
                result.bytes_written = target.write_frames(together.batch_of(m, rows, schema))
            except Exception as exc:
                if not _its_own(exc):
                    raise
                continue  # the per-table replay applies it or says why
            result.version = target.version
            result.applied_lsn = lsn_str(m.facts["position"])
            results.append(result)
            progress.table_done(f"{s}.{t}")
            if after_table is not None:
                after_table(f"{s}.{t}")
    return results


def run_frames(
    config: ApplyConfig,
    spark: SparkSession | None,
    files: list[SourceFile],
    manifests: dict[SourceFile, dict[str, Any]],
    state: TargetPath,
    progress: Progress,
    after_table: Callable[[str], None] | None,
    tuning: Tuning,
    lean: bool | None = None,
    guard: Callable[[], None] = lambda: None,
) -> Summary:
    """The run; ``lean``: whether it may take the lean read (None: it tries, where the lean read
    may apply, and if that declines, runs again without it)."""
    if lean is None:
        args = (config, spark, files, manifests, state, progress, after_table, tuning)
        try:
            return run_frames(*args, lean=tuning.direct and tuning.lean, guard=guard)
        except direct.LeanDeclined:  # nothing was committed: the ordinary way applies it or names what it is
            return run_frames(*args, lean=False, guard=guard)
    from pyspark.sql import functions as F

    started = time.monotonic()
    carried: list[TargetPath] = sorted(state.glob("*.jsonl"), key=str) if state.is_dir() else []
    writer = writer_of(spark, config.target, config.fmt, config.engine, config.catalog)
    if config.fmt == "iceberg" and spark is not None:
        from pgrecv.spark.tables.iceberg import use_catalog

        use_catalog(spark, config.target, config.catalog)
    summary = Summary(
        engine=_ENGINES.get(writer, "iceberg/spark"),
        files=len(files) + len(carried),
    )
    progress.files(len(files) + len(carried))
    if not files and not carried:
        summary.seconds = time.monotonic() - started
        return summary
    assert spark is not None  # run_apply starts one for any input
    # the parsed input, staged once as Parquet beside the run's state (raw change data: 0700)
    work = state.parent  # made 0700 by run_apply's target lock
    stage = work / f"stage-{uuid.uuid4().hex}"
    by_table = stage.with_name(f"{stage.name}-changes")
    # links to inputs Spark cannot name (files.input_urls): local ones, made by the driver
    links = (
        Path(tempfile.mkdtemp(prefix="pgrecv-inputs-")) / "links"
        if isinstance(stage, StorePath)
        else stage.with_name(f"{stage.name}-inputs")
    )
    restores = [size_shuffles(spark, config, [*files, *map(as_source, carried)])]  # the session's conf, given back
    # PostgreSQL's names are case-sensitive: columns "a" and "A" are two columns (Spark's default
    # would take them as one, and fail as ambiguous)
    restores.append(for_run(spark, config, "spark.sql.caseSensitive", "true"))
    if writer is DeltaSparkTable:
        restores.append(size_delta_snapshots(spark, config))
    try:
        plain = None
        if tuning.direct and not carried and not manifests and direct.looks_plain(files):
            restores.append(size_reads(spark, config, files))
            if lean and lean_fits(config, files, tuning):
                plain = lean_read.read_lean(spark, files, links, input_bytes(files))
                if plain is not None:
                    # the main job parses every line, which the JSON reader's filter pushdown would skip
                    restores.append(for_run(spark, config, PUSHDOWN, "false"))
            if plain is None:
                plain = direct.read_plain(spark, files, links)
            if plain is None:
                restores.pop()()
                shutil.rmtree(links, ignore_errors=True)  # the staged read makes its own
        keep = None  # the direct read's committed changes as a filter, when it can say them so
        if plain is not None:
            df, st, keep, any_truncate = None, plain.structure, plain.keep(), plain.truncates > 0
            commits = plain.commit_keys() if keep is None else None
            summary.input_read = "lean" if plain.lean else "direct"
        else:
            records = read_records(spark, files, [as_source(p) for p in carried], stage, links)
            restores.append(size_reads(spark, config, [as_source(p) for p in stage.rglob("*.parquet")]))
            df, commits, any_truncate = records.frame, None, True  # (not counted: maybe)
            check_input(records)
            st = rp.structure(df)
            summary.input_read = "staged"
        summary.transactions, summary.incomplete, summary.rolled_back = st.transactions, st.incomplete, st.rolled_back
        match = table_filter(config.tables, ())
        snap = snapshot_tables(manifests)
        # every table's changes follow its relation record (pgoutput and pgrecv's test_decoding reader)
        names = sorted({k for k in st.relations} | {(s, t) for s, t, _ in snap})
        wanted = [n for n in names if match is None or match(*n)]
        tids = {k: i for i, k in enumerate(wanted)}  # each table's _tid
        targets: dict[tuple[str, str], Table] = {}
        # A table the direct read saw no change of has nothing to apply, and is not opened (a
        # Delta table's log read each: 6 s of a run over 1,000 tables of which 10 changed,
        # bench/NOTES.md); it is not in the run's facts, nor its summary.
        changed = plain.changed if plain is not None and plain.changed is not None and len(wanted) > 1 else None
        for s, t in wanted:
            # absolute: data files are matched against the paths Spark reports
            path = config.target.resolve() / table_dir_name(s, t)
            target = writer(path, app_id(f"{s}.{t}"), spark)
            target.guard = guard
            target.names = (s, t)
            if (changed is None or (s, t) in changed) and target.exists():
                target.open()
            targets[(s, t)] = target
        lean_table = None
        if plain is not None and plain.lean:
            if len(wanted) != 1 or not lean_one_pass(plain, targets[wanted[0]], files):
                raise direct.LeanDeclined
            last, at = plain.last_commit, targets[wanted[0]].applied
            if last is None or (at is not None and last <= at):
                raise direct.LeanDeclined  # nothing new: the first pass's counts say so exactly
            lean_table = wanted[0]
        if plain is not None:
            at = targets[lean_table].applied if lean_table is not None else None
            df = plain.records(image_type(wanted, st, targets, config), applied=at)
        assert df is not None  # the staged read's, or the direct read's just made
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
        summary.lines = st.lines
        summary.pending_prepared, carry_file = carry_pending(pending, st, state, spark)

        history = config.mode == "history"
        applied = {k: v.applied for k, v in targets.items() if changed is None or k in changed}
        facts = None
        if lean_table is not None:
            assert plain is not None
            facts = {lean_table: lean_facts(plain)}
        elif plain is not None:
            facts = plain_facts(plain, applied)
        # each table's rows in files of its own: several tables, the staged rules, or commits too
        # many to broadcast to a join (each pass would sort and merge the input with them again)
        joined = keep is None and not rp.broadcasts_commits(st)
        staged = False
        if facts is None and (len(wanted) > 1 or st.chunked or st.prepared or joined):
            # written first, the facts' aggregates read those files: the committed changes' plan
            # (the input joined to its commits) runs once, not once more for each aggregate
            changes, staged = stage_changes(changes, by_table, spark), True
        if facts is None:
            facts = table_facts(changes, applied, spark)
        todo = [k for k in wanted if facts.get(k, {}).get("n_all", 0) > 0]
        progress.tables(len(todo))
        failures: list[str] = []
        warnings: list[str] = []
        lock = threading.Lock()
        stop = threading.Event()  # after_table raised: start no other table
        if tuning.together and lean_table is None and not history and len(todo) > 1:
            done = run_together(changes, todo, tids, targets, facts, st, config, progress, after_table)
            summary.tables.extend(done)
            summary.tables_grouped = len(done)
            applied_here = {r.table for r in done}
            todo = [k for k in todo if f"{k[0]}.{k[1]}" not in applied_here]
        busy = [k for k in todo if facts[k]["n"]]  # the others need no Spark job
        own_files = staged or len(busy) > 1 or (len(busy) == 1 and (st.chunked or st.prepared or joined))
        if own_files and not staged:
            changes = stage_changes(changes, by_table, spark)
        # else one table of plain transactions: its few passes each redo a cheap filter (or a
        # semi-join to the broadcast commits) over the input, less work than writing every change
        # once more

        def one(key: tuple[str, str]) -> TableResult | None:
            if stop.is_set():
                return None
            s, t = key
            target = targets[key]
            own = changes.where(F.col("_tid") == tids[key])  # partition pruning: its rows only
            result = TableResult(f"{s}.{t}", str(target.path), "up to date", version=target.version)
            if target.applied is not None:
                result.applied_lsn = lsn_str(target.applied)
            f = facts[key]
            lean_one = key == lean_table  # the lean read's table: its counts come with its write
            result.inserts, result.updates, result.deletes, result.truncates = (
                f["insert"],
                f["update"],
                f["delete"],
                f["truncate"],
            )
            # each thread's jobs are its own group in Spark's UI (and its description in logs)
            if not is_connect(spark):  # Spark Connect has no SparkContext (its jobs are named by the server)
                spark.sparkContext.setJobDescription(f"pgrecv spark-apply {s}.{t}")
            try:
                # checked even when nothing is left to apply: a wrong --mode fails on the first run
                made = mode_of(target)
                if made is not None and made != config.mode:
                    raise UsageError(f"{target.path} is a {made}-mode table: use the same --mode as before")
                if not f["n"]:  # every change of the input is applied already
                    progress.table_done(f"{s}.{t}")
                    return result
                plan = table_plan(
                    s, t, st.relations.get(key, []), target.schema, config.append_only, history, config.keys.get(key)
                )
                if config.fmt == "delta":
                    delta_names(plan)
                elif config.fmt == "iceberg":
                    from pgrecv.spark.tables.iceberg import check_names

                    check_names(plan)
                single = not lean_one and tuning.single_task and single_task(f, target)
                if single:
                    # its own files are few: one task reads them; else one shuffle of its rows
                    # (a coalesce would read the whole input in that task)
                    own = own.coalesce(1) if own_files else own.repartition(1)
                if history:
                    batch = history_batch(own, plan, target, f, spark, result, config)
                else:
                    batch = build_batch(own, plan, target, f, spark, result, config, one_pass=tuning.one_pass)
                    batch.upserts_at_most = None if lean_one else f["insert"] + f["update"]
                batch.single = single
                if lean_one:
                    assert plain is not None
                    batch.settle = lean_settle(plain, batch, result)
                target.path.parent.mkdir(parents=True, exist_ok=True)
                try:
                    result.bytes_written = target.write_frames(batch)
                except Exception as exc:
                    if lean_one:  # a line or a change the lean read does not take: nothing was committed
                        raise direct.LeanDeclined from exc
                    if batch.final is None or not one_pass_failed(exc):
                        raise
                    # a problem the one pass cannot name: step by step, it is reported or handled
                    batch = build_batch(own, plan, target, f, spark, result, config)
                    batch.upserts_at_most = f["insert"] + f["update"]
                    batch.single = single
                    result.bytes_written = target.write_frames(batch)
                result.status = "applied"
                result.version = target.version
                result.applied_lsn = lsn_str(batch.position)
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
            except Exception as exc:
                if lean_one or not _its_own(exc):
                    raise
                said = spark_failure(exc)
                result.status = "held back"
                result.error = (
                    f"{'Spark failed writing it' if said else 'writing it failed'} ({said or exception_line(exc)}): it "
                    "stays at its last applied position; fix the cause and run spark-apply again"
                )
                with lock:
                    failures.append(f"{s}.{t}: {result.error}")
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
            finish_carried(carried, carry_file)
        summary.warnings.extend(failures)
        summary.seconds = time.monotonic() - started
        return summary
    finally:
        for restore in reversed(restores):
            restore()
        spark.catalog.clearCache()  # the run's persisted frames (changes, final events)
        remove_tree(stage)
        remove_tree(by_table)
        shutil.rmtree(links if isinstance(stage, Path) else links.parent, ignore_errors=True)


def stage_changes(changes: DataFrame, by_table: TargetPath, spark: SparkSession) -> DataFrame:
    """The run's committed changes written once as Parquet partitioned by table (``_tid``), and
    read back: each table's passes then read its own rows only (partition pruning)."""
    shape = changes.schema
    changes.write.partitionBy("_tid").parquet(file_url(by_table))
    return literal_read(spark).schema(shape).parquet(file_url(by_table))
