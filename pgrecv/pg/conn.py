"""Connection options and connecting, with server errors translated in one place.

Only what the user passed explicitly goes into the conninfo; everything else is left to libpq,
so PG* environment variables, service files and ``.pgpass`` work unchanged. A password never
leaves this module in any message: :func:`redact` is what ``--verbose`` shows.

psycopg is imported where a connection string is parsed or a connection made, not with the module:
the command line's options and ``--help`` need :class:`ConnOptions` and :func:`redact` only, and
psycopg's import alone takes about 0.1 s (bench/help.py).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pgrecv.errors import (
    ConnectionFailed,
    PgrecvError,
    PublicationError,
    ServerConfigError,
    ServerError,
    SlotError,
    UsageError,
)

if TYPE_CHECKING:
    import psycopg

APPLICATION_NAME = "pgrecv"


def server_major(conn: psycopg.Connection[Any]) -> int:
    """The server's major version (15, 18, ...)."""
    return conn.info.server_version // 10000


@dataclass(frozen=True, slots=True)
class ConnOptions:
    dbname: str | None = None  # a database name, a conninfo string or a URI
    host: str | None = None
    port: str | None = None
    user: str | None = None
    password: str | None = None  # only from -W's prompt; never printed
    prompt: bool | None = None  # True: -W (always prompt); False: -w (never); None: prompt if needed
    # the option that gave dbname, named by every message about it (`slots --standby` is not -d)
    option: str = "--dbname"

    def __post_init__(self) -> None:
        # before anything can fail: every later message is masked, even if -d does not parse
        remember_secrets(self.dbname)
        if self.password:
            _remember(self.password)

    def conninfo(self, *, replication: bool = False, **extra: Any) -> str:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        try:
            base = self.dbname if self.dbname and ("=" in self.dbname or "://" in self.dbname) else ""
            params: dict[str, Any] = {
                "host": self.host,
                "port": self.port,
                "user": self.user,
                "password": self.password,
                **extra,
            }
            if base == "" and self.dbname:
                params["dbname"] = self.dbname
            parsed = conninfo_to_dict(base)
            if "application_name" not in parsed:
                params.setdefault("application_name", APPLICATION_NAME)
            if replication:
                params["replication"] = "database"
            conninfo = make_conninfo(base, **{k: v for k, v in params.items() if v is not None})
        except psycopg.ProgrammingError as exc:
            # libpq quotes the token it stumbled on, which may be (part of) a password
            # (an option name is kept: it tells what to fix, and a known password is masked anyway)
            reason = _QUOTED.sub(_mask_token, _first_line(redact(str(exc))))
            raise UsageError(
                f"invalid connection string in {self.option}: {reason}; use key=value pairs or a postgresql:// URI"
            ) from None
        if _URI.match(base) and any("@" in str(parsed.get(k) or "") for k in ("host", "hostaddr", "port", "dbname")):
            # libpq ends the user:password part at the first '@': the rest of the password
            # would be taken for the host and shown in every message about it
            raise UsageError(
                f"the {self.option} URI has more than one '@' before the host: percent-encode '@' in the user "
                "name or password as %40 (or pass the password with PGPASSWORD or ~/.pgpass)"
            )
        return conninfo


# Keys whose values are secrets, in conninfo strings and URI query parameters.
SECRET_KEYS = ("password", "sslpassword")
_URI = re.compile(r"postgres(?:ql)?://", re.IGNORECASE)
_PASSWORD_KV = re.compile(r"((?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]+)", re.IGNORECASE)
_PASSWORD_URI = re.compile(r"(://[^:/@\s]*:)([^\s]*)(@)")
_QUOTED = re.compile(r'"[^"]*"')
_MIN_MASKED = 3  # shorter secrets would mask ordinary words; the patterns above still catch them
_known: set[str] = set()


def _remember(secret: str) -> None:
    from urllib.parse import unquote

    for form in {secret, unquote(secret, errors="replace"), secret.replace("\\'", "'").replace("\\\\", "\\")}:
        if len(form) >= _MIN_MASKED:
            _known.add(form)


def remember_secret(value: str) -> None:
    """Note a secret given some other way (a --conf value whose key names one, an environment
    variable) so that no message shows it."""
    _remember(value)


# secrets libpq and AWS's SDKs (delta-rs, pyarrow, Hadoop's S3A provider chain) take from the environment
SECRET_VARIABLES = ("PGPASSWORD", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def remember_environment_secrets() -> None:
    """Note the secrets of :data:`SECRET_VARIABLES`: a store's or a catalog's message may quote them."""
    for name in SECRET_VARIABLES:
        value = os.environ.get(name)
        if value:
            _remember(value)


def remember_secrets(conninfo: str | None) -> None:
    """Note every password in a --dbname value, valid or not, so that no message shows it."""
    if not conninfo:
        return
    uri = _URI.match(conninfo)
    if uri:
        rest = conninfo[uri.end() :]
        userinfo = rest[: rest.rfind("@")] if "@" in rest else ""
        if ":" in userinfo:
            password = userinfo.partition(":")[2]
            _remember(password)
            for part in re.split(r"[@/?#:]", password):  # what libpq may take for host, port, path
                _remember(part)
    for match in _PASSWORD_KV.finditer(conninfo):
        value = match.group(2)
        _remember(value)
        if value.startswith("'") and value.endswith("'") and len(value) >= 2:
            _remember(value[1:-1])


def _mask_token(match: re.Match[str]) -> str:
    return match.group(0) if re.fullmatch(r'"[a-z_]*"|"\*+"', match.group(0)) else '"..."'


def redact(text: str) -> str:
    """Mask passwords in conninfo strings, URIs and messages that might quote them."""
    for secret in sorted(_known, key=len, reverse=True):
        text = text.replace(secret, "********")
    text = _PASSWORD_KV.sub(r"\1********", text)
    return _PASSWORD_URI.sub(r"\1********\3", text)


def describe(conninfo: str) -> str:
    """A password-free ``host:port/dbname as user`` summary for --verbose lines."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    try:
        d = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        return "<invalid conninfo>"
    for key in SECRET_KEYS:
        d.pop(key, None)
    return " ".join(f"{k}={v}" for k, v in sorted(d.items()))


# A password typed at a prompt and accepted by the server: the process's later connections
# (pgrecv start's reconnects, the snapshot's several connections) use it instead of asking again,
# as pg_recvlogical does.
_typed_password: str | None = None


def connect(opts: ConnOptions, *, replication: bool = False, autocommit: bool = True) -> psycopg.Connection[Any]:
    """Connect like the PostgreSQL tools do: prompt for a password (-W, or when needed unless -w),
    once per process."""
    import psycopg

    global _typed_password
    opts, typed = with_typed_password(opts), None
    if opts.password is None and opts.prompt is True:
        opts = replace(opts, password=(typed := _ask_password()))
    try:
        conn = _connect(opts, replication, autocommit)
    except psycopg.OperationalError as exc:
        if not (opts.prompt is None and opts.password is None and _needs_password(exc) and _interactive()):
            raise _refused(exc, opts, replication) from None
        opts = replace(opts, password=(typed := _ask_password()))
        try:
            conn = _connect(opts, replication, autocommit)
        except psycopg.OperationalError as again:
            raise _refused(again, opts, replication) from None
    if typed is not None:
        _typed_password = typed
    return conn


def _refused(exc: psycopg.OperationalError, opts: ConnOptions, replication: bool) -> PgrecvError:
    """The error for a refused connection. A connection-time FATAL has no SQLSTATE (libpq keeps
    only its text, translated by the server's lc_messages): when a replication connection is
    refused for a reason the text does not reveal, ask the server over a plain connection whether
    the role may replicate at all."""
    import psycopg

    error = translate(exc, conn_option=opts.option)
    if not replication or type(error) is not ConnectionFailed or "FATAL:" not in str(exc):
        return error
    try:
        with _connect(opts, False, True) as conn:
            row = conn.execute(
                "SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user"
            ).fetchone()
    except psycopg.Error:
        return error
    if row is not None and row[0] is False:
        return no_replication_attribute(server_message(exc), error.detail)
    return error


def with_typed_password(opts: ConnOptions) -> ConnOptions:
    """``opts`` with the password typed in this process, if any: for processes that cannot ask
    (snapshot workers, forked before the first connection)."""
    if opts.password is None and _typed_password is not None:
        return replace(opts, password=_typed_password)
    return opts


def _connect(opts: ConnOptions, replication: bool, autocommit: bool) -> psycopg.Connection[Any]:
    # A replication connection accepts the simple query protocol only: no prepared statements
    # (prepare_threshold=None) and parameters bound on the client (ClientCursor).
    import psycopg

    conn = psycopg.connect(opts.conninfo(replication=replication), autocommit=autocommit, prepare_threshold=None)
    if replication:
        conn.cursor_factory = psycopg.ClientCursor
    return conn


def _ask_password() -> str:
    """The prompt where the PostgreSQL tools show it: on the terminal, or from standard input in
    a process that has none (psql and pg_recvlogical read a piped password there too; getpass
    would first print a Python warning that a pipe echoes, which it does not)."""
    import os
    import sys

    try:
        os.close(os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY))
        terminal = True
    except OSError:
        terminal = False
    try:
        if terminal:
            import getpass

            password = getpass.getpass("Password: ")
        else:
            sys.stderr.write("Password: ")
            sys.stderr.flush()
            line = sys.stdin.readline() if sys.stdin is not None else ""
            sys.stderr.write("\n")
            if not line:
                raise EOFError
            password = line[:-1] if line.endswith("\n") else line
    except EOFError:
        raise ConnectionFailed(
            "no password: the input ended at the password prompt; type it there, or give it in "
            "PGPASSWORD or a ~/.pgpass file"
        ) from None
    _remember(password)
    return password


def _interactive() -> bool:
    import sys

    return sys.stdin.isatty()


def _needs_password(exc: BaseException) -> bool:
    return "no password supplied" in str(exc)


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[0] if lines else text.strip()


def server_message(exc: BaseException) -> str:
    diag = getattr(exc, "diag", None)
    primary = getattr(diag, "message_primary", None) if diag is not None else None
    text = primary or _first_line(str(exc))
    # libpq's connection errors wrap the server's words: keep the server's FATAL message
    _, fatal, rest = text.partition("FATAL:")
    return redact(rest.strip() if fatal else text)


def _unwrapped(msg: str) -> str:
    """libpq's words without psycopg's prefix (``connection failed: connection to server …``)."""
    for prefix in ("connection is bad: ", "connection failed: "):
        if msg.startswith(prefix):
            return msg[len(prefix) :]
    return msg


def _connect_advice(low: str, option: str = "--dbname") -> str:
    """What to do about a connection that failed before the server said why (or said who is
    unknown): the option that names the thing at fault. A connection given by another option
    than -d (``slots --standby``) is all in that option's string."""
    if option != "--dbname":
        return f"check the connection string given with {option} and that its server is running"
    if "role " in low and "does not exist" in low:
        return "connect as an existing role with -U (or PGUSER)"
    if "database " in low and "does not exist" in low:
        return "name an existing database with -d (or PGDATABASE)"
    if "resolve host" in low or "translate host name" in low:
        return "check the host name given with -h (or PGHOST)"
    if "timeout" in low or "timed out" in low:
        return "check the host and port, and that the network lets the connection through"
    if "connection refused" in low or "no such file or directory" in low:
        return "is the server running there? give its host and port with -h and -p (or PGHOST and PGPORT)"
    return "check the connection options (-d, -h, -p, -U) and that the server is running"


def server_hint(exc: BaseException) -> str | None:
    """The server's HINT, on one line: what it says to do, which it knows better than a guess here."""
    hint = getattr(getattr(exc, "diag", None), "message_hint", None)
    return redact(" ".join(hint.split())) if isinstance(hint, str) and hint.strip() else None


def sqlstate(exc: BaseException) -> str | None:
    """The server's SQLSTATE, if the error came with one (connection-time errors do not)."""
    state = getattr(exc, "sqlstate", None) or getattr(getattr(exc, "diag", None), "sqlstate", None)
    return state if isinstance(state, str) else None


def _source_file(exc: BaseException) -> str:
    """The server source file that raised the error: names the object kind in any lc_messages."""
    return str(getattr(getattr(exc, "diag", None), "source_file", None) or "")


# SQLSTATEs (never translated) decide; English text is only a fallback for errors that come
# without one (libpq's connection-time FATALs). GUC names stay untranslated in every catalog.
_PRIVILEGE = "42501"
_NOT_IN_PREREQUISITE_STATE = "55000"
_OBJECT_IN_USE = "55006"
_DUPLICATE_OBJECT = "42710"
_UNDEFINED_OBJECT = "42704"
_UNDEFINED_FILE = "58P01"
_CONFIGURATION_LIMIT = "53400"
_TOO_MANY_CONNECTIONS = "53300"


def translate(
    exc: BaseException, *, slot: str | None = None, publication: str | None = None, conn_option: str = "--dbname"
) -> PgrecvError:
    """Map a psycopg error to the one-line user error that says what to do about it; ``conn_option``
    is the option that gave the connection (for what to fix when it cannot be made)."""
    import psycopg

    msg = server_message(exc)
    detail = redact(str(exc))
    low = msg.lower()
    state = sqlstate(exc)
    source = _source_file(exc)
    if state == _PRIVILEGE or (
        state is None and ("permission denied to start" in low or "must be superuser or replication role" in low)
    ):
        if "replication" in low or "superuser" in low or "wal sender" in low or "walsender" in low:
            return no_replication_attribute(msg, detail)
        todo = server_hint(exc) or "grant the needed privilege or connect as another role"
        return ServerConfigError(f"{msg}: {todo}", detail=detail)
    if "wal_level" in low and state in (None, _NOT_IN_PREREQUISITE_STATE):
        return ServerConfigError(
            f"{msg}: set wal_level = logical in postgresql.conf and restart the server", detail=detail
        )
    slot_kind = source.startswith("slot") or (not source and "replication slot" in low)
    if state == _DUPLICATE_OBJECT and slot_kind:
        return SlotError(f"{msg}: use --if-not-exists, or drop it with 'pgrecv drop --slot {slot}'", detail=detail)
    if state == _UNDEFINED_OBJECT and slot_kind:
        return SlotError(f"{msg}: create it with 'pgrecv create --slot {slot}' or check 'pgrecv slots'", detail=detail)
    if state == _OBJECT_IN_USE and (source.startswith("slot") or "slot" in low):
        return SlotError(f"{msg}: another consumer is using it; stop it first", detail=detail)
    if (state == _UNDEFINED_OBJECT and "publication" in source) or (
        not source and "publication" in low and ("does not exist" in low or state == _UNDEFINED_OBJECT)
    ):
        return PublicationError(
            f"{msg}: create it with 'pgrecv create --slot S --publication {publication or 'NAME'}' "
            "or CREATE PUBLICATION",
            detail=detail,
        )
    if state == _UNDEFINED_FILE or (state is None and "could not access file" in low):
        return ServerConfigError(
            f"{msg}: the output plugin is not installed on the server; check --plugin", detail=detail
        )
    if (state in (_NOT_IN_PREREQUISITE_STATE, _CONFIGURATION_LIMIT, None) and "max_replication_slots" in low) or (
        state == _CONFIGURATION_LIMIT and source.startswith("slot")
    ):
        return ServerConfigError(f"{msg}: raise max_replication_slots and restart the server", detail=detail)
    if state is None and "replication slots can only be used" in low:
        return ServerConfigError(f"{msg}: raise max_replication_slots and restart the server", detail=detail)
    if state == _TOO_MANY_CONNECTIONS or "max_wal_senders" in low:
        return ServerConfigError(f"{msg}: raise max_wal_senders or max_connections", detail=detail)
    if isinstance(exc, psycopg.OperationalError):
        if "pg_hba.conf" in low and "replication" in low:
            return ConnectionFailed(f"{msg}: allow replication connections for this role in pg_hba.conf", detail=detail)
        if "password authentication failed" in low or "no password supplied" in low:
            return ConnectionFailed(f"{msg}: check the password (-W to be asked, or .pgpass)", detail=detail)
        where = "" if conn_option == "--dbname" else f" to the {conn_option} server"
        advice = _connect_advice(low, conn_option)
        return ConnectionFailed(f"cannot connect{where}: {_unwrapped(msg)}: {advice}", detail=detail)
    if state:  # the server's own words: not a bug here, and its hint (if any) says what to do
        hint = server_hint(exc)
        return ServerError(f"server error: {msg}" + (f": {hint}" if hint else ""), detail=detail)
    return PgrecvError(f"server error: {msg}", detail=detail)


def no_replication_attribute(msg: str, detail: str | None = None) -> ServerConfigError:
    return ServerConfigError(
        f"{msg}: the role needs the REPLICATION attribute (ALTER ROLE name REPLICATION)", detail=detail
    )
