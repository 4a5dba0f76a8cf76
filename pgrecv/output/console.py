"""The rich Console that pgrecv's tables and pretty output go through."""

from __future__ import annotations

import errno
from typing import Any

from rich.console import Console

from pgrecv.output.files import output_error


class PipeConsole(Console):
    """A Console whose output failing (``| head``, a full disk) is an output error like any other.

    Rich's own answer to a broken pipe is a silent ``SystemExit(1)``: exit 1 is pgrecv's code for
    its bugs, and nothing would say what happened. Here the BrokenPipeError reaches the CLI, which
    says so in one line and exits 8, as it does for JSONL and raw output; any other failed write
    (ENOSPC, EIO) is an OutputError naming it, where rich would let a traceback through.
    """

    def __init__(self, *args: Any, where: str = "standard output", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.where = where  # what a failed write names

    def on_broken_pipe(self) -> None:
        self.quiet = True  # what a cleanup prints after this goes nowhere
        raise BrokenPipeError(errno.EPIPE, "the reader of the output went away")

    def _check_buffer(self) -> None:  # rich's one place that writes the buffer out (13.x, 14.x)
        try:
            super()._check_buffer()
        except BrokenPipeError:
            raise
        except OSError as exc:
            self.quiet = True
            raise output_error(exc, self.where, "write") from None
