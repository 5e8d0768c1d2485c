"""Strategies: one module each, all behind :class:`polytrain.strategies.base.Strategy`.

The names below load lazily so that pure-data modules (e.g. pipeline schedules) import without
pulling in torch and the runtime.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from polytrain.strategies.base import Strategy, get_strategy_class, make_strategy, registry

__all__ = ["Strategy", "get_strategy_class", "make_strategy", "registry"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from polytrain.strategies import base

        return getattr(base, name)
    raise AttributeError(name)
