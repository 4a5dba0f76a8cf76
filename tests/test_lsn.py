import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgrecv.lsn import LSN, lsn_str


def test_parse_and_print() -> None:
    assert str(LSN.parse("16/B374D848")) == "16/B374D848"
    assert LSN.parse("16/B374D848") == (0x16 << 32) | 0xB374D848
    assert str(LSN("0/0")) == "0/0"


def test_zero_padded_low_half_and_lower_case() -> None:
    assert LSN.parse("0/0001A2B0") == LSN.parse("0/1A2B0")
    assert str(LSN.parse("a/ff")) == "A/FF"


def test_compares_as_integer_not_text() -> None:
    assert LSN.parse("9/0") < LSN.parse("10/0")
    assert LSN.parse("0/FFFFFFFF") < LSN.parse("1/0")
    assert sorted([LSN.parse("10/0"), LSN.parse("9/1"), LSN.parse("9/0")]) == [
        LSN.parse("9/0"),
        LSN.parse("9/1"),
        LSN.parse("10/0"),
    ]


@pytest.mark.parametrize("bad", ["", "0", "0/", "/0", "x/0", "0/123456789", "1/2/3", "-1/0"])
def test_invalid(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid LSN"):
        LSN.parse(bad)


def test_range() -> None:
    with pytest.raises(ValueError):
        LSN(-1)
    with pytest.raises(ValueError):
        LSN(1 << 64)


@given(st.integers(min_value=0, max_value=(1 << 64) - 1))
def test_round_trip(value: int) -> None:
    lsn = LSN(value)
    assert LSN.parse(str(lsn)) == value
    assert lsn_str(value) == str(lsn)
    assert f"{lsn}" == str(lsn)
