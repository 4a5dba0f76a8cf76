"""The oracle: spark-apply's older replay, in this process, for the tests only.

It reads the change files line by line in the driver (:mod:`.read`), replays each table's changes
in Python (:mod:`.reduce`), converts values one by one (:mod:`.convert`) and writes through the
product's table classes (:mod:`.writers`). It shares no replay rule with the Spark replay, which
is what makes it an oracle: the differential and PostgreSQL-truth tests compare the two, history
mode's version chains included.

:func:`run_apply` takes the product's arguments and a config with ``replay``: "spark" runs
pgrecv's own replay, "driver" this one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pgrecv.spark import apply as product
from pgrecv.spark import model
from pgrecv.spark.model import Progress, Summary, Tuning


@dataclass
class ApplyConfig(model.ApplyConfig):
    """The product's config, and which replay applies it."""

    replay: Literal["spark", "driver"] = "spark"


def run_apply(
    config: model.ApplyConfig,
    spark: Any = None,
    progress: Progress | None = None,
    after_table: Callable[[str], None] | None = None,
    tuning: Tuning | None = None,
) -> Summary:
    """pgrecv's run_apply, or the oracle's replay for a config with ``replay="driver"``."""
    if getattr(config, "replay", "spark") == "driver":
        from tests.spark.oracle.apply import run

        return run(config, spark, progress, after_table)
    return product.run_apply(config, spark, progress, after_table, tuning)
