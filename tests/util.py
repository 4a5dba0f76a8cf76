"""Small helpers shared by tests that drive the real command line."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import psycopg


def pgrecv(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    """Run ``python -m pgrecv`` as a user would; stdout stays bytes (raw output is binary)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "pgrecv", *args], capture_output=True, env=full_env, timeout=timeout, check=False
    )


def err(proc: subprocess.CompletedProcess[bytes]) -> str:
    return proc.stderr.decode()


def sql(dsn: str, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else []
