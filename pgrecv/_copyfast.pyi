"""Types of the C module built from _copyfast.c (see there, pgrecv.native, pgrecv.output.fastpath and
pgrecv.snapshot.fast)."""

from collections.abc import Callable
from typing import Any

def bind(libpq_path: str, /) -> None: ...
def backend_pid(pgconn_ptr: int, /) -> int: ...
def read(pgconn_ptr: int, limit: int, /) -> tuple[int, bytes]: ...
def encode(
    block: bytes,
    out: bytearray,
    kinds: bytes,
    elems: bytes,
    delims: bytes,
    head: bytes,
    keys: tuple[bytes, ...],
    tail: bytes,
    /,
) -> tuple[int, int] | None: ...
def make_plan(
    kinds: bytes,
    elems: bytes,
    delims: bytes,
    bkinds: bytes,
    keyflags: bytes,
    names: tuple[bytes, ...],
    tconvs: tuple[Callable[[str], object] | None, ...],
    bconvs: tuple[Callable[[bytes], object], ...],
    fields: tuple[bytes, ...],
    old_kinds: tuple[bytes, ...],
    dumps: Callable[[Any], bytes],
    json_null: object,
    /,
) -> object: ...
def encode_row(message: Any, lsn: int, plan: object, heads: tuple[bytes, ...], /) -> bytes | None: ...
def pump(
    pgconn_ptr: int, plans: dict[int, tuple[object, tuple[bytes, ...]]], endpos: int, limit: int, out: bytearray, /
) -> tuple[int, bytes | None, int, int]: ...
def float_json(x: float, /) -> bytes | None: ...
def writeback(fd: int, offset: int, nbytes: int, /) -> bool: ...
