"""What pgrecv knows about output plugins: option defaults and which decoder reads them.

Shared by ``peek`` (SQL interface) and ``start`` (streaming), so both ask the plugin for the
same thing and decode it the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pgrecv.errors import UsageError
from pgrecv.events import Event
from pgrecv.pg.names import quote_name


class Decoder(Protocol):
    def decode(self, data: Any, lsn: int = 0) -> Event | None: ...


def max_proto_version(major: int) -> int:
    """The highest pgoutput protocol the server speaks (14: 2, 15: 3, 16+: 4)."""
    return 4 if major >= 16 else 3 if major == 15 else 2 if major == 14 else 1


def parse_options(pairs: Sequence[str]) -> list[tuple[str, str]]:
    """``-o name=value`` (or a bare ``name``) into pairs, in order."""
    out = []
    for pair in pairs:
        name, eq, value = pair.partition("=")
        if not name:
            raise UsageError(f"invalid plugin option {pair!r}: expected name=value or name")
        if name == "proto_version" and not (value.isascii() and value.isdigit() and 1 <= int(value) <= 4):
            # pgrecv reads the stream with this version too: it must be one pgrecv decodes
            raise UsageError(f"invalid plugin option {pair!r}: proto_version is a number from 1 to 4")
        out.append((name, value if eq else ""))
    return out


@dataclass(frozen=True, slots=True)
class PgOutputSettings:
    """The pgoutput switches of ``pgrecv start`` (``peek`` uses the defaults)."""

    proto_version: int | None = None  # None: the highest the server speaks
    binary: bool = False
    messages: bool = True
    origin: str | None = None  # any | none (PostgreSQL 16+)
    streaming: str | None = None  # on | off | parallel; None: on where the protocol allows
    two_phase: bool = False


def pgoutput_options(
    major: int, publication: str, settings: PgOutputSettings, *, sql_interface: bool = False
) -> list[tuple[str, str]]:
    proto = settings.proto_version or max_proto_version(major)
    if proto > max_proto_version(major):
        raise UsageError(
            f"--proto-version {proto} is newer than this server speaks (PostgreSQL {major}: "
            f"up to {max_proto_version(major)})"
        )
    opts = [("proto_version", str(proto)), ("publication_names", quote_name(publication))]
    if settings.messages:
        opts.append(("messages", "true"))
    if settings.binary:
        opts.append(("binary", "true"))
    if settings.origin is not None:
        if major < 16:
            raise UsageError(f"--origin needs PostgreSQL 16 or newer; this server is {major}")
        opts.append(("origin", settings.origin))
    streaming = settings.streaming
    if streaming is None and not sql_interface:
        streaming = "on" if proto >= 2 else "off"
    if streaming not in (None, "off"):
        needed = 4 if streaming == "parallel" else 2
        if proto < needed:
            raise UsageError(f"--streaming {streaming} needs --proto-version {needed} or newer")
        opts.append(("streaming", streaming))
    if settings.two_phase:
        if proto < 3:
            raise UsageError("--two-phase needs --proto-version 3 or newer (PostgreSQL 15+)")
        opts.append(("two_phase", "on"))
    return opts


def plan_options(
    conn: Any,
    slot_info: dict[str, Any],
    publication: str | None,
    settings: PgOutputSettings,
    user_options: Sequence[tuple[str, str]],
    *,
    sql_interface: bool,
) -> list[tuple[str, str]]:
    """The options to read the slot with: the plugin's defaults for this server, the user's -o last."""
    if slot_info["plugin"] != "pgoutput":
        return list(user_options)
    from pgrecv.pg.conn import server_major
    from pgrecv.pg.slots import resolve_publication

    major = server_major(conn)
    given = {name for name, _ in user_options}
    pub = resolve_publication(conn, publication) if "publication_names" not in given else ""
    return merge_options(pgoutput_options(major, pub, settings, sql_interface=sql_interface), user_options)


def merge_options(defaults: Sequence[tuple[str, str]], user: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """User options (``-o``) replace defaults of the same name."""
    given = {name for name, _ in user}
    return [(n, v) for n, v in defaults if n not in given] + list(user)


def make_decoder(plugin: str, options: Sequence[tuple[str, str]]) -> Decoder:
    if plugin == "pgoutput":
        from pgrecv.decode.pgoutput import PgOutputDecoder

        opts = dict(options)
        return PgOutputDecoder(proto_version=int(opts.get("proto_version", "1")))
    if plugin == "test_decoding":
        from pgrecv.decode.test_decoding import TestDecodingParser

        return TestDecodingParser()
    raise UsageError(f"pgrecv decodes pgoutput and test_decoding, not {plugin}: use --format raw for other plugins")
