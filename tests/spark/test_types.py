"""Column conversion: the vectorised Arrow path gives exactly what the per-value path gives."""

from __future__ import annotations

from decimal import Context, Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgrecv.errors import InputError
from pgrecv.spark.schema import ColumnType, column_type
from tests.spark.oracle import apply as ap
from tests.spark.oracle import reduce as rd
from tests.spark.oracle.convert import convert_value, fast_column
from tests.spark.oracle.writers import OP_COL


def _typmod(p: int, s: int) -> int:
    return ((p << 16) | (s & 0x7FF)) + 4


def _per_value(ct: ColumnType, values: list[Any]) -> Any:
    """The reference: convert each value, then let Arrow store the list (as before the fast path)."""
    try:
        return pa.array([convert_value(ct, v, "c", "f:1") for v in values], type=ct.arrow)
    except (InputError, pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        return type(exc)


def _agrees(ct: ColumnType, values: list[Any]) -> None:
    fast = fast_column(ct, values)
    ref = _per_value(ct, values)
    if fast is None:  # the caller falls back to the per-value path
        return
    assert isinstance(ref, pa.Array), f"fast path accepted {values!r}, per-value path: {ref}"
    assert fast.type == ref.type and fast.to_pylist() == ref.to_pylist()


EDGE = [
    "0", "-0", "1", "-1", "0.5", ".5", "5.", "+1.5", "1.250", "1.256", "99.99", "100", "999.99", "-999.99",
    "1000", "0.001", "NaN", "Infinity", "-Infinity", " 1", "1 ", "1e3", "1E-2", "", "-", "1.2.3", "abc",
    "00000000000000000000000000000000000000000001", "123456789012345678901234567890123456789",
]  # fmt: skip


@pytest.mark.parametrize(("p", "s"), [(5, 2), (38, 0), (38, 18), (38, 38), (1, 0), (20, 10)])
def test_decimal_strings_edge_cases(p: int, s: int) -> None:
    ct = column_type("numeric", _typmod(p, s))
    for v in EDGE:
        _agrees(ct, [v])
        _agrees(ct, ["1", v, None])


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 38).flatmap(lambda p: st.tuples(st.just(p), st.integers(0, p))), st.data())
def test_decimal_strings_at_the_precision_limits(ps: tuple[int, int], data: Any) -> None:
    p, s = ps
    ct = column_type("numeric", _typmod(p, s))
    digits = data.draw(st.integers(0, 10 ** (p + 1)))
    scale = data.draw(st.integers(0, s + 2))
    sign = data.draw(st.sampled_from(["", "-"]))
    text = str(Decimal(f"{sign}{digits}").scaleb(-scale))
    text = format(Decimal(text), "f")  # PostgreSQL's form: no exponent
    _agrees(ct, [text, None])
    fast = fast_column(ct, [text])
    exact = Decimal(text)
    fits = (
        exact == exact.quantize(Decimal(1).scaleb(-s), context=Context(prec=100))
        and len(exact.as_tuple().digits) - max(0, -int(exact.as_tuple().exponent)) <= p - s
    )
    if fits:
        assert fast is not None and fast.to_pylist() == [exact]


def test_arrow_rescale_overflow_is_not_taken() -> None:
    """Arrow's own cast wraps 391961049985222 → decimal(29,29) around to 0.612…: must be refused."""
    ct = column_type("numeric", _typmod(29, 29))
    assert fast_column(ct, ["391961049985222"]) is None
    with pytest.raises(InputError):
        ap._table(
            {"n": ap._column(_rows(["391961049985222"]), {}, "n", ct, "s.t"), OP_COL: ["U"]},
            pa.schema([("n", ct.arrow)]),
        )


def test_unconstrained_numeric_keeps_18_decimals_and_refuses_more() -> None:
    ct = column_type("numeric", -1)
    assert fast_column(ct, ["0.123456789012345678"]).to_pylist() == [Decimal("0.123456789012345678")]  # type: ignore[union-attr]
    assert fast_column(ct, ["0.1234567890123456789"]) is None


@pytest.mark.parametrize(
    ("pg", "typmod", "values"),
    [
        ("integer", -1, [1, None, -(2**31)]),
        ("bigint", -1, [2**63 - 1, None]),
        ("smallint", -1, [2**15]),  # does not fit: both paths refuse
        ("boolean", -1, [True, False, None]),
        ("text", -1, ["a", None, "é"]),
        ("text", -1, ["a", 1]),  # a non-string in a string column: per-value path (JSON text)
        ("character varying", -1, [None]),
    ],
)
def test_plain_columns(pg: str, typmod: int, values: list[Any]) -> None:
    _agrees(column_type(pg, typmod), values)


def _rows(values: list[Any]) -> list[rd.Row]:
    return [rd.Row({"n": v}, set(), None, set(), where=f"f:{i + 1}") for i, v in enumerate(values)]


@pytest.mark.parametrize(
    ("value", "what"),
    [("NaN", "NaN"), ("1.256", "digits after the point"), ("Infinity", "NaN and infinities")],
)
def test_column_errors_name_the_line_and_value(value: str, what: str) -> None:
    ct = column_type("numeric", _typmod(12, 2))
    with pytest.raises(InputError, match=rf"^f:2: value '{value}' of column n \(numeric\).*{what}"):
        ap._column(_rows(["1.5", value]), {}, "n", ct, "s.t")


def test_column_overflow_is_a_clear_error() -> None:
    ct = column_type("numeric", _typmod(5, 2))
    arrays = {"n": ap._column(_rows(["1000.00"]), {}, "n", ct, "s.t"), OP_COL: ["U"]}
    with pytest.raises(InputError, match="column n: a value does not fit decimal128"):
        ap._table(arrays, pa.schema([("n", ct.arrow)]))


def test_fast_column_result_is_used() -> None:
    ct = column_type("numeric", _typmod(12, 2))
    out = ap._column(_rows(["1.5", None, "-2"]), {}, "n", ct, "s.t")
    assert isinstance(out, pa.Array)
    assert out.to_pylist() == [Decimal("1.50"), None, Decimal("-2.00")]


def test_planned_columns_keep_the_fast_path() -> None:
    """A numeric(12,2) column is planned as decimal(12,2), new or existing, which the oracle's
    whole-column cast takes (test_fast_column_result_is_used)."""
    from pgrecv.spark.schema import plan

    relations = [{"columns": [{"name": "n", "type": "numeric", "typmod": _typmod(12, 2)}], "key": ["n"]}]
    existing = pa.schema([("n", pa.decimal128(12, 2))])
    for schema in (None, existing):
        ct = plan("s", "t", relations, schema, False).columns["n"]
        assert ct.arrow == pa.decimal128(12, 2)
        assert fast_column(ct, ["1.5"]) is not None


def test_member_text_of_what_is_not_an_object_is_none() -> None:
    """json columns' exact text is cut from the image's text; an image that is not an object (which
    the replay holds back, named) or not JSON gives None instead of failing the Spark task."""
    from pgrecv.spark.replay.convert import member_text

    assert member_text('{"a": 1.000000000000000000001, "b": {"c": [1]}}', "a") == "1.000000000000000000001"
    assert member_text(' {"a":1,"b":{"c":[1]}}', "b") == '{"c":[1]}'
    assert member_text('{"a":null}', "a") is None
    for text in ("not an object", "[1]", "12", '{"a": "unterminated', "{"):
        assert member_text(text, "a") is None, text


def test_member_text_of_deep_values_and_brackets_in_strings() -> None:
    """A member nested thousands deep (jsonb allows it; Python's recursive decoder stopped at
    about 1,000 levels, failing the task), brackets and quotes inside strings, each member whole."""
    from pgrecv.spark.replay.convert import member_text

    deep = "[" * 5000 + '"]"' + "]" * 5000
    text = f'{{"s": "a]\\"}}[", "d": {deep}, "o": {{"x": ["}}", {{"y": null}}]}}, "n": -1.5e3 , "t":true}}'
    assert member_text(text, "s") == '"a]\\"}["'
    assert member_text(text, "d") == deep
    assert member_text(text, "o") == '{"x": ["}", {"y": null}]}'
    assert member_text(text, "n") == "-1.5e3"
    assert member_text(text, "t") == "true"
    assert member_text('{"a": [1, [2}', "a") is None
