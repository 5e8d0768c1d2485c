"""Who is who: the rank layout of each algorithm, and what a role's code is handed.

Ranks (world = all processes)::

    dqn     0: dqn (acts and learns)
    apex    0: learner | 1: replay | 2 .. N+1: actors 0 .. N-1
    gorila  0 .. L-1: learners (0 leads) | L: replay | L+1 .. L+S: parameter shards | then actors

Rank 0 is always the lead learner: it evaluates, decides when the run ends, and its event
stream drives the progress bar.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from polytrain.comm import Comm
from polytrain.metrics.recorder import Recorder
from polytrain.rl.config import RLConfig
from polytrain.rl.core import TransitionRow
from polytrain.rl.links import Link
from polytrain.runtime.layout import RL_ORDER, Layout

ROLE_NAMES = {"replicas": "learner", "replay": "replay", "servers": "server", "actors": "actor"}


def layout_ranks(cfg: RLConfig) -> Layout:
    """The algorithm's ranks: learners are the replicas (dp), then the replay, servers, actors."""
    if cfg.algo == "dqn":
        return Layout(dp=1, order=RL_ORDER)
    if cfg.algo == "apex":
        return Layout(dp=1, replay=1, actors=cfg.actors, order=RL_ORDER)
    return Layout(dp=cfg.learners, replay=1, servers=cfg.servers, actors=cfg.actors, order=RL_ORDER)


def role(ranks: Layout, rank: int) -> tuple[str, int]:
    """(role name, index within the role) of ``rank``."""
    block, i = ranks.role(rank)
    return ROLE_NAMES[block], i


def describe(ranks: Layout, rank: int) -> str:
    name, i = role(ranks, rank)
    if name == "learner" and ranks.dp == 1:
        return "learner"
    return name if name == "replay" else f"{name} {i}"


@dataclass
class RoleContext:
    """What a role's code gets: config, place, clock/events, and the counting communicator."""

    cfg: RLConfig
    rank: int
    ranks: Layout
    recorder: Recorder
    run_dir: Path
    comm: Comm | None = None
    links: dict[int, Link] = field(default_factory=dict)  # peer -> its link (see rl/links.py)
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def row(self) -> TransitionRow:
        return TransitionRow(self.cfg.info.obs_dim)

    @property
    def net_comm(self) -> Comm:
        if self.comm is None:
            raise RuntimeError("this role runs without a process group")
        return self.comm

    def link(self, peer: int) -> Link:
        """The link to ``peer`` (the replay, for a client; any client, for the replay)."""
        if peer not in self.links:
            raise RuntimeError(f"rank {self.rank} has no link to rank {peer}")
        return self.links[peer]

    def save_model(self, net: nn.Module) -> None:
        torch.save(net.state_dict(), self.run_dir / "model.pt")
