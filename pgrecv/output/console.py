"""The rich Console that pgrecv's tables and pretty output go through."""

from __future__ import annotations

import errno

from rich.console import Console


class PipeConsole(Console):
    """A Console whose reader going away (``| head``) is an output error like any other.

    Rich's own answer to a broken pipe is a silent ``SystemExit(1)``: exit 1 is pgrecv's code for
    its bugs, and nothing would say what happened. Here the BrokenPipeError reaches the CLI, which
    says so in one line and exits 8, as it does for JSONL and raw output.
    """

    def on_broken_pipe(self) -> None:
        self.quiet = True  # what a cleanup prints after this goes nowhere
        raise BrokenPipeError(errno.EPIPE, "the reader of the output went away")
