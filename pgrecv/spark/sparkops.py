"""The SparkSession and Arrow ↔ Spark frames (imported only when Spark is used)."""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import re
import secrets
import shutil
import sys
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from pgrecv.errors import SparkStartError, UsageError
from pgrecv.spark.schema import quoted, spark_ddl

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType


QUIET_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.delta.name = io.delta
logger.delta.level = error
"""

DEFAULT_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # PySpark 4 wraps every DataFrame and function call to record its Python call site in the JVM
    # (a failed IPython import, a stack walk and about six py4j round trips each). A table's plan
    # takes some 1,700 such calls: off, a run over 16 small tables took 19.1 s instead of 21.1 s.
    # It only adds the Python line to Spark's own error context; pgrecv reports its own errors.
    "spark.python.sql.dataFrameDebugging.enabled": "false",
    # The driver keeps every finished job, stage and SQL execution for the UI and status APIs
    # (1,000 of each by default) even with the UI off, each execution with its plan's metrics,
    # and pgrecv reads none of them: ten runs in one session (the differential test's, six
    # tables each) left 157 MB live in the driver's heap with Spark's limits, 90 MB with these.
    "spark.ui.retainedJobs": "50",
    "spark.ui.retainedStages": "50",
    "spark.sql.ui.retainedExecutions": "20",
    # Spark keeps the classes it compiles for generated code in a cache of 100 (a static setting,
    # so only where pgrecv launches the JVM). One run of many tables compiles the same code for
    # each table of a shape and evicted it before the next: 20 tables in a cold process took 10%
    # less CPU with 5,000, and a session serving run after run (the tests') compiled 26-151
    # classes a run instead of 556-701 (bench/NOTES.md, 2026-12-07). Same source, same class:
    # only the time changes.
    "spark.sql.codegen.cache.maxEntries": "5000",
}

# JDK 17's default collector, G1, takes much of a short batch job's time on a driver of a few
# cores: the parallel collector ran bench/spark_apply.py's 1M events in 12.9-15.6 s against
# 18.4-24.3 s (bench/NOTES.md, 2026-12-02). It goes in spark.driver.defaultJavaOptions (the options
# Spark puts before the user's spark.driver.extraJavaOptions) when pgrecv launches the JVM with
# a configuration of its own, and only if nothing else names a collector: two stop the JVM.
DRIVER_GC = "-XX:+UseParallelGC"
_GC_CHOICE = re.compile(r"-XX:[+-]Use\w*GC\b")
# where else a JVM's or the launcher's options may come from
_JAVA_OPTION_VARS = (
    "JAVA_TOOL_OPTIONS",
    "JDK_JAVA_OPTIONS",
    "_JAVA_OPTIONS",
    "SPARK_SUBMIT_OPTS",
    "PYSPARK_SUBMIT_ARGS",
)


def driver_defaults(conf: dict[str, str]) -> dict[str, str]:
    """The driver JVM's options pgrecv adds to ``conf`` (see :data:`DRIVER_GC`)."""
    if "spark.driver.defaultJavaOptions" in conf:
        return {}
    given = [conf.get("spark.driver.extraJavaOptions", "")] + [os.environ.get(v, "") for v in _JAVA_OPTION_VARS]
    if any(_GC_CHOICE.search(s) for s in given):
        return {}
    return {"spark.driver.defaultJavaOptions": DRIVER_GC}


_BYTE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "g": 1 << 30, "gb": 1 << 30}
_BYTE_UNITS |= {"t": 1 << 40, "tb": 1 << 40, "p": 1 << 50, "pb": 1 << 50}


def byte_conf(spark: SparkSession, key: str) -> int | None:
    """A size from the session's conf, in Spark's spelling (``134217728b``, ``128m``, ``1g``);
    None when it is not set or not one."""
    try:
        value = spark.conf.get(key)  # (with a default given, Spark's own default is not read)
    except Exception:  # not set, and no default
        return None
    m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", value or "")
    unit = _BYTE_UNITS.get(m.group(2).lower()) if m else None
    return int(m.group(1)) * unit if m and unit else None


def spark_schema(schema: pa.Schema) -> StructType:
    from pyspark.sql.types import StructType, _parse_datatype_string

    ddl = ", ".join(f"{quoted(f.name)} {spark_ddl(f.type)}" for f in schema)
    parsed = _parse_datatype_string(f"struct<{ddl}>") if ddl else StructType([])
    assert isinstance(parsed, StructType)
    return parsed


def frame(spark: SparkSession, table: pa.Table) -> DataFrame:
    """A Spark DataFrame of an Arrow table, with the Spark types of our mapping (timestamp_ntz…)."""
    return spark.createDataFrame(table, schema=spark_schema(table.schema))


def empty_frame(spark: SparkSession, schema: pa.Schema) -> DataFrame:
    return spark.createDataFrame([], schema=spark_schema(schema))


def keys_frame(spark: SparkSession, key_cols: list[str], keys: list[tuple[Any, ...]], schema: Any) -> DataFrame:
    from pyspark.sql.types import StructType

    sub = StructType([schema[c] for c in key_cols])
    return spark.createDataFrame([list(k) for k in keys], schema=sub)


@contextlib.contextmanager
def _jvm_output_to(fd: int | None) -> Iterator[None]:
    """The JVM launcher prints banners on fd 2, and the JVM keeps whatever fds 1 and 2 are at
    launch: both go to ``fd`` (None: fd 1 goes where fd 2 goes). Never to pgrecv's stdout, which
    carries its output (--json, rows): the JVM prints its own warnings there (JDK 17's unified
    logging, such as ``[12.3s][warning][codecache] CodeCache is full``), and one such line
    broke a --json summary in a test run."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    os.dup2(saved[1] if fd is None else fd, 1)
    if fd is not None:
        os.dup2(fd, 2)
    try:
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def _launch(builder: SparkSession.Builder, quiet: bool, master: str) -> SparkSession:
    """``builder.getOrCreate()``, the launcher's banners and the JVM's stdout and stderr sent to
    /dev/null (quiet; else its stdout to stderr). A launch that fails said why only there: it is
    tried once more with its output kept in an unnamed temporary file (a second or two, on failure
    only; a JVM that starts this time keeps that file as its stdout and stderr), and the reason
    goes into one line."""
    if not quiet:
        try:
            with _jvm_output_to(None):
                return builder.getOrCreate()
        except Exception as exc:  # its reason is on the user's stderr already
            raise _not_started(master, launch_reason("", exc)) from None
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        with _jvm_output_to(devnull):
            return builder.getOrCreate()
    except Exception:
        pass  # tried again below, its words kept
    finally:
        os.close(devnull)
    with tempfile.TemporaryFile() as printed:
        try:
            with _jvm_output_to(printed.fileno()):
                return builder.getOrCreate()
        except Exception as exc:
            printed.seek(0)
            raise _not_started(master, launch_reason(printed.read().decode(errors="replace"), exc)) from None


def _not_started(master: str, reason: str) -> SparkStartError:
    return SparkStartError(
        f"Spark did not start (master {master}): {reason}; check --master, --conf and that Java (17 or newer) "
        "is installed"
    )


_JVM_ERROR = re.compile(r"[\w.$]*(?:Exception|Error)(?::| in thread \S+ [\w.$]+:) (.+)")
_SPARK_CLASS = re.compile(r"^\S*spark-class: line \d+: ")
# what the launcher prints whatever went wrong (or right): never the reason
_JVM_NOISE = (
    "WARNING:",
    "Using Spark's default log4j",
    "Error: Could not create the Java Virtual Machine",
    "Error: A fatal exception has occurred",
)


def launch_reason(printed: str, exc: BaseException) -> str:
    """Why Spark did not start, in one line: the message of the last exception the JVM printed
    (its stack frames left out), else the last other line it printed, else pyspark's own error."""
    lines = [
        _SPARK_CLASS.sub("", ln.strip())  # the launcher script's place in itself says nothing
        for ln in printed.splitlines()
        if ln.strip()
        and not ln.startswith(("\t", " ", *_JVM_NOISE))
        and " WARN " not in ln
        and not ln.rstrip().endswith("CMD: bad array subscript")  # spark-class after a java that did not run
    ]
    for line in reversed(lines):
        m = _JVM_ERROR.search(line)
        if m:
            return m.group(1)
    if lines:
        return lines[-1]
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


_own_conf_dir: str | None = None  # the directory _private_conf_dir made for this process


def _private_conf_dir() -> str:
    """A Spark config directory only this process can have made: Spark's launcher sources
    ``spark-env.sh`` from it, so a name another user could create first would run their code as
    ours. ``mkdtemp`` makes it 0700 under an unpredictable name; it goes when the process exits
    (the JVM reads it once, at launch)."""
    conf_dir = tempfile.mkdtemp(prefix="pgrecv-spark-conf-")
    atexit.register(shutil.rmtree, conf_dir, True)
    fd = os.open(
        os.path.join(conf_dir, "log4j2.properties"),
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
        0o600,
    )
    with os.fdopen(fd, "w") as f:
        f.write(QUIET_LOG4J2)
    return conf_dir


def private_defaults(master: str | None, conf: dict[str, str]) -> dict[str, str]:
    """What keeps a local session's change data to this user (unless ``conf`` says otherwise):
    Spark's scratch space (shuffle and spilled blocks hold row values; Spark makes them 0755 and
    0644 under /tmp by default) in a 0700 directory of an unpredictable name, removed at exit;
    and the driver's RPC authenticated with a random secret. A cluster's executors have their
    own scratch space and would need the secret too: there both are the cluster's settings. So are
    they under spark-submit (its JVM, its ``--master``, which may be a cluster's): a secret set
    here would make its driver speak SASL to a master that expects none."""
    if master is None and "PYSPARK_GATEWAY_PORT" in os.environ:
        return {}
    if master is not None and not master.startswith("local"):
        return {}
    out: dict[str, str] = {}
    if "spark.local.dir" not in conf and "SPARK_LOCAL_DIRS" not in os.environ:
        scratch = tempfile.mkdtemp(prefix="pgrecv-spark-scratch-")
        atexit.register(shutil.rmtree, scratch, True)
        out["spark.local.dir"] = scratch
    if "spark.authenticate" not in conf:
        out["spark.authenticate"] = "true"
        out["spark.authenticate.secret"] = secrets.token_hex(32)
    return out


def start_session(
    master: str | None, conf: dict[str, str], quiet: bool = True, remote: str | None = None
) -> SparkSession:
    """A SparkSession: one of the Spark Connect server ``remote``, the active one (spark-submit),
    else a new one with quiet defaults."""
    from pyspark.sql import SparkSession

    if remote is not None:
        return connect_session(remote, conf)
    active = SparkSession.getActiveSession()
    if active is not None:
        for k, v in conf.items():
            active.conf.set(k, v)
        return active
    global _own_conf_dir
    if quiet and "SPARK_CONF_DIR" not in os.environ:
        _own_conf_dir = os.environ["SPARK_CONF_DIR"] = _private_conf_dir()
    # pgrecv launches the JVM, and no configuration directory of the user's (whose
    # spark-defaults.conf may name a collector) is in use
    own = os.environ.get("SPARK_CONF_DIR") in (None, _own_conf_dir) and "PYSPARK_GATEWAY_PORT" not in os.environ
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1") if master is None or master.startswith("local") else None
    builder = SparkSession.builder.appName("pgrecv spark-apply")
    if master or "PYSPARK_GATEWAY_PORT" not in os.environ:  # set: spark-submit's JVM, with its --master
        builder = builder.master(master or "local[*]")
    # The executors' Python runs pgrecv's Arrow UDF (json columns): by default the driver's own
    # interpreter, where pgrecv and pyarrow are installed (a cluster elsewhere sets its own).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    private = private_defaults(master, conf)
    for k, v in {**DEFAULT_CONF, **(driver_defaults(conf) if own else {}), **private, **conf}.items():
        builder = builder.config(k, v)
    spark = _launch(builder, quiet, master or "local[*]")
    spark.sparkContext.setLogLevel("ERROR")
    return spark


# what pgrecv sets in a Spark Connect session (a server's static configuration is its own)
CONNECT_CONF = {k: DEFAULT_CONF[k] for k in ("spark.sql.session.timeZone", "spark.sql.parquet.outputTimestampType")}


def connect_session(remote: str, conf: dict[str, str]) -> SparkSession:
    """A session on the Spark Connect server ``remote``, with ``conf`` set in it: runtime settings
    only (a static one, such as ``spark.jars``, is the server's: refused in one line)."""
    from pyspark.sql import SparkSession

    try:
        import pyspark.sql.connect.session  # noqa: F401 - its dependencies, checked before anything starts
    except ImportError as exc:
        raise UsageError(
            f"--remote {remote}: Spark Connect's client needs pyspark's connect extras ({exc.name} is missing): "
            "pip install 'pgrecv[connect]'"
        ) from None
    _reachable(remote)
    try:
        # PySpark's own builder (not the client class's): it also switches pyspark.sql.functions to
        # Spark Connect's implementations for this process
        spark = SparkSession.builder.remote(remote).getOrCreate()
        spark.conf.set(*next(iter(CONNECT_CONF.items())))  # the first call that reaches the server
    except Exception as exc:
        raise SparkStartError(
            f"Spark Connect at {remote} did not answer ({_first_line(exc)}): check --remote and that the server runs"
        ) from None
    for k, v in {**CONNECT_CONF, **conf}.items():
        try:
            spark.conf.set(k, v)
        except Exception as exc:
            raise UsageError(
                f"--conf {k}: the Spark Connect server does not let a session set it ({_first_line(exc)}): "
                "set it where the server starts"
            ) from None
    return spark


def _reachable(remote: str) -> None:
    """Something listens at the URL's host and port: the client would otherwise retry for
    minutes before it says that nothing answers."""
    import socket
    from urllib.parse import urlsplit

    where = urlsplit(remote.replace("sc://", "http://", 1))
    try:
        with socket.create_connection((where.hostname or "localhost", where.port or 15002), timeout=10):
            pass
    except (OSError, ValueError) as exc:
        raise SparkStartError(
            f"Spark Connect at {remote}: nothing answers there ({_first_line(exc)}): check --remote and that "
            "the server runs"
        ) from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def exception_line(exc: BaseException) -> str:
    """An exception's kind and the first line of its text (at most 300 characters)."""
    return f"{type(exc).__name__}: {_first_line(exc)}"


def no_space(exc: BaseException) -> bool:
    """Whether a write failed for a full device: an OSError of ours or delta-rs's, or a Spark job's
    (its Java exception's text, through py4j)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if (isinstance(e, OSError) and e.errno == errno.ENOSPC) or "No space left on device" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


def spark_failure(exc: BaseException) -> str | None:
    """The one line of an error Spark raised (the JVM's, through py4j or Spark Connect), else None.

    py4j's text starts with the call it made (``An error occurred while calling o123.merge.``),
    then the Java exception's line; Spark's own errors start with their condition; both may go on
    with the JVM's stack."""
    from pyspark.errors import PySparkException

    kinds: tuple[type[BaseException], ...] = (PySparkException,)
    with contextlib.suppress(ImportError):  # (a Spark Connect client may come without py4j)
        from py4j.protocol import Py4JJavaError

        kinds = (PySparkException, Py4JJavaError)
    if not isinstance(exc, kinds):
        return None
    for line in str(exc).splitlines():
        line = line.strip().removeprefix(": ").strip()
        if line and not line.startswith("An error occurred while calling"):
            return line[:300]
    return type(exc).__name__


def is_connect(spark: SparkSession) -> bool:
    """A Spark Connect session (``--remote``): no JVM in this process, no SparkContext."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def cores(spark: SparkSession) -> int:
    """The session's default parallelism (its cores, on local[N]). Spark Connect has no
    SparkContext to ask: a range without a partition count is split in that many parts."""
    if not is_connect(spark):
        return int(spark.sparkContext.defaultParallelism)
    from pyspark.sql import functions as F

    return int(spark.range(0, 1 << 16).select(F.spark_partition_id().alias("p")).distinct().count())


def shuffle_partitions(spark: SparkSession) -> int:
    """The tasks of a repartition by column: the setting, or adaptive execution's initial number."""
    if not is_connect(spark):
        return int(spark._jsparkSession.sessionState().conf().numShufflePartitions())
    adaptive = all(
        (spark.conf.get(k, "true") or "").lower() == "true"
        for k in ("spark.sql.adaptive.enabled", "spark.sql.adaptive.coalescePartitions.enabled")
    )
    initial = spark.conf.get("spark.sql.adaptive.coalescePartitions.initialPartitionNum", None)
    if adaptive and initial:
        return int(initial)
    return int(spark.conf.get("spark.sql.shuffle.partitions") or "200")
