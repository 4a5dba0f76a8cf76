"""An S3 bucket prefix as pgrecv's outputs use it: list, look at, and create objects, never overwrite.

Every call goes through boto3 (AWS's own SDK), so credentials, region and endpoint come the
standard way: ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``, ``AWS_PROFILE``
and ``~/.aws``, ``AWS_REGION``, ``AWS_ENDPOINT_URL`` (an S3-compatible server), and botocore's
retries. Nothing here prints a credential: errors name the bucket, the key and S3's error code.

Writes are conditional, so that two writers never silently replace each other's objects: a
final file is created with ``If-None-Match: *`` (S3 refuses it if the name exists), and the
state object is replaced with ``If-Match: <the ETag this writer last saw>`` (S3 refuses it if
anyone else wrote it in between). S3 has offered both since 2024; so do MinIO and moto.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pgrecv.errors import OutputError, UsageError

# boto3 ships without type hints (they are a separate, generated package)
S3Client = Any

SCHEMES: Final = ("s3://", "s3a://")
# one PUT takes up to 5 GiB; a larger file goes up in parts (the last step conditional as well)
SINGLE_PUT_MAX: Final = 5 << 30
PART_SIZE: Final = 256 << 20
_BUCKET_RE: Final = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


def is_store_url(text: str) -> bool:
    """An object store's URL (``s3://``, ``gs://``, …: a scheme other than ``file``)."""
    return bool(re.match(r"[a-z][a-z0-9+.-]*://", text)) and not text.startswith("file://")


@dataclass(frozen=True, slots=True)
class StoreURL:
    """``s3://BUCKET/PREFIX``: the prefix without slashes at either end ('' for the bucket's top)."""

    bucket: str
    prefix: str

    @classmethod
    def parse(cls, text: str) -> StoreURL:
        scheme = next((s for s in SCHEMES if text.startswith(s)), None)
        if scheme is None:
            given = text.split("://", 1)[0]
            raise UsageError(
                f"{text}: pgrecv start writes to s3:// (any S3-compatible store, AWS_ENDPOINT_URL), not {given}://: "
                "give s3://BUCKET/PREFIX or a local directory"
            )
        bucket, _, prefix = text[len(scheme) :].partition("/")
        if not _BUCKET_RE.fullmatch(bucket):
            raise UsageError(f"{text}: {bucket!r} is not an S3 bucket name: give s3://BUCKET/PREFIX")
        return cls(bucket, prefix.strip("/"))

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


class ObjectStore:
    """One bucket prefix, flat: the names directly under it (no deeper keys)."""

    def __init__(self, url: StoreURL, client: S3Client | None = None) -> None:
        self.url = url
        self._client = client

    @property
    def client(self) -> S3Client:
        if self._client is None:
            try:
                import boto3
            except ImportError:
                raise UsageError(f"{self.url} needs boto3 (AWS's SDK for Python): pip install 'pgrecv[s3]'") from None
            self._client = boto3.session.Session().client("s3")
        return self._client

    def where(self, name: str | None = None) -> str:
        return f"{self.url}/{name}" if name else str(self.url)

    def fail(self, exc: Exception, doing: str, name: str | None = None) -> OutputError:
        """One line naming the object, what was being done and S3's error code (never a credential)."""
        code = code_of(exc)
        what = f"{code}" if code else type(exc).__name__
        detail = _message(exc)
        return OutputError(
            f"cannot {doing} {self.where(name)}: {what}{f' ({detail})' if detail else ''}; nothing past what is "
            "already uploaded was confirmed: check the bucket, the credentials and AWS_ENDPOINT_URL, and run again"
        )

    def names(self) -> list[str]:
        """The names directly under the prefix (all pages)."""
        base = self.url.key("")
        out: list[str] = []
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.url.bucket, Prefix=base, Delimiter="/"
            )
            for page in pages:
                for obj in page.get("Contents", []):
                    out.append(obj["Key"][len(base) :])
        except Exception as exc:  # botocore's errors have no common base short of Exception
            raise self.fail(exc, "list") from None
        return out

    def metadata(self, name: str) -> dict[str, str] | None:
        """The object's user metadata; None when there is no such object."""
        try:
            head = self.client.head_object(Bucket=self.url.bucket, Key=self.url.key(name))
        except Exception as exc:
            if status_of(exc) == 404:
                return None
            raise self.fail(exc, "look at", name) from None
        return dict(head.get("Metadata", {}))

    def read(self, name: str) -> tuple[bytes, str] | None:
        """A small object's bytes and ETag; None when there is no such object."""
        try:
            got = self.client.get_object(Bucket=self.url.bucket, Key=self.url.key(name))
            return got["Body"].read(), str(got["ETag"])
        except Exception as exc:
            if status_of(exc) == 404:
                return None
            raise self.fail(exc, "read", name) from None

    def replace(self, name: str, data: bytes, etag: str | None) -> str:
        """Write a small object: created (``etag`` None) or replaced only if it still has ``etag``.
        Returns the new ETag. Refused: another writer was there first."""
        cond = {"IfNoneMatch": "*"} if etag is None else {"IfMatch": etag}
        try:
            put = self.client.put_object(Bucket=self.url.bucket, Key=self.url.key(name), Body=data, **cond)
        except Exception as exc:
            if status_of(exc) in (409, 412):
                raise OutputError(
                    f"{self.where(name)} was written by someone else while this run held it: is another "
                    "pgrecv writing to this prefix? nothing more was confirmed: give each slot a prefix of its own"
                ) from None
            raise self.fail(exc, "write", name) from None
        return str(put["ETag"])

    def delete(self, name: str) -> None:
        try:
            self.client.delete_object(Bucket=self.url.bucket, Key=self.url.key(name))
        except Exception as exc:
            raise self.fail(exc, "delete", name) from None

    def create_from(self, name: str, path: Path, metadata: dict[str, str]) -> None:
        """Upload a local file under a new name, whole or not at all; refused if the name exists."""
        size = path.stat().st_size
        key = self.url.key(name)
        try:
            if size <= SINGLE_PUT_MAX:
                with open(path, "rb") as body:
                    self.client.put_object(
                        Bucket=self.url.bucket, Key=key, Body=body, Metadata=metadata, IfNoneMatch="*"
                    )
            else:
                self._create_in_parts(key, path, metadata)
        except OutputError:
            raise
        except Exception as exc:
            if status_of(exc) in (409, 412):
                raise OutputError(
                    f"cannot publish {self.where(name)}: it already exists; is another program writing "
                    f"{self.url}? nothing more was confirmed"
                ) from None
            raise self.fail(exc, "upload", name) from None

    def _create_in_parts(self, key: str, path: Path, metadata: dict[str, str], part_size: int = PART_SIZE) -> None:
        """S3's multipart upload: the object appears only when the last call completes it, which is
        conditional as a single PUT is; a failed upload is aborted (its parts are not billed on)."""
        c, bucket = self.client, self.url.bucket
        upload = c.create_multipart_upload(Bucket=bucket, Key=key, Metadata=metadata)["UploadId"]
        try:
            parts = []
            with open(path, "rb") as f:
                number = 1
                while chunk := f.read(part_size):
                    etag = c.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=number, Body=chunk)["ETag"]
                    parts.append({"ETag": etag, "PartNumber": number})
                    number += 1
            c.complete_multipart_upload(
                Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts}, IfNoneMatch="*"
            )
        except BaseException:
            with contextlib.suppress(Exception):  # the first error is the one to report
                c.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload)
            raise


def status_of(exc: Exception) -> int | None:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return int(status) if status is not None else None
    return None


def code_of(exc: Exception) -> str | None:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
        return str(code) if code else None
    return None


def _message(exc: Exception) -> str:
    """botocore's own text for connection and credential errors (it names the endpoint, never a secret)."""
    if code_of(exc):
        response = getattr(exc, "response", {})
        return str(response.get("Error", {}).get("Message", ""))[:200]
    return str(exc).splitlines()[0][:200] if str(exc) else ""
