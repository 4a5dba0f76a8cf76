"""`pgrecv demo` end to end: a newcomer's first command must work, as root and as a normal user."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def check_output(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    for expected in ("created publication pgrecv_demo", "insert", "update", "delete", "invoice 42 sent"):
        assert expected in out
    assert '"op":"insert"' in out  # the JSONL sample
    assert "stopped cleanly: 4 transactions, 6 rows" in out  # the streaming part
    assert "removed the server and its data" in out
    assert "Traceback" not in proc.stderr
    check_lake(out)


def check_lake(out: str) -> None:
    """The last step: every change of the demo applied to a Delta table, read back and shown."""
    assert "$ pgrecv spark-apply changes.jsonl --target lake --format delta" in out, out
    lake = out.split("$ pgrecv spark-apply", 1)[1].split("$ pgrecv drop", 1)[0]
    assert "public.customers: applied (7 inserts, 3 updates, 2 deletes)" in lake
    assert "(Delta): 5 rows" in lake
    for present in ("Ada Lovelace", "94.74", "edsger@example.com", "Alan Turing", "Customer 1", "Customer 3"):
        assert present in lake
    for gone in ("Grace Hopper", "Customer 2"):  # deleted in PostgreSQL, so not in the lake
        assert gone not in lake


def test_demo_without_spark_extra() -> None:
    """Without pgrecv[spark] the demo says how to get the last step and still succeeds."""
    code = "import sys; sys.modules['deltalake'] = None; from pgrecv.cli.main import main; main(['demo'])"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "pip install 'pgrecv[spark]' enables" in proc.stdout
    assert "spark-apply" not in proc.stdout and "stopped cleanly" in proc.stdout
    assert "removed the server and its data" in proc.stdout and "Traceback" not in proc.stderr


def test_demo() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pgrecv", "demo"], capture_output=True, text=True, timeout=180, cwd=ROOT
    )
    check_output(proc)


@pytest.mark.skipif(os.geteuid() != 0, reason="already running as a normal user: test_demo covers it")
def test_demo_as_normal_user(monkeypatch: pytest.MonkeyPatch) -> None:
    """Drop root in a forked child (this Python lives under /root, which others cannot read, so a
    fresh interpreter cannot run as another user): everything the demo needs is imported first."""
    import io
    import tempfile
    import threading  # noqa: F401

    import rich.console

    import pgrecv.decode.assemble
    import pgrecv.decode.pgoutput
    import pgrecv.demo
    import pgrecv.output.jsonl
    import pgrecv.output.pretty
    import pgrecv.output.sinks
    import pgrecv.output.values
    import pgrecv.pg.server
    import pgrecv.stream.streamer

    # run it once here first, so that every module it imports lazily is loaded before the child
    # drops root (the interpreter and virtualenv may live where nobody cannot read). Without the lake
    # step: delta-rs's tokio runtime panics when used in a forked child once this process (or any
    # earlier test in it) has used it, so the child skips it too (test_demo covers it as a subprocess).
    monkeypatch.setitem(sys.modules, "pyspark", None)
    pgrecv.demo.run_demo(console=rich.console.Console(file=io.StringIO(), width=100))
    user = pwd.getpwnam("nobody")
    home = tempfile.mkdtemp(prefix="pgrecv-demo-home-")
    os.chmod(home, 0o777)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            os.environ["HOME"] = home
            os.chdir(home)
            buf = io.StringIO()
            pgrecv.demo.run_demo(console=rich.console.Console(file=buf, width=100))
            os.write(write_end, buf.getvalue().encode())
            code = 0
        except BaseException as exc:  # report anything, never return into pytest
            os.write(write_end, f"FAILED: {exc!r}".encode())
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        text = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    os.rmdir(home)
    assert os.waitstatus_to_exitcode(status) == 0, text
    assert "stopped cleanly: 4 transactions" in text and "removed the server" in text
    assert "pip install 'pgrecv[spark]' enables the last step" in text
