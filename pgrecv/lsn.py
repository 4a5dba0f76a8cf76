"""Log sequence numbers.

An LSN is a 64-bit WAL position. It is an ``int`` so that comparisons, sorting and
arithmetic are integer operations (comparing the ``X/X`` text would order ``9/0`` after
``10/0``); only ``str()`` gives PostgreSQL's text form.
"""

from __future__ import annotations

import re

_LSN_RE = re.compile(r"\s*([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})\s*\Z")
_MAX = (1 << 64) - 1


class LSN(int):
    """A WAL position that prints as ``%X/%X`` and compares as a 64-bit integer."""

    __slots__ = ()

    def __new__(cls, value: int | str | LSN = 0) -> LSN:
        if isinstance(value, str):
            return cls.parse(value)
        if not 0 <= value <= _MAX:
            raise ValueError(f"LSN out of range: {value}")
        return int.__new__(cls, value)

    @classmethod
    def parse(cls, text: str) -> LSN:
        """Parse ``X/X``; a zero-padded low half (``0/0001A2B0``) is accepted too."""
        m = _LSN_RE.match(text)
        if m is None:
            raise ValueError(f"invalid LSN {text!r}: expected two hexadecimal halves like 0/16B3748")
        return int.__new__(cls, (int(m.group(1), 16) << 32) | int(m.group(2), 16))

    def __str__(self) -> str:
        return f"{self >> 32:X}/{self & 0xFFFFFFFF:X}"

    def __repr__(self) -> str:
        return f"LSN('{self}')"

    def __format__(self, spec: str) -> str:
        if spec:
            return int.__format__(self, spec)
        return str(self)


def lsn_str(value: int) -> str:
    """``%X/%X`` of a plain int, without building an LSN (used on hot paths)."""
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"
