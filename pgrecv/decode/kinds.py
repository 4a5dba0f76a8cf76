"""pgoutput's message kinds: the first byte of every logical replication message, by name.

As in PostgreSQL's "Logical Replication Message Formats"; the copy-both framing around them
(XLogData, keepalive, status update) is in :mod:`pgrecv.stream.wire`.
"""

from __future__ import annotations

from typing import Final

BEGIN: Final = 0x42  # 'B'
COMMIT: Final = 0x43  # 'C'
ORIGIN: Final = 0x4F  # 'O'
RELATION: Final = 0x52  # 'R'
TYPE: Final = 0x59  # 'Y'
INSERT: Final = 0x49  # 'I'
UPDATE: Final = 0x55  # 'U'
DELETE: Final = 0x44  # 'D'
TRUNCATE: Final = 0x54  # 'T'
MESSAGE: Final = 0x4D  # 'M'
STREAM_START: Final = 0x53  # 'S'
STREAM_STOP: Final = 0x45  # 'E'
STREAM_COMMIT: Final = 0x63  # 'c'
STREAM_ABORT: Final = 0x41  # 'A'
BEGIN_PREPARE: Final = 0x62  # 'b'
PREPARE: Final = 0x50  # 'P'
COMMIT_PREPARED: Final = 0x4B  # 'K'
ROLLBACK_PREPARED: Final = 0x72  # 'r'
STREAM_PREPARE: Final = 0x70  # 'p'

# TupleData column kinds
COLUMN_TEXT: Final = 0x74  # 't'
COLUMN_NULL: Final = 0x6E  # 'n'
COLUMN_UNCHANGED: Final = 0x75  # 'u' unchanged TOASTed value
COLUMN_BINARY: Final = 0x62  # 'b'
