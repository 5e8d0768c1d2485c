"""Acting: ε-greedy steps in one environment, turned into n-step transitions as they happen."""

from __future__ import annotations

import numpy as np
import torch

from polytrain.rl.core import NStep
from polytrain.rl.envs import make_env
from polytrain.rl.roles import RoleContext


def act(net: torch.nn.Module, obs: np.ndarray, eps: float, actions: int, rng: np.random.Generator) -> int:
    """ε-greedy on one observation."""
    if rng.random() < eps:
        return int(rng.integers(actions))
    with torch.inference_mode():
        return int(net(torch.from_numpy(obs[None])).argmax(dim=1).item())


class EpisodeRunner:
    """One environment stepped ε-greedily, yielding n-step rows and episode ends."""

    def __init__(self, ctx: RoleContext, seed: int) -> None:
        self.cfg = ctx.cfg
        self.env = make_env(ctx.cfg.env)
        self.nstep = NStep(ctx.cfg.n_step, ctx.cfg.gamma, ctx.row.obs_dim)
        self.obs = np.asarray(self.env.reset(seed=seed)[0], dtype=np.float32)
        self.rng = np.random.default_rng(seed)
        self.ep_return = 0.0
        self.ep_len = 0
        self.steps = 0

    def step(self, net: torch.nn.Module, eps: float) -> tuple[list[np.ndarray], tuple[float, int] | None]:
        """One env step: (completed rows, (return, length) if an episode ended)."""
        a = act(net, self.obs, eps, self.cfg.info.actions, self.rng)
        nxt, r, terminated, truncated, _ = self.env.step(a)
        nxt = np.asarray(nxt, dtype=np.float32)
        rows = self.nstep.push(self.obs, a, float(r), nxt, bool(terminated), bool(truncated))
        self.steps += 1
        self.ep_return += float(r)
        self.ep_len += 1
        ended = None
        if terminated or truncated:
            ended = (self.ep_return, self.ep_len)
            self.ep_return, self.ep_len = 0.0, 0
            nxt = np.asarray(self.env.reset()[0], dtype=np.float32)
        self.obs = nxt
        return rows, ended
