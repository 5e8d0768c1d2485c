"""Strategies: one module each, all behind :class:`polytrain.strategies.base.Strategy`."""

from polytrain.strategies.base import Strategy, get_strategy_class, make_strategy, registry

__all__ = ["Strategy", "get_strategy_class", "make_strategy", "registry"]
