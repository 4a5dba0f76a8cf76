"""Small helpers shared by tests that drive the real command line."""

from __future__ import annotations

import errno
import math
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest


def pgrecv(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    """Run ``python -m pgrecv`` as a user would; stdout stays bytes (raw output is binary)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "pgrecv", *args], capture_output=True, env=full_env, timeout=timeout, check=False
    )


def pgrecv_here(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    """``pgrecv ARGS`` through ``main``, the entry point ``python -m pgrecv`` calls, in this process,
    with its own stdout, stderr and environment: exit codes and messages as a user gets them. A
    command that starts Spark gets the session's SparkSession (the ``spark`` fixture), not a JVM of
    its own: a JVM start and its warm-up cost more CPU than most tests' whole work."""
    from click.testing import CliRunner

    from pgrecv.cli.main import main

    with CliRunner().isolation(env=env) as (out, error, _):
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        return subprocess.CompletedProcess(["pgrecv", *args], code, out.getvalue(), error.getvalue())


def err(proc: subprocess.CompletedProcess[bytes]) -> str:
    return proc.stderr.decode()


def sql(dsn: str, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else []


class Terminal:
    """``python -m pgrecv`` with a pseudo-terminal as its controlling terminal, ``answer`` typed at
    every "Password:" prompt; ``output`` is everything it wrote to the terminal."""

    def __init__(self, args: list[str], answer: bytes, env: dict[str, str]) -> None:
        import pty

        self.pid, self._fd = pty.fork()
        if self.pid == 0:  # the child: pgrecv, nothing else
            os.execve(sys.executable, [sys.executable, "-m", "pgrecv", *args], env)
        self.output = b""
        self._answer = answer
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        answered = 0
        while True:
            try:
                chunk = os.read(self._fd, 4096)
            except OSError:  # EIO: the child is gone
                return
            if not chunk:
                return
            self.output += chunk
            if self.output.count(b"Password:") > answered:
                answered += 1
                os.write(self._fd, self._answer + b"\n")

    @property
    def prompts(self) -> int:
        return self.output.count(b"Password:")

    def wait(self, timeout: float = 120) -> int:
        """The exit code (the child is killed after ``timeout`` seconds)."""
        deadline = time.monotonic() + timeout
        while (done := os.waitpid(self.pid, os.WNOHANG))[0] == 0:
            if time.monotonic() > deadline:
                os.kill(self.pid, 9)
            time.sleep(0.05)
        self._reader.join(5)
        os.close(self._fd)
        return os.waitstatus_to_exitcode(done[1])


def awkward_doubles(n: int, seed: int = 20261202) -> list[float]:
    """``n`` doubles over 52 decades and both signs, values whose texts have 16 or 17 digits
    (g / 7, random()), and runs of neighbours around the float encoders' switches: 10^15, 2^53,
    10^16, 2.7e22 (whose text from PostgreSQL is not the shortest), 1e-5, 0.1."""
    rng = random.Random(seed)
    xs = [rng.uniform(1, 10) * 10.0 ** rng.randint(-30, 22) * rng.choice((1, -1)) for _ in range(n)]
    xs += [g / 7 for g in range(1, n // 5)] + [rng.random() for _ in range(n // 5)]
    for start in (1e15, 2.0**53, 1e16, 2.7e22, 1e-5, 0.1, 1.0, 123456789012345.6):
        up = down = start
        for _ in range(40):
            xs += [up, down, -up]
            up, down = math.nextafter(up, math.inf), math.nextafter(down, 0.0)
    return xs


def spy_fdatasync(monkeypatch: pytest.MonkeyPatch, fail_in: str | None = None) -> list[tuple[str, int]]:
    """Record each real ``os.fdatasync`` from now on: the calling thread's name and the descriptor
    (the background syncers name their threads). In the thread named ``fail_in`` it fails with
    EIO instead, as a failed writeback does: Linux reports one to a single fsync."""
    real = os.fdatasync
    calls: list[tuple[str, int]] = []

    def spy(fd: int) -> None:
        name = threading.current_thread().name
        calls.append((name, fd))
        if name == fail_in:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(fd)

    monkeypatch.setattr(os, "fdatasync", spy)
    return calls


def wait_for(predicate: Callable[[], object], timeout: float = 30, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
