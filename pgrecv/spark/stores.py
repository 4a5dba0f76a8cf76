"""SOURCE and --target on an object store (``s3://``/``s3a://``, ``gs://``): what the driver
lists and reads there, and what Spark is told to read (Cloud Storage's own settings:
pgrecv/spark/gcs.py).

The driver lists prefixes and reads a few bytes (the heads of files, snapshot manifests, a line
for an error message) through pyarrow's S3 file system; Spark's tasks read the files through
Hadoop's S3A connector (``s3a://``; an ``s3://`` URL is handed to Spark as ``s3a://``). Both take
their settings the standard way, from the same place: Hadoop's ``spark.hadoop.fs.s3a.*``
settings given with ``--conf``, else AWS's environment (``AWS_ENDPOINT_URL``, ``AWS_REGION``,
the credential chain: ``AWS_ACCESS_KEY_ID``…, ``AWS_PROFILE``, instance roles). Nothing here
prints a credential: errors name the URL and the store's error.

A :class:`StoreFile` offers the part of :class:`pathlib.Path` that the read path uses of a local
file (``name``, ``parent``, ``stat``, ``open``, ``read_bytes``, ``with_name``), so one read path
serves both (:data:`SourceFile`).
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Collection
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Final

from pgrecv.errors import InputError, UsageError
from pgrecv.output.store import SCHEMES, StoreURL, is_store_url
from pgrecv.spark import gcs
from pgrecv.spark.gcs import GCS, GCS_CLASS, GCS_PACKAGE

if TYPE_CHECKING:
    import pyarrow as pa
    from pyarrow.fs import FileInfo, FileSystem
    from pyarrow.parquet import FileMetaData
    from pyspark.sql import SparkSession

S3A_CLASS: Final = "org.apache.hadoop.fs.s3a.S3AFileSystem"
S3A_PACKAGE: Final = "org.apache.hadoop:hadoop-aws:3.4.2"  # Hadoop's version in PySpark's jars
_HADOOP: Final = "spark.hadoop.fs.s3a."
is_store_source = is_store_url  # a SOURCE on an object store: any ``scheme://`` but ``file://``


def scheme_of(text: str) -> str:
    """``s3`` (``s3://``, ``s3a://``) or ``gs``: the store a URL names."""
    return "gs" if text.startswith(GCS) else "s3"


def check_scheme(text: str, what: str = "SOURCE") -> None:
    if not text.startswith((*SCHEMES, GCS)):
        scheme = text.split("://", 1)[0]
        raise UsageError(
            f"{what} {text}: spark-apply takes s3:// and s3a:// (any S3-compatible store) and gs://; {scheme}:// "
            f"is not supported yet: {'copy the files to one of them' if what == 'SOURCE' else 'use one of them'} "
            "or a local path"
        )


def parse_source(text: str) -> tuple[str, str, str]:
    """A store URL's scheme (:func:`scheme_of`), bucket and prefix (no slash at either end)."""
    if text.startswith(GCS):
        return ("gs", *gcs.parse(text))
    url = StoreURL.parse(text)
    return "s3", url.bucket, url.prefix


@dataclass(frozen=True)
class _Stat:
    st_size: int


# what Spark reads a store's objects as: Hadoop's S3A connector for S3, Google's connector for gs://
SPARK_SCHEMES: Final = {"s3": "s3a", "gs": "gs"}


@dataclass(frozen=True)
class StoreDir:
    """A prefix of a bucket (no slash at either end; '' for the bucket's top) on store ``scheme``."""

    bucket: str
    prefix: str
    fs: FileSystem = field(compare=False, repr=False)
    scheme: str = "s3"

    def resolve(self) -> StoreDir:
        return self

    def __str__(self) -> str:
        top = f"{self.scheme}://{self.bucket}"
        return f"{top}/{self.prefix}" if self.prefix else top

    def file(self, name: str, size: int = -1) -> StoreFile:
        key = f"{self.prefix}/{name}" if self.prefix else name
        return StoreFile(self.bucket, key, size, self.fs, self.scheme)


@dataclass(frozen=True)
class StoreFile:
    """An object ``SCHEME://BUCKET/KEY`` of ``size`` bytes (-1: not listed)."""

    bucket: str
    key: str
    size: int
    fs: FileSystem = field(compare=False, repr=False)
    scheme: str = "s3"

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def parent(self) -> StoreDir:
        return StoreDir(self.bucket, self.key.rpartition("/")[0], self.fs, self.scheme)

    @property
    def spark_url(self) -> str:
        """What Spark reads it as: its Hadoop connector's URL (the key as it is: Hadoop's Path quotes it)."""
        return f"{SPARK_SCHEMES[self.scheme]}://{self.bucket}/{self.key}"

    def resolve(self) -> StoreFile:
        return self

    def stat(self) -> _Stat:
        return _Stat(self.size if self.size >= 0 else self.fs.get_file_info(self._path).size or 0)

    def with_name(self, name: str) -> StoreFile:
        return self.parent.file(name)

    def open(self, mode: str = "rb") -> BinaryIO:
        """The object's bytes as a buffered binary file (lines iterate as a local file's do).
        Raises FileNotFoundError when it is gone, OSError when it cannot be read."""
        assert mode == "rb"
        stream = self.fs.open_input_stream(self._path)
        return io.BufferedReader(_Raw(stream), 1 << 20)

    def read_bytes(self) -> bytes:
        with self.open() as f:
            return f.read()

    @property
    def _path(self) -> str:
        return f"{self.bucket}/{self.key}"

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.key}"


# what the read path takes: a local file or an object
SourceFile = Path | StoreFile


class _Raw(io.RawIOBase):
    """pyarrow's input stream as a raw file, for :class:`io.BufferedReader`."""

    def __init__(self, stream: io.RawIOBase) -> None:
        self._stream = stream

    def readable(self) -> bool:
        return True

    def readinto(self, b: memoryview) -> int:  # type: ignore[override]
        data = self._stream.read(len(b))
        n = len(data or b"")
        b[:n] = data
        return n

    def close(self) -> None:
        self._stream.close()
        super().close()


def _conf_or_env(conf: dict[str, str], key: str, *env: str) -> str | None:
    value = conf.get(_HADOOP + key)
    if value:
        return value
    return next((os.environ[e] for e in env if os.environ.get(e)), None)


@dataclass(frozen=True)
class Settings:
    """Where the store is and who is asking, as Spark's S3A connector takes it: ``--conf
    spark.hadoop.fs.s3a.*`` first, then AWS's environment. The one reading of them that pyarrow,
    boto3 and delta-rs are each set up from (None: that client's own default or chain)."""

    endpoint: str | None  # with its scheme (https:// when the setting has none)
    region: str | None
    key: str | None
    secret: str | None

    @classmethod
    def of(cls, conf: dict[str, str]) -> Settings:
        endpoint = _conf_or_env(conf, "endpoint", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
        if endpoint and "://" not in endpoint:
            endpoint = f"https://{endpoint}"
        key, secret = conf.get(_HADOOP + "access.key"), conf.get(_HADOOP + "secret.key")
        return cls(
            endpoint,
            _conf_or_env(conf, "endpoint.region", "AWS_REGION", "AWS_DEFAULT_REGION"),
            key if key and secret else None,
            secret if key and secret else None,
        )


def filesystem(conf: dict[str, str]) -> FileSystem:
    """pyarrow's S3 file system, set up as Spark's S3A connector is (:class:`Settings`; pyarrow's
    own credential chain when no key is given)."""
    from pyarrow import fs as pafs

    st = Settings.of(conf)
    kwargs: dict[str, str] = {}
    if st.endpoint:
        kwargs["scheme"], _, kwargs["endpoint_override"] = st.endpoint.partition("://")
    if st.region:
        kwargs["region"] = st.region
    if st.key and st.secret:
        kwargs["access_key"], kwargs["secret_key"] = st.key, st.secret
    return pafs.S3FileSystem(**kwargs)


def gcs_filesystem(conf: dict[str, str]) -> FileSystem:
    """pyarrow's Cloud Storage file system (:func:`pgrecv.spark.gcs.filesystem`)."""
    return gcs.filesystem(conf, gcs_retry_seconds())


def gcs_retry_seconds() -> float:
    """How long the driver's Cloud Storage clients retry: ``PGRECV_GCS_RETRY_SECONDS`` (at least 1)."""
    return seconds_from_env("PGRECV_GCS_RETRY_SECONDS", gcs.RETRY_SECONDS, least=1.0)


def seconds_from_env(name: str, default: float, least: float) -> float:
    """A duration from the environment variable ``name``, at least ``least``; ``default`` when it
    is unset or not a number."""
    raw = os.environ.get(name)
    try:
        return max(least, float(raw)) if raw else default
    except ValueError:
        return default


def filesystem_for(source: str, conf: dict[str, str], made: dict[str, FileSystem]) -> FileSystem:
    """The file system the driver lists and reads ``source`` with (one per store, kept in ``made``)."""
    scheme = scheme_of(source)
    if scheme not in made:
        made[scheme] = gcs_filesystem(conf) if scheme == "gs" else filesystem(conf)
    return made[scheme]


def s3_client(conf: dict[str, str]) -> object:
    """boto3's S3 client, set up as :func:`filesystem` is (for the conditional writes of a target's
    lock, which pyarrow's S3 file system cannot make); boto3's own chain for what is not given."""
    try:
        import boto3
    except ImportError:
        raise UsageError("a --target on S3 needs boto3 (AWS's SDK for Python): pip install 'pgrecv[s3]'") from None
    st = Settings.of(conf)
    kwargs: dict[str, str] = {}
    if st.endpoint:
        kwargs["endpoint_url"] = st.endpoint
    if st.region:
        kwargs["region_name"] = st.region
    if st.key and st.secret:
        kwargs["aws_access_key_id"], kwargs["aws_secret_access_key"] = st.key, st.secret
    return boto3.session.Session().client("s3", **kwargs)


# the run's settings (run_apply sets them) and the file system made from them, for the table
# files the driver reads a footer of (an Iceberg warehouse on s3a://)
_run: dict[str, str] = {}
_run_fs: dict[str, FileSystem] = {}


def use_conf(conf: dict[str, str]) -> None:
    """The settings :func:`parquet_metadata` reaches the store with, for this run."""
    _run.clear()
    _run.update(conf)
    _run_fs.clear()


def _on_run_fs(path: str) -> tuple[str, FileSystem | None]:
    """A table file's path as pyarrow takes it: a local path as it is (no file system), an
    ``s3a://``/``s3://``/``gs://`` URL as its bucket and key on the run's store."""
    if not path.startswith((*SCHEMES, GCS)):
        return path, None
    return path.split("://", 1)[1], filesystem_for(path, _run, _run_fs)


def parquet_metadata(path: str) -> FileMetaData:
    """A Parquet file's footer, read by the driver: a local path, or an ``s3a://``/``s3://`` URL
    (a table file Spark's catalog names), through pyarrow as the run's settings say."""
    import pyarrow.parquet as pq

    where, fs = _on_run_fs(path)
    return pq.read_metadata(where) if fs is None else pq.read_metadata(where, filesystem=fs)


def data_bytes(paths: list[str]) -> int:
    """The size of table files (local paths or store URLs, as :func:`parquet_metadata` takes them)."""
    total = 0
    for p in paths:
        where, fs = _on_run_fs(p)
        total += os.path.getsize(where) if fs is None else int(fs.get_file_info(where).size or 0)
    return total


def read_parquet(paths: list[str]) -> pa.Table:
    """Table files read whole by the driver (local paths or store URLs, not mixed)."""
    import pyarrow.parquet as pq

    if not paths:
        raise ValueError("no files")
    located = [_on_run_fs(p) for p in paths]
    return pq.read_table([w for w, _ in located], filesystem=located[0][1])


def delta_location(path: Path | StorePath) -> tuple[str, dict[str, str] | None]:
    """A Delta table's location as delta-rs takes it: a local path, or an object's URL with the
    run's store settings (``--conf`` first, then AWS's environment, which delta-rs also reads
    itself). delta-rs commits to S3 with conditional writes (``If-None-Match``): no lock table."""
    if not isinstance(path, StorePath):
        return str(path), None
    st = Settings.of(_run)
    out: dict[str, str] = {}
    if st.endpoint:
        out["AWS_ENDPOINT_URL"] = st.endpoint
        if st.endpoint.startswith("http://"):
            out["AWS_ALLOW_HTTP"] = "true"
    if st.region:
        out["AWS_REGION"] = st.region
    if st.key and st.secret:
        out["AWS_ACCESS_KEY_ID"], out["AWS_SECRET_ACCESS_KEY"] = st.key, st.secret
    return str(path), out


def session_conf(conf: dict[str, str]) -> dict[str, str]:
    """``conf`` with what Spark's S3A connector needs to reach the store the driver reaches: the
    endpoint and region of AWS's environment when ``--conf`` names none (and path-style requests
    for an endpoint of one's own: S3-compatible servers seldom serve a bucket's host name); for
    Google's connector, its class, and an emulator's address (STORAGE_EMULATOR_HOST)."""
    out = dict(conf)
    endpoint = _conf_or_env(conf, "endpoint", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
    if endpoint and _HADOOP + "endpoint" not in out:
        out[_HADOOP + "endpoint"] = endpoint
        out.setdefault(_HADOOP + "path.style.access", "true")
    region = _conf_or_env(conf, "endpoint.region", "AWS_REGION", "AWS_DEFAULT_REGION")
    if region:
        out.setdefault(_HADOOP + "endpoint.region", region)
    # Hadoop finds a scheme's file system in its own defaults or through its class loader's
    # services, neither of which sees spark.jars: Google's connector is named here
    out.setdefault(gcs.HADOOP + "impl", GCS_CLASS)
    emulator = os.environ.get("STORAGE_EMULATOR_HOST")
    if emulator and gcs.HADOOP + "storage.root.url" not in out:  # (Google's connector does not read it)
        out[gcs.HADOOP + "storage.root.url"] = emulator if "://" in emulator else f"http://{emulator}"
        out.setdefault(gcs.HADOOP + "auth.type", "UNAUTHENTICATED")
        out.setdefault(gcs.HADOOP + "operation.move.enable", "false")  # (an emulator's: no moveTo)
    return out


# each store's Hadoop connector: its class, what the user calls it, its pom, and another way to get it
_CONNECTORS: Final = {
    "s3": (S3A_CLASS, "s3:// paths: Hadoop's S3A connector", "s3a", f"or --conf spark.jars.packages={S3A_PACKAGE}"),
    "gs": (GCS_CLASS, "gs:// paths: Google's Cloud Storage connector", "gcs", GCS_PACKAGE),
}


def check_session(spark: SparkSession, schemes: Collection[str] = ("s3",)) -> None:
    """The Hadoop connector of each store in ``schemes`` is in the session (else every task would
    fail on its first file with a Java stack); a Spark Connect server's classes are its own to check."""
    from pgrecv.spark.jars import loads_class
    from pgrecv.spark.sparkops import is_connect

    if is_connect(spark):
        return
    for scheme in sorted(schemes):
        cls, what, pom, other = _CONNECTORS[scheme]
        if not loads_class(spark, cls):
            raise UsageError(
                f"{what} is not in this Spark session: give its jars (--conf spark.jars=... from "
                f"`mvn -f jvm/{pom}/pom.xml dependency:copy-dependencies`; {other})"
            )


def _trouble(url: str, exc: OSError) -> InputError:
    """One line for a store that cannot be listed or read (pyarrow's message names the AWS error
    and the bucket; never a credential)."""
    why = " ".join(str(exc).split())
    if len(why) > 300:
        why = why[:300] + "…"
    where = "the store's endpoint" if url.startswith(GCS) else "AWS_ENDPOINT_URL"
    return InputError(f"{url}: cannot read it from the store ({why}): check the URL, {where} and credentials")


def expand(source: str, fs: FileSystem) -> list[StoreFile] | StoreDir:
    """A store SOURCE as a prefix to list (:class:`StoreDir`), or the objects it names (one
    object, or a glob in its last part); raises InputError when it names nothing."""
    from pyarrow import fs as pafs

    scheme, bucket, key = parse_source(source)
    try:
        info = fs.get_file_info(f"{bucket}/{key}" if key else bucket)
        if info.type == pafs.FileType.Directory:
            return StoreDir(bucket, key, fs, scheme)
        if info.type == pafs.FileType.File:
            return [StoreFile(bucket, key, info.size or 0, fs, scheme)]
        head, _, last = key.rpartition("/")
        if any(c in last for c in "*?["):
            listed = listing(StoreDir(bucket, head, fs, scheme), source)
            return [f for f in listed if fnmatchcase(f.name, last)]
    except OSError as exc:
        raise _trouble(source, exc) from None
    raise InputError(f"{source}: no such object or prefix in the store: check the SOURCE arguments")


def listing(d: StoreDir, source: str) -> list[StoreFile]:
    """The objects directly under ``d`` (not deeper), in name order."""
    from pyarrow import fs as pafs

    try:
        infos = d.fs.get_file_info(pafs.FileSelector(f"{d.bucket}/{d.prefix}", recursive=False))
    except OSError as exc:
        raise _trouble(source, exc) from None
    out = [d.file(i.base_name, i.size or 0) for i in infos if i.type == pafs.FileType.File]
    return sorted(out, key=lambda f: f.name)


@dataclass(frozen=True)
class StorePath:
    """A key of a bucket (or the prefix of the keys under it) on store ``scheme`` where a target's
    tables and state are written: the part of :class:`pathlib.Path` that the writers use of a
    local directory (``/``, ``name``, ``exists``, ``iterdir``, ``glob``, ``stat``, ``unlink``...),
    through pyarrow's file system of the store. Directories do not exist on a store: ``mkdir``
    makes nothing, and a prefix exists while any object is under it. Spark and delta-rs take it
    by :attr:`spark_url`."""

    bucket: str
    key: str  # no slash at either end ('' for the bucket's top)
    fs: FileSystem = field(compare=False, repr=False)
    scheme: str = "s3"

    @classmethod
    def of(cls, text: str, fs: FileSystem) -> StorePath:
        scheme, bucket, key = parse_source(text)
        return cls(bucket, key, fs, scheme)

    def __truediv__(self, name: str) -> StorePath:
        name = name.strip("/")
        return StorePath(self.bucket, f"{self.key}/{name}" if self.key else name, self.fs, self.scheme)

    def __str__(self) -> str:
        return f"{self.scheme}://{self._path}"

    @property
    def spark_url(self) -> str:
        return f"{SPARK_SCHEMES[self.scheme]}://{self._path}"

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def parent(self) -> StorePath:
        return StorePath(self.bucket, self.key.rpartition("/")[0], self.fs, self.scheme)

    def with_name(self, name: str) -> StorePath:
        return self.parent / name

    def resolve(self) -> StorePath:
        return self

    @property
    def _path(self) -> str:
        return f"{self.bucket}/{self.key}" if self.key else self.bucket

    def _info(self) -> FileInfo:
        try:
            return self.fs.get_file_info(self._path)
        except OSError as exc:
            raise _trouble(str(self), exc) from None

    def exists(self) -> bool:
        from pyarrow import fs as pafs

        return bool(self._info().type != pafs.FileType.NotFound)

    def is_dir(self) -> bool:
        from pyarrow import fs as pafs

        return bool(self._info().type == pafs.FileType.Directory)

    def is_symlink(self) -> bool:
        return False

    def mkdir(self, mode: int = 0o777, parents: bool = False, exist_ok: bool = False) -> None:
        """Nothing: a prefix needs no making."""

    def rmdir(self) -> None:
        """Nothing: a prefix goes with its last object."""

    def stat(self) -> _Stat:
        return _Stat(self._info().size or 0)

    def read_bytes(self) -> bytes:
        try:
            with self.fs.open_input_stream(self._path) as f:
                return bytes(f.read())
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise _trouble(str(self), exc) from None

    def unlink(self, missing_ok: bool = False) -> None:
        try:
            self.fs.delete_file(self._path)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def remove_tree(self) -> None:
        """Every object under the prefix (none: nothing), then its marker object if a writer made
        one (pyarrow's Cloud Storage delete_dir fails on a prefix without one)."""
        self.fs.delete_dir_contents(self._path, missing_dir_ok=True)
        with contextlib.suppress(OSError):
            self.fs.delete_dir(self._path)

    def copy_to(self, other: StorePath) -> None:
        self.fs.copy_file(self._path, other._path)

    def iterdir(self) -> list[StorePath]:
        """The objects and prefixes directly under it (none when there is nothing). On Cloud
        Storage from a recursive listing: pyarrow's lists a prefix's prefixes only where a marker
        object names them, so a killed run's version prefix went unseen and was never removed."""
        from pyarrow import fs as pafs

        deep = self.scheme == "gs"
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self._path, allow_not_found=True, recursive=deep))
        except OSError as exc:
            raise _trouble(str(self), exc) from None
        names = {i.path[len(self._path) + 1 :].split("/", 1)[0] for i in infos}
        return sorted((self / n for n in names if n), key=lambda p: p.key)

    def glob(self, pattern: str) -> list[StorePath]:
        return [p for p in self.iterdir() if fnmatchcase(p.name, pattern)]

    def rglob(self, pattern: str) -> list[StorePath]:
        """The objects at any depth under it whose name matches ``pattern``."""
        from pyarrow import fs as pafs

        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self._path, recursive=True, allow_not_found=True))
        except OSError as exc:
            raise _trouble(str(self), exc) from None
        return sorted(
            (
                StorePath(self.bucket, i.path.partition("/")[2], self.fs, self.scheme)
                for i in infos
                if i.type == pafs.FileType.File and fnmatchcase(i.base_name, pattern)
            ),
            key=lambda p: p.key,
        )


# a target: a local directory, or a prefix of a bucket
TargetPath = Path | StorePath


def remove_tree(path: TargetPath) -> None:
    """A directory and all in it, or every object under a prefix (nothing there: nothing)."""
    if isinstance(path, StorePath):
        path.remove_tree()
    else:
        import shutil

        shutil.rmtree(path, ignore_errors=True)


def as_source(path: TargetPath) -> SourceFile:
    """A file the target keeps (a carried transaction) as the read path takes it."""
    return StoreFile(path.bucket, path.key, -1, path.fs, path.scheme) if isinstance(path, StorePath) else path
