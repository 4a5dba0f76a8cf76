"""The one place that decides whether pgrecv uses its C extension (:mod:`pgrecv._copyfast`).

The extension is optional: built by ``pip install`` where a C compiler is found, else absent, and
then the pure-Python encoders (the reference) do all the work. ``PGRECV_NO_NATIVE=1`` in the
environment disables it even when built, so that the whole test suite can run on the fallback
(and a suspected bug in the C code can be ruled out). Read once, at import; other modules take
``copyfast`` from here and never import the extension themselves.
"""

from __future__ import annotations

import os
from typing import Any, Final

__all__ = ["ENV_SWITCH", "copyfast", "pgconn_address"]

ENV_SWITCH: Final = "PGRECV_NO_NATIVE"

try:
    from pgrecv import _copyfast as copyfast
except ImportError:  # built without a C compiler: the Python paths do it all, more slowly
    copyfast = None  # type: ignore[assignment]

if os.environ.get(ENV_SWITCH, "") not in ("", "0"):
    copyfast = None  # type: ignore[assignment]


_bound: bool | None = None  # the extension bound to psycopg's libpq: not yet tried, yes, no


def pgconn_address(pgconn: Any) -> int | None:
    """The address of psycopg's ``PGconn`` for the extension's own libpq calls (``read``,
    ``pump``), or None: no extension, or it cannot be trusted with this connection.

    The extension must call the libpq that psycopg loaded (PGconn's layout is private to a
    release): it is bound to the one libpq mapped in this process, on Linux, and trusted for a
    connection only if that libpq reports the connection's backend pid as psycopg does.
    """
    global _bound
    if copyfast is None:
        return None
    if _bound is None:
        _bound = False
        try:
            with open("/proc/self/maps") as maps:  # address perms offset dev inode path (may hold spaces)
                paths = {f[5].strip() for ln in maps if "/libpq" in ln and len(f := ln.split(maxsplit=5)) == 6}
            paths = {p for p in paths if p.rpartition("/")[2].startswith("libpq") and ".so" in p}
            if len(paths) == 1:
                copyfast.bind(paths.pop())
                _bound = True
        except OSError:
            pass
    if not _bound:
        return None
    ptr = getattr(pgconn, "pgconn_ptr", None)  # in both of psycopg's libpq wrappers, not in its Protocol
    if not ptr or copyfast.backend_pid(ptr) != pgconn.backend_pid:
        return None
    return int(ptr)
