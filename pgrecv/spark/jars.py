"""Delta's and Iceberg's Spark connectors: where their jars are, and what a session needs for them.

The jars are JVM libraries from Maven Central. ``jvm/pom.xml`` lists them; one command fetches
them with their dependencies into a directory (``jvm/jars`` in a checkout; the tests and
``.ci/run`` use that one)::

    mvn -q -f jvm/pom.xml dependency:copy-dependencies -DoutputDirectory="$PWD/jvm/jars"

A user passes them as Spark users do: ``--conf spark.jars=a.jar,b.jar`` (the fetched files) or
``--conf spark.jars.packages=io.delta:delta-spark_4.1_2.13:4.4.0`` (Spark's own resolver).
Delta's connector also needs its SQL extension and catalog in the session, which are fixed when
the session starts: :func:`session_conf` adds them to a session pgrecv starts when the jars are
named in its configuration (or ``--delta-engine spark`` asks for the connector); a session of
``spark-submit`` must be given them (docs/spark-apply.md).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

JARS_ENV = "PGRECV_SPARK_JARS"  # a directory of connector jars (else the checkout's jvm/jars)

DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
DELTA_CLASS = "io.delta.tables.DeltaTable"
ICEBERG_CLASS = "org.apache.iceberg.spark.SparkCatalog"
ICEBERG_PACKAGE = "org.apache.iceberg:iceberg-spark-runtime-4.1_2.13:1.12.0"
# what names Delta's Spark connector in a jar's file name or a Maven coordinate
_DELTA_MARKS = ("delta-spark", "io.delta:")


def jars_dir() -> Path:
    """The directory the connector jars were fetched into: ``$PGRECV_SPARK_JARS``, else
    ``jvm/jars`` of the checkout pgrecv runs from (which may not exist)."""
    env = os.environ.get(JARS_ENV)
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "jvm" / "jars"


def connector_jars(directory: Path | None = None) -> list[Path]:
    """The jar files of ``directory`` (default :func:`jars_dir`), in name order; [] if none."""
    d = jars_dir() if directory is None else directory
    if not d.is_dir():
        return []
    return sorted(p for p in d.iterdir() if p.name.endswith(".jar") and p.is_file())


def spark_jars(directory: Path | None = None) -> str:
    """``spark.jars``'s value for the fetched jars (comma-separated local paths); "" if none."""
    return ",".join(str(p) for p in connector_jars(directory))


def names_delta(conf: dict[str, str]) -> bool:
    """Whether a session's configuration (or ``PYSPARK_SUBMIT_ARGS``) brings Delta's Spark connector:
    a jar or package of Delta's named in ``spark.jars``, ``spark.jars.packages`` or the driver's
    class path."""
    keys = ("spark.jars", "spark.jars.packages", "spark.driver.extraClassPath")
    texts = [conf.get(k, "") for k in keys] + [os.environ.get("PYSPARK_SUBMIT_ARGS", "")]
    return any(mark in text for text in texts for mark in _DELTA_MARKS)


def session_conf(conf: dict[str, str], fmt: str, engine: str) -> dict[str, str]:
    """``conf`` with what Delta's connector needs of a session pgrecv starts (its SQL extension
    added to ``spark.sql.extensions``, its catalog as ``spark_catalog`` unless another is set),
    when the run writes Delta and the connector is asked for or named in ``conf``. Otherwise
    ``conf`` as it is: the extension without the jars would fail the session's catalog. (Not for
    a session already active, spark-submit's: its static configuration is fixed.)"""
    if fmt != "delta" or engine == "delta-rs" or (engine != "spark" and not names_delta(conf)):
        return conf
    out = dict(conf)
    extensions = [e.strip() for e in out.get("spark.sql.extensions", "").split(",") if e.strip()]
    if DELTA_EXTENSION not in extensions:
        out["spark.sql.extensions"] = ",".join([*extensions, DELTA_EXTENSION])
    out.setdefault("spark.sql.catalog.spark_catalog", DELTA_CATALOG)
    return out


def loads_class(spark: Any, name: str) -> bool:
    """Whether the session's JVM loads class ``name`` through the context class loader, where
    ``spark.jars`` are (``Class.forName(name)`` alone asks the application class loader, which
    does not see them)."""
    jvm = spark.sparkContext._jvm
    try:
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName(name, False, loader)
    except Exception:
        return False
    return True


def delta_session(spark: Any) -> bool:
    """Whether Delta's Spark connector can write in this session: its classes load, and its SQL
    extension and catalog are configured (Delta refuses every write without them)."""
    from pgrecv.spark.sparkops import is_connect

    if not is_connect(spark) and not loads_class(spark, DELTA_CLASS):  # (a server's extension loads them)
        return False
    extensions = spark.conf.get("spark.sql.extensions", "") or ""
    catalog = spark.conf.get("spark.sql.catalog.spark_catalog", "") or ""
    return DELTA_EXTENSION in [e.strip() for e in extensions.split(",")] and catalog == DELTA_CATALOG


def iceberg_session(spark: Any) -> bool:
    """Whether Iceberg's Spark runtime is in this session (its catalog class loads). It needs
    no SQL extension for what pgrecv does (MERGE INTO is Spark's own since 3.x). A Spark Connect
    session has no JVM here to ask: a throwaway catalog of Iceberg's class is listed instead
    (loading it fails without the runtime; an in-memory catalog makes nothing)."""
    from pgrecv.spark.sparkops import is_connect

    if not is_connect(spark):
        return loads_class(spark, ICEBERG_CLASS)
    import secrets

    name = f"pgrecv_probe_{secrets.token_hex(4)}"
    impl = f"spark.sql.catalog.{name}.catalog-impl"
    spark.conf.set(f"spark.sql.catalog.{name}", ICEBERG_CLASS)
    spark.conf.set(impl, "org.apache.iceberg.inmemory.InMemoryCatalog")
    try:
        spark.sql(f"SHOW NAMESPACES IN {name}").collect()
    except Exception:
        return False
    finally:
        spark.conf.unset(f"spark.sql.catalog.{name}")
        spark.conf.unset(impl)
    return True
