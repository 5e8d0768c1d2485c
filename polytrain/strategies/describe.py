"""What `polytrain strategies NAME` prints: a strategy's options with types, defaults, meaning."""

from __future__ import annotations

import sys
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from polytrain.errors import unknown

# Keys every strategy takes (job-level, see polytrain/config.py).
COMMON = [
    ("split", "str", "-", "cut your own nn.Module into traced stages: module paths or 'auto'"),
    ("slow_rank", "int", "-", "straggler emulation: this rank takes slow_factor x as long"),
    ("slow_factor", "float", "1.0", "how much slower slow_rank runs"),
]


def _type(info: FieldInfo) -> str:
    ann = info.annotation
    if typing.get_origin(ann) is typing.Literal:
        return " | ".join(repr(a) for a in typing.get_args(ann))
    return getattr(ann, "__name__", None) or str(ann).replace("typing.", "")


def _meaning(name: str, info: FieldInfo, options: type[BaseModel]) -> str:
    if info.description:
        return info.description
    for cls in options.__mro__:  # ``name``: ... in a class docstring
        for part in (cls.__doc__ or "").replace("\n", " ").split(";"):
            if f"``{name}``:" in part:
                return part.split(f"``{name}``:", 1)[1].strip().rstrip(".")
    return ""


def option_rows(options: type[BaseModel]) -> list[tuple[str, str, str, str]]:
    """(name, type, default, meaning) per option of a strategy's Options model."""
    rows = []
    for name, info in options.model_fields.items():
        default: Any = info.get_default(call_default_factory=True)
        rows.append((name, _type(info), repr(default), _meaning(name, info, options)))
    return rows


def describe_strategy(name: str) -> dict[str, Any]:
    """Summary, family, options and the options every strategy takes, for one strategy."""
    from polytrain.strategies import registry

    strategies = registry()
    if name not in strategies:
        raise unknown("strategy", name, strategies)
    cls = strategies[name]
    from polytrain.runtime.supports import TRAINING

    declared = cls.declared()
    return {"name": name, "family": cls.family, "summary": cls.summary,
            "doc": (sys.modules[cls.__module__].__doc__ or "").strip().split("\n\n")[0],
            "options": option_rows(cls.Options), "common": COMMON,
            "training": [(f, declared.explain(f)) for f in TRAINING]}


def training_matrix() -> str:
    """The support matrix of the training features (docs/training.md), from every strategy's
    declared Supports."""
    from polytrain.runtime.supports import matrix
    from polytrain.strategies import registry

    return matrix((name, cls.declared()) for name, cls in registry().items())
