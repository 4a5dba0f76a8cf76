"""The run's inputs: SOURCE arguments as files in replay order, snapshot manifests, LSN text."""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from pgrecv.errors import InputError
from pgrecv.output.files import MANIFEST_SUFFIX, SNAPSHOT_FILE_RE, TMP_PREFIX, is_record_file
from pgrecv.spark import stores
from pgrecv.spark.stores import SourceFile, StoreDir, is_store_source

if TYPE_CHECKING:
    from pyarrow.fs import FileSystem

# one half of an LSN: plain hex digits only (int(x, 16) alone would take "-5", "0x10" and "1_0")
_half = re.compile(r"[0-9A-Fa-f]{1,8}\Z").match


def parse_lsn(text: Any) -> int:
    if not isinstance(text, str):
        raise ValueError(f"LSN {text!r} is not a string")
    hi, sep, lo = text.partition("/")
    if not sep or not _half(hi) or not _half(lo):
        raise ValueError(f"invalid LSN {text!r}")
    return (int(hi, 16) << 32) | int(lo, 16)


def expand_sources(sources: Iterable[str], conf: dict[str, str] | None = None) -> list[SourceFile]:
    """Files, globs and directories → files in replay order (each directory sorted by name).

    In a directory only finalised files count: ``FIRST-LAST*.jsonl`` names (not hidden ``.tmp-``
    files being written) and snapshot files. A SOURCE on an object store (``s3://``) is a prefix
    (taken as a directory), an object, or a glob in its last part (pgrecv/spark/stores.py);
    ``conf``: the run's Spark settings, which also say how to reach the store.
    """
    out: list[SourceFile] = []
    seen: set[SourceFile] = set()

    def add(path: SourceFile) -> None:
        key = path.resolve()
        if key not in seen:
            if isinstance(path, Path):
                _readable(path)
            seen.add(key)
            out.append(path)

    made: dict[str, FileSystem] = {}
    for source in sources:
        if is_store_source(source):
            stores.check_scheme(source)
            found = stores.expand(source, stores.filesystem_for(source, conf or {}, made))
            if isinstance(found, StoreDir):
                found = [
                    f for f in stores.listing(found, source) if not f.name.startswith(".") and is_record_file(f.name)
                ]
            elif not found:
                raise InputError(f"{source}: no object matches: check the SOURCE arguments")
            for f in found:
                if not f.name.startswith(TMP_PREFIX):
                    add(f)
            continue
        path = Path(source)
        if path.is_dir():
            try:
                entries = list(os.scandir(path))
            except OSError as exc:
                raise InputError(
                    f"{path}: cannot list it ({exc.strerror}): give spark-apply a SOURCE it can read"
                ) from None
            names = sorted(e.name for e in entries if e.is_file() and not e.name.startswith("."))
            for name in names:
                if is_record_file(name):
                    add(path / name)
        elif path.is_file():
            add(path)
        else:
            matches = sorted(glob.glob(source))
            if not matches:
                raise InputError(f"{source}: no such file, directory or matching glob: check the SOURCE arguments")
            for match in matches:
                mp = Path(match)
                if mp.is_file() and not mp.name.startswith(TMP_PREFIX):
                    add(mp)
    return out


def _readable(path: Path) -> None:
    """A file the driver can open: Spark's tasks would otherwise fail on it with a Java stack."""
    try:
        os.close(os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)))
    except OSError as exc:
        raise InputError(f"{path}: cannot read it ({exc.strerror}): give spark-apply a SOURCE it can read") from None


def ignored_in_directories(sources: Iterable[str], conf: dict[str, str] | None = None) -> list[str]:
    """A warning per directory SOURCE (or store prefix) holding ``.jsonl`` files that it does not
    take (a ``changes.jsonl`` of `pgrecv peek -f`, say): the run would otherwise say "0 files"
    and exit 0, as if there were nothing to apply."""
    out = []
    made: dict[str, FileSystem] = {}
    for source in sources:
        if is_store_source(source):
            found = stores.expand(source, stores.filesystem_for(source, conf or {}, made))
            if not isinstance(found, StoreDir):
                continue
            where, listed = str(found), [f.name for f in stores.listing(found, source)]
        else:
            path = Path(source)
            if not path.is_dir():
                continue
            where, listed = str(path), [e.name for e in os.scandir(path) if e.is_file()]
        names = sorted(n for n in listed if n.endswith(".jsonl") and not n.startswith(".") and not is_record_file(n))
        if names:
            shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            out.append(
                f"{where}: {len(names)} file(s) not taken ({shown}): a directory gives only the files that "
                "`pgrecv start --output-dir` names (FIRST-LAST.jsonl); give other files as SOURCE themselves"
            )
    return out


def check_snapshots(files: list[SourceFile]) -> dict[SourceFile, dict[str, Any]]:
    """Snapshot files must be listed in their manifest (written last): else they are incomplete."""
    manifests: dict[SourceFile, dict[str, Any]] = {}
    for path in files:
        m = SNAPSHOT_FILE_RE.fullmatch(path.name)
        if m is None:
            continue
        mpath = path.with_name(m.group("prefix") + MANIFEST_SUFFIX)
        if mpath not in manifests:
            try:
                manifest = orjson.loads(mpath.read_bytes())
                if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), list):
                    raise ValueError("not a snapshot manifest")
            except FileNotFoundError:
                manifest = None
            except (ValueError, OSError) as exc:
                raise InputError(f"{mpath}: unreadable snapshot manifest ({exc}): re-run `pgrecv snapshot`") from None
            if manifest is None:
                raise InputError(
                    f"{path}: snapshot file without its manifest {mpath.name}: the snapshot is incomplete; "
                    "re-run `pgrecv snapshot`"
                )
            manifests[mpath] = manifest
        names = {f.get("name") for f in manifests[mpath]["files"] if isinstance(f, dict)}
        if path.name not in names:
            raise InputError(
                f"{path}: snapshot file not listed in its manifest {mpath.name}: the snapshot is incomplete; "
                "re-run `pgrecv snapshot`"
            )
    return manifests


def snapshot_tables(manifests: dict[SourceFile, dict[str, Any]]) -> list[tuple[str, str, int]]:
    """(schema, table, the position just before the snapshot's) for every table of every manifest:
    each is a TRUNCATE barrier there, followed by its rows."""
    out: list[tuple[str, str, int]] = []
    for mpath, manifest in manifests.items():
        try:
            pos = parse_lsn(manifest["snapshot_lsn"]) - 1
            for entry in manifest.get("tables") or manifest["files"]:
                if isinstance(entry, dict) and "schema" in entry:  # v2: schema and table apart
                    out.append((str(entry["schema"]), str(entry["table"]), pos))
                else:  # v1 wrote "schema.table" (ambiguous when the schema holds a "."): split at the first
                    schema, _, table = str(entry["table"] if isinstance(entry, dict) else entry).partition(".")
                    out.append((schema, table, pos))
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"{mpath}: bad snapshot manifest ({exc!r}): re-run `pgrecv snapshot`") from None
    return out
