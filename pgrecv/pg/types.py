"""Built-in PostgreSQL types by OID: names as ``format_type()`` prints them, and array elements.

Built-in type OIDs are fixed in the catalog (pgoutput sends Type messages only for user-defined
types), so they are mapped here without a catalog query. The table was taken from
``SELECT oid, format_type(oid, NULL), typarray FROM pg_type`` on PostgreSQL 15 and 18 (identical);
tests/pg/test_pgtypes.py compares it with every live server the tests run against.

Covered: every base, range and multirange type below OID 10000 and its array type. Left out:
pseudo-types (``record``, ``anyarray``...), system catalog row types, and the ``cstring[]`` array.
"""

from __future__ import annotations

import re
from typing import Final

# (type OID, format_type() name, array type OID or 0); pg_type.typname in the comment.
_BUILTINS: Final[tuple[tuple[int, str, int], ...]] = (
    (16, "boolean", 1000),  # bool
    (17, "bytea", 1001),  # bytea
    (18, '"char"', 1002),  # char
    (19, "name", 1003),  # name
    (20, "bigint", 1016),  # int8
    (21, "smallint", 1005),  # int2
    (22, "int2vector", 1006),  # int2vector
    (23, "integer", 1007),  # int4
    (24, "regproc", 1008),  # regproc
    (25, "text", 1009),  # text
    (26, "oid", 1028),  # oid
    (27, "tid", 1010),  # tid
    (28, "xid", 1011),  # xid
    (29, "cid", 1012),  # cid
    (30, "oidvector", 1013),  # oidvector
    (114, "json", 199),  # json
    (142, "xml", 143),  # xml
    (194, "pg_node_tree", 0),  # pg_node_tree
    (600, "point", 1017),  # point
    (601, "lseg", 1018),  # lseg
    (602, "path", 1019),  # path
    (603, "box", 1020),  # box
    (604, "polygon", 1027),  # polygon
    (628, "line", 629),  # line
    (650, "cidr", 651),  # cidr
    (700, "real", 1021),  # float4
    (701, "double precision", 1022),  # float8
    (718, "circle", 719),  # circle
    (774, "macaddr8", 775),  # macaddr8
    (790, "money", 791),  # money
    (829, "macaddr", 1040),  # macaddr
    (869, "inet", 1041),  # inet
    (1033, "aclitem", 1034),  # aclitem
    (1042, "character", 1014),  # bpchar
    (1043, "character varying", 1015),  # varchar
    (1082, "date", 1182),  # date
    (1083, "time without time zone", 1183),  # time
    (1114, "timestamp without time zone", 1115),  # timestamp
    (1184, "timestamp with time zone", 1185),  # timestamptz
    (1186, "interval", 1187),  # interval
    (1266, "time with time zone", 1270),  # timetz
    (1560, "bit", 1561),  # bit
    (1562, "bit varying", 1563),  # varbit
    (1700, "numeric", 1231),  # numeric
    (1790, "refcursor", 2201),  # refcursor
    (2202, "regprocedure", 2207),  # regprocedure
    (2203, "regoper", 2208),  # regoper
    (2204, "regoperator", 2209),  # regoperator
    (2205, "regclass", 2210),  # regclass
    (2206, "regtype", 2211),  # regtype
    (2950, "uuid", 2951),  # uuid
    (2970, "txid_snapshot", 2949),  # txid_snapshot
    (3220, "pg_lsn", 3221),  # pg_lsn
    (3361, "pg_ndistinct", 0),  # pg_ndistinct
    (3402, "pg_dependencies", 0),  # pg_dependencies
    (3614, "tsvector", 3643),  # tsvector
    (3615, "tsquery", 3645),  # tsquery
    (3642, "gtsvector", 3644),  # gtsvector
    (3734, "regconfig", 3735),  # regconfig
    (3769, "regdictionary", 3770),  # regdictionary
    (3802, "jsonb", 3807),  # jsonb
    (3904, "int4range", 3905),  # int4range
    (3906, "numrange", 3907),  # numrange
    (3908, "tsrange", 3909),  # tsrange
    (3910, "tstzrange", 3911),  # tstzrange
    (3912, "daterange", 3913),  # daterange
    (3926, "int8range", 3927),  # int8range
    (4072, "jsonpath", 4073),  # jsonpath
    (4089, "regnamespace", 4090),  # regnamespace
    (4096, "regrole", 4097),  # regrole
    (4191, "regcollation", 4192),  # regcollation
    (4451, "int4multirange", 6150),  # int4multirange
    (4532, "nummultirange", 6151),  # nummultirange
    (4533, "tsmultirange", 6152),  # tsmultirange
    (4534, "tstzmultirange", 6153),  # tstzmultirange
    (4535, "datemultirange", 6155),  # datemultirange
    (4536, "int8multirange", 6157),  # int8multirange
    (4600, "pg_brin_bloom_summary", 0),  # pg_brin_bloom_summary
    (4601, "pg_brin_minmax_multi_summary", 0),  # pg_brin_minmax_multi_summary
    (5017, "pg_mcv_list", 0),  # pg_mcv_list
    (5038, "pg_snapshot", 5039),  # pg_snapshot
    (5069, "xid8", 271),  # xid8
)

TYPE_NAMES: Final[dict[int, str]] = {}
"""Type OID -> ``format_type(oid, NULL)`` name: ``"integer"``, ``"character varying"``, ``"text[]"``."""

ARRAY_ELEMENT: Final[dict[int, int]] = {}
"""Array type OID -> element type OID (true arrays only: ``int2vector``/``oidvector``, ``name`` and
``point`` also have a ``typelem`` in the catalog but a text form that is not an array literal)."""

for _oid, _name, _array in _BUILTINS:
    TYPE_NAMES[_oid] = _name
    if _array:
        TYPE_NAMES[_array] = _name + "[]"
        ARRAY_ELEMENT[_array] = _oid
del _oid, _name, _array

ARRAY_DELIMITER: Final[dict[int, str]] = {603: ";"}
"""Element type OID -> its array literal delimiter (``pg_type.typdelim``) where it is not ``,``:
``box`` values contain commas, so ``box[]`` separates elements with ``;``."""

_OIDS: Final[dict[str, int]] = {name: oid for oid, name in TYPE_NAMES.items()}
# A type modifier as format_type() prints it with a typmod: "numeric(10,2)", "timestamp(3) with time zone".
_TYPMOD: Final = re.compile(r"\(\d+(?:,\d+)?\)")


def type_name(oid: int) -> str | None:
    """The ``format_type()`` name of a built-in type, None for other OIDs (user-defined types)."""
    return TYPE_NAMES.get(oid)


def oid_for_name(name: str) -> int:
    """The OID of a built-in type from its ``format_type()`` name, 0 when it is not one.

    test_decoding prints column types by name only. Also accepted: a typmod as ``format_type``
    prints it (``"character varying(10)"``, ``"timestamp(3) with time zone"``, ``"numeric(10,2)[]"``,
    ``"interval day to second"``) and a ``pg_catalog.`` prefix. Other spellings (``int4``,
    ``varchar``) are not format_type output and could be user-defined types of that name: 0.
    """
    oid = _OIDS.get(name)
    if oid is not None:
        return oid
    if name.startswith("pg_catalog."):
        name = name[11:]
    if "(" in name:
        name = _TYPMOD.sub("", name)
    if name.startswith("interval "):  # the fields typmod: "interval year to month", "interval second(3)"
        return 1187 if name.endswith("[]") else 1186
    return _OIDS.get(name, 0)
