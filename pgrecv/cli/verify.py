"""`pgrecv verify`: the click command; the work is in pgrecv.verify (imported when it runs)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import click

from pgrecv.cli.options import STATE, Command, common_options, conn_opts, connection_options, info, log
from pgrecv.cli.spark_apply import (
    append_only_option,
    bad_values_option,
    check_catalog,
    check_remote,
    iceberg_catalog_option,
    key_option,
    parse_conf,
    parse_target,
    remote_option,
)
from pgrecv.errors import UsageError
from pgrecv.lsn import lsn_str

if TYPE_CHECKING:
    from pgrecv.spark.model import BadValues
    from pgrecv.verify.run import Report


@click.command("verify", cls=Command)
@click.option("-S", "--slot", required=True, help="The slot spark-apply's change files come from.")
@click.option(
    "--target",
    required=True,
    metavar="PATH",
    help="spark-apply's --target (a directory, s3://BUCKET/PREFIX or gs://BUCKET/PREFIX).",
)
@click.option(
    "--format", "fmt", type=click.Choice(["delta", "parquet", "iceberg"]), required=True, help="Table format."
)
@iceberg_catalog_option
@click.option("--table", "tables", multiple=True, metavar="GLOB", help="Only these tables (schema.table glob).")
@click.option("--publication", metavar="NAME", help="pgoutput: the publication (default: the only one).")
@click.option(
    "--source",
    metavar="DIR",
    help="The change directory (start's --output-dir): the slot is streamed into it up to the snapshot and "
    "applied first. Without it (or with --no-catch-up) the lake is compared as it is.",
)
@click.option("--no-catch-up", is_flag=True, help="Compare the lake as it is: lagging tables show as differences.")
@click.option("--master", metavar="URL", help="Spark master (default local[*]).")
@remote_option
@click.option("--conf", "confs", multiple=True, metavar="KEY=VALUE", help="Spark configuration (repeatable).")
@key_option
@append_only_option
@bad_values_option(
    "spark-apply's --bad-values: values it could not store in the column's type compare as it stored them "
    "(null: NULL; text: the column's text), not as differences."
)
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
@connection_options
@common_options
def verify(
    slot: str,
    target: str,
    fmt: str,
    catalog: str | None,
    tables: tuple[str, ...],
    publication: str | None,
    source: str | None,
    no_catch_up: bool,
    master: str | None,
    remote: str | None,
    confs: tuple[str, ...],
    keys: tuple[str, ...],
    append_only: bool,
    bad_values: BadValues,
    as_json: bool,
    **kw: Any,
) -> None:
    """Compare the lake with PostgreSQL at one exact position; name every difference by key.

    A temporary slot's exported snapshot fixes the position (its consistent point). With --source,
    the slot is first streamed into that directory up to the position (as `pgrecv start --endpos`)
    and the files are applied (as `pgrecv spark-apply`), so both sides hold exactly the
    transactions that commit before it, while the source goes on writing. Each table is compared
    by key ranges: both sides sum hashes of their rows per range, and only ranges that differ are
    split further, down to the keys. Exit codes: 0 equal, 18 different (each table and key named),
    5 the slot is in use or moved meanwhile.
    """
    from pgrecv.spark.keys import parse_keys
    from pgrecv.verify.run import VerifyConfig, run_verify

    ctx = click.get_current_context()
    start_kw = dict(kw)
    opts = conn_opts(kw)
    check_catalog(catalog, fmt)
    check_remote(master, remote)
    if no_catch_up and source is None:
        raise UsageError("--no-catch-up goes with --source (without --source nothing is caught up)")
    conf = parse_conf(confs)
    config = VerifyConfig(
        opts=opts,
        slot=slot,
        target=parse_target(target, conf),
        fmt=fmt,
        tables=tables,
        publication=publication,
        source=source,
        master=master,
        remote=remote,
        conf=conf,
        keys=parse_keys(keys),
        append_only=append_only,
        bad_values=bad_values,
        catalog=catalog,
    )

    def catch_up(position: int) -> None:
        from pgrecv.lsn import LSN

        root = ctx.find_root()
        start = root.command.get_command(root, "start") if isinstance(root.command, click.Group) else None
        assert start is not None, "pgrecv verify runs under the pgrecv group, beside start"

        info(f"streaming slot {slot} into {source} up to {LSN(position)}")
        ctx.invoke(start, slot=slot, output_dir=source, endpos=LSN(position), publication=publication, **start_kw)

    progress = None
    if sys.stderr.isatty() and not STATE.quiet and not as_json:
        from pgrecv.spark.ui import RichProgress

        progress = RichProgress("tables compared")
    try:
        wanted = catch_up if source is not None and not no_catch_up else None
        report = run_verify(config, wanted, log=lambda m: log(m), progress=progress)
    finally:
        if progress is not None:
            progress.stop()
    from pgrecv.output.files import write_stdout

    write_stdout(report_json(report) if as_json else report_text(report).encode())
    if not report.equal:
        from pgrecv.errors import Different

        bad = [t for t in report.tables if t.differs]
        raise Different(
            f"{len(bad)} of {len(report.tables)} tables differ from PostgreSQL at {lsn_str(report.lsn)}: {bad[0].name}"
            + (" and more (listed above)" if len(bad) > 1 else " (listed above)")
        )
    if not as_json and not STATE.quiet and sys.stderr.isatty():
        info("equal")


def report_text(report: Report) -> str:
    from pgrecv.verify.run import key_text

    how = "the lake brought to it first" if report.caught_up else "the lake as it is"
    lines = [f"verified at {lsn_str(report.lsn)} ({how})"]
    width = max((len(t.name) for t in report.tables), default=0)
    for t in report.tables:
        d = t.diff
        if t.status == "equal" and d is not None:
            text = f"equal      {d.rows_pg} rows"
        elif t.status == "missing":
            text = f"MISSING    no such table in the lake ({t.note})"
        elif t.status == "not compared":
            text = f"skipped    {t.note}"
        elif t.status == "only in the lake":
            text = f"lake only  {t.note}"
        else:
            assert d is not None
            parts = [f"{d.rows_pg} rows in PostgreSQL, {d.rows_lake} in the lake"]
            at_least = "" if d.exact else "at least "
            if d.missing:
                keys = ", ".join(key_text(t.key, k) for k in d.missing_keys)
                parts.append(f"{at_least}{d.missing} missing ({keys})")
            if d.extra:
                keys = ", ".join(key_text(t.key, k) for k in d.extra_keys)
                parts.append(f"{at_least}{d.extra} extra ({keys})")
            if d.changed:
                rows = ", ".join(f"{key_text(t.key, c.key)}: {' '.join(c.columns)}" for c in d.changed_rows)
                parts.append(f"{at_least}{d.changed} changed ({rows})")
            text = "DIFFERENT  " + "; ".join(parts)
            if t.note:
                text += f"; {t.note}"
        if t.not_compared:
            text += f" [not compared: {', '.join(t.not_compared)}]"
        lines.append(f"{t.name.ljust(width)}  {text}")
    return "\n".join(lines) + "\n"


def report_json(report: Report) -> bytes:
    import orjson

    from pgrecv.verify.run import key_text

    tables = []
    for t in report.tables:
        d = t.diff
        entry: dict[str, Any] = {
            "table": t.name,
            "status": t.status,
            "key": list(t.key),
            "applied_lsn": None if t.applied is None else lsn_str(t.applied),
            "not_compared": list(t.not_compared),
            "note": t.note,
        }
        if d is not None:
            entry.update(
                rows_postgres=d.rows_pg,
                rows_lake=d.rows_lake,
                missing=d.missing,
                extra=d.extra,
                changed=d.changed,
                exact=d.exact,
                missing_keys=[key_text(t.key, k) for k in d.missing_keys],
                extra_keys=[key_text(t.key, k) for k in d.extra_keys],
                changed_rows=[{"key": key_text(t.key, c.key), "columns": list(c.columns)} for c in d.changed_rows],
            )
        tables.append(entry)
    doc = {"lsn": lsn_str(report.lsn), "caught_up": report.caught_up, "equal": report.equal, "tables": tables}
    return orjson.dumps(doc, option=orjson.OPT_APPEND_NEWLINE)
