"""The strategies' ids, families and summaries, read from their source without importing it.

Importing the strategy modules imports torch and most of polytrain (seconds on a loaded
machine), which ``polytrain strategies`` and the first checks of a job (is the strategy id
known?) do not need. The class attributes ``name``, ``family`` and ``summary`` stay where they
are, in each strategy's class; this module reads them from the syntax tree of the files under
``polytrain/strategies`` (inherited values resolved through the base classes found there).
``tests/test_cli_fast.py`` holds it equal to the registry that imports every module.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_ATTRS = ("name", "family", "summary")
# a file that may declare a strategy: an indented ``name = "..."`` (a registered class sets its
# own) or a class deriving from one named ``...Strategy`` (an unnamed intermediate base)
_DECLARES = re.compile(r'^\s+name\s*(?::[^=\n]*)?=\s*"|Strategy[),]', re.MULTILINE)


@dataclass(frozen=True)
class Entry:
    """One registered strategy as its class declares it."""

    name: str
    family: str
    summary: str
    module: str


@dataclass
class _Class:
    bases: list[str]
    attrs: dict[str, str]
    module: str


def _base_name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _string(node: ast.expr) -> str | None:
    """A string literal (implicitly concatenated ones are one constant already)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _classes(path: Path, module: str) -> dict[str, _Class]:
    tree = ast.parse(path.read_text(), str(path))
    out = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        attrs = {}
        for stmt in node.body:
            target = value = None
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                target, value = stmt.targets[0], stmt.value
            elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                target, value = stmt.target, stmt.value
            if isinstance(target, ast.Name) and target.id in _ATTRS and value is not None:
                text = _string(value)
                if text is not None:
                    attrs[target.id] = text
        out[node.name] = _Class([_base_name(b) for b in node.bases], attrs, module)
    return out


def _resolve(cls: str, attr: str, classes: dict[str, _Class], seen: frozenset[str]) -> str | None:
    """``attr`` of class ``cls``: its own, else the first base's that has it (Python's order for
    the single inheritance strategies use)."""
    entry = classes.get(cls)
    if entry is None or cls in seen:
        return None
    if attr in entry.attrs:
        return entry.attrs[attr]
    for base in entry.bases:
        found = _resolve(base, attr, classes, seen | {cls})
        if found is not None:
            return found
    return None


def _is_strategy(cls: str, classes: dict[str, _Class], seen: frozenset[str] = frozenset()) -> bool:
    entry = classes.get(cls)
    if entry is None or cls in seen:
        return False
    return any(b == "Strategy" or _is_strategy(b, classes, seen | {cls}) for b in entry.bases)


@cache
def catalog() -> dict[str, Entry]:
    """Every strategy id -> its entry, sorted by id, as the registry would list them."""
    classes: dict[str, _Class] = {}
    for path in sorted(_HERE.rglob("*.py")):
        text = path.read_text()
        if not _DECLARES.search(text):  # helper modules: no need to parse them (half the time)
            continue
        rel = path.relative_to(_HERE.parent.parent).with_suffix("")
        module = ".".join(rel.parts).removesuffix(".__init__")
        # class names are unique among the strategy modules' top-level classes that matter;
        # a helper class of the same name elsewhere must not shadow a strategy's base
        for cls_name, found in _classes(path, module).items():
            if cls_name not in classes or _is_strategy_like(found):
                classes[cls_name] = found
    out = {}
    for cls in classes:
        if not _is_strategy(cls, classes):
            continue
        sid = _resolve(cls, "name", classes, frozenset())
        if sid:
            out[sid] = Entry(sid, _resolve(cls, "family", classes, frozenset()) or "",
                              _resolve(cls, "summary", classes, frozenset()) or "",
                              classes[cls].module)
    return dict(sorted(out.items()))


def _is_strategy_like(found: _Class) -> bool:
    return "name" in found.attrs or "Strategy" in found.bases


def strategy_ids() -> list[str]:
    return list(catalog())


@cache
def zoo_names(kind: str) -> tuple[str, ...]:
    """The names the built-in ``kind`` ("models" or "data") registers, read from the
    ``ModelEntry(name=...)`` / ``DatasetEntry(name=...)`` calls of their source files (the
    registries' own homes), so that an unknown ``--model``/``--dataset`` is refused before
    torch is imported. Held equal to the registries by ``tests/test_cli_fast.py``."""
    entry = {"models": "ModelEntry", "data": "DatasetEntry"}[kind]
    names = set()
    for path in sorted((_HERE.parent / kind).rglob("*.py")):
        text = path.read_text()
        if f"{entry}(" not in text:
            continue
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, ast.Call) and _base_name(node.func) == entry:
                for kw in node.keywords:
                    name = _string(kw.value) if kw.arg == "name" else None
                    if name:
                        names.add(name)
    return tuple(sorted(names))
