"""`pgrecv spark-apply`: the click command. Imports nothing heavy until it runs (`--help` stays fast)."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from pgrecv.cli.options import STATE, Command, common_options, log
from pgrecv.errors import UsageError

_Decorated = TypeVar("_Decorated", bound=Callable[..., Any])

if TYPE_CHECKING:
    from pgrecv.spark.model import BadValues, DeltaEngine, Format, Mode, Summary
    from pgrecv.spark.stores import TargetPath


# a --conf key whose value is a secret (fs.s3a.secret.key, a JDBC catalog's password, a token...)
_SECRET_KEY = re.compile(r"password|passwd|secret|token|credential|\.key$", re.IGNORECASE)


def parse_conf(values: tuple[str, ...]) -> dict[str, str]:
    """--conf KEY=VALUE options (spark-apply's and verify's) as a dict; a malformed one is a usage
    error. Secret values (by their key's name, or a password in a URL) are kept out of every message."""
    from pgrecv.pg.conn import remember_secret, remember_secrets

    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--conf {item!r}: expected key=value, e.g. spark.executor.memory=4g")
        out[key.strip()] = value
        if _SECRET_KEY.search(key):
            remember_secret(value)
        remember_secrets(value)
    return out


# options spark-apply shares with verify (whose catch-up applies the files as spark-apply would)
key_option = click.option(
    "--key",
    "keys",
    multiple=True,
    metavar="SCHEMA.TABLE=COLUMNS",
    help="Key columns (comma-separated) of a table whose input names none, as test_decoding's may not "
    '(repeatable; double-quote names holding . , = or ").',
)
append_only_option = click.option("--append-only", is_flag=True, help="Tables without any key: append their inserts.")
iceberg_catalog_option = click.option(
    "--iceberg-catalog",
    "catalog",
    metavar="NAME",
    help="--format iceberg: the session's Iceberg catalog NAME (set with --conf spark.sql.catalog.NAME=... and its "
    "type, uri, warehouse), tables NAME.SCHEMA.TABLE. Default: a Hadoop catalog under --target.",
)


remote_option = click.option(
    "--remote",
    metavar="sc://HOST:PORT",
    envvar="SPARK_REMOTE",
    help="Run the Spark side on a Spark Connect server instead (default: $SPARK_REMOTE).",
)


def check_remote(master: str | None, remote: str | None) -> None:
    if remote is None:
        return
    if master is not None:
        raise UsageError(f"--master {master} and --remote {remote} (or SPARK_REMOTE) exclude each other: pick one")
    if not remote.startswith("sc://"):
        raise UsageError(f"--remote {remote}: a Spark Connect URL is sc://HOST:PORT")


def check_catalog(catalog: str | None, fmt: str) -> None:
    """--iceberg-catalog names a catalog of Iceberg tables: refused with another format."""
    if catalog is not None and fmt != "iceberg":
        raise UsageError(f"--iceberg-catalog {catalog}: only with --format iceberg")


def parse_target(target: str, conf: dict[str, str]) -> TargetPath:
    """--target as a local directory or a prefix on S3 or Cloud Storage (reached with ``conf``'s
    settings, else the store's environment): spark-apply's and verify's, checked the same way."""
    from pgrecv.spark.stores import StorePath, check_scheme, filesystem_for, is_store_source

    if is_store_source(target):
        check_scheme(target, "--target")
        return StorePath.of(target, filesystem_for(target, conf, {}))
    path = Path(target)
    if not path.parent.is_dir():  # a typo must not grow a new directory tree
        raise UsageError(f"--target {target}: its parent directory does not exist: create it first")
    if path.exists() and not path.is_dir():
        raise UsageError(f"--target {target}: not a directory: give a directory (one table per subdirectory)")
    return path


BAD_VALUES_HELP = (
    "Values the target type cannot hold (numeric NaN, dates past 9999, ...): "
    "fail (hold the table back), null (store NULL), text (a new column becomes a string column "
    "holding the value's text). Changed values are counted in the summary."
)


def bad_values_option(help_text: str = BAD_VALUES_HELP) -> Callable[[_Decorated], _Decorated]:
    return click.option(
        "--bad-values", type=click.Choice(["fail", "null", "text"]), default="fail", show_default=True, help=help_text
    )


@click.command("spark-apply", cls=Command)
@click.argument("sources", nargs=-1, required=True, metavar="SOURCE...")
@click.option(
    "--target",
    required=True,
    metavar="PATH",
    help="Directory holding one table per PostgreSQL table, or s3://BUCKET/PREFIX, or gs://BUCKET/PREFIX "
    "(on gs://: Parquet, or Iceberg's state with --iceberg-catalog; Delta not yet).",
)
@click.option(
    "--format", "fmt", type=click.Choice(["delta", "parquet", "iceberg"]), required=True, help="Table format."
)
@click.option("--table", "tables", multiple=True, metavar="GLOB", help="Only these tables (schema.table glob).")
@click.option("--master", metavar="URL", help="Spark master (default local[*], or spark-submit's).")
@remote_option
@click.option("--conf", "confs", multiple=True, metavar="KEY=VALUE", help="Spark configuration (repeatable).")
@click.option(
    "--mode",
    type=click.Choice(["latest", "history"]),
    default="latest",
    show_default=True,
    help="latest: the tables as they are; history: every version (SCD type 2).",
)
@click.option(
    "--delta-engine",
    type=click.Choice(["auto", "delta-rs", "spark"]),
    default="auto",
    show_default=True,
    help="Who commits Delta tables: delta-rs, or Delta Lake's Spark connector (its jars given with --conf "
    "spark.jars=... or spark.jars.packages=...; deletion vectors on). auto: the connector when its jars are in the "
    "session, else delta-rs.",
)
@iceberg_catalog_option
@key_option
@append_only_option
@click.option("--replay", type=click.Choice(["spark", "driver"]), hidden=True, help="Deprecated: always spark.")
@bad_values_option()
@click.option("--json", "as_json", is_flag=True, help="Print a machine-readable summary on stdout.")
@click.option(
    "--list-applied",
    is_flag=True,
    help="Print the files of SOURCE that every table has applied (runs skip them; they may be removed), "
    "one per line, and exit without applying anything.",
)
@common_options
def _spark_apply(
    sources: tuple[str, ...],
    target: str,
    fmt: Format,
    tables: tuple[str, ...],
    master: str | None,
    remote: str | None,
    confs: tuple[str, ...],
    mode: Mode,
    delta_engine: DeltaEngine,
    catalog: str | None,
    keys: tuple[str, ...],
    append_only: bool,
    replay: str | None,
    bad_values: BadValues,
    as_json: bool,
    list_applied: bool,
) -> None:
    """Apply JSONL change files to Delta, Parquet or Iceberg tables with Spark, exactly and idempotently.

    SOURCE: files, globs or `pgrecv start --output-dir` directories (finalised files only), also
    on an object store (s3://BUCKET/PREFIX, gs://BUCKET/PREFIX).
    Each table goes to PATH/SCHEMA.TABLE. Re-running on the same files changes nothing; a run
    killed at any moment and run again ends with the exact tables. Exit codes: 0 done, 15 partly
    applied (tables held back, each named; the others applied), 9 bad input (file:line named), 8
    cannot write the target (or another run is applying to it), 16 Spark did not start.
    """
    from pgrecv.spark.apply import list_applied as applied_files
    from pgrecv.spark.apply import run_apply
    from pgrecv.spark.keys import parse_keys
    from pgrecv.spark.model import ApplyConfig
    from pgrecv.spark.ui import RichProgress, print_summary

    if replay == "driver":
        raise UsageError("--replay driver: the in-driver replay is gone (spark-apply replays in Spark): leave it out")
    if replay is not None:
        log("warning: --replay is deprecated and does nothing: spark-apply always replays in Spark", 0)

    check_remote(master, remote)
    from pgrecv.spark.stores import check_scheme, is_store_source

    for given in sources:
        if is_store_source(given):
            check_scheme(given)
    check_catalog(catalog, fmt)
    conf = parse_conf(confs)
    target_path = parse_target(target, conf)
    config = ApplyConfig(
        sources=sources,
        target=target_path,
        fmt=fmt,
        tables=tables,
        mode=mode,
        engine=delta_engine,
        master=master,
        remote=remote,
        conf=conf,
        append_only=append_only,
        keys=parse_keys(keys),
        bad_values=bad_values,
        catalog=catalog,
    )
    if list_applied:
        from pgrecv.output.files import write_stdout

        write_stdout(b"".join(os.fsencode(str(p)) + b"\n" for p in applied_files(config)))
        return
    show = sys.stderr.isatty() and not STATE.quiet and not as_json
    progress = RichProgress() if show else None
    try:
        summary = run_apply(config, progress=progress)
    finally:
        if progress is not None:
            progress.stop()
    summary = redacted(summary)
    if as_json:
        import orjson

        data: dict[str, Any] = asdict(summary)
        from pgrecv.output.files import write_stdout

        write_stdout(orjson.dumps(data, option=orjson.OPT_APPEND_NEWLINE))
    elif not STATE.quiet:
        print_summary(summary)
    held = [t for t in summary.tables if t.status == "held back"]
    if held:
        from pgrecv.errors import PartlyApplied

        for t in held[1:]:
            click.echo(f"pgrecv: error: {t.error}", err=True)
        others = "the others are applied" if len(held) < len(summary.tables) else "no other table had changes"
        raise PartlyApplied(f"{held[0].error} ({len(held)} of {len(summary.tables)} tables held back; {others})")


def redacted(summary: Summary) -> Summary:
    """``summary`` with no secret in a held-back table's failure (a Spark or catalog message may
    quote a URL or a setting): it goes to --json, the table and stderr as it is."""
    from dataclasses import replace

    from pgrecv.pg.conn import redact

    tables = [replace(t, error=redact(t.error)) if t.error else t for t in summary.tables]
    return replace(summary, tables=tables)


spark_apply: click.Command = _spark_apply  # annotated: pgrecv.cli.main imports this module at its end
