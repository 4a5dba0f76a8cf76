"""Sinks of `pgrecv start`: what is durable when, what survives a crash, rotation, errors.

Real files in temporary directories; crashes are real (``os._exit`` in a child process) or
simulated in-process by dropping the sink's buffer and descriptor, which is what a killed process
leaves: the kernel holds what was written, nothing more.
"""

from __future__ import annotations

import gc
import io
import json
import os
import re
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgrecv.errors import OutputError, UsageError
from pgrecv.lsn import lsn_str
from pgrecv.output import sinks as sinks_module
from pgrecv.output.sinks import (
    BUFFER_SIZE,
    DirSink,
    FileSink,
    Resume,
    Sink,
    StdoutSink,
    make_sink,
)
from tests.util import spy_fdatasync, wait_for

FINAL = re.compile(r"[0-9A-F]{16}-[0-9A-F]{16}\.jsonl")
RANDOM_TMP = re.compile(r"\.[a-z0-9_]{8}\.tmp$")  # mkstemp's part of a temporary state file name


def txn(n: int, rows: int = 3, size: int = 40) -> list[bytes]:
    """Records of one transaction: every line names its transaction and place, so a reader can
    tell a whole transaction from a piece of one."""
    pad = b"x" * size
    return [f"T{n} {i}/{rows} ".encode() + pad + b"\n" for i in range(rows)]


def lsns(n: int) -> tuple[int, int]:
    """Commit and end LSN of transaction n: increasing, and above 32 bits from n = 4 on."""
    commit = (n << 30) + 0x100 * n + 0x28
    return commit, commit + 0x30


def feed(sink: Sink, n: int, rows: int = 3, size: int = 40) -> bytes:
    data = b""
    for rec in txn(n, rows, size):
        sink.write(rec)
        data += rec
    sink.boundary(*lsns(n))
    return data


def whole_transactions(data: bytes) -> list[int]:
    """Transaction numbers in ``data``, asserting each is complete and in order."""
    seen: list[int] = []
    lines = data.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(rb"T(\d+) 0/(\d+) ", lines[i])
        assert m, f"a transaction does not start at line {i}: {lines[i]!r}"
        n, rows = int(m.group(1)), int(m.group(2))
        for k in range(rows):
            assert i + k < len(lines), f"transaction {n} cut after {k} of {rows} rows"
            assert lines[i + k].startswith(f"T{n} {k}/{rows} ".encode()), lines[i + k]
        seen.append(n)
        i += rows
    return seen


def crash(sink: FileSink | DirSink) -> None:
    """What a killed process leaves: written bytes stay with the kernel, the buffer is lost,
    descriptors (and so locks) go away."""
    raw = sink._fdraw
    raw.failure = OutputError("crashed")
    sink._bw.flush()  # into nowhere
    if raw.fd >= 0:
        os.close(raw.fd)
        raw.fd = -1
    lock = getattr(sink, "_lock_fd", -1)
    if lock >= 0:
        os.close(lock)
        sink._lock_fd = -1  # type: ignore[union-attr]


def run_child(code: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (helpers from this module available as in the test)."""
    prelude = textwrap.dedent(
        """
        import os, sys
        from pathlib import Path
        from pgrecv.output.sinks import FileSink, DirSink, StdoutSink
        def lsns(n):
            commit = (n << 30) + 0x100 * n + 0x28
            return commit, commit + 0x30
        def txn(n, rows=3, size=40):
            pad = b"x" * size
            return [f"T{n} {i}/{rows} ".encode() + pad + b"\\n" for i in range(rows)]
        def feed(sink, n, rows=3, size=40):
            for rec in txn(n, rows, size):
                sink.write(rec)
            sink.boundary(*lsns(n))
        tmp = Path(sys.argv[1])
        """
    )
    root = Path(__file__).resolve().parents[2]
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code), str(tmp)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=root,
        check=False,
    )


# --- Resume ------------------------------------------------------------------------------------


def test_resume_start_lsn_misses_nothing() -> None:
    assert Resume().start_lsn == 0
    assert Resume(0x100, 0x130).start_lsn == 0x130
    # only the commit known: the next commit record starts after it, the last one's does not
    assert Resume(0x100, None).start_lsn == 0x101


# --- standard output ---------------------------------------------------------------------------


def test_stdout_buffers_then_flushes_on_durable_and_tick() -> None:
    out = io.BytesIO()
    sink = StdoutSink(out)
    assert sink.open() == Resume()
    assert sink.durable() is None
    first = feed(sink, 1)
    assert out.getvalue() == b"", "a record should not cost a write to the stream"
    assert sink.durable() == lsns(1)[1]
    assert out.getvalue() == first
    second = feed(sink, 2)
    sink.tick(time.monotonic())  # the loop has nothing more to read: show what it has
    assert out.getvalue() == first + second
    sink.close()
    assert sink.file_started == 0


def test_stdout_broken_pipe_is_an_output_error() -> None:
    r, w = os.pipe()
    os.close(r)
    stream = open(w, "wb")  # noqa: SIM115 - closed below
    try:
        sink = StdoutSink(stream)
        sink.open()
        feed(sink, 1)
        with pytest.raises(OutputError, match="cannot write standard output: Broken pipe; the reader"):
            sink.durable()
        with pytest.raises(OutputError):  # stays failed: nothing is claimed durable afterwards
            sink.durable()
        with pytest.raises(OutputError):
            sink.close()
    finally:
        stream.close = lambda: None  # type: ignore[method-assign]  # its buffer would fail again


def test_stdout_broken_pipe_in_a_process_exits_with_a_message(tmp_path: Path) -> None:
    code = """
        from pgrecv.errors import OutputError
        sink = StdoutSink(sys.stdout.buffer)
        sink.open()
        try:
            for n in range(100000):
                feed(sink, n, rows=5, size=100)
                sink.tick(0.0)
        except OutputError as exc:
            sys.stderr.write(f"ERR {exc}\\n")
            os._exit(8)
        os._exit(0)
    """
    prelude_dir = Path(__file__).resolve().parents[2]
    script = tmp_path / "child.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, sys
            from pgrecv.output.sinks import StdoutSink
            def feed(sink, n, rows, size):
                for i in range(rows):
                    sink.write(f"T{n} {i}/{rows} ".encode() + b"x" * size + b"\\n")
                sink.boundary(n, n + 1)
            """
        )
        + textwrap.dedent(code)
    )
    child = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=prelude_dir
    )
    assert child.stdout is not None and child.stderr is not None
    head = child.stdout.read(1000)
    child.stdout.close()
    err = child.stderr.read().decode()
    assert child.wait(timeout=60) == 8, err
    assert head.startswith(b"T0 0/5 ")
    assert "ERR cannot write standard output: Broken pipe" in err


# --- one file ----------------------------------------------------------------------------------


def test_file_created_0600_even_with_a_lax_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        sink = FileSink(tmp_path / "out.jsonl")
        sink.open()
        feed(sink, 1)
        sink.close()
    finally:
        os.umask(old)
    for p in (tmp_path / "out.jsonl", tmp_path / ".out.jsonl.pgrecv-state"):
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p


def test_file_state_records_offset_and_lsns_of_last_durable_boundary(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    sink = FileSink(path)
    assert sink.open() == Resume(None, None)
    assert sink.warning is None
    assert sink.durable() is None
    data = feed(sink, 1) + feed(sink, 5)
    assert sink.durable() == lsns(5)[1]
    feed(sink, 6)  # complete but not made durable
    sink.write(b"T7 0/3 partial\n")
    state = json.loads((tmp_path / ".out.jsonl.pgrecv-state").read_text())
    assert state == {
        "version": 1,
        "offset": len(data),
        "commit_lsn": lsn_str(lsns(5)[0]),
        "end_lsn": lsn_str(lsns(5)[1]),
    }
    assert path.read_bytes()[: len(data)] == data


def test_file_durable_fsyncs_data_before_publishing_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The data is synced before the state record that claims it; the record is rewritten in
    place (one sector, pwrite + fdatasync) on the descriptor kept from its creation: no rename,
    no directory fsync per update."""
    events: list[str] = []
    real = {name: getattr(os, name) for name in ("fsync", "fdatasync", "replace", "pwrite")}

    def name_of(fd: int) -> str:
        return RANDOM_TMP.sub(".RANDOM.tmp", os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))

    def fsync(fd: int) -> None:
        events.append("fsync " + name_of(fd))
        real["fsync"](fd)

    def fdatasync(fd: int) -> None:
        events.append("fdatasync " + name_of(fd))
        real["fdatasync"](fd)

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        events.append(f"pwrite {name_of(fd)} {len(data)}@{offset}")
        return int(real["pwrite"](fd, data, offset))

    def replace(src: Any, dst: Any) -> None:
        events.append("replace " + os.path.basename(dst))
        real["replace"](src, dst)

    sink = FileSink(tmp_path / "out.jsonl")
    for name, fn in (("fsync", fsync), ("fdatasync", fdatasync), ("replace", replace), ("pwrite", pwrite)):
        monkeypatch.setattr(os, name, fn)
    sink.open()  # the state record is made once, whole, under a temporary name
    assert events == [
        "fsync .out.jsonl.pgrecv-state.RANDOM.tmp",
        "replace .out.jsonl.pgrecv-state",
        f"fsync {tmp_path.name}",
    ]
    events.clear()
    feed(sink, 1)
    sink.durable()
    assert events == [
        "fdatasync out.jsonl",
        "pwrite .out.jsonl.pgrecv-state 512@0",
        "fdatasync .out.jsonl.pgrecv-state",
    ]
    events.clear()
    assert sink.durable() == lsns(1)[1]
    assert events == [], "nothing new: no syscalls"
    monkeypatch.undo()
    sink.close()
    state = (tmp_path / ".out.jsonl.pgrecv-state").read_bytes()
    assert len(state) == 512 and json.loads(state)["end_lsn"] == lsn_str(lsns(1)[1])


def test_file_crash_in_a_child_truncates_to_last_durable_boundary(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    child = run_child(
        """
        sink = FileSink(tmp / "out.jsonl")
        sink.open()
        for n in range(1, 4):
            feed(sink, n)
        assert sink.durable() == lsns(3)[1]
        feed(sink, 4)                          # complete, not durable: never confirmed
        sink.write(b"T5 0/3 " + b"y" * 200000)  # half a transaction, past the buffer
        sink.tick(0.0)
        os._exit(0)
        """,
        tmp_path,
    )
    assert child.returncode == 0, child.stderr
    durable_part = b"".join(b"".join(txn(n)) for n in range(1, 4))
    assert path.stat().st_size > len(durable_part) + 200000  # the tail did reach the file
    sink = FileSink(path)
    assert sink.open() == Resume(*lsns(3))
    assert sink.warning is None
    assert path.read_bytes() == durable_part
    feed(sink, 4)  # the server sends transaction 4 again, in full
    sink.close()
    assert whole_transactions(path.read_bytes()) == [1, 2, 3, 4]


def test_file_abandoned_object_leaves_nothing_extra_after_reopen(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    sink = FileSink(path)
    sink.open()
    feed(sink, 1)
    sink.durable()
    sink.write(b"T2 0/3 tail\n")
    del sink
    gc.collect()  # the buffer's tail is flushed to the file by the collector
    assert path.read_bytes().endswith(b"tail\n")
    again = FileSink(path)
    assert again.open() == Resume(*lsns(1))
    assert whole_transactions(path.read_bytes()) == [1]
    again.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("txn"), st.integers(1, 5), st.integers(0, 3000)),
            st.tuples(st.just("split"), st.integers(2, 5), st.integers(0, 3000)),
            st.just(("durable",)),
            st.just(("lost",)),
            st.just(("tick",)),
        ),
        max_size=25,
    ),
    tail=st.booleans(),
    junk=st.binary(max_size=300),
)
def test_file_after_any_crash_holds_exactly_the_durable_transactions(
    ops: list[tuple[Any, ...]], tail: bool, junk: bytes
) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "out.jsonl"
        sink = FileSink(path)
        sink.open()
        n = 0
        written: list[int] = []  # complete transactions, in order
        durable: list[int] = []
        for op in ops:
            if op[0] == "txn":
                n += 1
                feed(sink, n, rows=op[1], size=op[2])
                written.append(n)
            elif op[0] == "durable":
                end = sink.durable()
                durable = list(written)
                assert end == (lsns(durable[-1])[1] if durable else None)
            elif op[0] == "split":  # the fsync interval falls inside a transaction
                n += 1
                recs = txn(n, rows=op[1], size=op[2])
                sink.write(recs[0])
                end = sink.durable()
                durable = list(written)
                assert end == (lsns(durable[-1])[1] if durable else None)
                sink.tick(0.0)
                for rec in recs[1:]:
                    sink.write(rec)
                sink.boundary(*lsns(n))
                written.append(n)
            elif op[0] == "lost":  # connection lost inside a transaction; it comes again whole
                sink.write(f"T{n + 1} 0/9 ".encode() + b"p" * 5000 + b"\n")
                sink.tick(0.0)
                sink.discard_partial()
            else:
                sink.tick(0.0)
        if tail:
            sink.write(f"T{n + 1} 0/9 ".encode() + b"p" * 200000 + b"\n")
        crash(sink)
        with open(path, "ab") as f:  # whatever a crash may leave past the durable part
            f.write(junk)
        again = FileSink(path)
        expected = Resume(*lsns(durable[-1])) if durable else Resume(None, None)
        assert again.open() == expected
        assert whole_transactions(path.read_bytes()) == durable
        again.close()


def test_file_without_state_appends_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_bytes(b"from pg_recvlogical\n")
    sink = FileSink(path)
    assert sink.open() == Resume(None, None)
    assert sink.warning == f"{path} has no pgrecv state: appending; transactions already in it may be repeated"
    data = feed(sink, 1)
    sink.close()
    assert path.read_bytes() == b"from pg_recvlogical\n" + data
    empty = tmp_path / "empty.jsonl"
    empty.touch()
    sink = FileSink(empty)
    sink.open()
    assert sink.warning is None
    sink.close()


def test_file_state_claiming_more_than_the_file_holds_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    sink = FileSink(path)
    sink.open()
    feed(sink, 1)
    sink.close()
    path.write_bytes(b"short\n")
    with pytest.raises(OutputError, match=r"has 6 bytes but \.out\.jsonl\.pgrecv-state says \d+ were written"):
        FileSink(path).open()
    assert path.read_bytes() == b"short\n", "the file is left alone"


@pytest.mark.parametrize(
    "content",
    [b"{not json", b'{"version": 2, "offset": 0}', b'{"version": 1, "offset": -1}', b'{"version": 1, "end_lsn": "zz"}'],
)
def test_file_unusable_state_is_an_error(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "out.jsonl").write_bytes(b"x\n")
    (tmp_path / ".out.jsonl.pgrecv-state").write_bytes(content)
    with pytest.raises(OutputError, match=r"cannot use .*\.out\.jsonl\.pgrecv-state: .*delete it"):
        FileSink(tmp_path / "out.jsonl").open()


def test_file_moved_away_while_stopped_starts_anew_after_its_end(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    sink = FileSink(path)
    sink.open()
    feed(sink, 1)
    sink.close()
    path.rename(tmp_path / "out.jsonl.1")
    sink = FileSink(path)
    assert sink.open() == Resume(*lsns(1))
    assert sink.warning is not None and "is missing: starting it anew after" in sink.warning
    data = feed(sink, 2)
    sink.close()
    assert path.read_bytes() == data


def test_file_reopen_after_rename_like_sighup(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    sink = FileSink(path)
    sink.open()
    old_data = feed(sink, 1)
    path.rename(tmp_path / "out.jsonl.old")
    assert sink.file_started == 0
    sink.reopen()
    assert sink.file_started == 1
    new_data = feed(sink, 2)
    assert sink.durable() == lsns(2)[1]
    state = json.loads((tmp_path / ".out.jsonl.pgrecv-state").read_text())
    assert state["offset"] == len(new_data)
    sink.close()
    assert (tmp_path / "out.jsonl.old").read_bytes() == old_data
    assert path.read_bytes() == new_data
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_file_reopen_mid_transaction_waits_for_its_boundary(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    sink = FileSink(path)
    sink.open()
    feed(sink, 1)
    path.rename(tmp_path / "out.jsonl.old")
    recs = txn(2)
    sink.write(recs[0])
    sink.reopen()  # SIGHUP while transaction 2 is half-written
    assert sink.file_started == 0
    for rec in recs[1:]:
        sink.write(rec)
    sink.boundary(*lsns(2))
    assert sink.file_started == 1
    feed(sink, 3)
    sink.close()
    assert whole_transactions((tmp_path / "out.jsonl.old").read_bytes()) == [1, 2]
    assert whole_transactions(path.read_bytes()) == [3]
    # a crash now resumes against the new file: nothing of it is cut
    assert FileSink(path).open() == Resume(*lsns(3))


def test_file_reopen_without_rename_keeps_appending(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    sink = FileSink(path)
    sink.open()
    data = feed(sink, 1)
    sink.reopen()
    data += feed(sink, 2)
    sink.close()
    assert sink.file_started == 0
    assert path.read_bytes() == data


def test_file_discard_partial_and_close_drop_the_unfinished_unit(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    sink = FileSink(path)
    sink.open()
    feed(sink, 1)
    sink.write(b"T2 0/3 cut by a lost connection\n")
    sink.tick(0.0)
    sink.discard_partial()
    feed(sink, 2)
    sink.write(b"T3 0/3 cut by a stop\n")
    sink.close()
    assert whole_transactions(path.read_bytes()) == [1, 2]


def test_file_second_writer_is_refused(tmp_path: Path) -> None:
    first = FileSink(tmp_path / "out.jsonl")
    first.open()
    with pytest.raises(OutputError, match="in use by another process"):
        FileSink(tmp_path / "out.jsonl").open()
    first.close()
    second = FileSink(tmp_path / "out.jsonl")
    second.open()
    second.close()


def test_file_path_errors_name_the_path_and_the_fix(tmp_path: Path) -> None:
    regular = tmp_path / "plain"
    regular.write_text("")
    with pytest.raises(OutputError, match=r"cannot open .*/plain/out\.jsonl: Not a directory; a component"):
        FileSink(regular / "out.jsonl").open()
    with pytest.raises(OutputError, match=r"cannot open .*/missing/out\.jsonl: .*the directory does not exist"):
        FileSink(tmp_path / "missing" / "out.jsonl").open()
    with pytest.raises(OutputError, match=r"Is a directory; .*give a file name"):
        FileSink(tmp_path).open()


def test_file_write_failure_is_an_output_error(tmp_path: Path) -> None:
    """A file size limit (EFBIG) stands in for a full disk: the failing write() is the one that
    overflows the buffer, from inside the C BufferedWriter."""
    child = run_child(
        """
        import resource, signal
        from pgrecv.errors import OutputError
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100000, 100000))
        sink = FileSink(tmp / "out.jsonl")
        sink.open()
        try:
            for n in range(1, 100):
                feed(sink, n, rows=10, size=1000)
                if n == 5:
                    assert sink.durable() == lsns(5)[1]
        except OutputError as exc:
            print("ERR", n, exc)
            try:
                sink.durable()
            except OutputError as again:
                print("AGAIN", again)
        """,
        tmp_path,
    )
    assert child.returncode == 0, child.stderr
    assert "ERR" in child.stdout and "cannot write" in child.stdout and "File too large" in child.stdout
    assert "AGAIN cannot write" in child.stdout, "a failed sink never reports a position again"
    assert child.stderr == "", "the collector's final flush stays quiet"
    sink = FileSink(tmp_path / "out.jsonl")
    assert sink.open() == Resume(*lsns(5))
    assert whole_transactions((tmp_path / "out.jsonl").read_bytes()) == [1, 2, 3, 4, 5]
    sink.close()


def fifo_reader(tmp_path: Path) -> tuple[Path, threading.Thread, list[bytes]]:
    """A FIFO and a started thread that reads it to its end into the list."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    return fifo, reader, got


def test_file_that_is_not_regular_is_written_like_standard_output(tmp_path: Path) -> None:
    sink = FileSink("/dev/null")
    assert sink.open() == Resume()
    feed(sink, 1)
    assert sink.durable() == lsns(1)[1]
    sink.close()
    assert not Path("/dev/.null.pgrecv-state").exists()

    fifo, reader, got = fifo_reader(tmp_path)
    sink = FileSink(fifo)
    assert sink.open() == Resume()
    data = feed(sink, 1) + feed(sink, 2)
    assert sink.durable() == lsns(2)[1]
    sink.write(b"T3 0/3 cannot be taken back from a pipe\n")
    sink.discard_partial()
    sink.close()
    reader.join()
    assert got[0].startswith(data)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo"]


# --- background syncs: the final fdatasync stays short ---------------------------------------


def spy_syncs(monkeypatch: pytest.MonkeyPatch, every: int) -> list[tuple[str, int]]:
    """Record each real fdatasync (the calling thread's name, the descriptor), with the sinks
    asking for a background sync every ``every`` bytes."""
    monkeypatch.setattr(sinks_module, "WRITEBACK_BYTES", every)
    return spy_fdatasync(monkeypatch)


def sync_threads(before: frozenset[threading.Thread] = frozenset()) -> list[threading.Thread]:
    """The sinks' syncer threads alive now, but those in ``before`` (another test's, left behind)."""
    return [t for t in threading.enumerate() if t.name == "pgrecv-sync" and t not in before]


def test_file_is_synced_in_the_background_as_it_grows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = spy_syncs(monkeypatch, 1000)
    before = frozenset(sync_threads())
    path = tmp_path / "out.jsonl"
    sink = FileSink(path)
    sink.open()
    data = b""
    for n in range(1, 6):
        data += feed(sink, n, rows=30)
        sink.tick(0.0)  # to the kernel, so that the raw layer sees the bytes
    assert sink._fdraw.syncer is not None and len(sync_threads(before)) == 1
    # the syncer runs when the scheduler lets it: on a loaded machine, not before the next line
    deadline = time.monotonic() + 60
    while not any(name == "pgrecv-sync" for name, _ in calls) and time.monotonic() < deadline:
        time.sleep(0.01)
    partial = txn(6, rows=40)
    for rec in partial:
        sink.write(rec)
    sink.tick(0.0)
    sink.discard_partial()  # cut back to the end of transaction 5, with syncs under way
    data += feed(sink, 7, rows=30)
    assert sink.durable() == lsns(7)[1]
    sink.close()
    assert path.read_bytes() == data
    assert not sync_threads(before), "the syncer outlived its file"
    background = [fd for name, fd in calls if name == "pgrecv-sync"]
    assert background and len(set(background)) == 1  # kicks during a sync make one more, not one each
    assert any(name == threading.current_thread().name for name, _ in calls)  # the sink's own, at durable()

    sink = FileSink(path)  # resumed, then reopened (SIGHUP): a new descriptor, a new syncer
    sink.open()
    data += feed(sink, 8, rows=30)
    sink.tick(0.0)
    first = sink._fdraw.syncer
    assert first is not None
    sink.reopen()
    assert first._thread.is_alive() is False and sink._fdraw.syncer is None
    data += feed(sink, 9, rows=30)
    sink.tick(0.0)
    assert sink._fdraw.syncer is not None and sink._fdraw.syncer is not first
    sink.close()
    assert path.read_bytes() == data and not sync_threads(before)


def test_a_failed_background_sync_fails_what_claims_durability(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel's EINVAL for fdatasync on a pipe stands for a failed writeback, which Linux
    reports to one fsync only: the background one. settle() (after the sink's own fdatasync)
    and detach() then check() must raise it."""
    monkeypatch.setattr(sinks_module, "WRITEBACK_BYTES", 100)
    for finish in ("settle", "detach"):
        r, w = os.pipe()
        try:
            raw = sinks_module._FdRaw("the pipe")
            raw.attach(w, 0, "the pipe", sync=True)
            raw.write(b"x" * 150)
            assert raw.syncer is not None
            deadline = time.monotonic() + 10
            while raw.syncer._error is None and time.monotonic() < deadline:
                time.sleep(0.01)
            if finish == "settle":
                with pytest.raises(OutputError, match=r"the pipe.*fsync|fsync.*the pipe"):
                    raw.settle()
            else:
                raw.detach()  # stops the thread, keeps the error, raises nothing
            with pytest.raises(OutputError, match="fsync"):
                raw.check()
            raw.detach()
            raw.fd = -1  # closed here, as the sinks close theirs: not by the collector
        finally:
            os.close(r)
            os.close(w)


def fail_background_syncs(monkeypatch: pytest.MonkeyPatch, every: int) -> None:
    """The syncer threads' fdatasync fails (EIO), the sink's own succeeds: a failed writeback,
    which a real one would need a faulty device for."""
    monkeypatch.setattr(sinks_module, "WRITEBACK_BYTES", every)
    spy_fdatasync(monkeypatch, fail_in="pgrecv-sync")


def sync_failed(sink: FileSink | DirSink) -> bool:
    return sink._fdraw.syncer is not None and sink._fdraw.syncer._error is not None


def test_file_sink_refuses_durability_after_a_failed_background_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """durable() must not report a position when the kernel gave the writeback error to the
    background sync: its own fdatasync succeeds, so only settle() can tell."""
    fail_background_syncs(monkeypatch, 1000)
    sink = FileSink(tmp_path / "out.jsonl")
    sink.open()
    feed(sink, 1, rows=40)
    sink.tick(0.0)  # hands the bytes to the kernel: the syncer starts
    wait_for(lambda: sync_failed(sink), 10, "the background sync")
    with pytest.raises(OutputError, match="fsync"):
        sink.durable()
    with pytest.raises(OutputError, match="fsync"):
        sink.durable()  # and it stays failed
    with pytest.raises(OutputError):
        sink.close()
    state = sink.state_path.read_text() if sink.state_path.exists() else ""
    assert lsn_str(lsns(1)[1]) not in state  # no position recorded as written


def test_dir_sink_does_not_publish_a_file_whose_background_sync_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fail_background_syncs(monkeypatch, 1000)
    sink = DirSink(tmp_path, rotate_size=10**9)
    sink.open()
    feed(sink, 1, rows=4 * sinks_module.BUFFER_SIZE // 40)  # past the buffer: the bytes reach the file
    wait_for(lambda: sync_failed(sink), 10, "the background sync")
    with pytest.raises(OutputError, match="fsync"):
        sink.reopen()  # SIGHUP at a boundary: publishes the file now
    assert finals(tmp_path) == []
    with pytest.raises(OutputError):
        sink.durable()
    with pytest.raises(OutputError):
        sink.close()
    assert finals(tmp_path) == []


def test_file_that_is_not_regular_is_never_synced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = spy_syncs(monkeypatch, 100)
    fifo, reader, got = fifo_reader(tmp_path)
    sink = FileSink(fifo)
    sink.open()
    data = feed(sink, 1, rows=30) + feed(sink, 2, rows=30)
    sink.tick(0.0)
    assert sink._fdraw.syncer is None
    assert sink.durable() == lsns(2)[1]
    sink.close()
    reader.join()
    assert got == [data]
    assert calls == []


def test_dir_syncs_each_file_with_a_syncer_of_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = spy_syncs(monkeypatch, 1000)
    before = frozenset(sync_threads())
    sink = DirSink(tmp_path, rotate_size=3000)
    sink.open()
    for n in range(1, 7):
        feed(sink, n, rows=40)
        sink.tick(0.0)
        assert len(sync_threads(before)) <= 1  # a published file's syncer has stopped
    assert sink.durable() == lsns(6)[1]
    sink.close()
    assert not sync_threads(before)
    files = finals(tmp_path)
    assert len(files) >= 3
    assert whole_transactions(read_all(tmp_path)) == list(range(1, 7))
    background = {fd for name, fd in calls if name == "pgrecv-sync"}
    assert background, "no file was synced in the background"


# --- a directory of rotated files ------------------------------------------------------------


def finals(d: Path) -> list[str]:
    names = sorted(p.name for p in d.iterdir() if not p.name.startswith("."))
    assert all(FINAL.fullmatch(n) for n in names), names
    return names


def read_all(d: Path) -> bytes:
    return b"".join((d / n).read_bytes() for n in finals(d))


def test_dir_rotates_by_size_at_boundaries_and_names_sort_by_lsn(tmp_path: Path) -> None:
    d = tmp_path / "out"
    sink = DirSink(d, rotate_size=400)
    assert sink.open() == Resume(None, None)
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    sizes = [3, 10, 1, 40, 2, 2, 2, 25, 7, 1, 1, 30]
    for n, rows in enumerate(sizes, start=1):
        feed(sink, n, rows=rows, size=60)
    sink.close()
    names = finals(d)
    assert len(names) > 3
    assert whole_transactions(read_all(d)) == list(range(1, len(sizes) + 1))
    for name in names:
        content = (d / name).read_bytes()
        nums = whole_transactions(content)
        first, last = name.removesuffix(".jsonl").split("-")
        assert int(first, 16) == lsns(nums[0])[0]
        assert int(last, 16) == lsns(nums[-1])[0]
        assert stat.S_IMODE((d / name).stat().st_mode) == 0o600
    # every file but the last closed at the first boundary at or past the size
    for name in names[:-1]:
        content = (d / name).read_bytes()
        last_txn = content.splitlines(keepends=True)
        rows_of_last = int(re.match(rb"T\d+ \d+/(\d+)", last_txn[-1]).group(1))  # type: ignore[union-attr]
        assert len(content) >= 400
        assert len(content) - sum(len(x) for x in last_txn[-rows_of_last:]) < 400
    assert sink.file_started == len(names)  # the last one filled up too: a new (empty, unpublished) one began
    assert sorted(d.iterdir()) == sorted([*(d / n for n in names), d / ".pgrecv-state", d / ".pgrecv.lock"])


def test_dir_names_sort_by_lsn_across_32_bit_halves(tmp_path: Path) -> None:
    sink = DirSink(tmp_path, rotate_size=1)
    sink.open()
    commits = [0x9_FFFF_FF00, 0xA_0000_0000, 0x10_0000_0000, 0xFF_0000_0010, 0x100_0000_0000]
    for i, c in enumerate(commits):
        sink.write(f"T{i} 0/1 \n".encode())
        sink.boundary(c, c + 0x20)
    sink.close()
    names = finals(tmp_path)
    assert [int(n[:16], 16) for n in names] == commits
    assert whole_transactions(read_all(tmp_path)) == list(range(len(commits)))


def test_dir_rotates_by_interval_from_first_unit(tmp_path: Path) -> None:
    now = [100.0]
    sink = DirSink(tmp_path, rotate_interval=60, clock=lambda: now[0])
    sink.open()
    sink.tick(now[0])
    feed(sink, 1)
    now[0] += 59
    sink.tick(now[0])
    assert finals(tmp_path) == []
    feed(sink, 2)
    now[0] += 1
    sink.tick(now[0])
    assert len(finals(tmp_path)) == 1, "60 s after its first unit the file is finished"
    # a half-written unit delays the rotation to its boundary
    feed(sink, 3)
    now[0] += 61
    sink.write(txn(4)[0])
    sink.tick(now[0])
    assert len(finals(tmp_path)) == 1
    for rec in txn(4)[1:]:
        sink.write(rec)
    sink.boundary(*lsns(4))
    names = finals(tmp_path)
    assert len(names) == 2
    assert whole_transactions((tmp_path / names[1]).read_bytes()) == [3, 4]
    # an idle file is not rotated, nor published empty
    now[0] += 1000
    sink.tick(now[0])
    assert sink.durable() == lsns(4)[1]
    assert len(finals(tmp_path)) == 2
    sink.close()
    assert len(finals(tmp_path)) == 2


def test_dir_boundary_checks_the_interval_too(tmp_path: Path) -> None:
    now = [0.0]
    sink = DirSink(tmp_path, rotate_interval=10, clock=lambda: now[0])
    sink.open()
    feed(sink, 1)
    now[0] = 10.0
    feed(sink, 2)
    assert len(finals(tmp_path)) == 1
    sink.close()


def test_dir_durable_publishes_complete_units_only(tmp_path: Path) -> None:
    sink = DirSink(tmp_path)
    sink.open()
    assert sink.durable() is None
    feed(sink, 1)
    assert sink.durable() == lsns(1)[1]
    assert len(finals(tmp_path)) == 1
    feed(sink, 2)
    sink.write(txn(3)[0])
    assert sink.durable() == lsns(1)[1], "transaction 2 shares a file with a half-written one"
    assert len(finals(tmp_path)) == 1
    for rec in txn(3)[1:]:
        sink.write(rec)
    sink.boundary(*lsns(3))  # the rotation durable() asked for
    assert len(finals(tmp_path)) == 2
    assert sink.durable() == lsns(3)[1]
    state = json.loads((tmp_path / ".pgrecv-state").read_text())
    assert state["end_lsn"] == lsn_str(lsns(3)[1]) and state["file"] == finals(tmp_path)[-1]
    sink.close()
    assert [whole_transactions((tmp_path / n).read_bytes()) for n in finals(tmp_path)] == [[1], [2, 3]]


def test_dir_durable_order_fsync_state_rename_dirsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The state records a file before it appears under its final name (issue 54, M1): a final
    name past the state is then never pgrecv's."""
    events: list[str] = []
    real_fsync, real_rename, real_replace = os.fsync, os.rename, os.replace

    def fsync(fd: int) -> None:
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        name = RANDOM_TMP.sub(".RANDOM.tmp", name)
        events.append("fsync " + ("DIR" if name == tmp_path.name else "TMP" if name.startswith(".tmp-") else name))
        real_fsync(fd)

    def rename(src: Any, dst: Any) -> None:
        src_kind = "TMP" if Path(src).name.startswith(".tmp-") else str(src)
        dst_kind = "FINAL" if FINAL.fullmatch(Path(dst).name) else str(dst)
        events.append(f"rename {src_kind} {dst_kind}")
        real_rename(src, dst)

    def replace(src: Any, dst: Any) -> None:
        events.append("replace " + Path(dst).name)
        real_replace(src, dst)

    sink = DirSink(tmp_path)
    sink.open()
    feed(sink, 1)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    monkeypatch.setattr(os, "replace", replace)
    assert sink.durable() == lsns(1)[1]
    assert events == [
        "fsync TMP",
        "fsync .pgrecv-state.RANDOM.tmp",
        "replace .pgrecv-state",
        "fsync DIR",
        "rename TMP FINAL",
        "fsync DIR",
    ]
    events.clear()
    assert sink.durable() == lsns(1)[1]
    assert events == []
    # later records are rewritten in place on the descriptor kept from the first (one sector)
    real_pwrite, real_fdatasync = os.pwrite, os.fdatasync

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        events.append(f"pwrite {os.path.basename(os.readlink(f'/proc/self/fd/{fd}'))} {len(data)}@{offset}")
        return int(real_pwrite(fd, data, offset))

    def fdatasync(fd: int) -> None:
        events.append("fdatasync " + os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        real_fdatasync(fd)

    monkeypatch.setattr(os, "pwrite", pwrite)
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    feed(sink, 2)
    assert sink.durable() == lsns(2)[1]
    assert events == [
        "fsync TMP",
        "pwrite .pgrecv-state 512@0",
        "fdatasync .pgrecv-state",
        "rename TMP FINAL",
        "fsync DIR",
    ]
    monkeypatch.undo()
    sink.close()
    state = (tmp_path / ".pgrecv-state").read_bytes()
    assert len(state) == 512 and json.loads(state)["end_lsn"] == lsn_str(lsns(2)[1])


def test_dir_partial_unit_never_reaches_a_final_file(tmp_path: Path) -> None:
    sink = DirSink(tmp_path, rotate_size=1)
    sink.open()
    feed(sink, 1)
    sink.write(b"T2 0/3 lost connection\n")
    sink.discard_partial()
    sink.durable()
    feed(sink, 2)
    sink.write(b"T3 0/3 stop\n")
    sink.close()
    assert whole_transactions(read_all(tmp_path)) == [1, 2]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")] == []


def test_dir_units_without_records_move_the_position_without_a_file(tmp_path: Path) -> None:
    sink = DirSink(tmp_path)
    sink.open()
    sink.boundary(*lsns(1))  # e.g. a filtered-out non-transactional message
    assert sink.durable() == lsns(1)[1]
    assert finals(tmp_path) == []
    sink.close()
    assert finals(tmp_path) == []
    assert DirSink(tmp_path).open() == Resume(*lsns(1))


def test_dir_unit_with_an_older_commit_lsn_waits_for_a_newer_one(tmp_path: Path) -> None:
    """A ROLLBACK PREPARED carries no commit LSN newer than those already out; a file holding
    only such units would clash by name with the one before."""
    sink = DirSink(tmp_path)
    sink.open()
    feed(sink, 5)
    sink.durable()
    sink.write(b"T9 0/1 rollback prepared\n")
    sink.boundary(lsns(3)[1], lsns(5)[1] + 0x100)
    assert sink.durable() == lsns(5)[1]
    assert len(finals(tmp_path)) == 1
    feed(sink, 6)
    assert sink.durable() == lsns(6)[1]
    names = finals(tmp_path)
    assert len(names) == 2 and names[1].startswith(f"{lsns(5)[0]:016X}-{lsns(6)[0]:016X}")
    sink.close()


def test_dir_crash_in_a_child_then_resume(tmp_path: Path) -> None:
    child = run_child(
        """
        sink = DirSink(tmp, rotate_size=500)
        sink.open()
        for n in range(1, 20):
            feed(sink, n)
        assert sink.durable() is not None
        feed(sink, 20)
        sink.write(b"T21 0/3 half\\n")
        sink.tick(0.0)
        sink._bw.flush()
        os._exit(0)
        """,
        tmp_path,
    )
    assert child.returncode == 0, child.stderr
    leftovers = [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
    assert leftovers and leftovers[0].stat().st_size > 0
    sink = DirSink(tmp_path, rotate_size=500)
    resume = sink.open()
    assert resume == Resume(*lsns(19))
    assert [p for p in tmp_path.iterdir() if p.name in {q.name for q in leftovers}] == []
    assert whole_transactions(read_all(tmp_path)) == list(range(1, 20))
    feed(sink, 20)  # sent again by the server
    sink.close()
    assert whole_transactions(read_all(tmp_path)) == list(range(1, 21))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("txn"), st.integers(0, 4), st.integers(0, 400)),
            st.just(("durable",)),
            st.just(("lost",)),
            st.tuples(st.just("wait"), st.floats(0, 40)),
            st.just(("split",)),
            st.just(("hup",)),
        ),
        max_size=30,
    ),
    rotate_size=st.one_of(st.none(), st.integers(1, 2000)),
    tail=st.booleans(),
)
def test_dir_after_any_crash_final_files_hold_a_gapless_prefix(
    ops: list[tuple[Any, ...]], rotate_size: int | None, tail: bool
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        now = [0.0]
        sink = DirSink(d, rotate_size=rotate_size, rotate_interval=30, clock=lambda: now[0])
        sink.open()
        n = 0
        confirmed = 0  # highest transaction whose end durable() returned
        nonempty: set[int] = set()
        for op in ops:
            if op[0] == "txn":
                n += 1
                feed(sink, n, rows=op[1], size=op[2])  # 0 rows: a unit that wrote nothing
                if op[1]:
                    nonempty.add(n)
            elif op[0] == "durable":
                end = sink.durable()
                if end is not None:
                    confirmed = next(k for k in range(n, 0, -1) if lsns(k)[1] == end)
                    assert confirmed >= max(0, n - 1)
            elif op[0] == "lost":
                sink.write(f"T{n + 1} 0/9 cut\n".encode())
                sink.discard_partial()
            elif op[0] == "wait":
                now[0] += op[1]
                sink.tick(now[0])
            elif op[0] == "split":  # fsync interval, SIGHUP, tick inside a transaction
                n += 1
                nonempty.add(n)
                recs = txn(n, rows=3)
                sink.write(recs[0])
                sink.durable()
                sink.reopen()
                now[0] += 31
                sink.tick(now[0])
                for rec in recs[1:]:
                    sink.write(rec)
                sink.boundary(*lsns(n))
            else:
                sink.reopen()
        if tail:
            sink.write(f"T{n + 1} 0/9 tail\n".encode())
        crash(sink)
        again = DirSink(d)
        resume = again.open()
        got = whole_transactions(read_all(d))
        k = 0
        if resume.last_commit_lsn is not None:
            k = next(k for k in range(n, 0, -1) if lsns(k)[0] == resume.last_commit_lsn)
            assert resume.last_end_lsn in (None, lsns(k)[1])
        assert k >= confirmed, "a confirmed transaction must never be lost"
        assert got == [j for j in range(1, k + 1) if j in nonempty], "each transaction up to the resume point once"
        temps = [p for p in d.iterdir() if p.name.startswith(".tmp-")]
        assert temps == [again._tmp] and temps[0].stat().st_size == 0, "the crash's temporary file is gone"
        again.close()


def test_dir_resume_from_the_state_which_records_files_before_they_appear(tmp_path: Path) -> None:
    sink = DirSink(tmp_path, rotate_size=1)
    sink.open()
    for n in (1, 2):
        feed(sink, n)
    assert sink.durable() == lsns(2)[1]
    feed(sink, 3)  # finished by size, between two durable() calls: on record all the same
    crash(sink)
    again = DirSink(tmp_path)
    assert again.open() == Resume(*lsns(3))
    again.close()
    for name in finals(tmp_path):  # a consumer takes every file
        (tmp_path / name).unlink()
    (tmp_path / "unrelated.jsonl").write_text("")
    (tmp_path / "0000000000000001-0000000000000002.jsonl.bak").write_text("")
    assert DirSink(tmp_path).open() == Resume(*lsns(3))


class _Killed(BaseException):
    pass


def test_dir_crash_between_recording_a_file_and_renaming_it_publishes_it_at_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The state counts a file from before its rename: a crash between the two must not leave
    the state past what the directory holds (the next open renames the part, issue 54, M1)."""
    sink = DirSink(tmp_path)
    sink.open()
    feed(sink, 1)
    assert sink.durable() == lsns(1)[1]
    feed(sink, 2)

    def killed(src: Any, dst: Any) -> None:
        raise _Killed

    monkeypatch.setattr(os, "rename", killed)
    with pytest.raises(_Killed):
        sink.durable()
    monkeypatch.undo()
    crash(sink)
    assert len(finals(tmp_path)) == 1
    again = DirSink(tmp_path)
    assert again.open() == Resume(*lsns(2))
    assert whole_transactions(read_all(tmp_path)) == [1, 2]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")] == [again._tmp.name]  # type: ignore[union-attr]
    again.close()


def test_dir_reader_never_sees_an_incomplete_final_file(tmp_path: Path) -> None:
    d = tmp_path / "out"
    stop = threading.Event()
    checked = {"files": 0, "rounds": 0}
    problems: list[str] = []

    def reader() -> None:
        seen: dict[str, bytes] = {}
        while not stop.is_set() or checked["rounds"] == 0:
            checked["rounds"] += 1
            try:
                names = [n for n in os.listdir(d) if not n.startswith(".")]
            except FileNotFoundError:
                continue
            for name in names:
                if not FINAL.fullmatch(name):
                    problems.append(f"unexpected name {name}")
                    continue
                if name in seen:
                    continue
                try:
                    data = (d / name).read_bytes()
                    if not data:
                        raise AssertionError("empty")
                    whole_transactions(data)
                except FileNotFoundError:
                    continue
                except AssertionError as exc:
                    problems.append(f"{name}: {exc}")
                seen[name] = data
                checked["files"] += 1

    t = threading.Thread(target=reader)
    t.start()
    try:
        sink = DirSink(d, rotate_size=20000)
        sink.open()
        for n in range(1, 3000):
            feed(sink, n, rows=1 + n % 17, size=50 + n % 200)
            if n % 97 == 0:
                sink.write(txn(n + 1)[0])
                sink.durable()  # asks for a rotation while a unit is half-written
                sink.discard_partial()
        sink.close()
    finally:
        stop.set()
        t.join()
    assert problems == []
    assert checked["files"] > 10
    assert whole_transactions(read_all(d)) == list(range(1, 3000))


def test_dir_second_writer_is_refused_and_its_temp_files_are_safe(tmp_path: Path) -> None:
    first = DirSink(tmp_path)
    first.open()
    feed(first, 1)
    first._bw.flush()
    with pytest.raises(OutputError, match="in use by another process"):
        DirSink(tmp_path).open()
    first.close()
    assert whole_transactions(read_all(tmp_path)) == [1]


def test_dir_errors_name_the_path(tmp_path: Path) -> None:
    regular = tmp_path / "plain"
    regular.write_text("")
    with pytest.raises(OutputError, match=r"cannot create the output directory .*/plain/out: .*Not a directory"):
        DirSink(regular / "out").open()
    with pytest.raises(OutputError, match=r"cannot create the output directory .*/plain: .*not a directory has that"):
        DirSink(regular).open()
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / DirSink.LOCK_NAME).mkdir()  # root ignores permissions: make the lock file unopenable instead
    with pytest.raises(OutputError, match=r"cannot open the lock file .*/ro/\.pgrecv\.lock: Is a directory; .*remove"):
        DirSink(ro).open()


def test_dir_reopen_finishes_the_current_file(tmp_path: Path) -> None:
    sink = DirSink(tmp_path)
    sink.open()
    feed(sink, 1)
    sink.reopen()
    assert len(finals(tmp_path)) == 1 and sink.file_started == 1
    sink.reopen()  # nothing new: no empty file
    assert len(finals(tmp_path)) == 1 and sink.file_started == 1
    sink.close()


@settings(max_examples=40, deadline=None)
@given(steps=st.lists(st.integers(1, 2**40), min_size=1, max_size=30), size=st.integers(1, 600))
def test_dir_names_sort_in_stream_order(steps: list[int], size: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        sink = DirSink(d, rotate_size=size)
        sink.open()
        commit = 0
        for i, step in enumerate(steps):
            commit += step
            sink.write(f"T{i} 0/1 ".encode() + b"z" * (i * 37 % 300) + b"\n")
            sink.boundary(commit, commit + 1)
        sink.close()
        assert whole_transactions(read_all(Path(d))) == list(range(len(steps)))


# --- factory and hot path ----------------------------------------------------------------------


def test_make_sink_chooses_by_options(tmp_path: Path) -> None:
    assert isinstance(make_sink(None, None), StdoutSink)
    assert isinstance(make_sink("-", None), StdoutSink)
    assert isinstance(make_sink(str(tmp_path / "f"), None), FileSink)
    d = make_sink(None, str(tmp_path), 10, 5.0, ".raw")
    assert isinstance(d, DirSink) and (d.rotate_size, d.rotate_interval, d.suffix) == (10, 5.0, ".raw")
    with pytest.raises(UsageError):
        make_sink("f", str(tmp_path))
    with pytest.raises(UsageError):
        make_sink("f", None, rotate_size=10)
    with pytest.raises(UsageError):
        make_sink(None, str(tmp_path), rotate_size=0)


def test_write_is_the_buffers_own_c_method_and_survives_rotation(tmp_path: Path) -> None:
    """The runner binds ``sink.write`` once; it must stay valid across rotations and SIGHUP."""
    sink = DirSink(tmp_path, rotate_size=1)
    sink.open()
    write = sink.write
    assert type(write).__name__ == "builtin_function_or_method"
    for n in range(1, 4):
        for rec in txn(n):
            write(rec)
        sink.boundary(*lsns(n))
    write(memoryview(b"T4 0/1 from a memoryview\n"))  # type: ignore[arg-type]  # raw output passes views
    sink.boundary(*lsns(4))
    sink.close()
    assert len(finals(tmp_path)) == 4
    assert whole_transactions(read_all(tmp_path)) == [1, 2, 3, 4]


def test_big_records_pass_the_buffer(tmp_path: Path) -> None:
    sink = FileSink(tmp_path / "out")
    sink.open()
    big = b"T1 0/1 " + b"b" * (3 * BUFFER_SIZE) + b"\n"
    sink.write(big)
    sink.boundary(*lsns(1))
    sink.close()
    assert (tmp_path / "out").read_bytes() == big


# --- records that cannot be trusted (issue 11, item 2) -------------------------------------------


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (["00000000000000ff-0000000000000100.jsonl"], "does not parse"),
        (["0000000000000200-0000000000000100.jsonl"], "starts after it ends"),
        (["0000000000000001-00000000000000FF.jsonl", "0000000000000010-0000000000000020.jsonl"], "overlap"),
    ],
)
def test_dir_refuses_names_it_cannot_resume_from(tmp_path: Path, names: list[str], message: str) -> None:
    for name in names:
        (tmp_path / name).write_text("")
    with pytest.raises(OutputError, match=rf"cannot resume from {re.escape(str(tmp_path))}: .*{message}.*move"):
        DirSink(tmp_path).open()


def test_dir_accepts_ranges_that_touch_and_copies_of_one_file(tmp_path: Path) -> None:
    """pgrecv itself can publish FIRST equal to the previous LAST (a unit with an older commit LSN
    opens the next file); a backup copy under another suffix has an identical range."""
    for name in ("0000000000000001-0000000000000010.jsonl", "0000000000000010-0000000000000020.jsonl",
                 "0000000000000010-0000000000000020.jsonl.bak"):  # fmt: skip
        (tmp_path / name).write_text("")
    resume = DirSink(tmp_path).open()
    assert resume == Resume(0x20, None)
    assert resume.source == str(tmp_path / "0000000000000010-0000000000000020.jsonl")


def test_state_with_commit_after_end_is_refused(tmp_path: Path) -> None:
    (tmp_path / "out.jsonl").write_bytes(b"")
    doc = {"version": 1, "offset": 0, "commit_lsn": "0/200", "end_lsn": "0/100"}
    (tmp_path / ".out.jsonl.pgrecv-state").write_text(json.dumps(doc))
    with pytest.raises(OutputError, match=r"commit_lsn 0/200 is after end_lsn 0/100.*delete it"):
        FileSink(tmp_path / "out.jsonl").open()


@pytest.mark.parametrize("kind", ["file", "dir"])
def test_durable_reports_only_what_this_run_wrote(tmp_path: Path, kind: str) -> None:
    """What an earlier run recorded is for the runner to check against the server, never to be
    confirmed as if this run had made it durable."""

    def make() -> FileSink | DirSink:
        return FileSink(tmp_path / "out.jsonl") if kind == "file" else DirSink(tmp_path / "d")

    sink = make()
    sink.open()
    feed(sink, 1)
    assert sink.durable() == lsns(1)[1]
    sink.close()
    again = make()
    resume = again.open()
    assert resume.last_commit_lsn == lsns(1)[0] and resume.source is not None
    assert resume.furthest == lsns(1)[1]
    assert again.durable() is None
    feed(again, 2)
    assert again.durable() == lsns(2)[1]
    again.close()


# --- -f JSONL at every boundary: one fsync, the state record left to writeback ------------------


def _jsonl_units() -> list[tuple[list[Any], int, int]]:
    """Units as the streamer sees them: (events, the commit and end LSNs it gives boundary())."""
    from pgrecv import events as ev

    rel = ev.Relation(16384, "public", "t", "d", (ev.Column("id", 23, -1, "integer", True),))
    row = ev.Insert(rel, ("1",), 7)
    return [
        ([ev.Begin(0x1100, 1, 7), rel, row, ev.Commit(0, 0x1100, 0x1130, 1, 7)], 0x1100, 0x1130),
        ([ev.Message(False, 0x1200, "p", b"hello")], 0x1200, 0x1200),
        # a non-transactional message inside a transaction is no boundary of its own
        (
            [ev.Begin(0x1300, 1, 8), ev.Message(False, 0x1280, "p", b"x"), ev.Commit(0, 0x1300, 0x1330, 1, 8)],
            0x1300,
            0x1330,
        ),
        ([ev.BeginPrepare(0x1400, 0x1430, 1, 9, "g"), row, ev.Prepare(0, 0x1400, 0x1430, 1, 9, "g")], 0x1400, 0x1430),
        ([ev.CommitPrepared(0, 0x1500, 0x1530, 2, 9, "g")], 0x1500, 0x1530),
        ([ev.RollbackPrepared(0, 0x1430, 0x1630, 1, 2, 9, "g")], 0x1430, 0x1630),
        ([ev.Begin(0x1700, 1, 10), row, ev.Commit(0, 0x1700, 0x1730, 1, 10)], 0x1700, 0x1730),
    ]


def _write_units(sink: FileSink, units: list[tuple[list[Any], int, int]]) -> list[tuple[int, int, int]]:
    from pgrecv.output.jsonl import JsonlEncoder

    enc = JsonlEncoder(sink.write)
    ends = []
    for events, commit, end in units:
        for e in events:
            enc.feed(e)
        sink.boundary(commit, end)
        assert sink.durable() == end
        ends.append((sink.path.stat().st_size, commit, end))
    return ends


@pytest.mark.parametrize("cut", range(7))
def test_lagging_state_record_keeps_every_whole_unit(tmp_path: Path, cut: int) -> None:
    """A machine crash can leave the record of the first unit while the disk holds more units
    (each made durable, and so confirmed, before the crash) and half of the next: the restart
    keeps every whole unit and cuts the half one, whatever kind of unit ended last."""
    out = tmp_path / "out.jsonl"
    sink = FileSink(out, tail="jsonl")
    sink.open()
    units = _jsonl_units()
    ends = _write_units(sink, units[: cut + 1])
    sink.close()
    state = out.with_name(".out.jsonl.pgrecv-state")
    stale = {"version": 1, "offset": ends[0][0], "commit_lsn": lsn_str(ends[0][1]), "end_lsn": lsn_str(ends[0][2])}
    stale["tail"] = "jsonl"
    data = json.dumps(stale).encode()
    state.write_bytes(data + b" " * (511 - len(data)) + b"\n")
    whole = out.read_bytes()
    with out.open("ab") as f:
        f.write(b'{"v":1,"op":"begin","xid":11,"commit_lsn":"0/1800"}\n{"v":1,"op":"insert","xid":1')
    sink = FileSink(out, tail="jsonl")
    resume = sink.open()
    sink.close()
    assert out.read_bytes() == whole
    assert (resume.last_commit_lsn, resume.last_end_lsn) == ends[cut][1:]


def test_garbage_after_the_record_is_cut(tmp_path: Path) -> None:
    """What a crash leaves of writes the disk never finished (zeros) is no unit."""
    out = tmp_path / "out.jsonl"
    sink = FileSink(out, tail="jsonl")
    sink.open()
    ends = _write_units(sink, _jsonl_units()[:2])
    sink.close()
    with out.open("ab") as f:
        f.write(b"\0" * 5000 + b"\n" + b'{"v":1,"op":"commit","commit_lsn":"0/9000","end_lsn":"0/9030"}\n')
    sink = FileSink(out, tail="jsonl")
    resume = sink.open()
    sink.close()
    assert out.stat().st_size == ends[-1][0]
    assert resume.last_end_lsn == ends[-1][2]


def test_a_record_without_tail_is_not_scanned(tmp_path: Path) -> None:
    """Outside JSONL at every boundary the record is synced with the data: what follows its
    offset was never confirmed and is cut, even whole units (they come again)."""
    out = tmp_path / "out.jsonl"
    sink = FileSink(out)
    sink.open()
    ends = _write_units(sink, _jsonl_units()[:1])
    sink.close()
    with out.open("ab") as f:
        f.write(b'{"v":1,"op":"message","transactional":false,"prefix":"p","content":"x","lsn":"0/2000"}\n')
    resume = FileSink(out).open()
    assert out.stat().st_size == ends[0][0]
    assert resume.last_end_lsn == ends[0][2]


@pytest.mark.parametrize("tail", [None, "jsonl"])
def test_fsyncs_per_boundary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tail: str | None) -> None:
    """The cost that --synchronous pays per commit: one fdatasync for JSONL (the record is left to
    writeback and synced once it is a second old), two otherwise."""
    import pgrecv.output.sinks as sinks_mod

    sink = FileSink(tmp_path / "out.jsonl", tail=tail)
    sink.open()
    calls: list[int] = []
    real = os.fdatasync
    monkeypatch.setattr(sinks_mod.os, "fdatasync", lambda fd: (calls.append(fd), real(fd))[1])
    sink.write(b'{"v":1,"op":"message","transactional":false,"prefix":"p","content":"x","lsn":"0/2000"}\n')
    sink.boundary(0x2000, 0x2000)
    sink.durable()
    assert len(calls) == (1 if tail else 2)
    sink.tick(time.monotonic())
    assert len(calls) == (1 if tail else 2)  # not yet a second old
    sink.tick(time.monotonic() + 1.5)
    assert len(calls) == 2
    sink.close()
    state = json.loads((tmp_path / ".out.jsonl.pgrecv-state").read_bytes())
    assert state.get("tail") == tail and state["end_lsn"] == "0/2000"


def test_sighup_with_tail_syncs_the_record_about_the_new_file(tmp_path: Path) -> None:
    """After SIGHUP the record describes a new file: a lagging one would describe the old file
    (renamed away) and make a restart scan or cut the new file at the old file's offset."""
    out = tmp_path / "out.jsonl"
    sink = FileSink(out, tail="jsonl")
    sink.open()
    _write_units(sink, _jsonl_units()[:2])
    assert sink._state.unsynced_since is not None  # each boundary's record left to writeback
    out.rename(tmp_path / "out.jsonl.1")
    sink.reopen()
    assert sink._state.unsynced_since is None
    state = json.loads((tmp_path / ".out.jsonl.pgrecv-state").read_bytes())
    assert (state["offset"], state["tail"]) == (0, "jsonl")
    sink.close()
