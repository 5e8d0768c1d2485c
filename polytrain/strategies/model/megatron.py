"""Megatron-LM tensor parallelism of `gpt-mini` blocks (Shoeybi et al. 2019, §3).

Rank r of a T-rank tensor group keeps, in every block (D = d_model, h heads of size hd):

    attention  q, k, v: rows [r·D/T, (r+1)·D/T) — whole heads r·h/T … (r+1)·h/T − 1, so the
               unchanged CausalSelfAttention runs on its h/T heads (it counts heads from q's rows)
               proj:    columns of the same range; bias kept whole, added once after the sum
    MLP        fc:      rows [r·4D/T, (r+1)·4D/T) and that slice of the bias (column-parallel)
               proj:    those columns (row-parallel); bias kept whole, added after the sum

Embedding, LayerNorms and the LM head stay replicated: every rank computes them on the same
input, so their gradients agree without communication. Per block and per step:

    x ─ ln ─ f ─ [local heads / local MLP slice] ─ g ─ + bias ─ + x
              ↑ backward: all-reduce d(ln out)      ↑ forward: all-reduce partial sums

two all-reduces forward (g) and two backward (f): four per layer, as the paper counts.
Parameter names do not change (``block1.attn.q.weight``), only their shapes; :data:`ShardDims`
records along which dimension each one is split so the full model can be gathered back.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from polytrain.errors import ConfigError
from polytrain.models.gpt import CausalSelfAttention, Mlp
from polytrain.strategies.model.shard_collectives import Wire, copy_to, reduce_from, shard_bounds

ShardDims = dict[str, int]


class RowParallelLinear(nn.Module):
    """y = g(x_r · W_rᵀ) + b: a column slice of a Linear whose partial outputs are summed.

    Attributes are named ``weight`` and ``bias`` like nn.Linear's, so state_dict keys stay the same.
    x (..., in/T) -> (..., out).
    """

    def __init__(self, full: nn.Linear, cols: tuple[int, int], wire: Wire) -> None:
        super().__init__()
        a, b = cols
        self.weight = nn.Parameter(full.weight.detach()[:, a:b].clone())
        self.bias = nn.Parameter(full.bias.detach().clone()) if full.bias is not None else None
        self.wire = wire

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = reduce_from(F.linear(x, self.weight), self.wire)
        return y if self.bias is None else y + self.bias


def _keep_rows(linear: nn.Linear, rows: tuple[int, int]) -> None:
    """Column-parallel: keep output rows [a, b) of ``linear`` (weight and bias)."""
    a, b = rows
    with torch.no_grad():
        linear.weight = nn.Parameter(linear.weight[a:b].clone())
        if linear.bias is not None:
            linear.bias = nn.Parameter(linear.bias[a:b].clone())
    linear.out_features = b - a


def _enter(wire: Wire) -> Any:
    """Forward pre-hook applying f once to a sub-block's input (not once per q/k/v)."""

    def hook(_module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return (copy_to(args[0], wire), *args[1:])

    return hook


def shard_attention(attn: CausalSelfAttention, wire: Wire, prefix: str, dims: ShardDims) -> None:
    d_model = attn.q.in_features
    heads = attn.q.out_features // attn.head_dim
    if heads % wire.size:
        raise ConfigError(
            f"Tensor parallelism splits attention heads over {wire.size} ranks, but {prefix} has "
            f"{heads} heads. Rule: n_head must be a multiple of the tensor-parallel degree. "
            f"Fix: --set model.n_head={wire.size * max(1, heads // wire.size)} or fewer ranks."
        )
    a, b = shard_bounds(d_model, wire.size)[wire.rank]
    for name in ("q", "k", "v"):
        _keep_rows(getattr(attn, name), (a, b))
        dims[f"{prefix}.{name}.weight"] = 0
        dims[f"{prefix}.{name}.bias"] = 0
    attn.proj = RowParallelLinear(attn.proj, (a, b), wire)  # type: ignore[assignment]
    dims[f"{prefix}.proj.weight"] = 1
    attn.register_forward_pre_hook(_enter(wire))


def shard_mlp(mlp: Mlp, wire: Wire, prefix: str, dims: ShardDims) -> None:
    width = mlp.fc.out_features
    rows = shard_bounds(width, wire.size)[wire.rank]
    _keep_rows(mlp.fc, rows)
    dims[f"{prefix}.fc.weight"] = 0
    dims[f"{prefix}.fc.bias"] = 0
    mlp.proj = RowParallelLinear(mlp.proj, rows, wire)  # type: ignore[assignment]
    dims[f"{prefix}.proj.weight"] = 1
    mlp.register_forward_pre_hook(_enter(wire))


def shard_transformer(model: nn.Module, wire: Wire) -> ShardDims:
    """Shard every gpt attention and MLP of ``model`` in place; returns the split dimension of
    each sharded parameter. A model without any is refused."""
    dims: ShardDims = {}
    for name, module in list(model.named_modules()):
        if isinstance(module, CausalSelfAttention):
            shard_attention(module, wire, name, dims)
        elif isinstance(module, Mlp):
            shard_mlp(module, wire, name, dims)
    if not dims:
        raise ConfigError(
            "Tensor parallelism found no transformer block to split: it splits the attention "
            "(polytrain.models.gpt.CausalSelfAttention) and MLP (gpt.Mlp) modules. "
            "Fix: use --model gpt-mini, or build your model from polytrain.models.gpt.Block."
        )
    return dims


def check_heads(model_options: dict[str, Any], degree: int, strategy: str) -> None:
    """Refuse a gpt-mini whose heads do not split over ``degree`` ranks (before any process)."""
    from polytrain.models.gpt import GptOptions

    try:
        heads = GptOptions(**model_options).n_head
    except ValueError:  # invalid options: the model registry reports them itself
        return
    if heads % degree:
        raise ConfigError(
            f"Strategy '{strategy}' splits gpt-mini's {heads} attention heads over {degree} "
            f"tensor-parallel ranks. Rule: n_head must be a multiple of the degree. Fix: "
            f"--set model.n_head={degree * max(1, heads // degree)}, or a degree dividing {heads}."
        )
