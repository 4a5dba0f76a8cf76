"""One exception hierarchy: each class carries its exit code, which ``pgrecv.cli.main`` exits with.

Every error a user can meet is a :class:`PgrecvError` with a one-line message that says what is
wrong and what to do. Anything else escaping to the CLI is a bug and is reported with a traceback.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    INTERNAL = 1  # a bug: unexpected exception
    USAGE = 2  # bad command line (Click's own code)
    CONNECTION = 3  # cannot connect or authenticate, connection lost
    SERVER_CONFIG = 4  # wal_level, privileges, missing plugin
    SLOT = 5  # slot missing, exists, active
    PUBLICATION = 6  # publication missing or ambiguous
    DECODE = 7  # bytes or lines that the decoder cannot read
    OUTPUT = 8  # cannot write or make durable the output
    INPUT = 9  # bad input files (spark-apply and friends)
    SERVER_ENV = 10  # no PostgreSQL binaries for a throwaway server
    STREAM_LOST = 11  # the stream ended or broke and --no-loop forbids reconnecting
    SERVER = 12  # the server refused a statement for a reason of its own (its message says which)
    POSITION = 13  # a start or resume position the server cannot have produced: nothing confirmed
    UNHEALTHY = 14  # slots --check: a slot is in trouble or past a limit (one line per problem)
    PARTLY_APPLIED = 15  # spark-apply: tables held back (each reported), every other table applied
    INTERRUPTED = 130  # stopped by SIGINT before finishing


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


class PartlyApplied(PgrecvError):
    """spark-apply held back the tables it names (they keep their position); the rest is applied."""

    exit_code = ExitCode.PARTLY_APPLIED


class PositionError(PgrecvError):
    """A start or resume position ahead of the server's WAL: confirming it would skip data."""

    exit_code = ExitCode.POSITION


class StreamLost(PgrecvError):
    """The stream ended (server shutdown, walsender terminated, network) and --no-loop was given."""

    exit_code = ExitCode.STREAM_LOST

