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
             by T, ``heads=ATTR+ATTR`` naming further ones (``heads=-``: none, for a forward
             that counts heads from its projections, as Llama's ``view(..., -1, head_dim)``),
             ``heads=@CHILD`` when the counts and q/k/v live in a child (BERT's
             ``attention.self``, its output projection in ``attention.output``); f applied
             once to the input of the module (or CHILD). The result is proven on T local shards
             before use, on the inputs the block receives from an example batch
             (:mod:`.tp_attention`).

A colwise layer must feed a rowwise one through elementwise operations only (an MLP's
fc → GELU → proj) or per-head ones (attention), as in Megatron-LM; the plan is the user's
promise of that. Without a plan (``tp_plan=auto``) polytrain derives one: for standard attention
blocks (:func:`.tp_attention.attention_plan`: fused or separate q/k/v, an output projection, a
head count or a head size — nanoGPT, GPT-2, BERT, Llama) and for MLP blocks, a module with
projections (c_fc, c_proj), (fc, proj), (fc1, fc2), (w1, w2), BERT's (intermediate.dense,
output.dense) or gated (gate_proj, up_proj → down_proj; w1, w3 → w2). Projections are
``nn.Linear`` or GPT-2's ``Conv1D`` (:mod:`.tp_layers`). Returns the split dimension of each
sharded parameter (for gathering).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from polytrain.errors import ConfigError
from polytrain.strategies.model.megatron import ShardDims
from polytrain.strategies.model.shard_collectives import Wire, copy_to, shard_bounds
from polytrain.strategies.model.tp_attention import (
    Inputs,
    LocalComm,
    attention_plan,
    capture_inputs,
    head_attrs,
    local_attrs,
    verify,
    width_from_input,
)
from polytrain.strategies.model.tp_layers import (
    RowParallel,
    in_features,
    is_projection,
    keep_outputs,
    out_dim,
    out_features,
)

STYLES = ("colwise", "rowwise", "qkv", "heads")
MLP_PAIRS = (("c_fc", "c_proj"), ("fc", "proj"), ("fc1", "fc2"), ("w1", "w2"),
             ("intermediate.dense", "output.dense"))
MLP_GATED = ((("gate_proj", "up_proj"), "down_proj"), (("w1", "w3"), "w2"))


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


def _mlp(name: str, m: nn.Module) -> list[tuple[str, str]] | None:
    """An MLP block's entries: a pair (c_fc → c_proj ...), gated projections (Llama's gate_proj
    and up_proj → down_proj), or BERT's siblings (intermediate.dense → output.dense)."""
    at = f"{name}." if name else ""

    def proj(path: str) -> bool:
        try:
            return is_projection(m.get_submodule(path))
        except AttributeError:
            return False

    for cols, row in MLP_GATED:
        if all(proj(c) for c in cols) and proj(row):
            return [*((at + c, "colwise") for c in cols), (at + row, "rowwise")]
    for a, b in MLP_PAIRS:
        if proj(a) and proj(b):
            return [(at + a, "colwise"), (at + b, "rowwise")]
    return None


def derive_plan(model: nn.Module) -> list[tuple[str, str]]:
    """The plan for the standard attention/MLP blocks of ``model`` (see the module doc)."""
    plan: list[tuple[str, str]] = []
    covered: list[str] = []
    for name, m in model.named_modules():
        if any(name.startswith(c + ".") for c in covered):
            continue  # inside a block already planned (BERT's attention.self)
        entries = attention_plan(name, m) or _mlp(name, m)
        if entries:
            plan += entries
            if any(s.startswith("heads") for _, s in entries):
                covered.append(name)
    return plan


def _enter(wire: Wire) -> Any:
    """Forward pre-hook applying f once to a block's input (positional, or the first tensor
    given by keyword: ``hidden_states=``)."""

    def hook(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if args:
            return (copy_to(args[0], wire), *args[1:]), kwargs
        key = next(k for k, v in kwargs.items() if isinstance(v, torch.Tensor))
        return args, {**kwargs, key: copy_to(kwargs[key], wire)}

    return hook


def _colwise(linear: nn.Module, wire: Wire, path: str, dims: ShardDims, chunks: int = 1,
             chunked: ShardDims | None = None) -> None:
    """Keep this rank's outputs of each of ``chunks`` equal output chunks (q|k|v: 3)."""
    out = out_features(linear) // chunks
    a, b = shard_bounds(out, wire.size)[wire.rank]
    rows = torch.cat([torch.arange(c * out + a, c * out + b) for c in range(chunks)])
    keep_outputs(linear, rows)
    dims[f"{path}.weight"] = out_dim(linear)
    if linear.bias is not None:
        dims[f"{path}.bias"] = 0
    if chunks > 1 and chunked is not None:
        chunked[f"{path}.weight"] = chunks
        if linear.bias is not None:
            chunked[f"{path}.bias"] = chunks


def _rowwise(parent: nn.Module, attr: str, wire: Wire, path: str, dims: ShardDims) -> None:
    linear = getattr(parent, attr)
    cols = shard_bounds(in_features(linear), wire.size)[wire.rank]
    setattr(parent, attr, RowParallel(linear, cols, wire))
    dims[f"{path}.weight"] = 1 - out_dim(linear)


def _linear(root: nn.Module, path: str, style: str, wire: Wire, dims: ShardDims,
            chunked: ShardDims, hook: bool) -> None:
    m = root.get_submodule(path)
    if not is_projection(m):
        raise ConfigError(f"tp_plan: '{path}' is a {type(m).__name__}; {style} takes "
                          "nn.Linear (or GPT-2's Conv1D) layers.")
    parent_path, _, attr = path.rpartition(".")
    if style == "rowwise":
        _rowwise(root.get_submodule(parent_path), attr, wire, path, dims)
        return
    _colwise(m, wire, path, dims, 3 if style == "qkv" else 1, chunked)
    if hook:
        m.register_forward_pre_hook(_enter(wire), with_kwargs=True)


def _heads(module: nn.Module, inner: list[tuple[str, str]], style: str, wire: Wire, mode: str,
           where: str, dims: ShardDims, chunked: ShardDims) -> None:
    """Shard attention ``module`` by its own entries ``inner`` (paths relative to it)."""
    first = next((p for p, s in inner if s in ("qkv", "colwise")), None)
    if first is None:
        raise ConfigError(f"tp_plan: '{where}:heads' needs its q/k/v projections in the plan "
                          f"('{where}.QKV:qkv' or each ':colwise').")
    q = module.get_submodule(first)
    if not is_projection(q):
        raise ConfigError(f"tp_plan: '{where}.{first}' is a {type(q).__name__}; "
                          f"{dict(inner)[first]} takes nn.Linear layers.")
    width = out_features(q) // (3 if dict(inner)[first] == "qkv" else 1)
    for path, s in inner:
        _linear(module, path, s, wire, dims, chunked, hook=False)
    attrs, _, child = style.partition("=")[2].partition("@")
    # heads@CHILD: the heads' attributes and f belong to CHILD (BERT's attention.self), so that
    # the residual its sibling adds (attention.output) is not all-reduced in backward
    target = module.get_submodule(child) if child else module
    extra = [a for a in attrs.split("+") if a and a != "-"]
    if attrs != "-":
        local_attrs(target, width, wire.size, extra, where)
    target.register_forward_pre_hook(_enter(wire), with_kwargs=True)
    if mode == "fx":
        width_from_input(target, width // wire.size)


def _prove(module: nn.Module, inner: list[tuple[str, str]], style: str, world: int,
           where: str, inputs: Inputs | None) -> str:
    """'attrs' or 'fx': the way T shards of ``module`` reproduce it (see .tp_attention), on the
    inputs it received from an example batch (``inputs``) or a random one."""
    first = next((p for p, s in inner if s in ("qkv", "colwise")), "")
    q = module.get_submodule(first) if first else None
    width = in_features(q) if q is not None and is_projection(q) else 0
    reasons = []
    for mode in ("attrs", "fx"):
        def shard(m: nn.Module, comm: LocalComm, mode: str = mode) -> None:
            _heads(m, inner, style, Wire(comm), mode, where, {}, {})
        reason = verify(module, shard, width, world, inputs)
        if reason is None:
            return mode
        reasons.append(f"{'head attributes' if mode == 'attrs' else 'traced width'}: {reason}")
    raise ConfigError(
        f"tensor: cannot split the heads of '{where}' ({type(module).__name__}) over {world} "
        f"ranks: {'; '.join(reasons)}. Give a plan that leaves it whole (--set tp_plan=... "
        "without its entries, e.g. only the MLPs), or let its forward count heads from the "
        "local projection (view(B, T, -1, head_dim)).")


def apply_plan(model: nn.Module, plan: list[tuple[str, str]], wire: Wire,
               example: Callable[[nn.Module], Any] | None = None) -> tuple[ShardDims, ShardDims]:
    """Shard ``model`` in place by ``plan``; a pattern matching nothing is refused. Returns the
    split dimension of each sharded parameter, and the chunk count of fused ones (q|k|v: 3).
    ``example(model)`` runs the model on an example batch: the inputs each attention block
    receives then are what its proof uses (rotary positions, masks)."""
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
    inputs = capture_inputs(model, [modules[h] for h in heads], example)
    proven: dict[tuple[object, ...], str] = {}
    for where, style in heads.items():
        at = where + "." if where else ""
        inner = [(p.removeprefix(at), s) for p, s in entries if p.startswith(at) and p != where]
        module = modules[where]
        key = (type(module), style, tuple(inner),
               tuple((n, tuple(p.shape)) for n, p in module.named_parameters()),
               tuple(getattr(module, a) for a in head_attrs(module)))
        if key not in proven:
            proven[key] = _prove(module, inner, style, wire.size, where, inputs.get(id(module)))
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
