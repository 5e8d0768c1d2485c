"""Environments: gymnasium's classic-control tasks with discrete actions (nothing downloads).

The table is data so that a config can be validated (and the error list the valid choices)
without importing gymnasium or starting a process. Greedy evaluation runs many episodes in
lock-step with one batched forward pass per step: 100 CartPole episodes cost ~0.5 s, not 50 000
batch-of-one forwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from polytrain.errors import ConfigError, did_you_mean

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class EnvInfo:
    name: str
    obs_dim: int
    actions: int
    reward_threshold: float  # gymnasium's "solved" threshold: the default --target-return
    max_steps: int  # time limit (truncation)
    max_reward: float  # largest reward of one step: bounds what an unfinished episode can still earn


ENVS: dict[str, EnvInfo] = {
    e.name: e
    for e in (
        EnvInfo("CartPole-v1", 4, 2, 475.0, 500, 1.0),
        EnvInfo("CartPole-v0", 4, 2, 195.0, 200, 1.0),
        EnvInfo("Acrobot-v1", 6, 3, -100.0, 500, 0.0),
        EnvInfo("MountainCar-v0", 2, 3, -110.0, 200, 0.0),
    )
}


def env_info(name: str) -> EnvInfo:
    if name not in ENVS:
        raise ConfigError(
            f"Unknown environment '{name}': polytrain rl runs gymnasium's classic-control tasks "
            f"with discrete actions (DQN picks one of a few actions). {did_you_mean(name, ENVS)}"
        )
    return ENVS[name]


def make_env(name: str) -> Any:
    """A gymnasium env with its time limit (the passive checker is off: it costs per step)."""
    try:
        import gymnasium as gym
    except ImportError as exc:  # pragma: no cover - a packaging problem, not user input
        raise ConfigError(
            "polytrain rl needs gymnasium: pip install 'gymnasium>=1.0' (classic control needs "
            "nothing else)."
        ) from exc
    env_info(name)
    return gym.make(name, disable_env_checker=True)


def greedy_returns(net: nn.Module, env_name: str, episodes: int, seed: int,
                   give_up_below: float | None = None) -> tuple[list[float], bool]:
    """Undiscounted returns of ``episodes`` greedy episodes (seeds ``seed ..``), all in lock-step.

    With ``give_up_below``, stops as soon as the mean can no longer reach it (every unfinished
    episode earning ``max_reward`` per remaining step) and returns ``(returns so far, True)``:
    a failing check then costs one short episode instead of ``episodes`` long ones.
    """
    import torch  # not at module level: validating a config must not import torch

    info = env_info(env_name)
    envs = [make_env(env_name) for _ in range(episodes)]
    obs = np.stack([e.reset(seed=seed + i)[0] for i, e in enumerate(envs)]).astype(np.float32)
    returns = np.zeros(episodes)
    active = np.ones(episodes, dtype=bool)
    t = 0
    try:
        while active.any():
            idx = np.flatnonzero(active)
            with torch.inference_mode():
                actions = net(torch.from_numpy(obs[idx])).argmax(dim=1).numpy()
            for i, a in zip(idx, actions, strict=True):
                o, r, terminated, truncated, _ = envs[i].step(int(a))
                returns[i] += float(r)
                obs[i] = o
                active[i] = not (terminated or truncated)
            t += 1
            if give_up_below is not None:
                best = returns.sum() + active.sum() * (info.max_steps - t) * info.max_reward
                if best < give_up_below * episodes:
                    return returns[~active].tolist(), True
    finally:
        for e in envs:
            e.close()
    return returns.tolist(), False
