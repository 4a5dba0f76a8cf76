"""One JVM with Delta's Spark connector for many ``pgrecv spark-apply`` runs.

A process of its own per run paid a JVM start with the connector's jars each time (half a minute
on CI's two cores, most of tests/spark/test_delta_spark.py's time). Here one process starts the
session once, as spark-submit would (pgrecv's ``start_session`` given the jars and the
connector's extension and catalog), and runs each command through pgrecv's own ``main``: the
session is active, so pgrecv takes it instead of starting one, as it does under spark-submit.

Protocol: each line of stdin is a JSON list of arguments (after ``pgrecv``); each answer is one
JSON line ``{"rc": int, "out": str, "err": str}`` on the stdout this process started with. Its
fd 1 is pointed at stderr meanwhile, so that nothing else (the JVM, Spark's logs) can write into
the answers.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import traceback

import orjson


def _one(argv: list[str]) -> dict[str, object]:
    """One command's exit code and output, as a process of its own would give them (a traceback
    in ``err`` with code 1 for what pgrecv let through)."""
    from pgrecv.cli.main import main

    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
    rc = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
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
            answers.write(orjson.dumps(_one(orjson.loads(line))) + b"\n")


if __name__ == "__main__":
    # argv: MASTER KEY=VALUE...
    serve(sys.argv[1], dict(a.split("=", 1) for a in sys.argv[2:]))
