"""polytrain: train a PyTorch model with every classic parallel technique, and measure each."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from polytrain.version import __version__

if TYPE_CHECKING:
    from polytrain.metrics.summary import TrainSummary


def train(**kwargs: Any) -> TrainSummary:
    """Run one training job; see :func:`polytrain.api.train`."""
    from polytrain.api import train as _train

    return _train(**kwargs)


def compare(strategies: list[str], **kwargs: Any) -> dict[str, Any]:
    """Run the same job with several strategies; see :func:`polytrain.api.compare`."""
    from polytrain.api import compare as _compare

    return _compare(strategies, **kwargs)


__all__ = ["__version__", "compare", "train"]
