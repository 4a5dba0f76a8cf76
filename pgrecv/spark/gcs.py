"""Google Cloud Storage (``gs://BUCKET/PREFIX``): how the driver reaches it, set up as Google's
Hadoop connector (Spark's side) is.

The driver lists and reads through pyarrow's Cloud Storage file system, and makes a target's
conditional writes (its lock, pgrecv/spark/objects.py) through Google's own client library
(google-cloud-storage), which pyarrow's file system cannot make. Both take the endpoint from
``--conf spark.hadoop.fs.gs.storage.root.url``, else ``STORAGE_EMULATOR_HOST`` (the variable
Google's SDKs take for an emulator); both are anonymous where the connector is
(``fs.gs.auth.type=UNAUTHENTICATED``, or an emulator), else they use Google's default credentials.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Final

from pgrecv.errors import OutputError, UsageError

if TYPE_CHECKING:
    from google.cloud.storage import Client
    from pyarrow.fs import FileSystem

GCS: Final = "gs://"
GCS_CLASS: Final = "com.google.cloud.hadoop.fs.gcs.GoogleHadoopFileSystem"
GCS_PACKAGE: Final = "com.google.cloud.bigdataoss:gcs-connector:4.0.4 (classifier shaded)"
HADOOP: Final = "spark.hadoop.fs.gs."
RETRY_SECONDS: Final = 30.0  # how long the driver's Cloud Storage clients retry (PGRECV_GCS_RETRY_SECONDS)
_BUCKET_RE: Final = re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]")


def parse(text: str) -> tuple[str, str]:
    """``gs://BUCKET/PREFIX``'s bucket and prefix (no slash at either end)."""
    bucket, _, prefix = text[len(GCS) :].partition("/")
    if not _BUCKET_RE.fullmatch(bucket):
        raise UsageError(f"{text}: {bucket!r} is not a Cloud Storage bucket name: give gs://BUCKET/PREFIX")
    return bucket, prefix.strip("/")


def _endpoint(conf: dict[str, str]) -> tuple[str | None, bool]:
    """The endpoint's URL (None: Google's) and whether to go anonymous."""
    root = conf.get(HADOOP + "storage.root.url") or os.environ.get("STORAGE_EMULATOR_HOST")
    if root and "://" not in root:
        root = f"http://{root}"
    auth = conf.get(HADOOP + "auth.type", "")
    return root, auth.upper() == "UNAUTHENTICATED" or (not auth and bool(os.environ.get("STORAGE_EMULATOR_HOST")))


def filesystem(conf: dict[str, str], retry_seconds: float) -> FileSystem:
    """pyarrow's Cloud Storage file system. Retries give up after ``retry_seconds``: Google's
    client otherwise retried an unreachable endpoint for minutes without a word (a cron run's
    next try is the retry)."""
    from datetime import timedelta

    from pyarrow import fs as pafs

    root, anonymous = _endpoint(conf)
    kwargs: dict[str, object] = {}
    if root:
        kwargs["scheme"], _, rest = root.partition("://")
        kwargs["endpoint_override"] = rest.strip("/")
    if anonymous:
        kwargs["anonymous"] = True
    return pafs.GcsFileSystem(retry_time_limit=timedelta(seconds=retry_seconds), **kwargs)


def client(conf: dict[str, str], where: str) -> Client:
    """Google's Cloud Storage client for ``where`` (a URL, for messages), set up as
    :func:`filesystem` is."""
    try:
        from google.auth.credentials import AnonymousCredentials
        from google.auth.exceptions import DefaultCredentialsError
        from google.cloud import storage
    except ImportError:
        raise UsageError(
            "a --target on gs:// needs Google's Cloud Storage library (conditional writes): pip install 'pgrecv[gcs]'"
        ) from None
    root, anonymous = _endpoint(conf)
    kwargs: dict[str, object] = {}
    if root:
        kwargs["client_options"] = {"api_endpoint": root.rstrip("/")}
    if anonymous:
        kwargs["credentials"] = AnonymousCredentials()  # type: ignore[no-untyped-call]
        kwargs["project"] = "pgrecv"  # (an anonymous client names no project; none is used)
    try:
        return storage.Client(**kwargs)
    except DefaultCredentialsError:
        raise OutputError(
            f"{where}: no Google credentials found: set GOOGLE_APPLICATION_CREDENTIALS (or run `gcloud auth "
            "application-default login`), or name an emulator with STORAGE_EMULATOR_HOST; nothing was applied"
        ) from None
