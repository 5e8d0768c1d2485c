"""Tensor parallelism of any model's ``nn.Linear`` layers by a plan, as DTensor's
``parallelize_module`` takes one (``ColwiseParallel`` / ``RowwiseParallel``).

``--set tp_plan="transformer.h.*.mlp.c_fc:colwise,transformer.h.*.mlp.c_proj:rowwise"``: module
paths (``fnmatch`` patterns) to a style. Rank r of T keeps

    colwise  output rows [r·O/T, (r+1)·O/T) of the weight and bias; its input passes f (identity
             forward, all-reduce of the gradient backward);
    qkv      the same of each third of a fused q|k|v projection (O = 3·width);
    rowwise  input columns [r·I/T, (r+1)·I/T); the partial outputs are summed (g: all-reduce
             forward), the bias added once after the sum;
    heads    (on an attention module, not a Linear) its head counts and width attributes divided
             by T, ``heads=ATTR+ATTR`` naming further ones; f applied once to its input. The
             result is proven on T local shards before use (:mod:`.tp_attention`).

A colwise layer must feed a rowwise one through elementwise operations only (an MLP's
fc → GELU → proj) or per-head ones (attention), as in Megatron-LM; the plan is the user's
promise of that. Without a plan (``tp_plan=auto``) polytrain derives one: for standard attention
blocks (:func:`.tp_attention.attention_plan`: fused or separate q/k/v, an output projection, a
head count) and for MLP blocks, a module with Linear children (c_fc, c_proj), (fc, proj),
(fc1, fc2) or (w1, w2). Returns the split dimension of each sharded parameter (for gathering).
"""

from __future__ import annotations

import fnmatch

import torch
from torch import nn

from polytrain.errors import ConfigError
from polytrain.strategies.model.megatron import RowParallelLinear, ShardDims, _enter
from polytrain.strategies.model.shard_collectives import Wire, shard_bounds
from polytrain.strategies.model.tp_attention import (
    LocalComm,
    attention_plan,
    head_attrs,
    local_attrs,
    verify,
    width_from_input,
)

STYLES = ("colwise", "rowwise", "qkv", "heads")
MLP_PAIRS = (("c_fc", "c_proj"), ("fc", "proj"), ("fc1", "fc2"), ("w1", "w2"))


def parse_plan(text: str) -> list[tuple[str, str]]:
    """``"pattern:style,..."`` -> [(pattern, style)], or a ConfigError naming the rule."""
    plan = []
    for item in (p.strip() for p in text.split(",") if p.strip()):
        pattern, sep, style = item.rpartition(":")
        if not sep or style.partition("=")[0] not in STYLES:
            raise ConfigError(f"tp_plan entry '{item}': write MODULE_PATTERN:STYLE with STYLE one "
                              f"of {', '.join(STYLES)} (heads=ATTR+ATTR), e.g. "
                              "tp_plan=h.*.mlp.c_fc:colwise.")
        plan.append((pattern, style))
    return plan


def derive_plan(model: nn.Module) -> list[tuple[str, str]]:
    """The plan for the standard attention/MLP blocks of ``model`` (see the module doc)."""
    plan = []
    for name, m in model.named_modules():
        attention = attention_plan(name, m)
        if attention is not None:
            plan += attention
            continue
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


def _linear(root: nn.Module, path: str, style: str, wire: Wire, dims: ShardDims,
            chunked: ShardDims, hook: bool) -> None:
    m = root.get_submodule(path)
    if not isinstance(m, nn.Linear):
        raise ConfigError(f"tp_plan: '{path}' is a {type(m).__name__}; {style} takes "
                          "nn.Linear layers.")
    parent_path, _, attr = path.rpartition(".")
    if style == "rowwise":
        _rowwise(root.get_submodule(parent_path), attr, wire, path, dims)
        return
    _colwise(m, wire, path, dims, 3 if style == "qkv" else 1, chunked)
    if hook:
        m.register_forward_pre_hook(_enter(wire))


def _heads(module: nn.Module, inner: list[tuple[str, str]], style: str, wire: Wire, mode: str,
           where: str, dims: ShardDims, chunked: ShardDims) -> None:
    """Shard attention ``module`` by its own entries ``inner`` (paths relative to it)."""
    first = next((p for p, s in inner if s in ("qkv", "colwise")), None)
    if first is None:
        raise ConfigError(f"tp_plan: '{where}:heads' needs its q/k/v projections in the plan "
                          f"('{where}.QKV:qkv' or each ':colwise').")
    q = module.get_submodule(first)
    if not isinstance(q, nn.Linear):
        raise ConfigError(f"tp_plan: '{where}.{first}' is a {type(q).__name__}; "
                          f"{dict(inner)[first]} takes nn.Linear layers.")
    width = q.out_features // (3 if dict(inner)[first] == "qkv" else 1)
    for path, s in inner:
        _linear(module, path, s, wire, dims, chunked, hook=False)
    extra = [a for a in style.partition("=")[2].split("+") if a]
    local_attrs(module, width, wire.size, extra, where)
    module.register_forward_pre_hook(_enter(wire))
    if mode == "fx":
        width_from_input(module, width // wire.size)


def _prove(module: nn.Module, inner: list[tuple[str, str]], style: str, world: int,
           where: str) -> str:
    """'attrs' or 'fx': the way T shards of ``module`` reproduce it (see .tp_attention)."""
    first = next((p for p, s in inner if s in ("qkv", "colwise")), "")
    q = module.get_submodule(first) if first else None
    width = q.in_features if isinstance(q, nn.Linear) else 0
    reasons = []
    for mode in ("attrs", "fx"):
        def shard(m: nn.Module, comm: LocalComm, mode: str = mode) -> None:
            _heads(m, inner, style, Wire(comm), mode, where, {}, {})
        reason = verify(module, shard, width, world)
        if reason is None:
            return mode
        reasons.append(f"{'head attributes' if mode == 'attrs' else 'traced width'}: {reason}")
    raise ConfigError(
        f"tensor: cannot split the heads of '{where}' ({type(module).__name__}) over {world} "
        f"ranks: {'; '.join(reasons)}. Give a plan that leaves it whole (--set tp_plan=... "
        "without its entries, e.g. only the MLPs), or let its forward count heads from the "
        "local projection (view(B, T, -1, head_dim)).")


def apply_plan(model: nn.Module, plan: list[tuple[str, str]], wire: Wire
               ) -> tuple[ShardDims, ShardDims]:
    """Shard ``model`` in place by ``plan``; a pattern matching nothing is refused. Returns the
    split dimension of each sharded parameter, and the chunk count of fused ones (q|k|v: 3)."""
    dims: ShardDims = {}
    chunked: ShardDims = {}
    modules = dict(model.named_modules())
    entries: list[tuple[str, str]] = []
    for pattern, style in plan:
        hits = [n for n in modules if fnmatch.fnmatchcase(n, pattern)]
        if not hits:
            shown = ", ".join(n for n, m in modules.items() if isinstance(m, nn.Linear))[:600]
            raise ConfigError(f"tp_plan pattern '{pattern}' matches no module. Linear layers: "
                              f"{shown}.")
        entries += [(h, style) for h in hits]
    heads = {p: s for p, s in entries if s.startswith("heads")}
    proven: dict[tuple[object, ...], str] = {}
    for where, style in heads.items():
        at = where + "." if where else ""
        inner = [(p.removeprefix(at), s) for p, s in entries if p.startswith(at) and p != where]
        module = modules[where]
        key = (type(module), style, tuple(inner),
               tuple((n, tuple(p.shape)) for n, p in module.named_parameters()),
               tuple(getattr(module, a) for a in head_attrs(module)))
        if key not in proven:
            proven[key] = _prove(module, inner, style, wire.size, where)
        sub_dims: ShardDims = {}
        sub_chunked: ShardDims = {}
        _heads(module, inner, style, wire, proven[key], where, sub_dims, sub_chunked)
        dims.update({at + k: v for k, v in sub_dims.items()})
        chunked.update({at + k: v for k, v in sub_chunked.items()})
    for path, style in entries:
        if style.startswith("heads") or any(path.startswith(h + ".") for h in heads):
            continue
        _linear(model, path, style, wire, dims, chunked, hook=True)
    if not dims:
        raise ConfigError("tp_plan: nothing to shard. Give --set tp_plan=PATTERN:colwise,"
                          "PATTERN:rowwise for your model's Linear layers.")
    return dims, chunked


def unchunk(full: torch.Tensor, ranks: int, chunks: int) -> torch.Tensor:
    """Rank-major [r0: q|k|v, r1: q|k|v, ...] (dim 0, as gathered) -> [q | k | v] of all ranks."""
    parts = [blk.chunk(chunks, dim=0) for blk in full.chunk(ranks, dim=0)]
    return torch.cat([parts[r][c] for c in range(chunks) for r in range(ranks)], dim=0)
