"""The package's layout rules (README, "How it is built"): data flows one way between the stages,
no module imports itself back, and spark-apply stays in modules a reader can hold."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pgrecv"

# Each top-level part's place in the flow: a part imports only parts of a lower rank (the ones
# at rank 0 are shared by all). stream, snapshot and spark are three consumers of the same stages
# and never import one another.
RANKS = {
    **dict.fromkeys(("__init__", "errors", "lsn", "events", "dates", "filters", "failpoints", "native"), 0),
    "pg": 1,
    "decode": 2,
    "output": 3,
    **dict.fromkeys(("stream", "snapshot", "spark"), 4),
    **dict.fromkeys(("demo", "verify"), 5),
    "cli": 6,
    "__main__": 7,
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Each module's imports of other pgrecv modules, at any depth of the file (lazy ones too)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                targets = [base, *(f"{base}.{a.name}" for a in node.names)]
            else:
                continue
            found |= {t for t in targets if t in modules and t != name and not name.startswith(t + ".")}
        graph[name] = found
    return graph


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_no_module_imports_itself_back() -> None:
    graph = _imports(_modules())
    seen: dict[str, int] = {}  # 1: on the path, 2: done
    cycles: list[list[str]] = []

    def visit(m: str, path: list[str]) -> None:
        seen[m] = 1
        for d in sorted(graph[m]):
            if seen.get(d) == 1:
                cycles.append([*path[path.index(d) :], d] if d in path else [m, d])
            elif d not in seen:
                visit(d, [*path, d])
        seen[m] = 2

    for m in sorted(graph):
        if m not in seen:
            visit(m, [m])
    assert cycles == []


def test_data_flows_one_way_between_the_parts() -> None:
    graph = _imports(_modules())
    assert {_part(m) for m in graph} <= set(RANKS), "a new top-level part needs its place in RANKS"
    back = sorted(
        f"{a} -> {b}"
        for a, deps in graph.items()
        for b in deps
        if _part(a) != _part(b) and RANKS[_part(b)] >= RANKS[_part(a)] and RANKS[_part(b)] > 0
    )
    assert back == []


@pytest.mark.parametrize("limit", [600])
def test_spark_apply_modules_stay_readable(limit: int) -> None:
    spark = PACKAGE / "spark"
    long = {str(p.relative_to(spark)): n for p in spark.rglob("*.py") if (n := len(p.read_text().splitlines())) > limit}
    assert long == {}
    anys = sum(len(re.findall(r"\bAny\b", p.read_text())) for p in spark.rglob("*.py"))
    assert anys <= 80, f"{anys} Any in pgrecv/spark: use pyspark's types (under TYPE_CHECKING)"


def test_record_text_is_written_by_the_format_module_only() -> None:
    """JSONL records are built by pgrecv/output (format.py owns the fields and their text);
    nothing else assembles one by hand."""
    hand = sorted(
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if p.parent.name != "output" and re.search(r"""['"]\{\\?"v\\?":""", p.read_text())
    )
    assert hand == []
