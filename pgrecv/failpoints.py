"""Failpoints: the hooks by which tests slow pgrecv down at chosen places, all of them here.

A failpoint is read from the environment, so that a test can set it on a ``pgrecv`` subprocess;
unset (the normal case) it does nothing. None changes what pgrecv writes or confirms, only when.

``PGRECV_SNAPSHOT_DELAY=SECONDS``
    Each ``pgrecv snapshot`` worker sleeps this long after importing the snapshot and after each
    file it copies: time for a test to interrupt the copy, kill the exporting connection, or look
    at the temporary files (tests/snapshot/test_snapshot.py, tests/output/test_output_tempfiles.py).

``PGRECV_STOP_DRAIN_DELAY=SECONDS``
    On a clean stop, ``pgrecv start`` sleeps this long after sending CopyDone and before it reads
    on: a client that slow lets the socket fill, and a walsender in the middle of a large
    transaction then answers CopyDone at once and goes on sending the transaction after it
    (tests/stream/test_stop.py).

``PGRECV_ICEBERG_CREATED_DELAY=SECONDS``
    ``spark-apply --format iceberg`` sleeps this long after it made a table by Iceberg's API (a
    table with uuid columns) and before it writes the table's first snapshot: time for a test to
    kill the run in between (tests/spark/test_iceberg.py).
"""

from __future__ import annotations

import os
from typing import Final

SNAPSHOT_DELAY: Final = "PGRECV_SNAPSHOT_DELAY"
STOP_DRAIN_DELAY: Final = "PGRECV_STOP_DRAIN_DELAY"
ICEBERG_CREATED_DELAY: Final = "PGRECV_ICEBERG_CREATED_DELAY"


def snapshot_delay() -> float:
    """Seconds a snapshot worker waits at its failpoints (0: none)."""
    return float(os.environ.get(SNAPSHOT_DELAY, "0") or 0)


def stop_drain_delay() -> float:
    """Seconds a stopping stream waits between its CopyDone and the rest of the server's data (0: none)."""
    return float(os.environ.get(STOP_DRAIN_DELAY, "0") or 0)


def iceberg_created_delay() -> float:
    """Seconds spark-apply waits between making an Iceberg table and its first snapshot (0: none)."""
    return float(os.environ.get(ICEBERG_CREATED_DELAY, "0") or 0)
