"""Tier 1: the package's files import each other one way (no import loops between files), and so
do its top-level packages, in the order of the layer table in docs/architecture.md (the one place
it is written: each row imports only from its own row and the rows above it).

Every ``import`` of a ``polytrain`` module counts, at module level or inside a function (a lazy
import is still a dependency); imports under ``if TYPE_CHECKING:`` do not (annotations only)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# loops still to break, each with the reason it remains
KNOWN: dict[frozenset[str], str] = {}


def _modules() -> dict[str, Path]:
    out = {}
    for path in (ROOT / "polytrain").rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        out[name] = path
    return out


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """module -> the polytrain modules it imports (TYPE_CHECKING blocks left out)."""
    modules = _modules()
    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                       and "TYPE_CHECKING" in ast.unparse(node.test)
                       for stmt in node.body for n in ast.walk(stmt)}
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package
                    for _ in range(node.level - 1):
                        up = up.rpartition(".")[0]
                    base = f"{up}.{base}" if base else up
                targets = [base, *(f"{base}.{a.name}" for a in node.names)]
            for target in targets:
                if target.startswith("polytrain"):
                    found = _resolve(target, modules)
                    if found and found != name:
                        edges[name].add(found)
    return edges


def loops(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(frozenset(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_loops_between_files() -> None:
    found = loops(import_graph())
    new = [sorted(group) for group in found if group not in KNOWN]
    assert not new, f"import loops between files: {new}"


def package_of(module: str) -> str:
    """``polytrain.cost.scene`` -> ``cost``, ``polytrain.api`` -> ``api``, ``polytrain`` -> itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def package_graph(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """top-level package -> the other top-level packages its files import."""
    out: dict[str, set[str]] = defaultdict(set)
    for a, bs in edges.items():
        out[package_of(a)] |= {package_of(b) for b in bs} - {package_of(a)}
    return out


def layer_rows() -> list[set[str]]:
    """The layer table of docs/architecture.md, lowest row first: each row's top-level packages."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        first = line.split("|")[1] if line.startswith("| `") else ""
        names = [n.removeprefix("polytrain/") for n in first.split("`")[1::2]]
        if names:
            rows.append({"polytrain" if n == "__init__.py" else n.removesuffix(".py").rstrip("/")
                         for n in names})
    return rows


def test_no_import_loops_between_packages() -> None:
    found = loops(package_graph(import_graph()))
    assert not found, f"import loops between packages: {[sorted(group) for group in found]}"


def test_packages_import_down_the_layer_table_only() -> None:
    rows = layer_rows()
    row = {name: i for i, names in enumerate(rows) for name in names}
    packages = {package_of(m) for m in _modules()}
    assert sum(map(len, rows)) == len(row), "a package is in two rows of the layer table"
    assert set(row) == packages, f"place in the layer table: {sorted(packages - set(row))}; " \
                                 f"gone: {sorted(set(row) - packages)}"
    up = sorted(f"{a} -> {b}" for a, bs in package_graph(import_graph()).items() for b in bs
                if row[b] > row[a])
    assert not up, f"imports up the layer table (docs/architecture.md): {up}"


def test_the_loop_finder_finds_a_loop() -> None:
    assert loops({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]


def test_every_environment_variable_is_named_in_one_place() -> None:
    """Only ``polytrain/env.py`` spells a ``POLYTRAIN_`` variable's name (as a string or a keyword);
    the docs' table lists each of them."""
    import re

    from polytrain.env import VARS

    names = {v.name for v in VARS}
    found: dict[str, set[str]] = {}
    for path in (ROOT / "polytrain").rglob("*.py"):
        if path.name == "env.py" and path.parent.name == "polytrain":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            text = None
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
            elif isinstance(node, ast.keyword) and node.arg:
                text = node.arg
            if text and re.fullmatch(r"POLYTRAIN_[A-Z0-9_]+", text):
                found.setdefault(str(path.relative_to(ROOT)), set()).add(text)
    assert found == {}, found
    table = (ROOT / "docs" / "architecture.md").read_text()
    assert all(f"`{n}`" in table for n in names) and len(names) == len(VARS)
