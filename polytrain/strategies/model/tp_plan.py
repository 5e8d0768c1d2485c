"""Tensor parallelism of any model's ``nn.Linear`` layers by a plan, as DTensor's
``parallelize_module`` takes one (``ColwiseParallel`` / ``RowwiseParallel``).

``--set tp_plan="transformer.h.*.mlp.c_fc:colwise,transformer.h.*.mlp.c_proj:rowwise"``: module
paths (``fnmatch`` patterns) to a style. Rank r of T keeps

    colwise  output rows [r·O/T, (r+1)·O/T) of the weight and bias; its input passes f (identity
             forward, all-reduce of the gradient backward);
    rowwise  input columns [r·I/T, (r+1)·I/T); the partial outputs are summed (g: all-reduce
             forward), the bias added once after the sum;

A colwise layer must feed a rowwise one through elementwise operations only (an MLP's
fc → GELU → proj), as in Megatron-LM; the plan is the user's promise of that. Without a plan
(``tp_plan=auto``) polytrain derives one for standard MLP blocks: a module with Linear children
(c_fc, c_proj), (fc, proj), (fc1, fc2) or (w1, w2). Attention is not derived: nanoGPT's attention
takes its head size from the input width (``C // n_head``), so its heads cannot be split without
changing its code (gpt-mini's are, by :mod:`polytrain.strategies.model.megatron`). Returns the
split dimension of each sharded parameter (for gathering).
"""

from __future__ import annotations

import fnmatch

import torch
from torch import nn

from polytrain.errors import ConfigError
from polytrain.strategies.model.megatron import RowParallelLinear, ShardDims, _enter
from polytrain.strategies.model.shard_collectives import Wire, shard_bounds

STYLES = ("colwise", "rowwise")
MLP_PAIRS = (("c_fc", "c_proj"), ("fc", "proj"), ("fc1", "fc2"), ("w1", "w2"))


def parse_plan(text: str) -> list[tuple[str, str]]:
    """``"pattern:style,..."`` -> [(pattern, style)], or a ConfigError naming the rule."""
    plan = []
    for item in (p.strip() for p in text.split(",") if p.strip()):
        pattern, sep, style = item.rpartition(":")
        if not sep or style not in STYLES:
            raise ConfigError(f"tp_plan entry '{item}': write MODULE_PATTERN:STYLE with STYLE one "
                              f"of {', '.join(STYLES)}, e.g. tp_plan=h.*.mlp.c_fc:colwise.")
        plan.append((pattern, style))
    return plan


def derive_plan(model: nn.Module) -> list[tuple[str, str]]:
    """The plan for the standard attention/MLP blocks of ``model`` (see the module doc)."""
    plan = []
    for name, m in model.named_modules():
        kids = dict(m.named_children())
        for a, b in MLP_PAIRS:
            if isinstance(kids.get(a), nn.Linear) and isinstance(kids.get(b), nn.Linear):
                plan += [(f"{name}.{a}" if name else a, "colwise"),
                         (f"{name}.{b}" if name else b, "rowwise")]
                break
    return plan


def _colwise(linear: nn.Linear, wire: Wire, path: str, dims: ShardDims, chunks: int = 1,
             chunked: ShardDims | None = None) -> None:
    """Keep this rank's rows of each of ``chunks`` equal output chunks (q|k|v: 3)."""
    out = linear.out_features // chunks
    a, b = shard_bounds(out, wire.size)[wire.rank]
    rows = torch.cat([torch.arange(c * out + a, c * out + b) for c in range(chunks)])
    with torch.no_grad():
        linear.weight = nn.Parameter(linear.weight[rows].clone())
        if linear.bias is not None:
            linear.bias = nn.Parameter(linear.bias[rows].clone())
    linear.out_features = len(rows)
    dims[f"{path}.weight"] = 0
    if linear.bias is not None:
        dims[f"{path}.bias"] = 0
    if chunks > 1 and chunked is not None:
        chunked[f"{path}.weight"] = chunks
        if linear.bias is not None:
            chunked[f"{path}.bias"] = chunks


def _rowwise(parent: nn.Module, attr: str, wire: Wire, path: str, dims: ShardDims) -> None:
    linear = getattr(parent, attr)
    cols = shard_bounds(linear.in_features, wire.size)[wire.rank]
    setattr(parent, attr, RowParallelLinear(linear, cols, wire))
    dims[f"{path}.weight"] = 1


def apply_plan(model: nn.Module, plan: list[tuple[str, str]], wire: Wire
               ) -> tuple[ShardDims, ShardDims]:
    """Shard ``model`` in place by ``plan``; a pattern matching nothing is refused. Returns the
    split dimension of each sharded parameter, and the chunk count of fused ones (none yet)."""
    dims: ShardDims = {}
    chunked: ShardDims = {}
    modules = dict(model.named_modules())
    for pattern, style in plan:
        hits = [n for n in modules if n and fnmatch.fnmatchcase(n, pattern)]
        if not hits:
            shown = ", ".join(n for n, m in modules.items() if isinstance(m, nn.Linear))[:600]
            raise ConfigError(f"tp_plan pattern '{pattern}' matches no module. Linear layers: "
                              f"{shown}.")
        for path in hits:
            m = modules[path]
            if not isinstance(m, nn.Linear):
                raise ConfigError(f"tp_plan: '{path}' is a {type(m).__name__}; {style} takes "
                                  "nn.Linear layers.")
            parent_path, _, attr = path.rpartition(".")
            if style == "colwise":
                _colwise(m, wire, path, dims)
                m.register_forward_pre_hook(_enter(wire))
            else:
                _rowwise(model.get_submodule(parent_path), attr, wire, path, dims)
    if not dims:
        raise ConfigError("tp_plan: nothing to shard. Give --set tp_plan=PATTERN:colwise,"
                          "PATTERN:rowwise for your model's Linear layers.")
    return dims, chunked


def unchunk(full: torch.Tensor, ranks: int, chunks: int) -> torch.Tensor:
    """Rank-major [r0: q|k|v, r1: q|k|v, ...] (dim 0, as gathered) -> [q | k | v] of all ranks."""
    parts = [blk.chunk(chunks, dim=0) for blk in full.chunk(ranks, dim=0)]
    return torch.cat([parts[r][c] for c in range(chunks) for r in range(ranks)], dim=0)
