"""`start --heartbeat`: a transactional logical message when the stream has been quiet.

Why: a slot only moves when its consumer confirms a position. pgrecv confirms keepalive positions
while idle, but only when the walsender sends one, which it does when it catches up with the
WAL and not while it is busy decoding other databases' writes; a heartbeat transaction in the
slot's own database adds a commit the stream delivers like any other, so the slot advances
through the ordinary path (durable, then confirmed) however the walsender behaves. It is
transactional on purpose: a non-transactional message is delivered without a commit, and the
slot's restart position does not move past it (as PeerDB found).

The message is emitted on a normal connection with ``synchronous_commit = local``: if pgrecv is
itself a synchronous standby (``start --synchronous``), a commit waiting for pgrecv's own
confirmation while pgrecv waits for the commit would never end. Failures are one line each and
never stop the stream: the next attempt comes an interval later.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import psycopg

from pgrecv.errors import PgrecvError
from pgrecv.pg.conn import ConnOptions, connect, server_message

PREFIX = "pgrecv.stream.heartbeat"


def is_heartbeat(prefix: str, transactional: bool) -> bool:
    return transactional and prefix == PREFIX


class Heartbeat:
    def __init__(self, opts: ConnOptions, interval: float, slot: str, log: Callable[..., None]) -> None:
        self.opts = replace(opts, prompt=False)  # a password typed at start is reused; never ask mid-stream
        self.interval = interval
        self.slot = slot
        self.log = log
        self.sent = 0
        self._conn: psycopg.Connection[Any] | None = None
        self._last_try = 0.0
        self._failing = False

    def maybe_send(self, now: float, quiet_since: float) -> None:
        """Send one if nothing arrived for an interval and the last try is an interval old."""
        if now - quiet_since < self.interval or now - self._last_try < self.interval:
            return
        self._last_try = now
        try:
            conn = self._connection()
            conn.execute("SELECT pg_logical_emit_message(true, %s, %s)", (PREFIX, self.slot))
        except (psycopg.Error, PgrecvError) as exc:
            self.close()
            if not self._failing:  # one line per outage, not one per interval
                reason = exc.message if isinstance(exc, PgrecvError) else server_message(exc)
                self.log(f"warning: heartbeat failed: {reason}; retrying every {self.interval:g} s", 0)
            self._failing = True
            return
        if self._failing:
            self.log("heartbeats work again", 0)
        self._failing = False
        self.sent += 1
        self.log("heartbeat sent", 2)

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            conn = connect(self.opts)
            try:
                conn.execute("SET synchronous_commit = local")
                conn.execute("SET statement_timeout = '10s'")
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
