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
