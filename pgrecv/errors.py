"""One exception hierarchy: each class carries its exit code, which ``pgrecv.cli.main.main`` exits with.

Every error a user can meet is a :class:`PgrecvError` with a one-line message that says what is
wrong and what to do. Anything else escaping to the CLI is a bug and is reported with a traceback.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """What ``pgrecv`` exits with; ``description`` is the one source of the man page's EXIT STATUS
    and the README's exit-code table (``tools/gen_docs.py`` writes both; backquotes mark code)."""

    description: str

    def __new__(cls, value: int, description: str) -> ExitCode:
        member = int.__new__(cls, value)
        member._value_ = value
        member.description = description
        return member

    OK = 0, "success"
    INTERNAL = 1, "internal error, a bug (run with `-v` and report it)"
    USAGE = 2, "bad command line: unknown option, missing or invalid value"
    CONNECTION = 3, "cannot connect or authenticate, or the connection was lost"
    SERVER_CONFIG = 4, "server configuration or privileges: wal_level, REPLICATION, missing plugin"
    SLOT = 5, "replication slot missing, already existing, or active elsewhere"
    PUBLICATION = 6, "publication missing, or several and none chosen"
    DECODE = 7, "bytes or lines the decoder cannot read"
    OUTPUT = 8, "cannot write the output or make it durable (nothing was consumed)"
    INPUT = 9, "`spark-apply`: bad input files"
    SERVER_ENV = 10, "no PostgreSQL binaries for a throwaway server (`demo`)"
    STREAM_LOST = 11, "`start --no-loop` (or `--temporary`): the stream ended or the connection broke"
    SERVER = 12, "the server refused a statement for a reason of its own (its message follows)"
    POSITION = 13, "`start`: a start or resume position ahead of the server's WAL (nothing confirmed)"
    UNHEALTHY = (
        14,
        "`slots --check`: a slot is invalidated, lost, unreserved, inactive too long, past"
        " `--max-lag`/`--max-retained`, or a failover slot not ready on `--standby`"
        " (one line per problem)",
    )
    PARTLY_APPLIED = (
        15,
        "`spark-apply`: some tables were held back (each named with file:line, column,"
        " value and the fix; they keep their position), every other table was applied",
    )
    SPARK = 16, "`spark-apply`: Spark did not start (`--master`, `--conf`, no Java); its reason follows"
    FOREIGN_OUTPUT = (
        17,
        "`start`: the output directory holds another stream's output (another slot, database or server),"
        " or a file pgrecv did not write there (nothing confirmed)",
    )
    DIFFERENT = (
        18,
        "`verify`: the lake differs from PostgreSQL at the snapshot's position (each table and key named)",
    )
    INTERRUPTED = 130, "interrupted by SIGINT before finishing"


class PgrecvError(Exception):
    """Base of every error that is the user's to fix; ``str()`` is the one-line message."""

    exit_code: ExitCode = ExitCode.INTERNAL

    def __init__(self, message: str, *, detail: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail  # shown with --verbose only


class UsageError(PgrecvError):
    exit_code = ExitCode.USAGE


class ConnectionFailed(PgrecvError):
    exit_code = ExitCode.CONNECTION


class ServerConfigError(PgrecvError):
    exit_code = ExitCode.SERVER_CONFIG


class SlotError(PgrecvError):
    exit_code = ExitCode.SLOT


class PublicationError(PgrecvError):
    exit_code = ExitCode.PUBLICATION


class DecodeError(PgrecvError):
    """Input the decoders cannot read: names the message type and the byte offset or line."""

    exit_code = ExitCode.DECODE


class OutputError(PgrecvError):
    exit_code = ExitCode.OUTPUT


class InputError(PgrecvError):
    exit_code = ExitCode.INPUT


class ServerEnvError(PgrecvError):
    """No usable PostgreSQL binaries for a throwaway server."""

    exit_code = ExitCode.SERVER_ENV


class ServerError(PgrecvError):
    """An error the server reported that pgrecv has no specific advice for: not a bug of pgrecv."""

    exit_code = ExitCode.SERVER


class Unhealthy(PgrecvError):
    """``slots --check`` found problems (each already printed on its own line)."""

    exit_code = ExitCode.UNHEALTHY


class Different(PgrecvError):
    """``verify`` found tables that differ from PostgreSQL (each already reported)."""

    exit_code = ExitCode.DIFFERENT


class PartlyApplied(PgrecvError):
    """spark-apply held back the tables it names (they keep their position); the rest is applied."""

    exit_code = ExitCode.PARTLY_APPLIED


class PositionError(PgrecvError):
    """A start or resume position ahead of the server's WAL: confirming it would skip data."""

    exit_code = ExitCode.POSITION


class SparkStartError(PgrecvError):
    """Spark could not start: a bad ``--master`` or ``--conf``, or no Java."""

    exit_code = ExitCode.SPARK


class ForeignOutput(PgrecvError):
    """An output directory written for another stream (slot, database, server), or holding a file
    that is not what its name claims: resuming from it would skip changes this stream never wrote."""

    exit_code = ExitCode.FOREIGN_OUTPUT


class StreamLost(PgrecvError):
    """The stream ended (server shutdown, walsender terminated, network) and --no-loop was given."""

    exit_code = ExitCode.STREAM_LOST
