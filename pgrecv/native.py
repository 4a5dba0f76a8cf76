"""The one place that decides whether pgrecv uses its C extension (:mod:`pgrecv._copyfast`).

The extension is optional: built by ``pip install`` where a C compiler is found, else absent, and
then the pure-Python encoders (the reference) do all the work. ``PGRECV_NO_NATIVE=1`` in the
environment disables it even when built, so that the whole test suite can run on the fallback
(and a suspected bug in the C code can be ruled out). Read once, at import; other modules take
``copyfast`` from here and never import the extension themselves.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Final

__all__ = ["ENV_SWITCH", "copyfast", "start_writeback"]

ENV_SWITCH: Final = "PGRECV_NO_NATIVE"

try:
    from pgrecv import _copyfast as copyfast
except ImportError:  # built without a C compiler: the Python paths do it all, more slowly
    copyfast = None  # type: ignore[assignment]

if os.environ.get(ENV_SWITCH, "") not in ("", "0"):
    copyfast = None  # type: ignore[assignment]


def _no_writeback(fd: int, offset: int, nbytes: int, /) -> bool:
    return False


# Start writing a file's range to disk without waiting (the extension's sync_file_range). Without
# the extension: nothing, and the next fdatasync writes it all, as it would have anyway.
start_writeback: Callable[[int, int, int], bool] = copyfast.writeback if copyfast is not None else _no_writeback
