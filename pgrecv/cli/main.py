"""The command line: parse options, wire parts together, map errors to exit codes. Nothing more."""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Callable
from typing import Any, TextIO, cast

import click

from pgrecv import __version__
from pgrecv.cli.options import (
    DURATION,
    NAME,
    POSITIVE_DURATION,
    POSITIVE_SIZE,
    SIZE,
    SLOT,
    STATE,
    Command,
    LSNType,
    PathType,
    common_options,
    conn_opts,
    connection_options,
    filter_options,
    info,
    log,
    reset_state,
    warn_divergence,
)
from pgrecv.errors import ExitCode, PgrecvError, Unhealthy, UsageError
from pgrecv.lsn import LSN
from pgrecv.pg.conn import ConnOptions, redact, remember_environment_secrets, translate


class _Group(click.Group):
    command_class = Command


@click.group(cls=_Group, context_settings={"max_content_width": 100})
@click.version_option(__version__, "--version", prog_name="pgrecv", message="%(prog)s %(version)s")
@common_options
def cli() -> None:
    """Consume PostgreSQL logical replication: slots, typed changes as JSONL or tables, raw output.

    Connection options follow pg_recvlogical and libpq: PGHOST, PGPORT, PGUSER, PGDATABASE,
    PGPASSWORD, service files and ~/.pgpass all work.
    """


# --- slots ------------------------------------------------------------------------------------


# `peek` and `start`: the same output formats
format_option = click.option(
    "--format",
    "fmt",
    type=click.Choice(["auto", "jsonl", "pretty", "raw", "debezium", "debezium-schema"]),
    default="auto",
    show_default=True,
    help="auto is pretty on a terminal and jsonl otherwise; raw is what the plugin wrote; "
    "debezium[-schema] is Debezium's JSON envelope (docs/debezium.md).",
)


@cli.command()
@click.option("-S", "--slot", type=SLOT, required=True, help="Name of the logical replication slot.")
@click.option(
    "-P",
    "--plugin",
    default="pgoutput",
    show_default=True,
    metavar="PLUGIN",
    help="Output plugin: pgoutput, test_decoding or another installed plugin.",
)
@click.option(
    "--if-not-exists",
    is_flag=True,
    help="Do not fail if the slot already exists as asked (plugin, database, --two-phase, --failover).",
)
@click.option(
    "--two-phase",
    "--enable-two-phase",
    "two_phase",
    is_flag=True,
    help="Decode prepared transactions at PREPARE (PostgreSQL 14+; --enable-two-phase as in pg_recvlogical 18).",
)
@click.option(
    "--failover",
    "--enable-failover",
    "failover",
    is_flag=True,
    help="Synchronise the slot to standbys (PostgreSQL 17+; --enable-failover as in pg_recvlogical 18).",
)
@click.option(
    "--publication",
    type=NAME,
    metavar="NAME",
    help="pgoutput: create this publication if missing (FOR ALL TABLES, or the --table list).",
)
@click.option(
    "--table",
    "tables",
    multiple=True,
    metavar="[SCHEMA.]TABLE",
    help="Table for a new publication (repeatable).",
)
@click.option(
    "--publish-generated-columns",
    is_flag=True,
    help="With --publication: publish stored generated columns' values (PostgreSQL 18+).",
)
@click.option(
    "--publish-via-partition-root",
    is_flag=True,
    help="With --publication: changes to partitions carry the partitioned table's name.",
)
@click.option(
    "--snapshot",
    "snapshot_dir",
    type=PathType(),
    metavar="DIR",
    help="Also copy existing rows into DIR (pgrecv snapshot).",
)
@connection_options
@common_options
def create(
    slot: str,
    plugin: str,
    if_not_exists: bool,
    two_phase: bool,
    failover: bool,
    publication: str | None,
    tables: tuple[str, ...],
    publish_generated_columns: bool,
    publish_via_partition_root: bool,
    snapshot_dir: str | None,
    **kw: Any,
) -> None:
    """Create a logical replication slot (and a publication for pgoutput)."""
    from pgrecv.pg.slots import PublicationOptions, create_slot

    opts = conn_opts(kw)
    pub_options = PublicationOptions(publish_generated_columns, publish_via_partition_root)
    if snapshot_dir is not None:
        from pgrecv.cli.snapshot import create_with_snapshot

        create_with_snapshot(
            opts, slot, snapshot_dir, plugin, if_not_exists, two_phase, failover, publication, tables, pub_options
        )
        return
    result = create_slot(
        opts,
        slot,
        plugin,
        if_not_exists=if_not_exists,
        two_phase=two_phase,
        failover=failover,
        publication=publication,
        tables=tables,
        on_wait=info,
        pub_options=pub_options,
    )
    if result.publication_created:
        info(f'created publication "{publication}"')
    if result.created:
        info(f'created slot "{result.name}" ({result.plugin}) at {result.consistent_point}')
    else:
        info(f'slot "{slot}" already exists')
    warn_divergence(opts, publication if plugin == "pgoutput" else None, slot, pgoutput=plugin == "pgoutput")


@cli.command()
@click.option("-S", "--slot", type=SLOT, required=True, help="Name of the slot to drop.")
@click.option("--if-exists", is_flag=True, help="Do not fail if the slot does not exist.")
@connection_options
@common_options
def drop(slot: str, if_exists: bool, **kw: Any) -> None:
    """Drop a replication slot."""
    from pgrecv.pg.slots import drop_slot

    if drop_slot(conn_opts(kw), slot, if_exists=if_exists):
        info(f'dropped slot "{slot}"')
    else:
        info(f'slot "{slot}" does not exist, nothing to drop')


@cli.command()
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "jsonl", "prometheus"]),
    default="table",
    show_default=True,
    help="A table for people, one JSON object per slot, or the Prometheus text format "
    "(for node_exporter's textfile collector).",
)
@click.option("-S", "--slot", "only", type=SLOT, multiple=True, help="Only this slot (repeatable).")
@click.option("--check", is_flag=True, help="Print one line per problem instead; exit 14 if there is any.")
@click.option("--max-lag", type=SIZE, help="--check: WAL not confirmed by the consumer, at most.")
@click.option("--max-retained", type=SIZE, help="--check: WAL the slot keeps on the server, at most.")
@click.option(
    "--max-inactive",
    type=DURATION,
    help="--check: time without a consumer, at most. PostgreSQL 17+: older servers do not record since when a "
    "slot is inactive, and the option is refused there (exit 2) rather than passed unchecked; use --max-lag "
    "or --max-retained instead.",
)
@click.option(
    "--standby",
    metavar="CONNSTR",
    help="--check: every failover slot must have a copy on this standby that survives a promotion.",
)
@connection_options
@common_options
def slots(
    fmt: str,
    only: tuple[str, ...],
    check: bool,
    max_lag: int | None,
    max_retained: int | None,
    max_inactive: float | None,
    standby: str | None,
    **kw: Any,
) -> None:
    """List replication slots with their positions, lag and retained WAL, or check their health."""
    from pgrecv.pg.slots import list_slots

    limits_given = max_lag is not None or max_retained is not None or max_inactive is not None or standby
    if limits_given and not check:
        raise UsageError("--max-lag, --max-retained, --max-inactive and --standby go with --check")
    opts = conn_opts(kw)
    if max_inactive is not None:  # a monitoring check must not pass by not checking
        from pgrecv.pg.slots import slot_column_missing

        major = slot_column_missing(opts, "inactive_since")
        if major is not None:
            raise UsageError(
                f"--max-inactive needs PostgreSQL 17 or newer (pg_replication_slots.inactive_since); this "
                f"server is {major} and does not record since when a slot is inactive: use --max-lag or "
                "--max-retained instead, which catch a slot nobody consumes as its WAL grows"
            )
    rows = list_slots(opts)
    if only:
        missing = sorted(set(only) - {r["slot_name"] for r in rows})
        rows = [r for r in rows if r["slot_name"] in only]
    if check:
        from pgrecv.pg import slot_health

        standby_rows = None
        if standby is not None:
            standby_rows = list_slots(ConnOptions(dbname=standby, prompt=opts.prompt, option="--standby"))
        found = [f"slot {name} does not exist" for name in missing] if only else []
        found += slot_health.problems(
            rows, slot_health.Limits(max_lag, max_retained, max_inactive), standby=standby_rows
        )
        if found:
            from pgrecv.output.files import write_stdout

            write_stdout("".join(f"{line}\n" for line in found).encode())
            raise Unhealthy(f"{len(found)} problem(s) with replication slots")
        info(f"{len(rows)} slot(s) checked: no problem")
        return
    if fmt == "prometheus":
        from pgrecv.output.files import write_stdout
        from pgrecv.pg.slot_health import prometheus

        write_stdout(prometheus(rows))
        return
    if fmt == "jsonl":  # one line per slot: few
        import orjson

        from pgrecv.output.files import write_stdout

        write_stdout(b"".join(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE) for row in rows))
        return
    from pgrecv.output.slot_table import render_slots

    render_slots(rows)


# --- changes ----------------------------------------------------------------------------------


@cli.command()
@click.option("-S", "--slot", type=SLOT, required=True, help="Name of the logical replication slot.")
@click.option("--consume", is_flag=True, help="Advance the slot past the changes once the output is durable.")
@click.option("--upto-lsn", type=LSNType(), help="Stop at this LSN.")
@click.option("--upto-nchanges", type=click.IntRange(1, 2**31 - 1), help="Stop after about this many changes.")
@click.option(
    "-o",
    "--option",
    "plugin_options",
    multiple=True,
    metavar="NAME[=VALUE]",
    help="Option passed to the output plugin (repeatable).",
)
@click.option(
    "--publication",
    type=NAME,
    metavar="NAME",
    help="pgoutput: the publication (default: the only one in the database).",
)
@format_option
@click.option(
    "-f", "--file", "file", type=PathType(), metavar="FILE", default="-", help="Write here instead of stdout ('-')."
)
@filter_options
@connection_options
@common_options
def peek(
    slot: str,
    consume: bool,
    upto_lsn: LSN | None,
    upto_nchanges: int | None,
    plugin_options: tuple[str, ...],
    publication: str | None,
    fmt: str,
    file: str,
    tables: tuple[str, ...],
    exclude_tables: tuple[str, ...],
    op_filter: str | None,
    **kw: Any,
) -> None:
    """Read a slot's pending changes through the SQL interface, decoded.

    --table, --exclude-table and --op filter as they do for start. With --consume the slot
    advances past what was filtered out too.
    """
    from pgrecv.decode.plugins import parse_options
    from pgrecv.output.oneshot import Output
    from pgrecv.stream.peek import peek as run_peek
    from pgrecv.stream.pipeline import parse_ops

    opts = conn_opts(kw)
    ops = parse_ops(op_filter)
    parsed = parse_options(plugin_options)
    with Output(file) as out:
        if fmt == "auto":
            fmt = "pretty" if out.is_terminal else "jsonl"
        if fmt.startswith("debezium"):
            from pgrecv.cli.debezium import debezium_factory, peek_closer

            enc = debezium_factory(opts, fmt, slot)(out.write)
            sink, raw, close = enc.feed, None, peek_closer(enc, consume)
        else:
            sink, raw, close = _formatter(fmt, out)

        def durable() -> None:
            close()
            out.finish()

        result = run_peek(
            opts,
            slot,
            sink=sink,
            raw=raw,
            durable=durable,
            consume=consume,
            upto_lsn=upto_lsn,
            upto_nchanges=upto_nchanges,
            options=parsed,
            publication=publication,
            tables=tables,
            exclude_tables=exclude_tables,
            ops=ops,
        )
    what = "consumed" if consume else "peeked"
    log(f"{what} {result.messages} messages from slot {slot} ({result.plugin}), last LSN {result.last_lsn}")


def _formatter(fmt: str, out: Any) -> tuple[Any, Any, Callable[[], Any]]:
    """(event sink, raw sink, close) for the chosen format."""
    if fmt == "raw":
        write = out.write

        def raw(data: bytes) -> None:
            write(data)
            write(b"\n")

        return None, raw, lambda: None
    if fmt == "jsonl":
        from pgrecv.output.jsonl import JsonlEncoder

        enc = JsonlEncoder(out.write)
        return enc.feed, None, enc.close
    from pgrecv.output.console import PipeConsole
    from pgrecv.output.pretty import PrettyRenderer

    if out.is_terminal:
        console = PipeConsole()
    else:
        text = io.TextIOWrapper(out.stream, encoding="utf-8", write_through=True)
        where = str(out.path) if out.path is not None else "standard output"
        console = PipeConsole(file=text, width=120, force_terminal=False, color_system=None, where=where)
    renderer = PrettyRenderer(console)
    return renderer.feed, None, renderer.close


# --- streaming -------------------------------------------------------------------------------


@cli.command()
@click.option("-S", "--slot", type=SLOT, required=True, help="Name of the logical replication slot.")
@click.option(
    "-f",
    "--file",
    "file",
    type=PathType(),
    metavar="FILE",
    help="Append to this file ('-' for stdout, the default). A regular file must be the user's own and "
    "named directly, not through a symbolic link (links to devices such as /dev/stdout are fine); so must "
    "its state file .FILE.pgrecv-state.",
)
@click.option(
    "--output-dir",
    type=PathType(),
    metavar="DIR",
    help="Write rotated files here, named by LSN (batch consumers); s3://BUCKET/PREFIX uploads each file "
    "once final (credentials and endpoint: AWS_* variables, profiles).",
)
@click.option("--rotate-size", type=POSITIVE_SIZE, help="--output-dir: start a new file past this size (e.g. 64MB).")
@click.option(
    "--rotate-interval", type=POSITIVE_DURATION, help="--output-dir: start a new file after this long (e.g. 5m)."
)
@format_option
@click.option(
    "-o", "--option", "plugin_options", multiple=True, metavar="NAME[=VALUE]", help="Option for the output plugin."
)
@click.option("--create", "create_slot_first", is_flag=True, help="Create the slot first (see pgrecv create).")
@click.option("-P", "--plugin", metavar="PLUGIN", help="With --create: the output plugin (default pgoutput).")
@click.option("--if-not-exists", is_flag=True, help="With --create: do not fail if the slot exists.")
@click.option(
    "--temporary",
    is_flag=True,
    help="With --create: a temporary slot, made on the streaming connection and dropped by the server when "
    "it ends (stop, error or lost connection: no reconnecting). For one-off reads; nothing stays behind.",
)
@click.option("--publication", type=NAME, metavar="NAME", help="pgoutput: the publication (default: the only one).")
@click.option(
    "--proto-version", type=click.IntRange(1, 4), help="pgoutput protocol (default: the newest the server speaks)."
)
@click.option("--binary", is_flag=True, help="pgoutput: values in binary form (decoded by pgrecv).")
@click.option("--messages/--no-messages", default=True, show_default=True, help="pgoutput: logical decoding messages.")
@click.option(
    "--origin", type=click.Choice(["any", "none"]), help="pgoutput: changes of any origin or only local (16+)."
)
@click.option(
    "--streaming",
    type=click.Choice(["on", "off", "parallel"]),
    help="pgoutput: stream large transactions as they happen (default on; pgrecv reassembles them).",
)
@click.option("--two-phase", is_flag=True, help="Decode prepared transactions at PREPARE (slot must allow it).")
@click.option("-I", "--startpos", type=LSNType(), help="Start streaming at this LSN (if the slot has not passed it).")
@click.option("-E", "--endpos", type=LSNType(), help="Stop when this LSN is reached, like pg_recvlogical.")
@click.option(
    "--until-caught-up",
    is_flag=True,
    help="Stop at the first transaction boundary past the server's WAL position at start.",
)
@click.option(
    "-F", "--fsync-interval", type=DURATION, default=10.0, show_default=True, help="How often to make output durable."
)
@click.option(
    "-s", "--status-interval", type=DURATION, default=10.0, show_default=True, help="How often to report to the server."
)
@click.option(
    "--metrics-file",
    type=PathType(),
    metavar="PATH",
    help="Rewrite PATH (Prometheus text format, for node_exporter's textfile collector) every status interval. "
    "A write that fails is one warning on stderr (once per distinct failure) and streaming goes on.",
)
@click.option(
    "--heartbeat",
    type=DURATION,
    metavar="INTERVAL",
    help="After INTERVAL without changes, emit a transactional logical message in the slot's database "
    "(a normal connection), so the slot advances while the published tables are idle; "
    "heartbeats are confirmed, not written.",
)
@click.option("--keep-heartbeats", is_flag=True, help="With --heartbeat: write heartbeat messages to the output too.")
@click.option(
    "--synchronous",
    is_flag=True,
    help="Make the output durable and report it at every transaction boundary, without a timer "
    "(for synchronous_standby_names; name pgrecv there by the application_name in -d).",
)
@click.option(
    "-n", "--no-loop", is_flag=True, help="Exit (code 11) when the connection is lost instead of reconnecting."
)
@filter_options
@connection_options
@common_options
def start(
    slot: str,
    file: str | None,
    output_dir: str | None,
    rotate_size: int | None,
    rotate_interval: float | None,
    fmt: str,
    plugin_options: tuple[str, ...],
    create_slot_first: bool,
    plugin: str | None,
    if_not_exists: bool,
    temporary: bool,
    publication: str | None,
    proto_version: int | None,
    binary: bool,
    messages: bool,
    origin: str | None,
    streaming: str | None,
    two_phase: bool,
    startpos: LSN | None,
    endpos: LSN | None,
    until_caught_up: bool,
    fsync_interval: float,
    status_interval: float,
    synchronous: bool,
    metrics_file: str | None,
    heartbeat: float | None,
    keep_heartbeats: bool,
    no_loop: bool,
    tables: tuple[str, ...],
    exclude_tables: tuple[str, ...],
    op_filter: str | None,
    **kw: Any,
) -> None:
    """Stream a slot's changes over the replication protocol, like pg_recvlogical --start.

    Positions are confirmed to the server only once the output holding them is durable; a clean stop
    (SIGINT, SIGTERM, --endpos, --until-caught-up) makes the output durable and confirms it. SIGHUP
    reopens --file (rotation by rename).

    Only ends of transactions received and made durable by this run, and keepalive positions the
    server sent in this run, are ever confirmed. A start position (-I) ahead of the server's WAL, or
    an output record (state file, file name) claiming changes past it, is refused before the slot is
    touched (exit 13, nothing confirmed); records that do not parse or overlap are refused with
    exit 8. An --output-dir records whose stream it holds (slot, database, the server's system
    identifier) and each file before it appears: another stream's directory, or a non-empty file
    past that record (without one: a file that does not end with the transaction its name
    claims), is refused with exit 17, nothing confirmed. Give each slot its own --output-dir. A
    refused start creates nothing: the file, its state file and the directory are made only once
    every check has passed.

    --output-dir s3://BUCKET/PREFIX (any S3-compatible store: AWS_ENDPOINT_URL) writes the same
    files: each is written in a private directory under $TMPDIR and uploaded whole under its final
    name (never over an existing object) before its position is confirmed; each object carries its
    position and stream as metadata, and PREFIX/.pgrecv-state the record above. A restart resumes
    from the listing of the prefix. Needs boto3 (pip install 'pgrecv[s3]').

    Synchronous standby: with --synchronous the output is made durable and reported at every
    transaction boundary; commits that arrive together share one fsync and one status update. Name
    pgrecv in synchronous_standby_names by the application_name of its connection (-d
    "dbname=mydb application_name=cdc"); a commit then returns only once its rows are durable in the
    output (standard output: written to the pipe). Caveats: the setting is server-wide while pgrecv
    decodes one database, so commits in every database wait for it (pgrecv answers those at once,
    but they stop while pgrecv is down); and a transaction holding an exclusive lock on a catalog
    table (LOCK pg_class, CLUSTER pg_class) can deadlock against a synchronous logical receiver,
    which needs the catalogs to decode. pgrecv slots shows the walsender's sync_state and lag. Into
    a JSONL --file (with --synchronous or -F 0) each sync point is one fsync: the state file follows
    the data without one of its own, and a restart after a crash reads the lines past it.
    """
    from pgrecv.decode.plugins import PgOutputSettings, parse_options
    from pgrecv.output.remote import StoreDirSink, is_store_url
    from pgrecv.output.sinks import make_sink
    from pgrecv.pg.slots import create_slot, ensure_publication_for
    from pgrecv.stream.pipeline import parse_ops
    from pgrecv.stream.streamer import StartConfig, Streamer, plan_start

    if file and output_dir:
        raise UsageError("--file and --output-dir exclude each other: pick one")
    if (rotate_size or rotate_interval) and not output_dir:
        raise UsageError("--rotate-size and --rotate-interval need --output-dir")
    if (plugin or if_not_exists or temporary) and not create_slot_first:
        raise UsageError("-P/--plugin, --if-not-exists and --temporary go with --create")
    if temporary and if_not_exists:
        raise UsageError("--temporary makes a new slot that lives as long as this run: drop --if-not-exists")
    if keep_heartbeats and heartbeat is None:
        raise UsageError("--keep-heartbeats goes with --heartbeat")
    if heartbeat is not None and heartbeat <= 0:
        raise UsageError("--heartbeat needs an interval above 0 (e.g. 10s)")
    opts = conn_opts(kw)
    ops = parse_ops(op_filter)
    to_terminal = not output_dir and (file in (None, "-")) and sys.stdout.isatty()
    if fmt == "auto":
        fmt = "pretty" if to_terminal else "jsonl"
    if output_dir and fmt == "pretty":
        raise UsageError("--output-dir writes jsonl or raw files, not pretty tables")
    if two_phase and fmt.startswith("debezium"):
        raise UsageError("--format debezium writes committed rows only: it cannot go with --two-phase")
    if temporary:  # the slot itself is made on the streaming connection
        if publication and (plugin or "pgoutput") != "pgoutput":
            raise UsageError(f"--publication applies to the pgoutput plugin only, not {plugin}")
        if publication and ensure_publication_for(opts, publication):
            info(f'created publication "{publication}" (FOR ALL TABLES)')
    elif create_slot_first:
        made = create_slot(
            opts, slot, plugin or "pgoutput", if_not_exists=if_not_exists, two_phase=two_phase, publication=publication
        )
        if made.created:
            info(f'created slot "{slot}" ({made.plugin}) at {made.consistent_point}')
    settings = PgOutputSettings(
        proto_version=proto_version,
        binary=binary,
        messages=messages,
        origin=origin,
        streaming=streaming,
        two_phase=two_phase,
    )
    slot_plugin, options, warnings = plan_start(
        opts,
        slot,
        fmt=fmt,
        plugin=plugin,
        publication=publication,
        settings=settings,
        user_options=parse_options(plugin_options),
        temporary=temporary,
    )
    if heartbeat is not None and slot_plugin not in ("pgoutput", "test_decoding"):
        raise UsageError(f"--heartbeat needs a plugin pgrecv decodes (pgoutput, test_decoding), not {slot_plugin}")
    if heartbeat is not None and slot_plugin == "pgoutput" and dict(options).get("messages") != "true":
        raise UsageError("--heartbeat needs pgoutput's messages (heartbeats are logical messages): drop --no-messages")
    if fmt != "raw" and slot_plugin not in ("pgoutput", "test_decoding"):
        raise UsageError(f"pgrecv decodes pgoutput and test_decoding, not {slot_plugin}: use --format raw")
    option_map = dict(options)
    config = StartConfig(
        slot=slot,
        fmt=fmt,
        options=options,
        plugin=slot_plugin,
        startpos=startpos,
        endpos=endpos,
        until_caught_up=until_caught_up,
        status_interval=status_interval,
        fsync_interval=fsync_interval,
        synchronous=synchronous,
        metrics_file=metrics_file,
        warnings=warnings,
        heartbeat=heartbeat,
        keep_heartbeats=keep_heartbeats,
        no_loop=no_loop,
        tables=tables,
        exclude_tables=exclude_tables,
        ops=ops,
        assemble=slot_plugin == "pgoutput" and option_map.get("streaming", "off") in ("on", "parallel", "true"),
        temporary=temporary,
        two_phase_slot=temporary and two_phase,
    )
    suffix = ".jsonl" if fmt == "jsonl" else ".raw"
    make_formatter = _stream_formatter(fmt, to_terminal)
    if fmt.startswith("debezium"):
        from pgrecv.cli.debezium import SUFFIX, debezium_factory

        suffix, make_formatter = SUFFIX, debezium_factory(opts, fmt, slot)
    # durable at every boundary into JSONL: one fsync each, the state record left to writeback
    tail = "jsonl" if fmt == "jsonl" and config.durable_at_every_boundary else None
    sink = (
        StoreDirSink(output_dir, rotate_size, rotate_interval, suffix)
        if output_dir is not None and is_store_url(output_dir)
        else make_sink(file, output_dir, rotate_size, rotate_interval, suffix, tail)
    )
    status = None
    if fmt == "pretty" and to_terminal and sys.stderr.isatty() and not STATE.quiet:
        from pgrecv.output.status_line import StatusLine

        status = StatusLine(sys.stderr)
    streamer = Streamer(opts, config, sink, make_formatter, log, status)
    stats = streamer.run()
    log(f"{stats.messages} messages, {stats.transactions} transactions, {stats.rows} rows", 1)


def _stream_formatter(fmt: str, to_terminal: bool) -> Callable[[Callable[[bytes], None]], Any] | None:
    if fmt == "raw":
        return None
    if fmt == "jsonl":
        from pgrecv.output.jsonl import JsonlEncoder

        return JsonlEncoder

    def pretty(write: Callable[[bytes], None]) -> Any:
        from pgrecv.output.console import PipeConsole
        from pgrecv.output.pretty import PrettyRenderer
        from pgrecv.stream.streamer import SinkText

        if to_terminal:
            console = PipeConsole(file=cast(TextIO, SinkText(write)), force_terminal=True)
        else:
            console = PipeConsole(file=cast(TextIO, SinkText(write)), width=120, color_system=None)
        return PrettyRenderer(console)

    return pretty


# --- demo -------------------------------------------------------------------------------------


@cli.command()
@click.option(
    "--bindir",
    type=PathType(),
    metavar="DIR",
    help="PostgreSQL binaries to use (default: the newest found on this machine).",
)
@common_options
def demo(bindir: str | None) -> None:
    """Show the whole path on a throwaway PostgreSQL: slot, changes, decoded output."""
    from pgrecv.demo import run_demo

    run_demo(bindir)


# --- entry point ------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    try:
        # make_context + invoke rather than cli.main: Click's main turns a broken pipe into a silent
        # exit 1, and every error here must be one line with its own exit code
        args = sys.argv[1:] if argv is None else argv
        remember_environment_secrets()
        with cli.make_context("pgrecv", list(args)) as ctx:
            cli.invoke(ctx)
        if argv is None:  # the process is ours: a flush that fails is still this command's error
            _leave(ExitCode.OK)
    except click.exceptions.Abort:
        click.echo("pgrecv: interrupted", err=True)
        sys.exit(ExitCode.INTERRUPTED)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(ExitCode.USAGE if isinstance(exc, click.UsageError) else exc.exit_code)
    except _reported_errors() as caught:
        # A server error no command translated itself still gets the one-line treatment.
        error = caught if isinstance(caught, PgrecvError) else translate(caught)
        if error.exit_code == ExitCode.OUTPUT:
            _silence_stdout()
        click.echo(f"pgrecv: error: {redact(error.message)}", err=True)
        if STATE.verbose and error.detail and error.detail != error.message:
            click.echo(f"pgrecv: detail: {redact(error.detail)}", err=True)
        sys.exit(error.exit_code)
    except KeyboardInterrupt:
        click.echo("pgrecv: interrupted", err=True)
        sys.exit(ExitCode.INTERRUPTED)
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): nothing was confirmed or consumed past what it got.
        _silence_stdout()
        click.echo("pgrecv: error: the reader of standard output went away before all was written", err=True)
        sys.exit(ExitCode.OUTPUT)
    finally:
        reset_state()  # a run's -q and -v end with it (the tests run many in one process)
    sys.exit(ExitCode.OK)


def _reported_errors() -> tuple[type[Exception], ...]:
    """What ``main`` reports as one line: pgrecv's errors, and psycopg's once it is imported (an
    ``except`` evaluates this only when something is raised; ``--help`` never imports psycopg)."""
    psycopg = sys.modules.get("psycopg")
    return (PgrecvError,) if psycopg is None else (PgrecvError, psycopg.Error)


def _leave(code: int) -> None:
    """End the process without the interpreter's teardown when nothing can need it.

    Freeing every module takes 20-40 ms after a command is done (psycopg's alone about 30 ms,
    bench/NOTES.md), and `pgrecv start -E` pays it on top of its stream. Exit handlers still run
    and the standard streams are flushed first, so a broken pipe is reported as one. With another
    thread alive, or a profiler or debugger attached, the usual exit instead.
    """
    import atexit
    import os
    import threading

    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            with contextlib.suppress(ValueError):  # closed by the command: nothing left in it
                stream.flush()
    if threading.active_count() != 1 or sys.getprofile() is not None or sys.gettrace() is not None:
        return  # a profiler or debugger writes its findings after main() returns
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            with contextlib.suppress(OSError, ValueError):  # what a handler wrote: no one left to tell
                stream.flush()
    os._exit(code)


def _silence_stdout() -> None:
    """After a broken pipe, make the interpreter's final flush of stdout go nowhere quietly."""
    import os

    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


from pgrecv.cli.snapshot import snapshot  # noqa: E402

cli.add_command(snapshot)

from pgrecv.cli.spark_apply import spark_apply  # noqa: E402

cli.add_command(spark_apply)

from pgrecv.cli.verify import verify  # noqa: E402

cli.add_command(verify)
