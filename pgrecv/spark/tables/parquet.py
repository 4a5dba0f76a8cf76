"""Parquet tables: versions switched by an atomic pointer.

``TABLE/_versions/vNNNNNN/`` holds each version's data files (files a batch does not touch are
hard links to the previous version's), ``TABLE/_pgrecv_table.json`` is the truth (the current
version, the applied position, the key), ``TABLE/current`` a symlink to the current version for
readers (``spark.read.parquet("TABLE/current")``). A batch writes a new version directory, renames
it into place, then replaces the pointer (write, fsync, rename) and the link; a run killed at any
moment leaves the pointer on the old version or the new one. See docs/spark-apply.md for readers.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from pgrecv.errors import OutputError
from pgrecv.lsn import lsn_str
from pgrecv.output.files import fsync_dir
from pgrecv.spark.stores import StorePath, TargetPath
from pgrecv.spark.tables import DATA_SUFFIX, POINTER, Batch, Table, refuse_other_format
from pgrecv.spark.tables.rewrite import fsync_files, missing_dirs, rewrite_for, unmake

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


# a table's pointer, ``_pgrecv_table.json``, as read (its fields: ParquetTable._switch, ParquetStoreTable)
Pointer = dict[str, Any]


def atomic_write(path: Path, data: bytes, mode: int | None = None) -> None:
    """``data`` under ``path`` whole or not at all. The temp file has an unpredictable name and is
    created with O_EXCL (mkstemp); ``mode`` None means what the umask allows (lake metadata other
    readers need), else exactly ``mode`` (0600 for raw change data)."""
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if mode is None:
                mask = os.umask(0)
                os.umask(mask)
                mode = 0o666 & ~mask
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


class ParquetTable(Table):
    """``TABLE/_versions/vNNNNNN/`` data, ``TABLE/_pgrecv_table.json`` the truth, ``TABLE/current``
    a symlink to the current version for readers."""

    path: Path  # a local directory (on a store: ParquetStoreTable)

    KEEP = 2  # versions kept: the current one and the one before (readers still on it)

    def __init__(self, path: Path, app_id: str, spark: SparkSession) -> None:
        super().__init__(path, app_id, spark)
        self.pointer: Pointer | None = None

    def _dir(self, version: int) -> Path:
        return self.path / "_versions" / f"v{version:06d}"

    def open(self) -> None:
        import pyarrow.parquet as pq

        refuse_other_format(self.path, "parquet")
        self._sweep()
        try:
            self.pointer = orjson.loads((self.path / POINTER).read_bytes())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            raise OutputError(f"{self.path / POINTER}: unreadable ({exc}): restore it or remove the table") from None
        assert self.pointer is not None
        self.version = int(self.pointer["version"])
        self.applied = int(self.pointer["applied_lsn_int"])
        self.mode = self.pointer.get("mode")
        self.schema = pq.read_schema(self._dir(self.version) / "_schema.parquet")
        self._link(self.version)  # repair a switch a crash interrupted

    def _link(self, version: int) -> None:
        link = self.path / "current"
        want = f"_versions/v{version:06d}"
        with contextlib.suppress(OSError):
            if os.readlink(link) == want:
                return
        tmp = self.path / f".tmp-current-{os.getpid()}"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        os.symlink(want, tmp)
        os.replace(tmp, link)

    def data_files(self) -> list[str]:
        if self.version is None:
            return []
        d = self._dir(self.version)
        return sorted(str(p) for p in d.iterdir() if p.name.endswith(DATA_SUFFIX) and not p.name.startswith((".", "_")))

    def write_frames(self, batch: Batch) -> int:
        """Writes the batch; returns the bytes of the files written."""
        import pyarrow.parquet as pq

        current = self.data_files()
        rw = rewrite_for(self.spark, batch, current, self.schema)
        dropped, rows = rw.plan()
        version = (self.version or 0) + 1
        base = self.path / "_versions"
        made = missing_dirs(self.path)
        base.mkdir(parents=True, exist_ok=True)
        final = self._dir(version)
        if final.exists():  # left by a run killed after the rename and before the pointer switch
            shutil.rmtree(final)
        tmp = base / f".tmp-v{version:06d}-{uuid.uuid4().hex}"
        try:
            written = rw.write(rows, tmp, dropped)
            if batch.settle is not None:
                batch.settle()
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)  # what the failed job left
            unmake(made)
            raise
        size = sum(p.stat().st_size for p in written)
        for p in tmp.iterdir():
            if not p.name.endswith(DATA_SUFFIX) or p.name.startswith(("_", ".")):
                p.unlink()  # Spark's _SUCCESS and .crc files
        gone = set(dropped)
        for kept in current:
            if kept not in gone:
                dest = tmp / os.path.basename(kept)
                try:
                    os.link(kept, dest)
                except OSError:
                    shutil.copy2(kept, dest)
        pq.write_metadata(batch.schema, tmp / "_schema.parquet")  # the schema even when empty
        fsync_files(list(tmp.iterdir()))
        fsync_dir(tmp)
        os.rename(tmp, final)
        fsync_dir(base)
        self._switch(version, "history" if batch.history else "latest", batch.position, batch.key_cols)
        return size

    def _switch(self, version: int, mode: str, position: int, key_cols: list[str]) -> None:
        """The new version (already renamed into place) becomes the table: pointer, then link."""
        pointer = {
            "v": 1,
            "format": "parquet",
            "mode": mode,
            "version": version,
            "path": f"_versions/v{version:06d}",
            "applied_lsn": lsn_str(position),
            "applied_lsn_int": position,
            "key": key_cols,
        }
        atomic_write(self.path / POINTER, orjson.dumps(pointer, option=orjson.OPT_INDENT_2))
        self._link(version)
        self.version = version
        self._cleanup(version)

    def _sweep(self) -> None:
        """Temp versions and temp pointers a killed run left (even when this run has nothing to write)."""
        for base in (self.path, self.path / "_versions"):
            if not base.is_dir():
                continue
            for entry in base.iterdir():
                if entry.name.startswith(".tmp-"):
                    if entry.is_dir() and not entry.is_symlink():
                        shutil.rmtree(entry, ignore_errors=True)
                    else:
                        entry.unlink(missing_ok=True)

    def _cleanup(self, version: int) -> None:
        base = self.path / "_versions"
        for entry in base.iterdir():
            name = entry.name
            if name.startswith(".tmp-") or (name.startswith("v") and int(name[1:]) <= version - self.KEEP):
                shutil.rmtree(entry, ignore_errors=True)


class ParquetStoreTable(Table):
    """A Parquet table on an object store, where nothing can be renamed or linked:
    ``TABLE/_versions/vNNNNNN-<random>/`` holds the data files a version wrote (a fresh name each
    attempt, so a killed run's never meets the next one's), and ``TABLE/_pgrecv_table.json`` is the
    truth: the version, the applied position, and ``files``, every data file of the version by its
    path under the table (files a batch did not touch are named again, not copied). A batch writes
    its files, then replaces the pointer in one PUT, which S3 makes visible whole: readers that
    follow the pointer see the old version or the new one, never a mix (docs/spark-apply.md).
    Versions that neither the current pointer nor the one before name are removed after a switch."""

    path: StorePath

    def __init__(self, path: TargetPath, app_id: str, spark: SparkSession) -> None:
        assert isinstance(path, StorePath)
        super().__init__(path, app_id, spark)
        self.pointer: Pointer | None = None

    def open(self) -> None:
        import pyarrow.parquet as pq

        refuse_other_format(self.path, "parquet")
        where = self.path / POINTER
        if not where.exists():
            return
        try:
            self.pointer = orjson.loads(where.read_bytes())
            assert self.pointer is not None
            self.version = int(self.pointer["version"])
            self.applied = int(self.pointer["applied_lsn_int"])
            self.mode = self.pointer.get("mode")
            schema = self.path / str(self.pointer["schema"])
            self.schema = pq.read_schema(f"{schema.bucket}/{schema.key}", filesystem=self.path.fs)
            if not isinstance(self.pointer.get("files"), list):
                raise ValueError("no list of files")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise OutputError(f"{where}: unreadable ({exc}): restore it or remove the table") from None

    def data_files(self) -> list[str]:
        if self.pointer is None:
            return []
        return [f"{self.path.spark_url}/{rel}" for rel in self.pointer["files"]]

    def write_frames(self, batch: Batch) -> int:
        import pyarrow.parquet as pq

        current = self.data_files()
        rw = rewrite_for(self.spark, batch, current, self.schema)
        dropped, rows = rw.plan()
        version = (self.version or 0) + 1
        name = f"_versions/v{version:06d}-{uuid.uuid4().hex[:12]}"
        out = self.path / name
        try:
            written = rw.write(rows, out, dropped)
            if batch.settle is not None:
                batch.settle()
            for p in out.iterdir():
                if not p.name.endswith(DATA_SUFFIX) or p.name.startswith(("_", ".")):
                    p.unlink()  # Spark's _SUCCESS
            schema = out / "_schema.parquet"  # the schema even when empty
            pq.write_metadata(batch.schema, f"{schema.bucket}/{schema.key}", filesystem=self.path.fs)
            size = sum(p.stat().st_size for p in written)
            gone = set(dropped)
            prefix = self.path.spark_url + "/"
            files = [f[len(prefix) :] for f in current if f not in gone] + [f"{name}/{p.name}" for p in written]
            self.guard()
        except BaseException:
            out.remove_tree()  # no pointer names these files
            raise
        before = self.pointer
        self.pointer = {
            "v": 1,
            "format": "parquet",
            "mode": "history" if batch.history else "latest",
            "version": version,
            "schema": f"{name}/_schema.parquet",
            "files": files,
            "applied_lsn": lsn_str(batch.position),
            "applied_lsn_int": batch.position,
            "key": batch.key_cols,
        }
        pointer = self.path / POINTER
        with self.path.fs.open_output_stream(f"{pointer.bucket}/{pointer.key}") as f:
            f.write(orjson.dumps(self.pointer, option=orjson.OPT_INDENT_2))
        self.version = version
        self._cleanup(before)
        return size

    def _cleanup(self, before: Pointer | None) -> None:
        """Version prefixes that neither this pointer nor the one before names (older versions, a
        killed run's): readers on the previous version keep its files."""
        assert self.pointer is not None
        named = {str(f).split("/", 2)[1] for p in (self.pointer, before or {}) for f in p.get("files", [])}
        named |= {str(p["schema"]).split("/", 2)[1] for p in (self.pointer, before or {}) if "schema" in p}
        for entry in (self.path / "_versions").iterdir():
            if entry.name not in named:
                entry.remove_tree()
