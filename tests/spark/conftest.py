"""One real local SparkSession for the whole test session (local[2], quiet, small shuffles)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark", reason="pip install 'pgrecv[spark]'")
    from pgrecv.spark.sparkops import start_session

    session = start_session("local[2]", {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"})
    yield session
    session.stop()
