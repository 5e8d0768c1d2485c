"""RL checkpoints in the run's :class:`~polytrain.runtime.checkpoint.CheckpointStore` (training's
layout: ``RUN/checkpoints/step-K/rank{R}.pt``, a manifest of SHA-256s, ``LATEST`` moved last,
verified on resume, a refused newest one falling back to the one before), and ``dqn``'s state:
everything its loop carries, so a resumed run continues exactly.

The store's fingerprint is the run's options but those a resume may change (:data:`RESUMABLE`), so
a checkpoint is refused by a run with other settings. Each checkpoint's ``meta.json`` keeps the
cut's figures (``info``: env steps, learner updates, the run's clock ``t``; apex and gorila also
the checkpoint's number ``save``), which resume reads without loading a tensor.

A ``dqn`` checkpoint (step K = its env steps, written every ``checkpoint_every`` env steps and at a
stop) holds the online and target networks, the optimizer, the update and episode counters, the whole
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

import hashlib
import json
import sys
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from polytrain.errors import CheckpointError, ConfigError
from polytrain.runtime.checkpoint import CheckpointStore

if TYPE_CHECKING:
    from polytrain.rl.config import RLConfig

ROOT = Path("checkpoints")
KEEP = 2  # the newest and the one before it: a refused newest one falls back
# settings a resumed run may change: when to stop and how to evaluate, not what it learns
RESUMABLE = frozenset({"max_env_steps", "max_seconds", "target_return", "eval_every_s",
                       "eval_episodes", "screen_episodes", "out", "debug"})
_PLAIN = (bool, int, float, str, type(None))


def fingerprint(cfg: RLConfig) -> str:
    """The run's options but the resumable ones: what a checkpoint must have been written with."""
    kept = {k: v for k, v in cfg.model_dump(mode="json").items() if k not in RESUMABLE}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:16]


def saved_options(run_dir: Path) -> dict[str, Any]:
    """The options the run in ``run_dir`` was started with (its ``config.toml``)."""
    try:
        return tomllib.loads((run_dir / "config.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError):
        raise ConfigError(f"--resume {run_dir}: no polytrain rl run there (no readable config.toml)."
                          ) from None


def run_config(run_dir: Path) -> RLConfig:
    """The config the run in ``run_dir`` was started with."""
    from polytrain.rl.config import make_rl_config

    return make_rl_config({**saved_options(run_dir), "out": str(run_dir)})


def store(run_dir: Path, cfg: RLConfig) -> CheckpointStore:
    """The run's checkpoint store (every RL algorithm's, as training's)."""
    return CheckpointStore(run_dir / ROOT, fingerprint(cfg))


def latest(run_dir: Path, cfg: RLConfig | None = None) -> Path:
    """The newest intact checkpoint of the run (``cfg``: the run's own config by default; each
    newer checkpoint refused is named on stderr); ConfigError, before anything starts, when
    there is none."""
    try:
        ckpt, refused = store(run_dir, cfg or run_config(run_dir)).find_good()
    except CheckpointError as e:  # names the directory, what is wrong and the fix
        raise ConfigError(str(e)) from None
    for why in refused:
        print(f"warning: {why}; resuming from {ckpt.name} instead", file=sys.stderr, flush=True)
    return ckpt


def saved_info(run_dir: Path, cfg: RLConfig | None = None) -> dict[str, Any]:
    """The newest checkpoint's figures (``info``: env steps, updates, ``t``; apex/gorila ``save``)."""
    return CheckpointStore.info_of(latest(run_dir, cfg))


def load_part(run_dir: Path, cfg: RLConfig | None, rank: int) -> dict[str, Any]:
    """Rank ``rank``'s file of the newest checkpoint (dqn: rank 0), read as tensors, numbers and
    strings only (never unpickling more); refused before the run starts."""
    try:
        return CheckpointStore.load_rank(latest(run_dir, cfg), rank)
    except CheckpointError as e:
        raise ConfigError(str(e)) from None


def has_checkpoint(run_dir: Path) -> bool:
    """Whether the run has committed a checkpoint (its ``LATEST`` pointer exists)."""
    return (run_dir / ROOT / "LATEST").is_file()


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


def save(run_dir: Path, cfg: RLConfig, state: dict[str, Any]) -> Path:
    """Commit ``state`` (:func:`dqn_state`) as checkpoint step-(its env steps)."""
    steps = int(state["env_steps"])
    st = store(run_dir, cfg)
    st.write_rank(steps, 0, state)
    info = {"env_steps": steps, "updates": int(state["updates"]), "t": float(state["t"])}
    return st.commit(steps, keep=KEEP, info=info)


def load(run_dir: Path, cfg: RLConfig | None = None) -> dict[str, Any]:
    """The newest dqn checkpoint's state (ConfigError when there is none, or none is intact)."""
    return load_part(run_dir, cfg, 0)


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
