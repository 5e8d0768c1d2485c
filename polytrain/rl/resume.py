"""Resuming an RL run: where it continues and with which options, for every algorithm (``dqn``
from its one checkpoint file, apex and gorila from their snapshot's manifest)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from polytrain.errors import ConfigError
from polytrain.rl.checkpoint import RESUMABLE, load
from polytrain.rl.snapshot import load_meta


def resume_point(run_dir: Path, algo: str) -> dict[str, Any]:
    """Where a resumed run continues: env steps, learner updates, the run's clock ``t`` and (apex,
    gorila) the checkpoint's number ``save``."""
    if algo == "dqn":
        state = load(run_dir)
        return {"env_steps": state["env_steps"], "updates": state["updates"], "t": state.get("t"),
                "save": 0}
    meta = load_meta(run_dir)
    return {"env_steps": int(meta["env_steps"]), "updates": int(meta["updates"]), "t": float(meta["t"]),
            "save": int(meta["save"])}


def resume_options(run_dir: Path, given: dict[str, Any]) -> dict[str, Any]:
    """The resumed run's options: the run's own, with the ``given`` ones that may change.

    Refused (ConfigError, before anything starts): no run or no checkpoint at ``run_dir``, another
    algorithm, a differing option outside :data:`RESUMABLE`, or a step or time limit the
    checkpoint has already reached."""
    try:
        saved = tomllib.loads((run_dir / "config.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError):
        raise ConfigError(f"--resume {run_dir}: no polytrain rl run there (no readable config.toml)."
                          ) from None
    algo = saved.get("algo")
    if given.get("algo", algo) != algo:
        raise ConfigError(f"--resume {run_dir}: this run is {algo}, asked: {given.get('algo')}; a run "
                          f"resumes with its own algorithm. Fix: polytrain rl {algo} --resume {run_dir}.")
    from polytrain.rl.config import RLConfig

    fields = RLConfig.model_fields  # the run's config.toml leaves out options that were None
    changed = sorted(k for k, v in given.items() if k not in RESUMABLE and k != "algo"
                     and saved.get(k, fields[k].default if k in fields else None) != v)
    if changed:
        was = ", ".join(f"{k}={given[k]!r} (the run's: {saved.get(k)!r})" for k in changed)
        raise ConfigError(f"--resume {run_dir}: a resumed run keeps its settings; these differ: {was}. "
                          f"Only {', '.join(sorted(RESUMABLE - {'out', 'debug'}))} may change. Fix: "
                          "drop them, or start a new run.")
    options = {**saved, **given, "out": str(run_dir)}
    point = resume_point(run_dir, str(algo))
    at, t = point["env_steps"], point["t"] or 0.0
    limit = options.get("max_env_steps", 0)
    if limit and limit <= at:
        raise ConfigError(f"--resume {run_dir}: the checkpoint is at env step {at}, --max-env-steps "
                          f"{limit} leaves nothing to do. Fix: --max-env-steps above {at}.")
    budget = options.get("max_seconds", fields["max_seconds"].default)
    if budget <= t:
        raise ConfigError(f"--resume {run_dir}: the checkpoint is at {t:.1f} s of the run's clock, "
                          f"--max-seconds {budget:g} (the whole run's budget) leaves nothing to do. "
                          f"Fix: --max-seconds above {t:.1f}.")
    return options
