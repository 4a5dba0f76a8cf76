"""The old replay's table targets against real tables (delta-rs; no Spark needed)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from tests.spark.oracle.writers import OracleDelta as DeltaRsTarget

deltalake = pytest.importorskip("deltalake")


def test_lookup_after_a_delta_rs_merge(tmp_path: Path) -> None:
    """After a delta-rs MERGE (how the old replay writes), Arrow cannot push a string key filter
    down to the table's files ("no kernel matching input types (string, string_view)"): the
    lookup still finds the rows."""
    schema = pa.schema([("k", pa.string()), ("v", pa.int64())])
    path = tmp_path / "t"
    deltalake.DeltaTable.create(str(path), schema=schema)
    deltalake.write_deltalake(str(path), pa.table({"k": ["a", "b", "c"], "v": [1, 2, 3]}, schema=schema), mode="append")
    src = pa.table({"k": ["b", "d"], "v": [20, 40]}, schema=schema)
    (
        deltalake.DeltaTable(str(path))
        .merge(src, "t.k = s.k", source_alias="s", target_alias="t")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute()
    )
    target = DeltaRsTarget(path, "pgrecv:s.t", None)
    target.open()
    found = target.lookup(["k"], [("b",), ("d",), ("x",)], ["v"], history=False)
    assert found == {("b",): {"k": "b", "v": 20}, ("d",): {"k": "d", "v": 40}}
