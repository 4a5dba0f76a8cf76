"""How pgrecv names files to Spark, and finds a line again for an error message.

Spark takes paths as Hadoop URIs and globs; pgrecv gives it the files it listed itself, read
literally (:func:`literal_read`), as ``file:`` URLs (objects as ``s3a:`` ones), and maps the
paths Spark reports back to the names the user gave (:func:`local_path`) to name ``file:line``
in what it tells the user.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from pgrecv.errors import InputError
from pgrecv.output.store import SCHEMES
from pgrecv.spark.stores import SPARK_SCHEMES, SourceFile, StoreFile, StorePath

if TYPE_CHECKING:
    from pyspark.sql import DataFrameReader, SparkSession


# Link (or object's URL) -> the file it stands for, for every message that names a file (see _urls).
_REAL_NAMES: dict[str, str] = {}
# an object's name in messages -> the object, to find a line in it again
_OBJECTS: dict[str, StoreFile] = {}


def input_urls(paths: list[SourceFile], links: Path | None) -> list[str]:
    """What Spark is given to read each of ``paths``: its ``file:`` URL, or for a file whose name
    holds ':' the URL of a symbolic link to it in ``links`` (made 0700 here). Hadoop's local file
    system builds a checksum file's path from the name (``.a:b.jsonl.crc``) and cannot parse that
    back ("Relative path in absolute URI"); a ':' in a directory is no trouble."""
    urls = []
    for i, p in enumerate(paths):
        if isinstance(p, StoreFile):  # no checksum files on S3A: any name is read as it is
            _REAL_NAMES[p.spark_url] = str(p)
            _OBJECTS[str(p)] = p
            urls.append(p.spark_url)
            continue
        real = p.resolve()  # what file_url gives Spark: a link given to us counts by its target's name
        if ":" not in real.name:
            urls.append(file_url(p))
            continue
        if links is None:
            raise InputError(f"{p}: Spark cannot read a file whose name holds ':': rename it")
        if not links.exists():  # a fresh name in the run's private directory
            links.mkdir(mode=0o700)
        link = links.resolve() / f"{i:06d}.jsonl"  # the link itself, not resolved through it
        link.symlink_to(real)  # fails if the name exists
        _REAL_NAMES[str(link)] = str(real)
        urls.append("file://" + str(link))
    return urls


def literal_read(spark: SparkSession) -> DataFrameReader:
    """Spark's reader for paths pgrecv names itself (the inputs it listed, its staged copies, the
    target's files): never a Hadoop glob. Spark takes ``[``, ``{``, ``*`` and ``?`` in a path as
    one, and a target such as ``lake[1]`` is then "not found". (``__globPaths__`` is the option
    Spark's own file streams read their listed files with; pyproject pins pyspark to versions
    that have it, and tests/spark/test_engine.py's test of glob characters fails without it.)"""
    return spark.read.option("__globPaths__", "false")


def file_url(path: Path | StorePath) -> str:
    """A local path for Spark: ``file://`` and the path as it is (Hadoop's Path escapes it itself;
    a percent-encoded URI would be taken literally and not found); a key of a store: ``s3a://``."""
    if isinstance(path, StorePath):
        return path.spark_url
    return "file://" + str(path.resolve())


def data_file_url(name: str) -> str:
    """A table's data file for Spark, as a writer lists it: a local path, or an object's
    ``s3://``/``s3a://``/``gs://`` URL (the writers' own names for files on a store target)."""
    for scheme in SCHEMES:
        if name.startswith(scheme):
            return "s3a://" + name[len(scheme) :]
    return name if name.startswith(_SPARK_STORES) else file_url(Path(name))


# the URL schemes Spark reads a store's objects with (stores.StoreFile.spark_url)
_SPARK_STORES = tuple(f"{s}://" for s in SPARK_SCHEMES.values())


def spelling(spark: SparkSession, url: str) -> str:
    """How Spark's ``_metadata.file_path`` spells the file at ``url``: ``file:`` (or ``s3a://BUCKET``,
    ``gs://BUCKET``) and the URI's raw path."""
    store = next((s for s in _SPARK_STORES if url.startswith(s)), None)
    if store is not None:
        bucket, _, key = url[len(store) :].partition("/")
        return f"{store}{bucket}" + java_raw_path("/" + key)
    assert url.startswith("file://")
    return "file:" + java_raw_path(url[len("file://") :])


# java.net.URI leaves these ASCII characters of a path as they are (unreserved, punct, '/', '@')
_URI_PATH_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-!.~'()*,;:$&+=/@")


def java_raw_path(path: str) -> str:
    """``new java.net.URI("file", null, path, null, null).getRawPath()``, as Hadoop's Path
    makes it: what java.net.URI quotes is quoted (as %XX of its UTF-8 bytes); other
    non-ASCII characters stay, unless they are control or space characters. For a path without
    ``.`` or ``..`` segments (a listed file's), which Hadoop's Path would also drop or resolve."""
    import unicodedata

    out = []
    for ch in path:
        o = ord(ch)
        if ch in _URI_PATH_SAFE or (o > 0x7F and not (o <= 0x9F or unicodedata.category(ch) in ("Zs", "Zl", "Zp"))):
            out.append(ch)
        else:
            out.append("".join(f"%{b:02X}" for b in ch.encode("utf-8", "surrogatepass")))
    return "".join(out)


def local_path(uri: str) -> str:
    """A local file's path from the URI Spark gives (``file:/a%20b/c``); an object's URL as the
    user named it (``s3://…``)."""
    from urllib.parse import unquote

    if uri.startswith(_SPARK_STORES):
        url = unquote(uri)
        return _REAL_NAMES.get(url, url)
    path = uri[5:] if uri.startswith("file:") else uri
    while path.startswith("//"):
        path = path[1:]
    path = unquote(path)
    return _REAL_NAMES.get(path, path)


def find_line(path_uri: str, needle: dict[str, Any]) -> str:
    """``file:line`` of the first line holding every ``"field":value`` of ``needle`` (for error
    messages only: reads one file in the driver, line by line, without keeping it)."""
    import orjson

    path = local_path(path_uri)
    parts = [orjson.dumps({k: v})[1:-1] for k, v in needle.items() if v is not None]
    try:
        with _open(path) as f:
            for lineno, line in enumerate(f, 1):
                if all(p in line for p in parts):
                    return f"{path}:{lineno}"
    except OSError:
        pass
    return path


def line_of_text(path_uri: str, text: str) -> str:
    path = local_path(path_uri)
    want = text.encode().rstrip(b"\n")
    try:
        with _open(path) as f:
            for lineno, line in enumerate(f, 1):
                if line.rstrip(b"\n") == want:
                    return f"{path}:{lineno}"
    except OSError:
        pass
    return path


def _open(name: str) -> BinaryIO:
    """A file named in a message: a local path, or an object read as input."""
    obj = _OBJECTS.get(name)
    return obj.open() if obj is not None else open(name, "rb")
