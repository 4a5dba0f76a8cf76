"""The target's lock and state on an object store (pgrecv/spark/targets.py), against a real S3
server on 127.0.0.1 (moto's, which implements S3's conditional writes) and a real Cloud Storage
emulator (fake-gcs-server, which implements ``ifGenerationMatch`` on uploads)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from pgrecv.errors import OutputError
from pgrecv.spark import ledger
from pgrecv.spark.stores import StorePath, filesystem_for
from pgrecv.spark.targets import StoreTarget
from tests.conftest import S3Server

HOLD = (
    "import sys\n"
    "from pgrecv.spark.targets import StoreTarget\n"
    "with StoreTarget.of(sys.argv[1]).lock():\n"
    "    print('held', flush=True)\n"
    "    sys.stdin.read()\n"
)


@pytest.fixture(params=["s3", "gs"])
def target(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> StoreTarget:
    server = request.getfixturevalue("s3_server" if request.param == "s3" else "gcs_server")
    for k, v in server.env.items():
        monkeypatch.setenv(k, v)
    return StoreTarget.of(f"{request.param}://{server.bucket()}/lake")


def _holder(target: StoreTarget) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(target)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=os.environ
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"held\n"
    return proc


def _lock_object(target: StoreTarget) -> dict[str, Any] | None:
    got = target.read_state("lock")
    return None if got is None else json.loads(got)


def test_a_held_lock_refuses_a_second_run_and_its_end_frees_it(target: StoreTarget) -> None:
    holder = _holder(target)
    try:
        busy = rf"another spark-apply run is applying.*process {holder.pid} on"
        with pytest.raises(OutputError, match=busy), target.lock():
            pass
    finally:
        holder.communicate(b"")
    assert holder.returncode == 0
    assert _lock_object(target) is None  # deleted at its end
    with target.lock():
        assert _lock_object(target)["pid"] == os.getpid()  # type: ignore[index]
    assert _lock_object(target) is None


def test_a_killed_holder_on_this_machine_is_taken_over_at_once(target: StoreTarget) -> None:
    holder = _holder(target)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    assert _lock_object(target)["pid"] == holder.pid  # type: ignore[index]  # left behind
    started = time.monotonic()
    with target.lock():
        assert _lock_object(target)["pid"] == os.getpid()  # type: ignore[index]
    assert time.monotonic() - started < 10  # not the lease's 60 s


def test_another_machines_lock_holds_until_its_lease_runs_out_by_the_stores_clock(target: StoreTarget) -> None:
    other = {"v": 1, "run": "x", "host": "some-other-host", "boot": "b", "pid": 1, "started": "1", "lease": 4}
    target.write_state("lock", json.dumps(other).encode(), what="a test's lock")
    with (
        pytest.raises(
            OutputError, match=r"held by process 1 on some-other-host \(if that run died, the lock is free in [0-4] s\)"
        ),
        target.lock(),
    ):
        pass
    time.sleep(5.5)
    with target.lock():
        assert _lock_object(target)["host"] != "some-other-host"  # type: ignore[index]


def test_a_run_whose_lock_was_taken_over_stops_before_its_next_commit(
    target: StoreTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGRECV_LOCK_LEASE_SECONDS", "4")  # renewed every second
    with target.lock() as held:
        held.check()
        time.sleep(1.5)
        held.check()  # renewed: still ours
        # another run takes it over (as one does after a stall longer than the lease)
        target.write_state("lock", b'{"v": 1, "host": "elsewhere", "pid": 2}', what="a test's lock")
        time.sleep(2)
        with pytest.raises(
            OutputError, match=r"lost the target's lock \(another run took it over\).*run spark-apply again"
        ):
            held.check()
    # the run that took it keeps it: the loser does not delete it
    assert _lock_object(target)["host"] == "elsewhere"  # type: ignore[index]


def test_the_record_of_what_was_applied_lives_on_the_store(target: StoreTarget) -> None:
    options = {"tables": [], "mode": "latest", "append_only": False, "keys": [], "format": "delta"}
    assert ledger.load(target, options) is None
    record = ledger.Ledger(
        options=options, through={"s3://b/changes": 0x1_0000_0010}, tables={"public.t": ("public.t", 5)}
    )
    ledger.save(target, record)
    assert ledger.load(target, options) == record
    assert ledger.load(target, {**options, "mode": "history"}) is None


@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_an_unreachable_store_is_one_line_naming_the_lock(
    monkeypatch: pytest.MonkeyPatch, s3_server: S3Server, scheme: str
) -> None:
    for k, v in s3_server.env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")
    monkeypatch.setenv("PGRECV_GCS_RETRY_SECONDS", "1")
    target = StoreTarget.of(f"{scheme}://no-such-bucket/lake")
    with pytest.raises(OutputError) as err, target.lock():
        pass
    text = str(err.value)
    assert text.startswith(f"cannot read the target's lock {scheme}://no-such-bucket/lake/_pgrecv/lock: "), text
    assert ("AWS_ENDPOINT_URL" if scheme == "s3" else "the store's endpoint") in text
    assert "\n" not in text and "pgrecv-test-secret" not in text


def test_the_lock_sweeps_what_killed_runs_left(target: StoreTarget) -> None:
    """Staged input and a half-made carried file of a killed run go when the next run takes the
    lock; the record and the carried transactions stay."""
    left = [
        "_pgrecv/stage-1/part-0.parquet",
        "_pgrecv/stage-1-changes/_tid=0/x.parquet",
        "_pgrecv/prepared/.tmp-2/part-0",
    ]
    kept = ["_pgrecv/applied.json", "_pgrecv/prepared/3.jsonl", "public.t/_delta_log/00000000000000000000.json"]
    for k in left + kept:
        target.objects.write(k, b"x")
    with target.lock():
        pass
    lake = StorePath.of(str(target), filesystem_for(str(target), {}, {}))
    assert sorted(p.key[len("lake/") :] for p in lake.rglob("*")) == sorted(kept)


@pytest.mark.parametrize(
    ("raw", "want"),
    [(None, 60.0), ("", 60.0), ("7.5", 7.5), ("1", 4.0), ("soon", 60.0)],
    ids=["unset", "empty", "set", "below-the-least", "not-a-number"],
)
def test_durations_from_the_environment(monkeypatch: pytest.MonkeyPatch, raw: str | None, want: float) -> None:
    """The lease (and the Cloud Storage retry limit, read the same way): a number at least the
    least, else the default, never an error from a stray value."""
    from pgrecv.spark.targets import lease_seconds

    if raw is None:
        monkeypatch.delenv("PGRECV_LOCK_LEASE_SECONDS", raising=False)
    else:
        monkeypatch.setenv("PGRECV_LOCK_LEASE_SECONDS", raw)
    assert lease_seconds() == want
