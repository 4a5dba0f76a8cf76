"""Options and helpers shared by every command module: connection options like pg_recvlogical's,
-v/-q, parameter types for LSNs, sizes and durations, and the diagnostic printers.

Kept apart from :mod:`pgrecv.cli.main` so that command modules (snapshot, spark-apply) can use them
without importing the command tree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from pgrecv.errors import UsageError
from pgrecv.lsn import LSN
from pgrecv.pg.conn import ConnOptions, redact

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class _State:
    verbose: int = 0
    quiet: bool = False


STATE = _State()


def reset_state() -> None:
    """The default verbosity again, when a run of ``main`` ends. The options only raise it (``-v``
    counts up over the group and the command, ``-q`` sticks), so what ran next in the process (the
    tests run many) would otherwise inherit the run's ``-q``."""
    STATE.verbose, STATE.quiet = 0, False


def log(message: str, level: int = 1) -> None:
    """A diagnostic line on stderr, shown from verbosity ``level`` on (never with -q)."""
    if not STATE.quiet and STATE.verbose >= level:
        click.echo(f"pgrecv: {redact(message)}", err=True)


def route_library_logs() -> None:
    """A library's log records as -v lines. psycopg logs a warning when it ignores a second error
    while leaving a COPY or a transaction on the first; without a handler Python prints it on
    stderr, above pgrecv's one-line error for that first one. (logging is imported here, not for
    ``--help``: bench/help.py.)"""
    import logging

    class LibraryLog(logging.Handler):
        pgrecv = True

        def emit(self, record: logging.LogRecord) -> None:
            try:
                log(f"{record.name}: {record.getMessage()}")
            except Exception:
                self.handleError(record)

    lib = logging.getLogger("psycopg")
    if not any(getattr(h, "pgrecv", False) for h in lib.handlers):
        lib.addHandler(LibraryLog())
        lib.propagate = False


class Command(click.Command):
    """Every pgrecv command: a library's log records routed to -v lines before it runs (a
    ``--help`` ends while its options are parsed, before this)."""

    def invoke(self, ctx: click.Context) -> Any:
        route_library_logs()
        return super().invoke(ctx)


def info(message: str) -> None:
    if not STATE.quiet:
        click.echo(redact(message), err=True)


class LSNType(click.ParamType):  # type: ignore[type-arg]
    name = "LSN"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> LSN:
        if isinstance(value, LSN):
            return value
        try:
            return LSN.parse(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def _set_verbose(ctx: click.Context, param: click.Parameter, value: int) -> int:
    STATE.verbose = max(STATE.verbose, value)
    return value


def _set_quiet(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    STATE.quiet = STATE.quiet or value
    return value


def common_options(f: F) -> F:
    """-v/-q on every command, so they work before or after the command name."""
    f = click.option(
        "-q",
        "--quiet",
        is_flag=True,
        expose_value=False,
        callback=_set_quiet,
        help="Print no progress or notices.",
    )(f)
    f = click.option(
        "-v",
        "--verbose",
        count=True,
        expose_value=False,
        callback=_set_verbose,
        help="More detail on stderr (repeat for more).",
    )(f)
    return f


class PortType(click.ParamType):  # type: ignore[type-arg]
    """-p: a TCP port (1-65535), or libpq's comma-separated list of them for several -h hosts. A
    value libpq would refuse is a bad command line (exit 2), not a failed connection."""

    name = "PORT"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value).strip()
        for part in text.split(","):
            part = part.strip()
            if part and not (part.isascii() and part.isdigit() and 1 <= int(part) <= 65535):
                raise UsageError(
                    f"-p/--port {str(value)!r} is not a port number: give one from 1 to 65535 "
                    "(or a comma-separated list of them, one per -h host)"
                )
        return text


PORT = PortType()


def connection_options(f: F) -> F:
    """pg_recvlogical's connection options; libpq's PG* variables, services and .pgpass still apply."""
    options = [
        click.option("-d", "--dbname", metavar="CONNSTR", help="Database name, conninfo string or URI."),
        click.option("-h", "--host", metavar="HOST", help="Server host or socket directory."),
        click.option("-p", "--port", type=PORT, metavar="PORT", help="Server port."),
        click.option("-U", "--username", metavar="NAME", help="Connect as this role."),
        click.option("-w", "--no-password", "no_password", is_flag=True, help="Never prompt for a password."),
        click.option("-W", "--password", "ask_password", is_flag=True, help="Prompt for a password before connecting."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


table_option = click.option(
    "--table", "tables", multiple=True, metavar="GLOB", help="Only these tables (schema.table glob, repeatable)."
)


def filter_options(f: F) -> F:
    """--table, --exclude-table and --op: the filters of the pipeline (pgrecv.stream.pipeline), for start and peek."""
    ops_help = "Only these operations: insert,update,delete,truncate,message."
    f = click.option("--op", "op_filter", metavar="OPS", help=ops_help)(f)
    exclude_help = "Not these tables (repeatable)."
    f = click.option("--exclude-table", "exclude_tables", multiple=True, metavar="GLOB", help=exclude_help)(f)
    return table_option(f)


def conn_opts(kw: dict[str, Any]) -> ConnOptions:
    never = kw.pop("no_password")
    ask = kw.pop("ask_password")
    if never and ask:
        raise UsageError("-w/--no-password and -W/--password contradict each other: pass one")
    opts = ConnOptions(
        dbname=kw.pop("dbname"),
        host=kw.pop("host"),
        port=kw.pop("port"),
        user=kw.pop("username"),
        prompt=True if ask else False if never else None,
    )
    from pgrecv.pg.conn import describe

    log(f"connecting with {describe(opts.conninfo())}")
    return opts


_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
}
_TIME_UNITS = {"": 1.0, "s": 1.0, "ms": 0.001, "m": 60.0, "min": 60.0, "h": 3600.0}


def _option_name(param: click.Parameter | None) -> str:
    opts: list[str] = list(getattr(param, "opts", None) or [getattr(param, "name", None) or "option"])
    return max(opts, key=len)


class _UnitType(click.ParamType):  # type: ignore[type-arg]
    """A size or duration with a unit; bounded, so no later arithmetic or timeout overflows."""

    def __init__(
        self, name: str, units: dict[str, Any], example: str, maximum: float, most: str, positive: bool = False
    ) -> None:
        self.name = name
        self.units = units
        self.example = example
        self.maximum = maximum
        self.most = most
        self.positive = positive  # 0 refused here, before any connection, not after

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        number = text.rstrip("abcdefghijklmnopqrstuvwxyz ")
        unit = text[len(number) :].strip()
        option = _option_name(param)
        try:
            amount = float(number)
        except ValueError:
            raise UsageError(f"{option} {value!r} is not a {self.name}: write it like {self.example}") from None
        if unit not in self.units or not amount >= 0:  # also NaN
            raise UsageError(f"{option} {value!r} is not a {self.name}: write it like {self.example}")
        result = amount * self.units[unit]
        if result > self.maximum:  # also inf
            raise UsageError(f"{option} {value!r} is too large: at most {self.most}")
        out = int(result) if self.name == "SIZE" else result
        if self.positive and not out > 0:
            raise UsageError(f"{option} {value!r} must be more than 0: write it like {self.example}")
        return out


SIZE = _UnitType("SIZE", _SIZE_UNITS, "64MB or 1GiB", float(1 << 50), "1PiB")
POSITIVE_SIZE = _UnitType("SIZE", _SIZE_UNITS, "64MB or 1GiB", float(1 << 50), "1PiB", positive=True)
# A wait of more than 2**31-1 ms overflows poll()/select() timeouts: 24 days is far below that.
DURATION = _UnitType("DURATION", _TIME_UNITS, "10, 10s, 500ms or 5m", 24 * 86400.0, "24 days")
POSITIVE_DURATION = _UnitType("DURATION", _TIME_UNITS, "10, 10s, 500ms or 5m", 24 * 86400.0, "24 days", positive=True)

NAMEDATALEN = 64  # PostgreSQL's identifier limit, terminator included


class NameType(click.ParamType):  # type: ignore[type-arg]
    """A slot or publication name: the server would cut a longer one to 63 bytes and pgrecv
    would go on with a name the user never gave."""

    name = "NAME"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        option = _option_name(param)
        if not text:
            raise UsageError(f"{option} is empty: give a name")
        size = len(text.encode("utf-8", "surrogateescape"))
        if size >= NAMEDATALEN:
            raise UsageError(
                f"{option} {text!r} is {size} bytes long: PostgreSQL names are at most "
                f"{NAMEDATALEN - 1} bytes; choose a shorter name"
            )
        return text


class PathType(click.ParamType):  # type: ignore[type-arg]
    """A file or directory path that must not be empty ('' would mean the current directory
    to some calls and fail with a traceback in others)."""

    def __init__(self, name: str = "PATH") -> None:
        self.name = name

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        if not text.strip():
            raise UsageError(f"{_option_name(param)} is empty: give a path")
        return text


class SlotNameType(NameType):
    """A replication slot name, checked as PostgreSQL checks it (ReplicationSlotValidateName) before
    any connection: lower-case letters, digits and underscores, at most 63 bytes. A name the
    server would refuse is a bad value on the command line (exit 2), not a server error."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = super().convert(value, param, ctx)
        bad = sorted({c for c in text if not ("a" <= c <= "z" or "0" <= c <= "9" or c == "_")})
        if bad:
            shown = "".join(bad)
            raise UsageError(
                f"{_option_name(param)} {text!r} is not a replication slot name (it has {shown!r}): slot names "
                "may only contain lower-case letters, digits and underscores (e.g. "
                f"{_slot_like(text)!r})"
            )
        return text


def _slot_like(text: str) -> str:
    """A slot name close to ``text`` that PostgreSQL accepts, for the message."""
    name = "".join(c if "a" <= c <= "z" or "0" <= c <= "9" else "_" for c in text.lower())
    return name.encode()[: NAMEDATALEN - 1].decode(errors="ignore") or "slot"


NAME = NameType()
SLOT = SlotNameType()


def warn_divergence(opts: ConnOptions, publication: str | None, slot: str | None, *, pgoutput: bool) -> None:
    """One stderr line per way the output could differ from the source (pgrecv.pg.divergence)."""
    from pgrecv.pg import divergence
    from pgrecv.pg.conn import connect
    from pgrecv.pg.slots import get_slot

    with connect(opts) as conn:
        pub = divergence.only_publication(conn, publication) if pgoutput else None
        row = get_slot(conn, slot) if slot is not None else None
        for line in divergence.warnings(conn, pub, row):
            log(f"warning: {line}", 0)
