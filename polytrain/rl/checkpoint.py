"""``dqn`` checkpoints and resume: everything its loop carries, so a resumed run continues exactly.

A checkpoint (``RUN/checkpoints/dqn.pt``, written by rename every ``checkpoint_every`` env steps)
holds the online and target networks, the optimizer, the update and episode counters, the whole
prioritized replay (rows, ids, both trees, the next id, the largest priority, its sampling RNG),
the acting side (the environment's own state and RNG, the current observation, the n-step
transitions still pending, the ε-greedy RNG, the episode in progress), the return window and
torch's RNG. Only tensors, numbers and strings are stored (RNG states as JSON), so loading uses
``torch.load(weights_only=True)``: a crafted file cannot run code.

``polytrain rl dqn --resume RUN [--max-env-steps N]`` continues a run from its checkpoint with the
run's own settings; only the stopping and evaluation settings (:data:`RESUMABLE`) may change, any
other option given that differs is refused before the run starts. ``apex`` and ``gorila``
checkpoint a consistent cut of their processes instead (:mod:`polytrain.rl.snapshot`); they resume
through the same :func:`polytrain.rl.resume.resume_options`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from polytrain.errors import ConfigError
from polytrain.runtime.checkpoint import load_tensors, save_tensors

FILE = Path("checkpoints") / "dqn.pt"
# settings a resumed run may change: when to stop and how to evaluate, not what it learns
RESUMABLE = frozenset({"max_env_steps", "max_seconds", "target_return", "eval_every_s",
                       "eval_episodes", "screen_episodes", "out", "debug"})
_PLAIN = (bool, int, float, str, type(None))


def _rng_state(gen: np.random.Generator) -> str:
    return json.dumps(gen.bit_generator.state)


def _set_rng(gen: np.random.Generator, state: str) -> None:
    gen.bit_generator.state = json.loads(state)


def _layers(env: Any) -> list[Any]:
    """The wrapper chain of a gymnasium env, outermost first, the bare env last."""
    out = [env]
    while hasattr(out[-1], "env"):
        out.append(out[-1].env)
    return out


def env_state(env: Any) -> list[dict[str, Any]]:
    """Each layer's plain attributes (the physics state, step counters, flags) and RNGs."""
    layers = []
    for layer in _layers(env):
        mine: dict[str, Any] = {}
        for key, value in vars(layer).items():
            if isinstance(value, np.random.Generator):
                mine[key] = {"rng": _rng_state(value)}
            elif isinstance(value, np.ndarray) and value.dtype.kind in "fiub":
                mine[key] = {"array": torch.from_numpy(value.copy())}
            elif isinstance(value, _PLAIN):
                mine[key] = {"value": value}
        layers.append(mine)
    return layers


def load_env_state(env: Any, layers: list[dict[str, Any]]) -> None:
    for layer, mine in zip(_layers(env), layers, strict=True):
        for key, saved in mine.items():
            if "rng" in saved:
                value = getattr(layer, key)
                if not isinstance(value, np.random.Generator):  # created by the first reset
                    value = np.random.default_rng()
                    setattr(layer, key, value)
                _set_rng(value, saved["rng"])
            elif "array" in saved:
                setattr(layer, key, saved["array"].numpy().copy())
            else:
                setattr(layer, key, saved["value"])


def replay_buffer_state(replay: Any) -> dict[str, Any]:
    """A PrioritizedReplay whole: rows, ids, both trees, the next id, the largest priority, RNG."""
    return {"rows": torch.from_numpy(replay.rows.copy()), "ids": torch.from_numpy(replay.ids.copy()),
            "sums": torch.from_numpy(replay.sums.tree.copy()),
            "mins": torch.from_numpy(replay.mins.tree.copy()),
            "next_id": replay.next_id, "max_priority": replay.max_priority, "rng": _rng_state(replay.rng)}


def restore_replay_buffer(replay: Any, r: dict[str, Any]) -> None:
    replay.rows[:] = r["rows"].numpy()
    replay.ids[:] = r["ids"].numpy()
    replay.sums.tree[:] = r["sums"].numpy()
    replay.mins.tree[:] = r["mins"].numpy()
    replay.next_id, replay.max_priority = r["next_id"], r["max_priority"]
    _set_rng(replay.rng, r["rng"])


def dqn_state(learner: Any, replay: Any, runner: Any, window: Any, episodes: int,
              eval_index: int, t: float) -> dict[str, Any]:
    return {
        "t": t, "env_steps": runner.steps, "episodes": episodes, "eval_index": eval_index,
        "net": learner.net.state_dict(), "target": learner.target.state_dict(),
        "optimizer": learner.opt.state_dict(), "updates": learner.updates,
        "replay": replay_buffer_state(replay),
        "runner": {"env": env_state(runner.env), "obs": torch.from_numpy(runner.obs.copy()),
                   "rng": _rng_state(runner.rng), "ep_return": runner.ep_return,
                   "ep_len": runner.ep_len, "steps": runner.steps,
                   "pending": [(torch.from_numpy(o.copy()), a, r) for o, a, r in runner.nstep.pending]},
        "window": list(window.values),
        "torch_rng": torch.get_rng_state(),
    }


def save(run_dir: Path, state: dict[str, Any]) -> None:
    """Write ``RUN/checkpoints/dqn.pt`` whole (:func:`polytrain.runtime.checkpoint.save_tensors`)."""
    save_tensors(run_dir / FILE, state)


def load(run_dir: Path) -> dict[str, Any]:
    path = run_dir / FILE
    if not path.exists():
        raise ConfigError(f"--resume {run_dir}: no checkpoint ({FILE}); the run was started without "
                          "--checkpoint-every N. Start a new run with it.")
    return load_part_file(run_dir, path)


def load_part_file(run_dir: Path, path: Path) -> dict[str, Any]:
    """One checkpoint file of an RL run (dqn's, or a part of an apex/gorila snapshot), read as
    tensors, numbers and strings only (never unpickling more); refused before the run starts."""
    state, problem = load_tensors(path)
    if problem is not None or not isinstance(state, dict):
        raise ConfigError(f"--resume {run_dir}: {path} cannot be loaded ({problem or 'not a state'}); "
                          "start a new run.")
    return state


def restore(state: dict[str, Any], learner: Any, replay: Any, runner: Any, window: Any) -> None:
    """Put ``state`` (from :func:`load`) back into a freshly built dqn loop's objects."""
    learner.net.load_state_dict(state["net"])
    learner.target.load_state_dict(state["target"])
    learner.opt.load_state_dict(state["optimizer"])
    learner.updates = state["updates"]
    restore_replay_buffer(replay, state["replay"])
    a = state["runner"]
    load_env_state(runner.env, a["env"])
    runner.obs = a["obs"].numpy().copy()
    _set_rng(runner.rng, a["rng"])
    runner.ep_return, runner.ep_len, runner.steps = a["ep_return"], a["ep_len"], a["steps"]
    runner.nstep.pending.clear()
    runner.nstep.pending.extend((o.numpy().copy(), a_, r_) for o, a_, r_ in a["pending"])
    window.values.clear()
    window.values.extend(state["window"])
    torch.set_rng_state(state["torch_rng"])
