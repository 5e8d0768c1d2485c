"""Options every strategy that all-reduces shares: which collective carries the data.

``--set collective=ring|builtin``: ``builtin`` (default) is the backend's own all-reduce (gloo or
NCCL); ``ring`` is polytrain's explicit ring (:mod:`polytrain.comm.ring`), whose 2(W−1) phases
appear on the timeline.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from polytrain.errors import ConfigError

COLLECTIVES = ("builtin", "ring")


class CollectiveOptions(BaseModel):
    collective: Literal["builtin", "ring"] = Field(
        "builtin", description="all-reduce: builtin (the backend's) or ring (polytrain's, on p2p)")


def check_collective(strategy: str, collective: str, world: int) -> None:
    """A ring needs a neighbour: refuse ``collective=ring`` on one rank before launch."""
    if collective == "ring" and world < 2:
        raise ConfigError(
            f"Strategy '{strategy}' with collective=ring needs world size >= 2 (a ring of at least "
            f"two ranks), but --procs is {world}. Use --procs 2 or more, or collective=builtin "
            f"(valid: {', '.join(COLLECTIVES)}).")
