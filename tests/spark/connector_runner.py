"""One JVM with Delta's Spark connector for many ``pgrecv spark-apply`` runs.

A process of its own per run paid a JVM start with the connector's jars each time (half a minute
on CI's two cores, most of tests/spark/test_delta_spark.py's time). Here one process starts the
session once, as spark-submit would (pgrecv's ``start_session`` given the jars and the
connector's extension and catalog), and runs each command through pgrecv's own ``main``: the
session is active, so pgrecv takes it instead of starting one, as it does under spark-submit.

Protocol: each line of stdin is a JSON object, ``args`` (after ``pgrecv``) and ``env`` (set for
that command only: an S3 test's ``AWS_*``, which the driver's own clients read); each answer is one
JSON line ``{"rc": int, "out": str, "err": str}`` on the stdout this process started with. Its
fd 1 is pointed at stderr meanwhile, so that nothing else (the JVM, Spark's logs) can write into
the answers.
"""

from __future__ import annotations

import contextlib
import io
import os
import select
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

import orjson


class Runner:
    """The tests' side: this module as a process of its own, one command at a time."""

    def __init__(self, jars: str, log: Path, master: str = "local[2]", conf: tuple[str, ...] = ()) -> None:
        from tests.conftest import long_lived_jvm  # (the runner's own process does not import conftest)

        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.spark.connector_runner", master, *conf, f"spark.jars={jars}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log.open("wb"),
            env={**long_lived_jvm(dict(os.environ)), "SPARK_LOCAL_IP": "127.0.0.1"},
            cwd=Path(__file__).resolve().parents[2],
        )
        assert self._answer(600) == {"ready": True}

    def _answer(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else b""
        if not line:
            self.proc.kill()
            tail = self.log.read_bytes()[-4000:].decode(errors="replace")
            raise AssertionError(f"the connector runner gave no answer in {timeout} s: {tail}")
        answer: dict[str, Any] = orjson.loads(line)
        return answer

    def run(
        self, args: list[str], timeout: float, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[bytes]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(orjson.dumps({"args": args, "env": env or {}}) + b"\n")
        self.proc.stdin.flush()
        a = self._answer(timeout)
        return subprocess.CompletedProcess(args, a["rc"], a["out"].encode(), a["err"].encode())

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _one(argv: list[str], env: dict[str, str]) -> dict[str, object]:
    """One command's exit code and output, as a process of its own would give them (a traceback
    in ``err`` with code 1 for what pgrecv let through), with ``env`` in the environment meanwhile."""
    from unittest import mock

    from pgrecv.cli.main import main

    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
    rc = 0
    with mock.patch.dict(os.environ, env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
        except Exception:
            traceback.print_exc()
            rc = 1
    text = {k: f.buffer.getvalue().decode(errors="replace") for k, f in (("out", out), ("err", err))}  # type: ignore[attr-defined]
    return {"rc": rc, **text}


def serve(master: str, conf: dict[str, str]) -> None:
    answers = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    from pgrecv.spark.jars import session_conf
    from pgrecv.spark.sparkops import start_session

    start_session(master, session_conf(conf, "delta", "spark"))
    answers.write(b'{"ready": true}\n')
    for line in sys.stdin.buffer:
        if line.strip():
            asked = orjson.loads(line)
            answers.write(orjson.dumps(_one(asked["args"], asked["env"])) + b"\n")


if __name__ == "__main__":
    # argv: MASTER KEY=VALUE...
    serve(sys.argv[1], dict(a.split("=", 1) for a in sys.argv[2:]))
