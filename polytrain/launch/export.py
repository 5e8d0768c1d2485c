"""``polytrain export RUN_DIR [--step N] --out F``: a checkpoint as the user's own ``model.pt``
(the naming itself is :mod:`polytrain.models.export`'s)."""

from __future__ import annotations

from pathlib import Path

import torch

from polytrain.models.export import user_state_dict


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
