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
from polytrain.rl.config import RLConfig
from polytrain.rl.core import Layout
from polytrain.rl.links import Link
from polytrain.runtime.recorder import Recorder


@dataclass(frozen=True)
class Ranks:
    learners: tuple[int, ...]
    replay: int | None = None
    servers: tuple[int, ...] = ()
    actors: tuple[int, ...] = ()

    @property
    def lead(self) -> int:
        return self.learners[0]

    def role(self, rank: int) -> tuple[str, int]:
        """(role name, index within the role) of ``rank``."""
        for name, ranks in (("learner", self.learners), ("server", self.servers), ("actor", self.actors)):
            if rank in ranks:
                return name, ranks.index(rank)
        if rank == self.replay:
            return "replay", 0
        raise ValueError(f"rank {rank} has no role")

    def describe(self, rank: int) -> str:
        name, i = self.role(rank)
        if name == "learner" and len(self.learners) == 1:
            return "learner"
        return name if name == "replay" else f"{name} {i}"


def layout_ranks(cfg: RLConfig) -> Ranks:
    if cfg.algo == "dqn":
        return Ranks(learners=(0,))
    if cfg.algo == "apex":
        return Ranks(learners=(0,), replay=1, actors=tuple(range(2, 2 + cfg.actors)))
    learners = tuple(range(cfg.learners))
    replay = cfg.learners
    servers = tuple(range(replay + 1, replay + 1 + cfg.servers))
    actors = tuple(range(servers[-1] + 1, servers[-1] + 1 + cfg.actors))
    return Ranks(learners=learners, replay=replay, servers=servers, actors=actors)


@dataclass
class RoleContext:
    """What a role's code gets: config, place, clock/events, and the counting communicator."""

    cfg: RLConfig
    rank: int
    ranks: Ranks
    recorder: Recorder
    run_dir: Path
    comm: Comm | None = None
    links: dict[int, Link] = field(default_factory=dict)  # peer -> its link (see rl/links.py)
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def layout(self) -> Layout:
        return Layout(self.cfg.info.obs_dim)

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
