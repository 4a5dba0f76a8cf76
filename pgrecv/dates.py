"""Calendar arithmetic shared by the decoders (test_decoding's timestamps) and the encoders."""

from __future__ import annotations

from typing import Final

_DAYS_0000_03_01_TO_1970: Final = 719_468  # days from 0000-03-01 to 1970-01-01


def days_from_civil(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (year 0 is 1 BC), for any year:
    PostgreSQL allows years far beyond :mod:`datetime`'s range (H. Hinnant's days_from_civil;
    :func:`pgrecv.output.values._ymd` goes the other way, from days since 2000-01-01)."""
    y -= m <= 2
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146_097 + doe - _DAYS_0000_03_01_TO_1970
