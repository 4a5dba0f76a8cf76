"""Column values -> JSON-ready Python values, from the server's text form or its binary (send) form.

The decoders keep values as the server sent them (text ``str`` or binary ``bytes``); sinks that
want typed output (JSONL) ask here for one converter per column, once per relation, and call it
once per value on the hot path. Converters are plain callables, cheap by construction (``int``
itself converts integers) and return values orjson serialises as they are:

* integers (``smallint``, ``integer``, ``bigint``, ``oid``, ``xid``, ``xid8``, ``cid``) -> ``int``
* ``real``/``double precision`` -> ``float``; ``NaN``, ``Infinity``, ``-Infinity`` stay strings
  (JSON has no such numbers)
* ``numeric`` -> the exact decimal string, ``NaN``/``Infinity`` included (never a float)
* ``boolean`` -> ``True``/``False``
* ``json``/``jsonb`` -> the document embedded as is (an ``orjson.Fragment`` of the server's text,
  raw CR/LF turned into spaces so a JSONL line stays one line: they can only be whitespace
  between tokens, as JSON strings cannot hold raw control characters); the document ``null``
  gives :data:`JSON_NULL` so that it stays distinguishable from SQL NULL (``None``)
* ``bytea`` -> base64 (standard alphabet, padded), see :data:`BYTEA_ENCODING`
* arrays -> nested lists (:func:`parse_array`), elements converted like scalars of their type,
  SQL NULL elements ``None``, lower bounds dropped
* every other type -> the server's text, unchanged (:func:`text_converter` returns ``None`` for
  them, so callers skip the call altogether)

Binary values (pgoutput's ``binary`` option) are decoded to the *same* JSON value the text form
gives: types kept as text are rendered exactly as the server's output function would
(timestamps in ISO DateStyle with the server's TimeZone taken to be UTC, intervals in the
``postgres`` IntervalStyle, ...). Types without a binary decoder here (``money``, geometric
types, ``tsvector``, ``reg*``, enums and other user-defined types...) give the base64 of their
raw send() bytes, as the send format is all that is known about them.

Malformed input raises :class:`ValueFormatError`, which is both a :class:`~pgrecv.errors.DecodeError`
and a ``ValueError``; text converters may also raise the ``ValueError`` of ``int()``/``float()``.
"""

from __future__ import annotations

import binascii
import re
import struct
from collections.abc import Callable
from fractions import Fraction
from typing import Final

import orjson

from pgrecv.errors import DecodeError
from pgrecv.pg.types import ARRAY_DELIMITER, ARRAY_ELEMENT, TYPE_NAMES, oid_for_name

__all__ = [
    "BYTEA_ENCODING",
    "JSON_NULL",
    "BinaryConverter",
    "TextConverter",
    "ValueFormatError",
    "binary_converter",
    "bool_from_text",
    "int_from_text",
    "parse_array",
    "text_converter",
]

TextConverter = Callable[[str], object]
BinaryConverter = Callable[[bytes], object]


class ValueFormatError(DecodeError, ValueError):
    """A value that is not in its type's text or binary form.

    A DecodeError for the exit code, and a ValueError so that callers catching the conversion
    errors of ``int()``/``float()`` catch this one too (and can name the column)."""


JSON_NULL: Final = orjson.Fragment(b"null")
"""A json/jsonb document that is the literal ``null`` (SQL NULL is ``None``). Compare with ``is``.

It is an ``orjson.Fragment`` itself, so where it is not singled out (an element of a ``jsonb[]``)
it serialises as ``null``: inside arrays, SQL NULL elements (``None``) and ``null`` documents
(``JSON_NULL``) differ in Python but both print as JSON ``null``."""

BYTEA_ENCODING: Final = "base64"
"""How ``bytea`` values (and values of types without a binary decoder) are represented: RFC 4648
base64 with the standard alphabet and padding, no line breaks."""

# --- text form --------------------------------------------------------------------------------


class _Lookup(dict[str, bool]):
    """A dict whose misses raise ValueFormatError; its bound ``__getitem__`` is the converter."""

    def __missing__(self, key: str) -> bool:
        raise ValueFormatError(f"not a boolean: {key[:40]!r}")


bool_from_text: Final = _Lookup({"t": True, "f": False, "true": True, "false": False}).__getitem__


def _float_from_text(text: str) -> float | str:
    """A finite float, or the server's text for NaN/Infinity/-Infinity (``inf - inf`` is NaN)."""
    v = float(text)
    return v if v - v == 0.0 else text


def _json_from_text(text: str) -> object:
    if text == "null" or (len(text) < 64 and text.strip(" \t\r\n") == "null"):
        return JSON_NULL
    return orjson.Fragment(text.replace("\n", " ").replace("\r", " "))


def _b64(data: bytes) -> str:
    return binascii.b2a_base64(data, newline=False).decode("ascii")


_OCTAL: Final = frozenset("01234567")


def _bytea_escape_decode(text: str) -> bytes:
    """The escape output format: printable ASCII as is, ``\\\\`` for a backslash, ``\\ooo`` octal."""
    out = bytearray()
    i = 0
    n = len(text)
    try:
        while i < n:
            j = text.find("\\", i)
            if j < 0:
                out += text[i:].encode("ascii")
                break
            out += text[i:j].encode("ascii")
            if text[j + 1 : j + 2] == "\\":
                out.append(92)
                i = j + 2
                continue
            code = text[j + 1 : j + 4]
            if len(code) != 3 or not _OCTAL.issuperset(code) or code[0] > "3":
                raise ValueFormatError(f"invalid bytea escape at offset {j}: {text[j : j + 4]!r}")
            out.append(int(code, 8))
            i = j + 4
    except UnicodeEncodeError:
        raise ValueFormatError("bytea escape format holds a non-ASCII character") from None
    return bytes(out)


def _bytea_from_text(text: str) -> str:
    if text.startswith("\\x"):
        try:
            return _b64(bytes.fromhex(text[2:]))
        except ValueError:
            raise ValueFormatError(f"invalid bytea hex text: {text[:40]!r}") from None
    return _b64(_bytea_escape_decode(text))


# All case spellings of an unquoted NULL element (array_in accepts any; array_out writes "NULL"
# and quotes any element that would read as one).
_NULLS: Final = frozenset(
    "".join(c.upper() if (mask >> k) & 1 else c for k, c in enumerate("null")) for mask in range(16)
)


def parse_array(text: str, element_converter: TextConverter | None = None, delimiter: str = ",") -> list[object]:
    """Parse an array literal in ``array_out`` syntax into nested lists.

    Handles quoted elements (backslash escapes ``\\"`` and ``\\\\``), unquoted ``NULL`` (-> None;
    a quoted ``"NULL"`` is the string), nesting (``{{1,2},{3,4}}``), the empty array ``{}``, and
    the ``[lo:hi]=`` dimension decoration the server prints when a lower bound is not 1: the
    decoration is dropped and the elements kept, so ``[0:1]={a,b}`` gives ``["a", "b"]``.
    Non-NULL elements go through ``element_converter`` (kept as strings when it is None);
    ``delimiter`` is the element type's ``typdelim`` (``;`` for ``box``).
    """
    if text[:1] == "{" and text[-1:] == "}":
        start = 1
    elif text[:1] == "[":  # dimension decoration: [1:2][0:3]=
        start = text.find("=") + 1
        if start == 0 or text[start - 2 : start] != "]=" or text[start : start + 1] != "{" or text[-1:] != "}":
            raise ValueFormatError(f"malformed array literal: {text[:40]!r}")
        start += 1
    else:
        raise ValueFormatError(f"malformed array literal: {text[:40]!r}")
    body = text[start:-1]
    if '"' in body or "\\" in body:
        return _parse_nested(text, start, element_converter, delimiter)
    if "{" in body or "}" in body:
        return _parse_braces(text, body, element_converter, delimiter)
    # one dimension, nothing quoted: the common case
    if not body:
        return []
    items = body.split(delimiter)
    if "" in items:
        raise ValueFormatError(f"malformed array literal (empty element): {text[:40]!r}")
    conv = element_converter
    if "n" not in body and "N" not in body:  # no NULL element can be there
        return items if conv is None else list(map(conv, items))  # type: ignore[return-value]
    if conv is None:
        return [None if s in _NULLS else s for s in items]
    return [None if s in _NULLS else conv(s) for s in items]


_BRACES: Final = re.compile("([{}])")


def _parse_braces(text: str, body: str, conv: TextConverter | None, delim: str) -> list[object]:
    """Nested arrays with nothing quoted or escaped: the braces are all structure, so one split
    at them leaves runs of elements (and the delimiters between sub-arrays)."""
    root: list[object] = []
    cur = root
    stack: list[list[object]] = []
    tokens = _BRACES.split(body)  # text, brace, text, brace, ..., text
    last = len(tokens) - 1
    if tokens[0] or tokens[last]:
        raise ValueFormatError(f"malformed array literal: {text[:40]!r}")
    for k in range(1, last, 2):
        if tokens[k] == "{":
            new: list[object] = []
            cur.append(new)
            stack.append(cur)
            cur = new
        else:
            if not stack:
                raise ValueFormatError(f"unbalanced braces in array literal: {text[:40]!r}")
            cur = stack.pop()
        tok = tokens[k + 1]
        pair = tokens[k] + tokens[k + 2] if k + 2 <= last else tokens[k]
        if pair == "{}":  # elements
            items = tok.split(delim)
            if "" in items:
                raise ValueFormatError(f"malformed array literal (empty element): {text[:40]!r}")
            if conv is None:
                cur.extend(None if s in _NULLS else s for s in items)
            else:
                cur.extend(None if s in _NULLS else conv(s) for s in items)
        elif tok != (delim if pair == "}{" else ""):
            raise ValueFormatError(f"malformed array literal: {text[:40]!r}")
    if stack:
        raise ValueFormatError(f"unbalanced braces in array literal: {text[:40]!r}")
    return root


def _parse_nested(text: str, i: int, conv: TextConverter | None, delim: str) -> list[object]:
    """The general scanner, from just after the outer ``{``: an explicit stack, no recursion."""
    n = len(text)
    root: list[object] = []
    cur = root
    stack: list[list[object]] = []
    next_delim = next_close = -1  # cached next positions: keeps unquoted scans linear overall
    if text[i : i + 1] == "}":
        if i + 1 != n:
            raise ValueFormatError(f"junk after array literal: {text[:40]!r}")
        return root
    while True:
        if i >= n:
            raise ValueFormatError(f"unterminated array literal: {text[:40]!r}")
        c = text[i]
        if c == "{":
            new: list[object] = []
            cur.append(new)
            stack.append(cur)
            cur = new
            i += 1
            continue
        value: object
        if c == '"':
            i += 1
            parts: list[str] = []
            while True:
                q = text.find('"', i)
                if q < 0:
                    raise ValueFormatError(f"unterminated quoted array element: {text[:40]!r}")
                b = text.find("\\", i, q)
                if b < 0:
                    parts.append(text[i:q])
                    i = q + 1
                    break
                parts.append(text[i:b])
                parts.append(text[b + 1 : b + 2])
                i = b + 2
            s = parts[0] if len(parts) == 1 else "".join(parts)
            value = s if conv is None else conv(s)
        else:
            if next_delim < i:
                next_delim = text.find(delim, i)
                if next_delim < 0:
                    next_delim = n
            if next_close < i:
                next_close = text.find("}", i)
                if next_close < 0:
                    next_close = n
            j = next_delim if next_delim < next_close else next_close
            if text.find("\\", i, j) >= 0:  # array_in's escapes in an unquoted element (array_out quotes)
                s, j = _unquoted_escaped(text, i, delim)
                value = s if conv is None else conv(s)
            else:
                s = text[i:j]
                if not s or '"' in s or "{" in s:
                    raise ValueFormatError(f"malformed array element at offset {i}: {text[:40]!r}")
                value = None if s in _NULLS else (s if conv is None else conv(s))
            i = j
        cur.append(value)
        # after an element: a delimiter, or closing braces (each closing a list that is itself an element)
        while True:
            if i >= n:
                raise ValueFormatError(f"unterminated array literal: {text[:40]!r}")
            c = text[i]
            if c == delim:
                i += 1
                break
            if c == "}":
                i += 1
                if not stack:
                    if i != n:
                        raise ValueFormatError(f"junk after array literal: {text[:40]!r}")
                    return root
                cur = stack.pop()
                continue
            raise ValueFormatError(f"expected {delim!r} or '}}' at offset {i} of array literal: {text[:40]!r}")


def _unquoted_escaped(text: str, i: int, delim: str) -> tuple[str, int]:
    """An unquoted element holding backslash escapes, from ``i``: (its value, the end offset)."""
    out: list[str] = []
    n = len(text)
    while i < n:
        c = text[i]
        if c == delim or c == "}":
            return "".join(out), i
        if c == "\\":
            i += 1
            if i == n:
                break
            c = text[i]
        elif c == '"' or c == "{":
            raise ValueFormatError(f"malformed array element at offset {i}: {text[:40]!r}")
        out.append(c)
        i += 1
    raise ValueFormatError(f"unterminated array literal: {text[:40]!r}")


# --- text converters by type ------------------------------------------------------------------


def int_from_text(text: str) -> int:
    """An integer type's value: ``int()``, within what JSON (orjson) carries, -2^63 to 2^64-1
    (xid8's top). Only a garbled message holds one past it, which is then malformed instead of
    stopping the encoder with orjson's TypeError."""
    value = int(text)
    if not -(2**63) <= value <= 2**64 - 1:
        raise ValueFormatError(f"integer value out of range: {text[:40]!r}")
    return value


_TEXT_SCALARS: Final[dict[int, TextConverter]] = {
    16: bool_from_text,
    20: int_from_text,
    21: int_from_text,
    23: int_from_text,
    26: int_from_text,  # oid
    28: int_from_text,  # xid
    29: int_from_text,  # cid
    5069: int_from_text,  # xid8
    700: _float_from_text,
    701: _float_from_text,
    114: _json_from_text,
    3802: _json_from_text,
    17: _bytea_from_text,
}


def _text_array(conv: TextConverter | None, delimiter: str) -> TextConverter:
    def convert(text: str) -> list[object]:
        return parse_array(text, conv, delimiter)

    return convert


def _user_array(text: str) -> object:
    """A user-defined array type known only by its ``_name`` (pgoutput's Type message gives the
    catalog name): parsed when it reads as an array literal, else kept as text."""
    if text[:1] in ("{", "["):
        try:
            return parse_array(text)
        except ValueFormatError:
            return text
    return text


_TEXT_BY_OID: Final[dict[int, TextConverter | None]] = {}
for _oid in TYPE_NAMES:
    if _oid in ARRAY_ELEMENT:
        _elem = ARRAY_ELEMENT[_oid]
        _TEXT_BY_OID[_oid] = _text_array(_TEXT_SCALARS.get(_elem), ARRAY_DELIMITER.get(_elem, ","))
    else:
        _TEXT_BY_OID[_oid] = _TEXT_SCALARS.get(_oid)
_GENERIC_ARRAY: Final = _text_array(None, ",")


def text_converter(type_oid: int, type_name: str) -> TextConverter | None:
    """The converter for a column's text values; ``None`` means "keep the server's text".

    Built-in types are recognised by OID, or by their ``format_type`` name when the OID is 0 or
    not a built-in one (test_decoding gives names only: ``"integer"``, ``"text[]"``,
    ``"numeric(10,2)"``). Other names ending in ``[]`` are arrays of strings; a user-defined
    type whose catalog name starts with ``_`` (``public._mood``, how pgoutput names the array type
    of ``mood``) is parsed as an array when its value reads as one.
    """
    if type_oid in _TEXT_BY_OID:
        return _TEXT_BY_OID[type_oid]
    if not type_name:
        return None
    oid = oid_for_name(type_name)
    if oid:
        return _TEXT_BY_OID[oid]
    if type_name.endswith("[]"):
        return _GENERIC_ARRAY
    if type_name.rpartition(".")[2].lstrip('"').startswith("_"):
        return _user_array
    return None


# --- binary (send) form -----------------------------------------------------------------------


def _fixed(fmt: str, what: str) -> BinaryConverter:
    unpack = struct.Struct(fmt).unpack
    size = struct.calcsize(fmt)

    def convert(data: bytes) -> object:
        try:
            return unpack(data)[0]
        except struct.error:
            raise ValueFormatError(f"binary {what} must be {size} bytes, got {len(data)}") from None

    return convert


class _BoolBytes(dict[bytes, bool]):
    def __missing__(self, key: bytes) -> bool:
        if len(key) == 1:
            return True  # boolrecv: any non-zero byte is true
        raise ValueFormatError(f"binary boolean must be 1 byte, got {len(key)}")


_bool_from_binary: Final = _BoolBytes({b"\x00": False, b"\x01": True}).__getitem__
_int2_from_binary: Final = _fixed(">h", "smallint")
_int4_from_binary: Final = _fixed(">i", "integer")
_int8_from_binary: Final = _fixed(">q", "bigint")
_uint4_from_binary: Final = _fixed(">I", "oid/xid/cid")
_uint8_from_binary: Final = _fixed(">Q", "xid8")
_F4: Final = struct.Struct(">f")
_U4: Final = struct.Struct(">I")
_F8: Final = struct.Struct(">d")


def _float_special(v: float) -> str:
    return "NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")


def _float8_from_binary(data: bytes) -> float | str:
    try:
        (v,) = _F8.unpack(data)
    except struct.error:
        raise ValueFormatError(f"binary double precision must be 8 bytes, got {len(data)}") from None
    return v if v - v == 0.0 else _float_special(v)


def _float4_from_binary(data: bytes) -> float | str:
    """The float the text form gives: float4out prints the shortest decimal that reads back as the
    same float4, which as a double is usually not the float4's exact value (0.1f vs 0.1)."""
    try:
        (v,) = _F4.unpack(data)
    except struct.error:
        raise ValueFormatError(f"binary real must be 4 bytes, got {len(data)}") from None
    if v - v != 0.0:
        return _float_special(v)
    if v == 0.0:
        return float(v)  # keeps -0.0
    a = abs(v)
    bits = int.from_bytes(data, "big") & 0x7FFFFFFF
    if bits & 0x7FFFFF and bits < 0x7F7FFFFF:
        # Symmetric interval: the nearest decimal of each length is the one to try, and the
        # midpoints to the neighbours are exact doubles, so comparing doubles decides exactly
        # (a decimal rounds to a double on the same side of a midpoint, or onto it only if equal).
        low = (a + _F4.unpack(_U4.pack(bits - 1))[0]) * 0.5
        high = (a + _F4.unpack(_U4.pack(bits + 1))[0]) * 0.5
        for digits in range(9):
            c = float(f"{a:.{digits}e}")
            if low < c < high:
                return c if v > 0 else -c
    shortest = _float4_shortest(a, bits, 0)
    return shortest if v > 0 else -shortest


def _float4_shortest(a: float, bits: int, start: int) -> float:
    """Ryu as PostgreSQL builds it (f2s.c): the shortest decimal strictly between the midpoints to
    the neighbouring float4s (a decimal exactly on a midpoint does not count), the nearest one
    when two of that length qualify."""
    x = Fraction(a)
    below = Fraction(_F4.unpack(_U4.pack(bits - 1))[0])
    above = Fraction(_F4.unpack(_U4.pack(bits + 1))[0]) if bits < 0x7F7FFFFF else 2 * x - below
    low, high = (below + x) / 2, (x + above) / 2
    for digits in range(start, 10):
        text = f"{a:.{digits}e}"
        d = Fraction(text)
        if low < d < high:
            return float(text)
        step = Fraction(10) ** (int(text.partition("e")[2]) - digits)
        other = d + step if d < x else d - step
        if low < other < high:
            return float(other)
    return a  # unreachable: 9 significant digits always qualify


def _utf8(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueFormatError(f"binary text value is not valid UTF-8 at byte {exc.start}") from None


def _json_from_binary(data: bytes) -> object:
    return _json_from_text(_utf8(data))


def _versioned(data: bytes, what: str) -> str:
    """jsonb_send/jsonpath_send: a version byte (1) then the text."""
    if data[:1] != b"\x01":
        raise ValueFormatError(f"binary {what} must start with version byte 1, got {data[:1]!r}")
    return _utf8(data[1:])


def _jsonb_from_binary(data: bytes) -> object:
    return _json_from_text(_versioned(data, "jsonb"))


def _jsonpath_from_binary(data: bytes) -> str:
    return _versioned(data, "jsonpath")


def _char_from_binary(data: bytes) -> str:
    """``"char"``: charout prints a high-bit byte as ``\\ooo`` and the zero byte as ''."""
    if len(data) != 1:
        raise ValueFormatError(f'binary "char" must be 1 byte, got {len(data)}')
    c = data[0]
    return f"\\{c:03o}" if c & 0x80 else ("" if c == 0 else chr(c))


def _uuid_from_binary(data: bytes) -> str:
    if len(data) != 16:
        raise ValueFormatError(f"binary uuid must be 16 bytes, got {len(data)}")
    h = data.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


# numeric: int16 ndigits, int16 weight, uint16 sign, uint16 dscale, then ndigits base-10000 digits
_NUMERIC_SPECIAL: Final = {0xC000: "NaN", 0xD000: "Infinity", 0xF000: "-Infinity"}
_NUMERIC_STRUCTS: dict[int, struct.Struct] = {n: struct.Struct(f">hhHH{n}H") for n in range(32)}
_DIGIT_FORMATS: Final = tuple("%04d" * n for n in range(32))


def _numeric_from_binary(data: bytes) -> str:
    """The exact text numeric_out prints: all integer digits, then exactly dscale fraction digits
    (zero-padded, or truncated as numeric_recv truncates digits dscale would hide)."""
    if len(data) < 8:
        raise ValueFormatError(f"binary numeric shorter than its 8-byte header: {len(data)} bytes")
    ndigits = data[0] << 8 | data[1]
    st = _NUMERIC_STRUCTS.get(ndigits)
    if st is None:
        if ndigits & 0x8000:
            raise ValueFormatError(f"binary numeric with a negative digit count: {ndigits - 0x10000}")
        st = struct.Struct(f">hhHH{ndigits}H")
    try:
        t = st.unpack(data)
    except struct.error:
        raise ValueFormatError(f"binary numeric with {ndigits} digits cannot be {len(data)} bytes") from None
    weight, sign, dscale = t[1], t[2], t[3]
    if sign == 0:
        prefix = ""
    elif sign == 0x4000:
        prefix = "-"
    else:
        special = _NUMERIC_SPECIAL.get(sign)
        if special is None:
            raise ValueFormatError(f"invalid sign 0x{sign:04X} in binary numeric")
        return special
    if dscale > 0x3FFF:
        raise ValueFormatError(f"invalid scale {dscale} in binary numeric")
    digits = t[4:]
    if ndigits and max(digits) > 9999:
        raise ValueFormatError("invalid digit in binary numeric")
    s: str = _DIGIT_FORMATS[ndigits] % digits if ndigits < 32 else ("%04d" * ndigits) % digits
    text: str
    frac: str
    if weight >= 0:
        int_len = 4 * weight + 4
        if len(s) < int_len:
            s += "0" * (int_len - len(s))
        text = prefix + str(int(s[:4])) + s[4:int_len]  # the first group without leading zeros
        frac = s[int_len:]
    else:
        text = prefix + "0"
        frac = "0000" * (-weight - 1) + s
    if dscale:
        if len(frac) < dscale:
            frac += "0" * (dscale - len(frac))
        return text + "." + frac[:dscale]
    return text


# --- dates and times: PostgreSQL's ISO DateStyle, proleptic Gregorian, year 0 = 1 BC -----------

_I4: Final = struct.Struct(">i")
_I8: Final = struct.Struct(">q")
_TIMETZ: Final = struct.Struct(">qi")
_INTERVAL: Final = struct.Struct(">qii")
_INT32_MIN: Final = -(2**31)
_INT32_MAX: Final = 2**31 - 1
_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1
_USECS_PER_DAY: Final = 86_400_000_000
_DAYS_0000_03_01_TO_2000: Final = 730_425  # days from 0000-03-01 to 2000-01-01
# printf-style templates (faster than f-strings with format specs on this path)
_HMS: Final = "%02d:%02d:%02d"
_HMS_FRAC: Final = "%02d:%02d:%02d.%s"
_USEC: Final = "%06d"
_ZONE_H: Final = "%s%02d"
_ZONE_HM: Final = "%s%02d:%02d"
_ZONE_HMS: Final = "%s%02d:%02d:%02d"
_DATE: Final = "%04d-%02d-%02d"
_DATE_BC: Final = "%04d-%02d-%02d BC"
_STAMP: Final = "%s %02d:%02d:%02d%s"
_STAMP_FRAC: Final = "%s %02d:%02d:%02d.%s%s"
_TIMESTAMP_BC: Final = "%04d-%02d-%02d %s%s BC"
_LSN: Final = "%X/%X"


def _ymd(days: int) -> tuple[int, int, int]:
    """Civil (year, month, day) from days since 2000-01-01 (March-based 400-year eras)."""
    z = days + _DAYS_0000_03_01_TO_2000
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    if mp < 10:
        return yoe + era * 400, mp + 3, day
    return yoe + era * 400 + 1, mp - 9, day


def _hms(usecs: int) -> str:
    """HH:MM:SS plus the fraction with trailing zeros trimmed, from non-negative microseconds."""
    secs, frac = divmod(usecs, 1_000_000)
    mins, sec = divmod(secs, 60)
    hour, minute = divmod(mins, 60)
    if frac:
        return _HMS_FRAC % (hour, minute, sec, (_USEC % frac).rstrip("0"))
    return _HMS % (hour, minute, sec)


def _zone(west: int) -> str:
    """EncodeTimezone: seconds west of UTC -> +HH, +HH:MM or +HH:MM:SS."""
    mins, sec = divmod(abs(west), 60)
    hour, minute = divmod(mins, 60)
    sign = "+" if west <= 0 else "-"
    if sec:
        return _ZONE_HMS % (sign, hour, minute, sec)
    if minute:
        return _ZONE_HM % (sign, hour, minute)
    return _ZONE_H % (sign, hour)


def _date_text(days: int) -> str:
    y, m, d = _ymd(days)
    if y > 0:
        return _DATE % (y, m, d)
    return _DATE_BC % (1 - y, m, d)


_DAY_CACHE: dict[int, str] = {}  # days since 2000-01-01 -> "YYYY-MM-DD" (AD), bounded


def _timestamp_text(usecs: int, zone: str) -> str:
    days, usecs = divmod(usecs, _USECS_PER_DAY)
    date = _DAY_CACHE.get(days)
    if date is None:
        y, m, d = _ymd(days)
        if y <= 0:
            return _TIMESTAMP_BC % (1 - y, m, d, _hms(usecs), zone)
        if len(_DAY_CACHE) >= 4096:
            _DAY_CACHE.clear()
        date = _DAY_CACHE[days] = _DATE % (y, m, d)
    secs, frac = divmod(usecs, 1_000_000)
    mins, sec = divmod(secs, 60)
    hour, minute = divmod(mins, 60)
    if frac:
        return _STAMP_FRAC % (date, hour, minute, sec, (_USEC % frac).rstrip("0"), zone)
    return _STAMP % (date, hour, minute, sec, zone)


def _date_from_binary(data: bytes) -> str:
    try:
        (days,) = _I4.unpack(data)
    except struct.error:
        raise ValueFormatError(f"binary date must be 4 bytes, got {len(data)}") from None
    if days == _INT32_MAX:
        return "infinity"
    if days == _INT32_MIN:
        return "-infinity"
    return _date_text(days)


def _timestamp_reader(zone: str, what: str) -> BinaryConverter:
    unpack = _I8.unpack

    def convert(data: bytes) -> str:
        try:
            (usecs,) = unpack(data)
        except struct.error:
            raise ValueFormatError(f"binary {what} must be 8 bytes, got {len(data)}") from None
        if usecs == _INT64_MAX:
            return "infinity"
        if usecs == _INT64_MIN:
            return "-infinity"
        return _timestamp_text(usecs, zone)

    return convert


def _time_from_binary(data: bytes) -> str:
    try:
        (usecs,) = _I8.unpack(data)
    except struct.error:
        raise ValueFormatError(f"binary time must be 8 bytes, got {len(data)}") from None
    if not 0 <= usecs <= _USECS_PER_DAY:
        raise ValueFormatError(f"binary time out of range: {usecs} microseconds")
    return _hms(usecs)


def _timetz_from_binary(data: bytes) -> str:
    try:
        usecs, west = _TIMETZ.unpack(data)
    except struct.error:
        raise ValueFormatError(f"binary time with time zone must be 12 bytes, got {len(data)}") from None
    if not 0 <= usecs <= _USECS_PER_DAY:
        raise ValueFormatError(f"binary time with time zone out of range: {usecs} microseconds")
    return _hms(usecs) + _zone(west)


def _trunc_divmod(a: int, b: int) -> tuple[int, int]:
    """C's truncating division (quotient toward zero, remainder with the dividend's sign)."""
    q = abs(a) // b
    if a < 0:
        return -q, a + q * b
    return q, a - q * b


def _interval_from_binary(data: bytes) -> str:
    """interval_out with IntervalStyle ``postgres``: ``1 year 2 mons -3 days +04:05:06.5``."""
    try:
        usecs, days, months = _INTERVAL.unpack(data)
    except struct.error:
        raise ValueFormatError(f"binary interval must be 16 bytes, got {len(data)}") from None
    if months == _INT32_MAX and days == _INT32_MAX and usecs == _INT64_MAX:
        return "infinity"  # PostgreSQL 17+
    if months == _INT32_MIN and days == _INT32_MIN and usecs == _INT64_MIN:
        return "-infinity"
    year, mon = _trunc_divmod(months, 12)
    out: list[str] = []
    before = False  # the previous field was negative: positive ones get an explicit +
    for value, unit in ((year, "year"), (mon, "mon"), (days, "day")):
        if value:
            sign = "+" if before and value > 0 else ""
            out.append(f"{sign}{value} {unit}" if value == 1 else f"{sign}{value} {unit}s")
            before = value < 0
    if not out or usecs:
        sign = "-" if usecs < 0 else ("+" if before else "")
        out.append(sign + _hms(abs(usecs)))
    return " ".join(out)


# --- network, bits, misc ----------------------------------------------------------------------


def _ipv6_text(addr: bytes) -> str:
    """inet_net_ntop's IPv6 form: lower-case hex words, the first longest run of two or more zero
    words as ``::``, and a dotted IPv4 tail for ``::a.b.c.d`` and ``::ffff:a.b.c.d``."""
    words = struct.unpack(">8H", addr)
    best_base, best_len, cur_base = -1, 0, -1
    for k in range(9):
        if k < 8 and words[k] == 0:
            if cur_base < 0:
                cur_base = k
        elif cur_base >= 0:
            if k - cur_base > best_len:
                best_base, best_len = cur_base, k - cur_base
            cur_base = -1
    if best_len < 2:
        best_base = -1
    if best_base == 0 and (best_len == 6 or (best_len == 5 and words[5] == 0xFFFF)):
        tail = ".".join(str(b) for b in addr[12:])
        return ("::ffff:" if best_len == 5 else "::") + tail
    if best_base < 0:
        return ":".join(f"{w:x}" for w in words)
    head = ":".join(f"{w:x}" for w in words[:best_base])
    rest = ":".join(f"{w:x}" for w in words[best_base + best_len :])
    return f"{head}::{rest}"


def _inet_reader(cidr: bool) -> BinaryConverter:
    what = "cidr" if cidr else "inet"

    def convert(data: bytes) -> str:
        if len(data) < 4:
            raise ValueFormatError(f"binary {what} shorter than its 4-byte header")
        family, bits, _is_cidr, nb = data[0], data[1], data[2], data[3]
        if family == 2 and nb == 4 and len(data) == 8 and bits <= 32:
            text, full = ".".join(str(b) for b in data[4:]), 32
        elif family == 3 and nb == 16 and len(data) == 20 and bits <= 128:
            text, full = _ipv6_text(data[4:]), 128
        else:
            raise ValueFormatError(f"invalid binary {what}: family {family}, {bits} bits, {nb} address bytes")
        return f"{text}/{bits}" if cidr or bits != full else text

    return convert


def _macaddr_reader(size: int) -> BinaryConverter:
    def convert(data: bytes) -> str:
        if len(data) != size:
            raise ValueFormatError(f"binary macaddr must be {size} bytes, got {len(data)}")
        return data.hex(":")

    return convert


def _bits_from_binary(data: bytes) -> str:
    """bit/bit varying: int32 bit count, then the bits packed most significant first."""
    try:
        (nbits,) = _I4.unpack_from(data)
    except struct.error:
        raise ValueFormatError("binary bit string shorter than its 4-byte length") from None
    if nbits < 0 or len(data) != 4 + (nbits + 7) // 8:
        raise ValueFormatError(f"binary bit string of {nbits} bits cannot be {len(data)} bytes")
    if not nbits:
        return ""
    return format(int.from_bytes(data[4:], "big"), "b").zfill(8 * (len(data) - 4))[:nbits]


def _pg_lsn_from_binary(data: bytes) -> str:
    try:
        (lsn,) = struct.unpack(">Q", data)
    except struct.error:
        raise ValueFormatError(f"binary pg_lsn must be 8 bytes, got {len(data)}") from None
    return _LSN % (lsn >> 32, lsn & 0xFFFFFFFF)


def _tid_from_binary(data: bytes) -> str:
    try:
        block, offset = struct.unpack(">IH", data)
    except struct.error:
        raise ValueFormatError(f"binary tid must be 6 bytes, got {len(data)}") from None
    return f"({block},{offset})"


# --- ranges and multiranges -------------------------------------------------------------------

_RANGE_EMPTY: Final = 0x01
_RANGE_LB_INC: Final = 0x02
_RANGE_UB_INC: Final = 0x04
_RANGE_LB_INF: Final = 0x08
_RANGE_UB_INF: Final = 0x10
_RANGE_QUOTE: Final = frozenset('"\\()[],{} \t\n\r\v\f')


def _range_bound(text: str) -> str:
    """range_out's quoting: a bound that is empty or holds a special character or whitespace is
    double-quoted, with ``"`` and ``\\`` doubled."""
    if text and _RANGE_QUOTE.isdisjoint(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '""') + '"'


def _range_reader(bound_text: Callable[[bytes], str]) -> Callable[[bytes, int, int], str]:
    def read(data: bytes, pos: int, end: int) -> str:
        if pos >= end:
            raise ValueFormatError("binary range is empty")
        flags = data[pos]
        pos += 1
        if flags & _RANGE_EMPTY:
            if pos != end:
                raise ValueFormatError("binary empty range has trailing bytes")
            return "empty"
        bounds = []
        for inf in (_RANGE_LB_INF, _RANGE_UB_INF):
            if flags & inf:
                bounds.append("")
                continue
            try:
                (n,) = _I4.unpack_from(data, pos)
            except struct.error:
                raise ValueFormatError("binary range bound length cut short") from None
            pos += 4
            if n < 0 or pos + n > end:
                raise ValueFormatError(f"binary range bound of {n} bytes overruns the value")
            bounds.append(_range_bound(bound_text(data[pos : pos + n])))
            pos += n
        if pos != end:
            raise ValueFormatError("binary range has trailing bytes")
        lower = "[" if flags & _RANGE_LB_INC else "("
        upper = "]" if flags & _RANGE_UB_INC else ")"
        return f"{lower}{bounds[0]},{bounds[1]}{upper}"

    return read


def _range_converter(bound_text: Callable[[bytes], str]) -> BinaryConverter:
    read = _range_reader(bound_text)

    def convert(data: bytes) -> str:
        return read(data, 0, len(data))

    return convert


def _multirange_converter(bound_text: Callable[[bytes], str]) -> BinaryConverter:
    read = _range_reader(bound_text)

    def convert(data: bytes) -> str:
        try:
            (count,) = _I4.unpack_from(data)
        except struct.error:
            raise ValueFormatError("binary multirange shorter than its range count") from None
        pos = 4
        out = []
        for _ in range(count):
            try:
                (n,) = _I4.unpack_from(data, pos)
            except struct.error:
                raise ValueFormatError("binary multirange cut short") from None
            pos += 4
            if n < 0 or pos + n > len(data):
                raise ValueFormatError(f"binary multirange element of {n} bytes overruns the value")
            out.append(read(data, pos, pos + n))
            pos += n
        if pos != len(data):
            raise ValueFormatError("binary multirange has trailing bytes")
        return "{" + ",".join(out) + "}"

    return convert


# --- arrays -----------------------------------------------------------------------------------

_ARRAY_HEAD: Final = struct.Struct(">iiI")
_MAXDIM: Final = 6


def _binary_array(element_oid: int) -> BinaryConverter:
    """array_send: int32 ndim, int32 has-nulls, uint32 element type, ndim x (int32 length, int32
    lower bound), then each element as int32 length (-1 for NULL) and its send() bytes. Lower
    bounds are dropped, as in the text form."""

    def convert(data: bytes) -> list[object]:
        try:
            ndim, flags, elem = _ARRAY_HEAD.unpack_from(data)
        except struct.error:
            raise ValueFormatError(f"binary array shorter than its 12-byte header: {len(data)} bytes") from None
        if ndim == 0:
            if len(data) != 12:
                raise ValueFormatError("binary empty array has trailing bytes")
            return []
        if not 0 < ndim <= _MAXDIM or flags not in (0, 1):
            raise ValueFormatError(f"invalid binary array header: {ndim} dimensions, flags {flags}")
        try:
            bounds = struct.unpack_from(f">{2 * ndim}i", data, 12)
        except struct.error:
            raise ValueFormatError("binary array dimensions cut short") from None
        dims = bounds[0::2]
        total = 1
        for d in dims:
            if d < 0:
                raise ValueFormatError(f"invalid binary array dimension {d}")
            total *= d
        if total > len(data):  # each element takes at least 4 bytes: a cheap guard before looping
            raise ValueFormatError(f"binary array of {total} elements cannot be {len(data)} bytes")
        pos = 12 + 8 * ndim
        end = len(data)
        flat: list[object] = []
        if fixed is not None and elem == element_oid and end == pos + total * (4 + fixed[1]):
            # integers without NULLs: one unpack for (length, value) pairs, then check the lengths
            values = _pairs(fixed[0], total).unpack_from(data, pos)
            if values[0::2].count(fixed[1]) == total:
                flat = list(values[1::2])
                if ndim > 1:
                    for d in reversed(dims[1:]):
                        flat = [flat[k : k + d] for k in range(0, len(flat), d)]
                return flat
        conv = element if elem == element_oid else binary_converter(elem)
        unpack = _I4.unpack_from
        append = flat.append
        try:
            for _ in range(total):
                (n,) = unpack(data, pos)
                pos += 4
                if n == -1:
                    append(None)
                    continue
                if n < 0 or pos + n > end:
                    raise ValueFormatError(f"binary array element of {n} bytes overruns the value")
                append(conv(data[pos : pos + n]))
                pos += n
        except struct.error:
            raise ValueFormatError("binary array elements cut short") from None
        if pos != end:
            raise ValueFormatError("binary array has trailing bytes")
        if total == 0:
            return []
        for d in reversed(dims[1:]):
            flat = [flat[k : k + d] for k in range(0, len(flat), d)]
        return flat

    element = binary_converter(element_oid)
    fixed = _FIXED_WIDTH.get(element_oid)
    return convert


# element OID -> (struct code, byte width) for arrays read with one unpack
_FIXED_WIDTH: Final = {21: ("h", 2), 23: ("i", 4), 20: ("q", 8), 26: ("I", 4)}
_PAIRS: dict[tuple[str, int], struct.Struct] = {}


def _pairs(code: str, n: int) -> struct.Struct:
    st = _PAIRS.get((code, n))
    if st is None:
        st = struct.Struct(">" + ("i" + code) * n)
        if n <= 1024:
            if len(_PAIRS) >= 512:
                _PAIRS.clear()
            _PAIRS[(code, n)] = st
    return st


def _int_text(conv: BinaryConverter) -> Callable[[bytes], str]:
    def text(data: bytes) -> str:
        return str(conv(data))

    return text


_BINARY_BY_OID: Final[dict[int, BinaryConverter]] = {
    16: _bool_from_binary,
    17: _b64,
    18: _char_from_binary,
    19: _utf8,  # name
    20: _int8_from_binary,
    21: _int2_from_binary,
    23: _int4_from_binary,
    25: _utf8,  # text
    26: _uint4_from_binary,  # oid
    27: _tid_from_binary,
    28: _uint4_from_binary,  # xid
    29: _uint4_from_binary,  # cid
    114: _json_from_binary,
    142: _utf8,  # xml
    650: _inet_reader(cidr=True),
    700: _float4_from_binary,
    701: _float8_from_binary,
    774: _macaddr_reader(8),
    829: _macaddr_reader(6),
    869: _inet_reader(cidr=False),
    1042: _utf8,  # character
    1043: _utf8,  # character varying
    1082: _date_from_binary,
    1083: _time_from_binary,
    1114: _timestamp_reader("", "timestamp"),
    1184: _timestamp_reader("+00", "timestamp with time zone"),
    1186: _interval_from_binary,
    1266: _timetz_from_binary,
    1560: _bits_from_binary,
    1562: _bits_from_binary,
    1700: _numeric_from_binary,
    2950: _uuid_from_binary,
    3220: _pg_lsn_from_binary,
    3802: _jsonb_from_binary,
    4072: _jsonpath_from_binary,
    5069: _uint8_from_binary,  # xid8
}
# range/multirange OID -> bound element OID
_RANGES: Final = {3904: 23, 3926: 20, 3906: 1700, 3908: 1114, 3910: 1184, 3912: 1082}
_MULTIRANGES: Final = {4451: 23, 4536: 20, 4532: 1700, 4533: 1114, 4534: 1184, 4535: 1082}
for _oid, _elem in _RANGES.items():
    _bound = _BINARY_BY_OID[_elem]
    _BINARY_BY_OID[_oid] = _range_converter(_int_text(_bound) if _elem in (20, 23) else _bound)  # type: ignore[arg-type]
for _oid, _elem in _MULTIRANGES.items():
    _bound = _BINARY_BY_OID[_elem]
    _BINARY_BY_OID[_oid] = _multirange_converter(_int_text(_bound) if _elem in (20, 23) else _bound)  # type: ignore[arg-type]


def binary_converter(type_oid: int) -> BinaryConverter:
    """The converter for a column's binary (send format) values: the same JSON value the text
    form gives. Types without a decoder here give the base64 of the raw bytes."""
    conv = _BINARY_BY_OID.get(type_oid)
    if conv is not None:
        return conv
    element = ARRAY_ELEMENT.get(type_oid)
    if element is not None:
        conv = _BINARY_BY_OID[type_oid] = _binary_array(element)
        return conv
    return _b64
