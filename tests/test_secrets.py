"""No password reaches stdout or stderr, whatever shape --dbname has, valid or not, -v included."""

from __future__ import annotations

from urllib.parse import quote

import pytest

from pgrecv.pg.server import TempServer
from tests.util import pgrecv

SECRET = "Sekr1t"  # every shape below hides this in a secret-bearing part

SHAPES = {
    "bad-percent": "postgresql://postgres:{s}%zzPW@{host}:{port}/postgres",
    "nul": "postgresql://postgres:{s}%00PW@{host}:{port}/postgres",
    "space": "postgresql://postgres:{s} PW@{host}:{port}/postgres",
    "query-password": "postgresql://postgres@{host}:{port}/postgres?password={s}PW",
    "query-password-invalid": "postgresql://postgres@{host}:{port}/postgres?password={s}%zzPW",
    "unencoded-at": "postgresql://postgres:{s}@Tail{s}@{host}:{port}/postgres",
    "sslpassword-kv": "host={host} port={port} dbname=postgres sslpassword={s}PW",
    "sslpassword-uri": "postgresql://postgres:{s}PW@{host}:{port}/postgres?sslpassword={s}2",
    "kv-invalid": "host={host} port={port} password='{s} PW' trailing",
    "kv-bad-option": "host={host} port={port} password={s}PW bogus=1",
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("command", [["slots"], ["drop", "--slot", "no_such_slot"]])
def test_password_never_printed(pg_server: TempServer, shape: str, command: list[str]) -> None:
    host = pg_server.host if shape.endswith("-kv") or shape.startswith("kv-") else quote(pg_server.host, safe="")
    dsn = SHAPES[shape].format(s=SECRET, host=host, port=pg_server.port)
    proc = pgrecv("-vv", *command, "-d", dsn)
    out = proc.stdout.decode() + proc.stderr.decode()
    assert out.strip(), "pgrecv said nothing: the test would prove nothing"
    assert SECRET not in out, out
    assert "Traceback" not in out, out
    assert "Tail" not in out, out  # the part after an unencoded '@' is the password's too
