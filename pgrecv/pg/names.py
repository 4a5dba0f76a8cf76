"""SQL identifiers as the server reads them in option lists and statements pgrecv writes."""

from __future__ import annotations


def quote_name(name: str) -> str:
    """An identifier quoted where it needs it (publication_names is a list of identifiers; a
    publication named in ALTER PUBLICATION)."""
    if name.isidentifier() and name == name.lower():
        return name
    return '"' + name.replace('"', '""') + '"'
