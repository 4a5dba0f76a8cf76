"""spark-apply's file modes (issue 11, item 11): the carry-over of prepared transactions holds raw
change data, so it is this user's only (0700 directory, 0600 files), whatever the umask; table files
follow the umask, since other readers of the lake need them."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import orjson
import pytest

from pgrecv.spark.model import table_dir_name
from tests.spark.oracle import ApplyConfig, run_apply

pytest.importorskip("deltalake")

LINES = [
    {
        "op": "relation",
        "schema": "public",
        "table": "t",
        "replica_identity": "default",
        "key": ["id"],
        "columns": [{"name": "id", "type": "integer", "typmod": -1, "key": True}],
    },
    {"op": "begin", "xid": 1, "commit_lsn": "0/100", "commit_time": None},
    {
        "op": "insert",
        "schema": "public",
        "table": "t",
        "xid": 1,
        "commit_lsn": "0/100",
        "lsn": "0/90",
        "key": ["id"],
        "new": {"id": 1},
        "unchanged_toast": [],
    },
    {"op": "commit", "xid": 1, "commit_lsn": "0/100", "end_lsn": "0/101", "commit_time": None},
    {"op": "begin_prepare", "xid": 2, "gid": "g", "prepare_lsn": "0/200", "end_lsn": "0/201", "prepare_time": None},
    {
        "op": "insert",
        "schema": "public",
        "table": "t",
        "xid": 2,
        "commit_lsn": None,
        "gid": "g",
        "prepare_lsn": "0/200",
        "lsn": "0/190",
        "key": ["id"],
        "new": {"id": 2},
        "unchanged_toast": [],
    },
    {"op": "prepare", "xid": 2, "gid": "g", "prepare_lsn": "0/200", "end_lsn": "0/201", "prepare_time": None},
]


def _modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in root.rglob("*") if not p.is_symlink()}


@pytest.mark.parametrize("replay", ["driver", "spark"])
def test_carry_over_is_private_and_tables_follow_the_umask(tmp_path: Path, spark: Any, replay: str) -> None:
    src = tmp_path / "a.jsonl"
    src.write_bytes(b"".join(orjson.dumps({"v": 1, **r}) + b"\n" for r in LINES))
    target = tmp_path / "lake"
    old = os.umask(0o022)
    try:
        summary = run_apply(
            ApplyConfig((str(src),), target, fmt="delta", engine="delta-rs", replay=replay), spark=spark
        )
    finally:
        os.umask(old)
    assert summary.pending_prepared == 1
    carried = target / "_pgrecv" / "prepared"
    assert stat.S_IMODE(carried.stat().st_mode) == 0o700
    files = list(carried.iterdir())
    assert files and all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files), _modes(carried)
    table = target / table_dir_name("public", "t")
    log = next((table / "_delta_log").glob("*.json"))
    assert stat.S_IMODE(log.stat().st_mode) & 0o044 == 0o044  # readable by others, as the umask allows


def test_a_state_directory_that_is_a_link_or_anothers_is_refused(tmp_path: Path, spark: Any) -> None:
    """TARGET/_pgrecv holds the lock and staged change data: a symbolic link there (planted in a
    shared target) was followed, its chmod and lock landing in the directory it names (issue 54,
    L6). Refused in one line, exit 8, and nothing made there; a directory of another user too."""
    from pgrecv.errors import OutputError
    from pgrecv.spark.apply import run_apply as prun_apply
    from pgrecv.spark.model import ApplyConfig as PConfig

    src = tmp_path / "a.jsonl"
    src.write_text("")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    target = tmp_path / "lake"
    target.mkdir()
    (target / "_pgrecv").symlink_to(elsewhere)
    with pytest.raises(OutputError) as exc:
        prun_apply(PConfig((str(src),), target, fmt="parquet"), spark=spark)
    assert exc.value.message == (
        f"{target / '_pgrecv'} is a symbolic link: spark-apply keeps the target's lock and change data there, "
        "in a directory of its own; remove the link"
    )
    assert list(elsewhere.iterdir()) == [] and stat.S_IMODE(elsewhere.stat().st_mode) == 0o755
    if os.geteuid() == 0:  # a directory of another user (as root, made so by chown)
        (target / "_pgrecv").unlink()
        (target / "_pgrecv").mkdir()
        os.chown(target / "_pgrecv", 1, 1)
        with pytest.raises(OutputError, match=r"_pgrecv belongs to another user \(uid 1\)"):
            prun_apply(PConfig((str(src),), target, fmt="parquet"), spark=spark)
        assert list((target / "_pgrecv").iterdir()) == []
