"""Lake directory names read back as the PostgreSQL names they encode (verify lists the lake's
tables PostgreSQL does not have): every name spark-apply encodes, and nothing else."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pgrecv.spark.model import MAX_DIR_NAME, table_dir_name, table_of_dir_name

# PostgreSQL identifiers: any characters but NUL, at most 63 bytes
_IDENT = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), min_size=1).filter(
    lambda s: len(s.encode()) <= 63
)


@given(_IDENT, _IDENT)
def test_dir_names_read_back(schema: str, table: str) -> None:
    name = table_dir_name(schema, table)
    assert table_of_dir_name(name) == ((schema, table) if len(name) <= MAX_DIR_NAME and "~~" not in name else None)


@given(st.text())
def test_other_names_are_none_or_exact(text: str) -> None:
    """A name read back is one spark-apply would write for it; anything else is None, never an error."""
    back = table_of_dir_name(text)
    assert back is None or table_dir_name(*back) == text


def test_state_dir_and_cut_names() -> None:
    assert table_of_dir_name("_pgrecv") is None and table_of_dir_name(".tmp-x") is None
    long = table_dir_name("s" * 63, "é" * 31)
    assert len(long) <= MAX_DIR_NAME and table_of_dir_name(long) is None
    assert table_of_dir_name("public.a~4") is None and table_of_dir_name("public.a~e9") is None
