"""Values the target type cannot hold (``--bad-values``), and changes that cannot name their row:
per table, reported with file:line, column and value (the table is held back), or stored as NULL
or text and counted."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import pyarrow as pa

from pgrecv.errors import InputError
from pgrecv.spark.files import find_line
from pgrecv.spark.replay import committed as rp
from pgrecv.spark.replay import events as rev
from pgrecv.spark.schema import ColumnType, TablePlan

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from pgrecv.spark.model import ApplyConfig, TableResult
    from pgrecv.spark.tables import Table


SAMPLE = 5  # poison values named per table


def typed_rows(rows: DataFrame, plan: TablePlan) -> DataFrame:
    """Rows whose values ``v`` are JSON texts, with ``tv`` (typed values) and ``ok`` (whether each
    value fits its type: a value that does not is NULL in ``tv``) and ``raw`` (the texts)."""
    from pyspark.sql import functions as F

    names = list(plan.columns)
    values, oks = rev.typed({n: F.col("v")[n] for n in names}, plan)
    return rows.select(
        *[c for c in rows.columns if c not in ("tv", "ok", "raw")],
        F.struct(*[values[n].alias(n) for n in names]).alias("tv"),
        F.struct(*[oks[n].alias(n) for n in names]).alias("ok"),
        F.col("v").alias("raw"),
    )


def apply_policy(
    rows: DataFrame, plan: TablePlan, target: Table, config: ApplyConfig, result: TableResult
) -> tuple[DataFrame, TablePlan]:
    """Values the target type cannot hold, by ``--bad-values``: ``fail`` holds the table back
    (the first few named), ``null`` stores NULL, ``text`` makes the column a string column holding
    the value's text (only where the column is new). Key values are never changed: they fail.
    Every value changed is counted. Returns the rows (``tv`` updated) and the plan."""
    from pyspark.sql import functions as F

    names = list(plan.columns)
    policy = config.bad_values
    if policy == "fail":
        check_values(rows, plan, names)
        return rows, plan
    counts = rows.agg(*[F.count(F.when(~F.col("ok")[n], 1)).alias(n) for n in names]).first()
    assert counts is not None
    bad = {n: int(counts[n]) for n in names if counts[n]}
    if not bad:
        return rows, plan
    keys = [n for n in bad if n in plan.key_cols]
    if keys:  # a key must stay exact: the row could not be found again
        check_values(rows.where(~all_ok(keys)), plan, keys, note="key values are never changed by --bad-values")
    if policy == "text":
        typed_in_target = [
            n
            for n in bad
            if target.schema is not None
            and n in target.schema.names
            and not pa.types.is_string(target.schema.field(n).type)
        ]
        if typed_in_target and target.schema is not None:
            n = typed_in_target[0]
            check_values(
                rows.where(~F.col("ok")[n]),
                plan,
                [n],
                note=f"--bad-values text cannot turn the existing {target.schema.field(n).type} column {n} into "
                "text: use --bad-values null, or re-create the table",
            )
        columns = dict(plan.columns)
        for n in bad:
            ct = columns[n]
            columns[n] = ColumnType(ct.pg_type, pa.string(), ct.is_json)
        plan = replace(plan, columns=columns)
        rows = typed_rows(rows, plan)
    result.values_changed += sum(bad.values())
    result.changed_columns = sorted(bad)
    return rows, plan


def all_ok(names: list[str]) -> Column:
    from pyspark.sql import functions as F

    return rp.all_of([F.col("ok")[n] for n in names])


def check_values(rows: DataFrame, plan: TablePlan, names: list[str], note: str = "") -> None:
    """Values the target type cannot hold: the table is held back, the first few named."""
    from pyspark.sql import functions as F

    bad_any = F.lit(False)
    for n in names:
        bad_any = bad_any | ~F.col("ok")[n]
    bad = rows.where(bad_any).select("ok", "raw", "_path", "lsn").limit(SAMPLE).collect()
    if not bad:
        return
    r = bad[0]
    col = next(n for n in names if not r["ok"][n])
    value = r["raw"][col]
    ct = plan.columns[col]
    where = find_line(r["_path"], {"lsn": r["lsn"], "table": plan.table})
    more = f" (and {len(bad) - 1}+ more)" if len(bad) > 1 else ""
    raise InputError(
        f"{where}: value {value!r} of column {col} ({ct.pg_type}) cannot be stored as {ct.arrow}{more}: "
        + (note or "the table is held back; --bad-values null or text stores it (see docs/spark-apply.md)")
    )


def no_identity(rows: DataFrame) -> None:
    """A change without the row image that identifies its row: the table is held back."""
    problem = rows.where("_problem IS NOT NULL").select("_problem", "op", "_path", "lsn").limit(1).collect()
    if problem:
        p = problem[0]
        where = find_line(p["_path"], {"op": p["op"], "lsn": p["lsn"]})
        if p["_problem"] in (rp.NOT_OBJECT, rp.CLASH) or p["_problem"].startswith(rp.NO_KEY):
            raise InputError(f"{where}: {p['op']} {p['_problem']}: the file is corrupt")
        raise InputError(
            f"{where}: {p['op']} {p['_problem']}: cannot identify the row; "
            "give the table a primary key or REPLICA IDENTITY FULL"
        )
