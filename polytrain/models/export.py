"""``model.pt`` in the user's own key names: a plain ``state_dict`` that the user's class loads.

Strategies hold a job's model in one of three forms, and their state dicts name its tensors
accordingly; :func:`user_state_dict` maps each back to the names of the module the user built:

- a user module held whole (:class:`~polytrain.models.user.UserModule`): ``0.<name>`` → ``<name>``;
- a module cut into traced segments (``--set split=...``): segment ``k`` names the module's own
  tensors ``k.m.<name>`` (``m`` is the traced root's attribute) → ``<name>``; a weight tied across
  segments (nanoGPT's ``wte``/``lm_head``) appears under both of its names, as in the user's own
  ``state_dict``;
- the zoo's layer lists and a user factory's own ``nn.Sequential``: already the user's names.

Pipeline stages and tensor shards are consolidated by the strategies before this mapping (one
full state on the leader), so every strategy's ``model.pt`` has the same keys as ``single``'s.
``polytrain export RUN [--step N] --out F`` (:func:`export_checkpoint`) writes the same from a
checkpoint taken during the run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch

Form = Literal["layers", "whole", "traced"]
ROOT = "m"


def user_key(key: str, form: Form) -> str:
    """The user's name for one key of the strategy's state dict."""
    if form == "whole":
        return key.removeprefix("0.")
    if form == "traced":
        head, _, rest = key.partition(".")
        if head.isdigit() and rest.startswith(ROOT + "."):
            return rest.removeprefix(ROOT + ".")
    return key


def user_state_dict(state: dict[str, torch.Tensor], form: Form,
                    keys: tuple[str, ...] | None = None) -> dict[str, torch.Tensor]:
    """``state`` under the user's own key names (see the module doc); the same tensor named
    twice (a tied weight seen by two segments) is kept once per user name. ``keys``: the user
    module's own keys, in its order (a traced model's segments may hold more)."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        out.setdefault(user_key(key, form), value)
    if keys is not None:
        out = {k: out[k] for k in keys if k in out}
    return out


def export_checkpoint(run_dir: Path, step: int | None = None) -> tuple[dict[str, torch.Tensor], int]:
    """A checkpoint of ``run_dir`` (the newest good one, or ``step``) as ``model.pt`` would hold
    it: every rank's model state put together and named as the user's module names it. Ranks of
    replicated strategies hold the whole model; pipeline stages hold disjoint keys; a tensor
    shard holds a slice, which only the end of a run consolidates (refused here, naming why)."""
    from polytrain.errors import ConfigError
    from polytrain.launch.prepare import resume_config
    from polytrain.runtime.checkpoint import CheckpointStore
    from polytrain.runtime.job import Job
    from polytrain.strategies.base import job_fingerprint

    cfg = resume_config(run_dir, {}, [])
    store = CheckpointStore(run_dir / "checkpoints", job_fingerprint(cfg))
    ckpt = store.find_good()[0] if step is None else run_dir / "checkpoints" / f"step-{step:08d}"
    if not ckpt.is_dir():
        raise ConfigError(f"{run_dir} has no checkpoint step-{step:08d}; list them with "
                          f"ls {run_dir / 'checkpoints'}.")
    job = Job.from_config(cfg)
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in job.build_model().state_dict().items()}
    merged: dict[str, torch.Tensor] = {}
    for part in sorted(ckpt.glob("rank*.pt")):
        state = CheckpointStore.load_rank(ckpt, int(part.stem.removeprefix("rank")))
        for key, value in (state.get("model") or {}).items():
            if key in shapes and value.shape != shapes[key]:
                raise ConfigError(
                    f"{ckpt.name}: {key} is a shard {tuple(value.shape)} of {tuple(shapes[key])} "
                    f"({cfg.strategy} splits tensors across ranks); the run's model.pt is the "
                    "consolidated model, written when the run ends.")
            merged.setdefault(key, value)
    missing = [k for k in shapes if k not in merged]
    if missing:
        raise ConfigError(f"{ckpt.name} holds no model state for {missing[0]} (and "
                          f"{len(missing) - 1} more): {cfg.strategy} checkpoints the model "
                          "elsewhere (its servers' files); use the run's model.pt.")
    return user_state_dict(merged, job.form, job.user_keys), int(ckpt.name.removeprefix("step-"))
