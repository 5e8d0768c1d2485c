"""Loss and accuracy for the two tasks, shared by every strategy.

An lm model may predict only a suffix of the sequence (seq2seq-lstm predicts the second half), so
an lm output (B, L, V) is scored against the LAST L targets ``y[:, -L:]`` of y (B, T).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from polytrain.data.base import DataSpec
from polytrain.errors import ConfigError


def _scored(spec: DataSpec, out: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits (M, V), targets (M,)) after checking the shapes against the task."""
    if out.shape[-1] != spec.num_classes:
        raise ConfigError(
            f"The model's output has {out.shape[-1]} scores per prediction but dataset "
            f"'{spec.name}' has {spec.num_classes} classes (output shape {tuple(out.shape)}). "
            f"Make the last layer produce {spec.num_classes} outputs."
        )
    if spec.task == "classify":
        if out.dim() != 2 or out.shape[0] != y.shape[0]:
            raise ConfigError(
                f"A classify model must output (batch, classes) = ({y.shape[0]}, "
                f"{spec.num_classes}); got {tuple(out.shape)}."
            )
        return out, y
    if out.dim() != 3 or out.shape[0] != y.shape[0] or out.shape[1] > y.shape[1]:
        raise ConfigError(
            f"An lm model must output (batch, L, vocab) with L <= {y.shape[1]} (scored against "
            f"the last L next-token targets); got {tuple(out.shape)} for targets "
            f"{tuple(y.shape)}."
        )
    length = out.shape[1]
    return out.reshape(-1, out.shape[-1]), y[:, y.shape[1] - length :].reshape(-1)


def task_loss(spec: DataSpec, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy. classify: out (B, C), y (B,). lm: out (B, L, V), y (B, T)."""
    logits, target = _scored(spec, out, y)
    return F.cross_entropy(logits, target)


@torch.no_grad()
def task_correct(spec: DataSpec, out: torch.Tensor, y: torch.Tensor) -> tuple[int, int]:
    """(correct, counted): samples for classify, suffix tokens for lm."""
    logits, target = _scored(spec, out, y)
    kept = target != -100  # positions a dataset marks ignored (Hugging Face's convention)
    return int((logits.argmax(dim=-1) == target)[kept].sum()), int(kept.sum())
