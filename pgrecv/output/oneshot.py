"""Where output goes, and when it counts as written.

A file is written under a temporary name beside its final one and renamed only after it is
complete and fsync'd, so a reader never takes a partial file for a complete one; standard output
is flushed. :meth:`Output.finish` is the durability point the caller waits for before it lets
the server forget anything (e.g. before committing ``pg_logical_slot_get_changes``).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

from pgrecv.errors import OutputError
from pgrecv.output.files import fsync_dir, output_error

TMP_SUFFIX = ".pgrecv-tmp"


class Output:
    """A binary destination: a path, or ``-``/None for standard output."""

    def __init__(self, path: str | None) -> None:
        self.path = None if path is None or path == "-" else Path(path)
        self._tmp: Path | None = None
        self.path_is_special = False
        self.stream: BinaryIO
        if self.path is None:
            self.stream = sys.stdout.buffer
            return
        try:
            if self.path.exists() and not self.path.is_file():
                # a device or a FIFO (-f /dev/null, a named pipe): written in place like stdout;
                # renaming a temporary file over it would replace the device with a plain file
                self.stream = open(self.path, "wb", buffering=1 << 16)  # noqa: SIM115
                self.path_is_special = True
                return
            # an unpredictable name, created with O_EXCL|O_NOFOLLOW (0600): in a shared directory
            # nobody can plant a symlink for pgrecv to write through or to publish as the output
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=TMP_SUFFIX, dir=self.path.parent)
            self._tmp = Path(tmp)
            self.stream = os.fdopen(fd, "wb", buffering=1 << 16)
        except OSError as exc:
            raise output_error(exc, self.path, "write") from None

    @property
    def is_terminal(self) -> bool:
        return self.path is None and sys.stdout.isatty()

    def write(self, data: bytes) -> None:
        try:
            self.stream.write(data)
        except BrokenPipeError:
            raise  # the CLI's one line for a reader that went away
        except OSError as exc:  # a full disk, an I/O error: nothing is consumed after this
            raise output_error(exc, self.path or "standard output", "write") from None

    def finish(self) -> None:
        """Make everything written durable; for a file, publish it under its final name."""
        try:
            self.stream.flush()
            if self.path is None or self._tmp is None:
                if self.path_is_special:
                    self.stream.close()
                return
            os.fsync(self.stream.fileno())
            self.stream.close()
            os.replace(self._tmp, self.path)
            fsync_dir(self.path.parent)
            self._tmp = None
        except BrokenPipeError:
            raise OutputError("output pipe closed before all data was written") from None
        except OSError as exc:
            raise output_error(exc, self.path or "standard output", "write") from None

    def abort(self) -> None:
        """Drop a partial file: nothing incomplete is left under the final name."""
        if self._tmp is not None:
            with contextlib.suppress(OSError):
                self.stream.close()
            self._tmp.unlink(missing_ok=True)
            self._tmp = None

    def __enter__(self) -> Output:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        if et is not None:
            self.abort()
