"""`pgrecv --help` and each command's `--help` import neither psycopg nor rich (nor pyspark): psycopg's
import alone took about 0.1 s, and help should come at once (issue 60; bench/help.py times it)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pgrecv.cli.main import cli

HEAVY = ("psycopg", "psycopg_binary", "rich", "pyspark", "logging")  # logging: a few ms, only for commands
# Run the CLI in a fresh interpreter and list, on stderr, every module loaded by the end.
CODE = (
    "import sys\nfrom pgrecv.cli.main import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
    "print(' '.join(sorted(sys.modules)), file=sys.stderr)\n"
)


def loaded(*args: str) -> tuple[str, set[str]]:
    proc = subprocess.run([sys.executable, "-c", CODE, *args], capture_output=True, text=True, timeout=60, check=True)
    return proc.stdout, set(proc.stderr.split())


@pytest.mark.parametrize("command", [None, *sorted(cli.commands)])
def test_help_imports_no_heavy_library(command: str | None) -> None:
    out, modules = loaded(*([] if command is None else [command]), "--help")
    assert "Usage: pgrecv" in out
    heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY)
    assert heavy == [], f"pgrecv {command or ''} --help imported {heavy}"


def test_psycopg_errors_are_reported_once_psycopg_is_loaded() -> None:
    """``main`` catches psycopg's errors through ``_reported_errors``, which names them only once
    psycopg is imported (before that none can be raised)."""
    import psycopg

    from pgrecv.cli.main import _reported_errors
    from pgrecv.errors import PgrecvError

    assert _reported_errors() == (PgrecvError, psycopg.Error)
    code = "from pgrecv.cli.main import _reported_errors as r; print([c.__name__ for c in r()])"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert proc.stdout.strip() == "['PgrecvError']"


def test_a_command_that_runs_routes_library_logs() -> None:
    """The psycopg log handler (options.route_library_logs) comes with every command that runs,
    though no longer with --help."""
    code = (
        "import logging, sys\nfrom pgrecv.cli.main import main\ntry:\n    main(sys.argv[1:])\n"
        "except SystemExit:\n    pass\nprint(len(logging.getLogger('psycopg').handlers), file=sys.stderr)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "slots", "-d", "host=/nonexistent-dir dbname=x connect_timeout=1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.stderr.strip().splitlines()[-1] == "1", proc.stderr
