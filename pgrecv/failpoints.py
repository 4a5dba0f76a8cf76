"""Failpoints: the hooks by which tests slow pgrecv down at chosen places, all of them here.

A failpoint is read from the environment, so that a test can set it on a ``pgrecv`` subprocess;
unset (the normal case) it does nothing. None changes what pgrecv writes or confirms, only when.

``PGRECV_SNAPSHOT_DELAY=SECONDS``
    Each ``pgrecv snapshot`` worker sleeps this long after importing the snapshot and after each
    file it copies: time for a test to interrupt the copy, kill the exporting connection, or look
    at the temporary files (tests/snapshot/test_snapshot.py, tests/output/test_output_tempfiles.py).
"""

from __future__ import annotations

import os
from typing import Final

SNAPSHOT_DELAY: Final = "PGRECV_SNAPSHOT_DELAY"


def snapshot_delay() -> float:
    """Seconds a snapshot worker waits at its failpoints (0: none)."""
    return float(os.environ.get(SNAPSHOT_DELAY, "0") or 0)
