"""`pgrecv snapshot`: the command line of :mod:`pgrecv.snapshot.core`."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from pgrecv.cli.options import (
    NAME,
    POSITIVE_SIZE,
    SLOT,
    STATE,
    Command,
    PathType,
    common_options,
    conn_opts,
    connection_options,
    info,
    log,
    table_option,
)

if TYPE_CHECKING:
    from pgrecv.snapshot.core import SnapshotResult


@click.command("snapshot", cls=Command)
@click.option("-S", "--slot", type=SLOT, required=True, help="Name of the new logical replication slot.")
@click.option(
    "--output-dir",
    type=PathType(),
    required=True,
    metavar="DIR",
    help="Write the snapshot files here: a new or empty directory (anything in it but pgrecv's lock and an "
    "interrupted run's temporary files is refused, exit 8); or an empty s3://BUCKET/PREFIX, uploaded once "
    "complete.",
)
@table_option
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=1, show_default=True, help="Worker connections.")
@click.option("--publication", type=NAME, metavar="NAME", help="pgoutput: the publication (default: the only one).")
@click.option(
    "-P",
    "--plugin",
    type=click.Choice(["pgoutput", "test_decoding"]),
    default="pgoutput",
    show_default=True,
    help="Output plugin of the new slot.",
)
@click.option(
    "--range-size",
    type=POSITIVE_SIZE,
    default="64MiB",
    show_default=True,
    help="With --jobs > 1: split tables bigger than this into ctid ranges of about this size.",
)
@click.option("--two-phase", is_flag=True, help="Create the slot with two-phase decoding.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["jsonl", "debezium", "debezium-schema"]),
    default="jsonl",
    show_default=True,
    help="pgrecv's JSONL, or Debezium's JSON envelope (op r; docs/debezium.md).",
)
@connection_options
@common_options
def _snapshot(
    slot: str,
    output_dir: str,
    tables: tuple[str, ...],
    jobs: int,
    publication: str | None,
    plugin: str,
    range_size: int,
    two_phase: bool,
    fmt: str,
    **kw: Any,
) -> None:
    """Create a slot and copy every published table's rows as of its start (an initial snapshot).

    The files sort before the changes that `pgrecv start --slot S --output-dir DIR` writes next
    to them: together they hold every row once, with nothing missed. On failure nothing is
    published and the new slot is dropped; after a kill -9, drop the slot before running again.
    """
    opts = conn_opts(kw)
    debezium = None
    if fmt != "jsonl":
        from pgrecv.cli.debezium import current_database

        debezium = (current_database(opts), slot, fmt == "debezium-schema")
    run_and_report(
        opts,
        slot,
        output_dir,
        debezium=debezium,
        plugin=plugin,
        publication=publication,
        tables=tables,
        jobs=jobs,
        range_size=range_size,
        two_phase=two_phase,
    )


# annotated: pgrecv.cli.main imports this name while this module imports pgrecv.cli.main
snapshot: click.Command = _snapshot


def run_and_report(opts: Any, slot: str, output_dir: str, **options: Any) -> None:
    """Run the snapshot with a progress bar on a terminal, and say what it wrote."""
    from pgrecv.cli.options import warn_divergence
    from pgrecv.lsn import lsn_str
    from pgrecv.output.store import is_store_url
    from pgrecv.snapshot.core import run_snapshot

    progress = sys.stderr.isatty() and not STATE.quiet
    if is_store_url(output_dir):
        result = _to_store(opts, slot, output_dir, progress, **options)
    else:
        result = run_snapshot(opts, slot, output_dir, progress=progress, log=log, **options)
    # said once it worked, so that a failure stays the one line it was
    warn_divergence(opts, options.get("publication"), slot, pgoutput=options.get("plugin", "pgoutput") == "pgoutput")
    info(
        f'created slot "{slot}" at {lsn_str(result.snapshot_lsn)}; snapshot of {len(result.tables)} tables, '
        f"{result.rows} rows in {len(result.files)} files in {output_dir}; "
        f"continue with: pgrecv start --slot {slot} --output-dir {output_dir}"
    )


def _to_store(opts: Any, slot: str, url: str, progress: bool, **options: Any) -> SnapshotResult:
    """The snapshot written in a private local directory, then uploaded (files, manifest, state
    last: pgrecv.output.remote.publish_snapshot); an upload that fails drops the new slot, as a
    snapshot that fails does, so that a re-run starts over."""
    import tempfile

    from pgrecv.output.remote import check_empty, publish_snapshot
    from pgrecv.output.store import ObjectStore, StoreURL
    from pgrecv.pg.slots import drop_slot
    from pgrecv.snapshot.core import run_snapshot

    store = ObjectStore(StoreURL.parse(url))
    check_empty(store)
    with tempfile.TemporaryDirectory(prefix="pgrecv-snapshot-") as stage:
        result = run_snapshot(opts, slot, stage, progress=progress, log=log, **options)
        try:
            publish_snapshot(store, Path(stage))
        except BaseException:
            with contextlib.suppress(Exception):
                drop_slot(opts, slot, if_exists=True)
            raise
    return result


def create_with_snapshot(
    opts: Any,
    slot: str,
    output_dir: str,
    plugin: str,
    if_not_exists: bool,
    two_phase: bool,
    failover: bool,
    publication: str | None,
    tables: tuple[str, ...],
    pub_options: Any = None,
) -> None:
    """`pgrecv create ... --snapshot DIR`: the publication if asked for, then `pgrecv snapshot`."""
    from pgrecv.errors import PgrecvError, SlotError, UsageError
    from pgrecv.pg.conn import connect, server_major
    from pgrecv.pg.slots import drop_publication, ensure_publication, get_slot

    if if_not_exists:
        raise UsageError("--snapshot needs a new slot: it cannot go with --if-not-exists")
    if tables and not publication:
        raise UsageError("--table needs --publication: tables are published through a publication")
    created = False
    if publication:
        with connect(opts) as conn:
            if get_slot(conn, slot) is not None:  # checked first: a refused run makes nothing
                raise SlotError(
                    f'replication slot "{slot}" already exists: a snapshot needs a new slot; drop it with '
                    f"'pgrecv drop --slot {slot}' or choose another name"
                )
            if pub_options is not None:
                pub_options.check(publication, server_major(conn))
            created = ensure_publication(conn, publication, tables, pub_options)
    try:
        run_and_report(
            opts, slot, output_dir, plugin=plugin, publication=publication, two_phase=two_phase, failover=failover
        )
    except BaseException:
        if created and publication:  # the snapshot failed: take back what this run made
            with contextlib.suppress(PgrecvError), connect(opts) as conn:
                drop_publication(conn, publication)
        raise
    if created:
        info(f'created publication "{publication}"')
