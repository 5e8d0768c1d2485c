"""Resuming an RL run: where it continues and with which options, for every algorithm (from the
newest intact checkpoint of the run's store, :mod:`polytrain.rl.checkpoint`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from polytrain.errors import ConfigError
from polytrain.rl.checkpoint import RESUMABLE, saved_info, saved_options

if TYPE_CHECKING:
    from polytrain.rl.config import RLConfig


def resume_point(run_dir: Path, cfg: RLConfig) -> dict[str, Any]:
    """Where a resumed run continues: env steps, learner updates, the run's clock ``t`` and (apex,
    gorila) the checkpoint's number ``save`` (dqn: 0)."""
    info = saved_info(run_dir, cfg)
    try:
        return {"env_steps": int(info["env_steps"]), "updates": int(info["updates"]),
                "t": float(info["t"]), "save": int(info.get("save", 0))}
    except (KeyError, TypeError, ValueError):
        raise ConfigError(f"--resume {run_dir}: its newest checkpoint's meta.json lacks the figures "
                          "of the cut (env_steps, updates, t); start a new run.") from None


def resume_options(run_dir: Path, given: dict[str, Any]) -> dict[str, Any]:
    """The resumed run's options: the run's own, with the ``given`` ones that may change.

    Refused (ConfigError, before anything starts): no run or no checkpoint at ``run_dir``, another
    algorithm, a differing option outside :data:`RESUMABLE`, or a step or time limit the
    checkpoint has already reached."""
    saved = saved_options(run_dir)
    algo = saved.get("algo")
    if given.get("algo", algo) != algo:
        raise ConfigError(f"--resume {run_dir}: this run is {algo}, asked: {given.get('algo')}; a run "
                          f"resumes with its own algorithm. Fix: polytrain rl {algo} --resume {run_dir}.")
    from polytrain.rl.config import RLConfig, make_rl_config

    fields = RLConfig.model_fields  # the run's config.toml leaves out options that were None
    changed = sorted(k for k, v in given.items() if k not in RESUMABLE and k != "algo"
                     and saved.get(k, fields[k].default if k in fields else None) != v)
    if changed:
        was = ", ".join(f"{k}={given[k]!r} (the run's: {saved.get(k)!r})" for k in changed)
        raise ConfigError(f"--resume {run_dir}: a resumed run keeps its settings; these differ: {was}. "
                          f"Only {', '.join(sorted(RESUMABLE - {'out', 'debug'}))} may change. Fix: "
                          "drop them, or start a new run.")
    options = {**saved, **given, "out": str(run_dir)}
    point = resume_point(run_dir, make_rl_config(options))
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
