"""A target's small objects on a store (its lock, the record of what it applied), read with a
token naming the version read and written on the condition that it is still that version: what
a lock takes on a store that has no locks (pgrecv/spark/targets.py).

- S3 (boto3): ``If-None-Match: *`` creates, ``If-Match: ETAG`` replaces and deletes. An object's
  age is taken by the store's own clock (the response's ``Date`` against ``Last-Modified``).
- Cloud Storage (google-cloud-storage): ``ifGenerationMatch=0`` creates, ``ifGenerationMatch=N``
  replaces and deletes. An object's age is this machine's clock against its ``updated`` time:
  Google's client shows no clock of the store's. A lease is renewed every quarter of itself, so
  two machines' clocks would have to differ by most of a lease for a live one to be taken over.

Nothing here prints a credential: errors name the object and the store's error code.
"""

from __future__ import annotations

import contextlib
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Final

from pgrecv.output.store import ObjectStore, S3Client, StoreURL, code_of, status_of
from pgrecv.spark import gcs
from pgrecv.spark.stores import StorePath, gcs_retry_seconds, s3_client

if TYPE_CHECKING:
    from google.cloud.storage import Bucket, Client

PRECONDITION_FAILED: Final = 412


@dataclass(frozen=True)
class Seen:
    """An object as read: its bytes, the token of that version, and its age in seconds."""

    data: bytes
    token: str
    age: float


class Refused(Exception):
    """A conditional write was refused: the object is no longer the version the writer saw."""


class Objects(ABC):
    """The objects under one prefix, by their names relative to it."""

    endpoint: str  # where a user looks when the store cannot be reached (for error messages)

    @abstractmethod
    def where(self, name: str = "") -> str:
        """The URL of the prefix, or of the object ``name`` under it."""

    @abstractmethod
    def get(self, name: str) -> Seen | None:
        """The object (None: there is none)."""

    @abstractmethod
    def put(self, name: str, data: bytes, token: str | None) -> str:
        """Creates the object (``token`` None) or replaces the version ``token``; returns the new
        version's token. Raises :class:`Refused` when it exists, or is another version."""

    @abstractmethod
    def write(self, name: str, data: bytes) -> None:
        """Writes the object whole, whatever is there."""

    @abstractmethod
    def delete(self, name: str, token: str) -> None:
        """Deletes the object if it is still the version ``token`` (else leaves it)."""

    @abstractmethod
    def remove_under(self, prefix: str) -> None:
        """Every object whose name starts with ``prefix``."""

    @staticmethod
    @abstractmethod
    def short(exc: Exception) -> str:
        """The store's error code of ``exc``, or its kind (never a credential)."""


class S3Objects(Objects):
    endpoint = "AWS_ENDPOINT_URL"

    def __init__(self, url: StoreURL, client: S3Client) -> None:
        self._url = url
        self._client = client

    def where(self, name: str = "") -> str:
        return ObjectStore(self._url).where(name)

    def get(self, name: str) -> Seen | None:
        try:
            got = self._client.get_object(Bucket=self._url.bucket, Key=self._url.key(name))
        except Exception as exc:  # botocore's errors have no common base short of Exception
            if status_of(exc) == 404:
                return None
            raise
        data = bytes(got["Body"].read())
        headers = got.get("ResponseMetadata", {}).get("HTTPHeaders", {})
        try:
            now = parsedate_to_datetime(headers["date"]).timestamp()
            age = max(0.0, now - got["LastModified"].timestamp())
        except (KeyError, TypeError, ValueError):
            age = 0.0  # no clock to go by: only the holder's own end frees it
        return Seen(data, str(got["ETag"]), age)

    def put(self, name: str, data: bytes, token: str | None) -> str:
        cond = {"IfNoneMatch": "*"} if token is None else {"IfMatch": token}
        try:
            put = self._client.put_object(Bucket=self._url.bucket, Key=self._url.key(name), Body=data, **cond)
        except Exception as exc:
            if status_of(exc) in (404, 409, 412):  # (404: deleted since)
                raise Refused from None
            raise
        return str(put["ETag"])

    def write(self, name: str, data: bytes) -> None:
        self._client.put_object(Bucket=self._url.bucket, Key=self._url.key(name), Body=data)

    def delete(self, name: str, token: str) -> None:
        self._client.delete_object(Bucket=self._url.bucket, Key=self._url.key(name), IfMatch=token)

    def remove_under(self, prefix: str) -> None:
        bucket = self._url.bucket
        pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=self._url.key(prefix))
        for page in pages:
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                self._client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})

    @staticmethod
    def short(exc: Exception) -> str:
        return code_of(exc) or type(exc).__name__


class GcsObjects(Objects):
    """Cloud Storage's objects; every call retries for at most ``PGRECV_GCS_RETRY_SECONDS``."""

    endpoint = "the store's endpoint"

    def __init__(self, path: StorePath, client: Client) -> None:
        from google.cloud.storage.retry import DEFAULT_RETRY

        self._path = path
        self._bucket: Bucket = client.bucket(path.bucket)
        self._retry = DEFAULT_RETRY.with_timeout(gcs_retry_seconds())

    def where(self, name: str = "") -> str:
        return str(self._path / name) if name else str(self._path)

    def _key(self, name: str) -> str:
        return (self._path / name).key

    def get(self, name: str) -> Seen | None:
        from google.api_core.exceptions import GoogleAPICallError

        for _ in range(3):  # replaced between the look and the read: look again
            blob = self._bucket.get_blob(self._key(name), retry=self._retry)
            if blob is None:
                return None
            try:
                data = blob.download_as_bytes(if_generation_match=blob.generation, retry=self._retry)
            except GoogleAPICallError as exc:
                if exc.code in (404, PRECONDITION_FAILED):
                    continue
                raise
            updated = blob.updated.timestamp() if blob.updated is not None else time.time()
            return Seen(data, str(blob.generation), max(0.0, time.time() - updated))
        raise Refused

    def put(self, name: str, data: bytes, token: str | None) -> str:
        from google.api_core.exceptions import GoogleAPICallError

        blob = self._bucket.blob(self._key(name))
        try:
            blob.upload_from_string(data, if_generation_match=int(token or 0), retry=self._retry)
        except GoogleAPICallError as exc:
            if exc.code == PRECONDITION_FAILED:
                raise Refused from None
            raise
        return str(blob.generation)

    def write(self, name: str, data: bytes) -> None:
        self._bucket.blob(self._key(name)).upload_from_string(data, retry=self._retry)

    def delete(self, name: str, token: str) -> None:
        from google.api_core.exceptions import GoogleAPICallError

        with contextlib.suppress(GoogleAPICallError):  # (not that version any more: not ours to delete)
            self._bucket.blob(self._key(name)).delete(if_generation_match=int(token), retry=self._retry)

    def remove_under(self, prefix: str) -> None:
        for blob in self._bucket.list_blobs(prefix=self._key(prefix), retry=self._retry):
            blob.delete(retry=self._retry)

    @staticmethod
    def short(exc: Exception) -> str:
        code = getattr(exc, "code", None)
        return f"{type(exc).__name__} ({code})" if isinstance(code, int) else type(exc).__name__


def objects_for(path: StorePath, conf: dict[str, str]) -> Objects:
    """The objects under ``path``, reached with ``conf``'s settings (else the store's environment)."""
    if path.scheme == "gs":
        return GcsObjects(path, gcs.client(conf, str(path)))
    return S3Objects(StoreURL(path.bucket, path.key), s3_client(conf))
