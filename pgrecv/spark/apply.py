"""spark-apply: one run per target — lock it, list the inputs, replay them in Spark, summarise.

The replay (:mod:`pgrecv.spark.engine`) runs in Spark tasks; prepared transactions whose outcome
is not in the input are carried over in ``TARGET/_pgrecv/prepared/`` and read before the input
next time; see docs/spark-apply.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pgrecv.errors import OutputError, PgrecvError, UsageError
from pgrecv.spark import ledger, stores
from pgrecv.spark.inputs import check_snapshots, expand_sources, ignored_in_directories
from pgrecv.spark.model import STATE_DIR, ApplyConfig, Progress, Summary, Tuning
from pgrecv.spark.stores import SourceFile, StoreFile, is_store_source
from pgrecv.spark.targets import check_store, target_of

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def run_apply(
    config: ApplyConfig,
    spark: SparkSession | None = None,
    progress: Progress | None = None,
    after_table: Callable[[str], None] | None = None,
    tuning: Tuning | None = None,
) -> Summary:
    """Applies ``config.sources`` to the tables under ``config.target``; ``spark``: a session to
    use (None: one is started if there is anything to read); ``tuning``: the replay's switches
    (None: from the environment)."""
    if config.fmt not in ("delta", "parquet", "iceberg") or config.mode not in ("latest", "history"):
        raise UsageError("--format is delta, parquet or iceberg, --mode latest or history")
    if config.bad_values not in ("fail", "null", "text"):
        raise UsageError("--bad-values is fail, null or text")
    check_store(config.target, config.fmt, config.catalog)
    on_store = isinstance(config.target, stores.StorePath)
    with target_of(config).lock() as held:
        stores.use_conf(config.conf)
        listed = expand_sources(config.sources, config.conf)
        unread = ledger.split(config, listed)  # files every table applied before: not read again
        files = unread.read
        manifests = check_snapshots(files)
        state = config.target / STATE_DIR / "prepared"
        # nothing to read (a cron run before the stream's first file): no JVM started for it
        has_input = bool(files) or (state.is_dir() and any(state.glob("*.jsonl")))
        if spark is None and has_input:
            on_stores = on_store or any(is_store_source(s) for s in config.sources)
            spark = open_session(config.master, config.remote, config.conf, config.fmt, config.engine, on_stores)
        schemes = {f.scheme for f in files if isinstance(f, StoreFile)}
        if isinstance(config.target, stores.StorePath):
            schemes.add(config.target.scheme)
        if spark is not None and has_input and schemes:
            stores.check_session(spark, schemes)
        from pgrecv.spark.engine.run import run_frames

        try:
            summary: Summary = run_frames(
                config,
                spark,
                files,
                manifests,
                state,
                progress or Progress(),
                after_table,
                tuning or Tuning.from_env(),
                guard=held.check,
            )
        except PgrecvError:
            raise
        except Exception as exc:
            from pgrecv.spark.sparkops import no_space

            if not no_space(exc):
                raise
            raise OutputError(
                f"{config.target}: no space left on a device this run writes to (the target, or Spark's scratch "
                "space): free some and run spark-apply again (every table is at its last applied position)"
            ) from None
        summary.files_skipped = len(unread.skipped)
        held.check()  # (a run that lost a store's lock records nothing: another run has the target)
        ledger.advance(config, unread, summary)
    summary.warnings[:0] = ignored_in_directories(config.sources, config.conf)
    if unread.warning is not None:
        summary.warnings.insert(0, unread.warning)
    return summary


def open_session(
    master: str | None, remote: str | None, conf: dict[str, str], fmt: str, engine: str, on_stores: bool
) -> SparkSession:
    """The session of a job on a lake (spark-apply's, and verify's of the same lake): a new one
    gets the table format's connector and, when SOURCE or the target is on a store, the store's
    settings. spark-submit's session and a Spark Connect server's have their static configuration
    fixed: they take the runtime settings only."""
    from pyspark.sql import SparkSession

    from pgrecv.spark.jars import session_conf
    from pgrecv.spark.sparkops import start_session

    fixed = SparkSession.getActiveSession() is not None or remote is not None
    given = conf if fixed else session_conf(conf, fmt, engine)
    return start_session(master, stores.session_conf(given) if on_stores else given, remote=remote)


def list_applied(config: ApplyConfig) -> list[SourceFile]:
    """The files of ``config.sources`` that every table has applied: a run skips them, and they may
    be retired (pgrecv/spark/ledger.py). Under the target's lock, so that no run moves it meanwhile."""
    if not config.target.is_dir():
        return []
    with target_of(config).lock():
        stores.use_conf(config.conf)
        return ledger.split(config, expand_sources(config.sources, config.conf)).skipped
