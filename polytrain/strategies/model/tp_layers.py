"""The projections tensor parallelism shards: ``nn.Linear`` (weight (out, in)) and Hugging Face's
GPT-2 ``Conv1D`` (weight (in, out), ``y = x·W + b``), behind one small set of functions so the
plan code never asks which it holds.

Column-parallel keeps output features (Linear: weight rows, dim 0; Conv1D: weight columns,
dim 1); row-parallel keeps input features (Linear: dim 1; Conv1D: dim 0) and sums the partial
outputs (Megatron's g) before adding the bias once. State-dict keys and layouts stay the user's,
so the gathered ``model.pt`` loads into the user's class.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from polytrain.strategies.model.shard_collectives import Wire, reduce_from


def is_conv1d(m: nn.Module) -> bool:
    """Hugging Face's ``transformers.pytorch_utils.Conv1D`` (detected without importing it)."""
    return type(m).__name__ == "Conv1D" and type(m).__module__.startswith("transformers")


def is_projection(m: nn.Module) -> bool:
    return isinstance(m, nn.Linear) or is_conv1d(m)


def out_features(m: nn.Module) -> int:
    return int(m.weight.shape[1] if is_conv1d(m) else m.weight.shape[0])  # type: ignore[index]


def in_features(m: nn.Module) -> int:
    return int(m.weight.shape[0] if is_conv1d(m) else m.weight.shape[1])  # type: ignore[index]


def out_dim(m: nn.Module) -> int:
    """The weight dimension that holds the output features."""
    return 1 if is_conv1d(m) else 0


def keep_outputs(m: nn.Module, rows: torch.Tensor) -> None:
    """Column-parallel: keep output features ``rows`` (weight and bias)."""
    with torch.no_grad():
        w = m.weight.index_select(out_dim(m), rows).clone()  # type: ignore[operator]
        m.weight = nn.Parameter(w)
        if m.bias is not None:
            m.bias = nn.Parameter(m.bias[rows].clone())  # type: ignore[index]
    if isinstance(m, nn.Linear):
        m.out_features = len(rows)
    else:
        m.nf = len(rows)  # type: ignore[assignment]


class RowParallel(nn.Module):
    """y = g(x_r · W_r) + b: the input-feature slice [a, b) of a Linear or Conv1D whose partial
    outputs are summed over the tensor-parallel group. ``weight``/``bias`` keep their names and
    the original layout, so state-dict keys stay the user's. x (..., in/T) -> (..., out)."""

    def __init__(self, full: nn.Module, cols: tuple[int, int], wire: Wire) -> None:
        super().__init__()
        a, b = cols
        self.conv1d = is_conv1d(full)
        w = cast(torch.Tensor, full.weight).detach()
        self.weight = nn.Parameter((w[a:b] if self.conv1d else w[:, a:b]).clone())
        bias = cast("torch.Tensor | None", full.bias)
        self.bias = nn.Parameter(bias.detach().clone()) if bias is not None else None
        self.wire = wire

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x @ self.weight if self.conv1d else F.linear(x, self.weight)
        y = reduce_from(y, self.wire)
        return y if self.bias is None else y + self.bias
