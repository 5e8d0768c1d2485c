"""Cut any ``nn.Module`` into an ordered list of stage modules by tracing its forward.

``--set split=PATHS`` (module paths such as ``transformer.h.2,transformer.h.4``) cuts the forward
just before each named submodule is called, as ``torch.distributed.pipelining``'s
``SplitPoint.BEGINNING`` does; ``split=auto`` offers a cut before every call of a submodule with
parameters that is a direct child of the model or of its containers (``Sequential``,
``ModuleList``, ``ModuleDict``) and lets the partitioner (``partition=auto``) choose among them.
The result is an ``nn.Sequential`` of ``torch.fx.GraphModule`` segments, each mapping ONE tensor to
ONE tensor: the form the zoo's layer lists take, so every pipeline and layer-wise strategy and the
partitioner consume it unchanged.

Tracing tries ``torch.export`` first (what ``pipelining.pipeline()`` uses; one ATen graph of the
whole forward, batch dimension dynamic, :mod:`polytrain.models.trace_export`) when an example
input is given, and accepts it only if the cut model computes what the module does (eval mode,
the example batch); otherwise it falls back to ``torch.fx`` symbolic tracing with every module
that is not on the way to a cut kept whole (a leaf), so code inside blocks (nanoGPT's
``B, T, C = x.size()``, attention) is never traced. The returned Sequential's ``tracer`` says
which one made it (``torch.export`` or ``torch.fx``; ``tracer_fallback`` why export was not
used), and runs record it in their strategy metrics. A forward neither can trace is refused
naming the module, both reasons and what to cut at instead.

Rules, each a ConfigError naming the values: a path must name a submodule (the error lists the
module paths that may be cut); a cut carries one tensor, or (exported graphs) several of one
floating dtype with the batch first, packed into one ``(B, total)`` tensor (:func:`pack`; a cut
inside a residual block carries the block's input and the branch's activation); a model output
``(logits, loss)`` keeps ``logits`` (the loss is the job's). Weights
tied between segments (nanoGPT's ``wte``/``lm_head``) stay one ``nn.Parameter`` shared by both
segments: in one process they are simply tied; on two pipeline stages gpipe/1f1b sum their
gradient over the stages at the flush (`polytrain.strategies.pipeline.ties`), and the strategies
that cannot (pipedream, spectrain, distbelief) refuse them before launch.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from polytrain.errors import ConfigError
from polytrain.models.call import ModelCall

CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
ROOT = "m"  # the traced wrapper's attribute holding the user's module


class Forward(nn.Module):
    """The traced root: ``forward(x)`` calls the module by its model-call contract
    (:meth:`polytrain.models.call.ModelCall.logits`: nanoGPT with placeholder targets so that it
    returns every position's logits, a Hugging Face model with ``input_ids``) and returns the
    logits alone; what only the dropped loss needed is removed from the graph."""

    def __init__(self, module: nn.Module, tokens: bool = True) -> None:
        super().__init__()
        self.m = module
        self.__dict__["contract"] = ModelCall.of(module)
        self.tokens = tokens

    def forward(self, x: torch.Tensor) -> Any:
        contract: ModelCall = self.__dict__["contract"]
        return contract.logits(self.m, x, self.tokens)


class _Tracer(fx.Tracer):
    """Traces through the root, the containers and the ancestors of cut paths only."""

    def __init__(self, paths: list[str] | None) -> None:
        super().__init__()
        self.paths = paths

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        if qualname == ROOT:
            return False
        path = qualname.removeprefix(ROOT + ".")
        if self.paths is None:
            return not isinstance(m, CONTAINERS)
        return not any(p.startswith(path + ".") for p in self.paths)


def cut_paths(model: nn.Module) -> list[str]:
    """Module paths ``split=`` may name (submodules; ModuleList/ModuleDict are never called)."""
    lists = (nn.ModuleList, nn.ModuleDict)
    return [n for n, m in model.named_modules() if n and not isinstance(m, lists)]


def check_paths(model: nn.Module, paths: list[str]) -> None:
    valid = cut_paths(model)
    for p in paths:
        if p not in valid:
            shown = ", ".join(valid[:120]) + (" ..." if len(valid) > 120 else "")
            raise ConfigError(
                f"split path '{p}' names no submodule of {type(model).__name__} that can start a "
                f"stage. Valid module paths: {shown}.")


class TraceFailed(Exception):
    """A tracer could not trace the forward (the message says why)."""


def trace_graph(model: nn.Module, paths: list[str] | None, tokens: bool = True) -> fx.GraphModule:
    root = Forward(model, tokens)
    try:
        graph = _Tracer(paths).trace(root)
    except Exception as exc:
        raise TraceFailed(f"{type(exc).__name__}: {first_line(exc)}") from exc
    gm = fx.GraphModule(root, graph)
    gm.graph.eliminate_dead_code()  # e.g. the loss a targets model computed from placeholder targets
    gm.recompile()
    return gm


def _where(n: fx.Node) -> str:
    """A node as a user reads it: the module path it runs in (FX: its target; an exported graph:
    the innermost module on its ``nn_module_stack``), else its name."""
    if n.op == "call_module":
        return str(n.target).removeprefix(ROOT + ".")
    stack = n.meta.get("nn_module_stack")
    if stack:
        path = str(list(stack.values())[-1][0])
        return path.removeprefix("L['self'].").removeprefix(ROOT + ".") or n.name
    return n.name


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else ""


def _free(n: fx.Node) -> bool:
    """Values a segment makes itself: parameters, and values computed from no input (arange)."""
    return n.op == "get_attr" or (n.op == "call_function" and not n.all_input_nodes)


def _sym_dim(tensor: fx.Node, sym: fx.Node) -> int | None:
    """The dimension of ``tensor`` whose symbolic size is ``sym`` (exported graphs), or None."""
    t, v = tensor.meta.get("val"), sym.meta.get("val")
    if not isinstance(v, torch.SymInt) or not isinstance(t, torch.Tensor):
        return None
    return next((d for d, n in enumerate(t.shape) if isinstance(n, torch.SymInt)
                 and str(n) == str(v)), None)


def _live_after(nodes: list[fx.Node], i: int) -> list[fx.Node]:
    """Values defined before position ``i`` and used at or after it (free values excluded)."""
    later = set(nodes[i:])
    return [n for n in nodes[:i] if not _free(n) and any(u in later for u in n.users)]


def _carried(live: list[fx.Node]) -> list[fx.Node] | None:
    """The tensors a cut with ``live`` values carries, or None when it cannot: one tensor, or
    several packed into one (see :func:`pack`); symbolic sizes they carry are recomputed."""
    tensors = [n for n in live if not isinstance(n.meta.get("val"), torch.SymInt)]
    syms = [n for n in live if n not in tensors]
    if not tensors or (len(tensors) > 1 and not _packable(tensors)):
        return None
    if any(all(_sym_dim(t, s) is None for t in tensors) for s in syms):
        return None
    return tensors


def _packable(tensors: list[fx.Node]) -> bool:
    """Several values can cross a cut as one tensor when they share a floating dtype and the batch
    dimension (dim 0, the same symbol) and their other dimensions are fixed (exported graphs)."""
    vals = [t.meta.get("val") for t in tensors]
    if not all(isinstance(v, torch.Tensor) and v.dim() >= 1 for v in vals):
        return False
    first = vals[0]
    return all(v.dtype == first.dtype and v.dtype.is_floating_point  # type: ignore[union-attr]
               and isinstance(v.shape[0], torch.SymInt) and str(v.shape[0]) == str(first.shape[0])  # type: ignore[union-attr]
               and all(isinstance(d, int) for d in v.shape[1:]) for v in vals)  # type: ignore[union-attr]


def pack(values: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """(B, ...) tensors as one (B, total) tensor: what crosses a cut that carries several values."""
    return torch.cat([v.reshape(v.shape[0], -1) for v in values], dim=1)


def unpack(x: torch.Tensor, shapes: tuple[tuple[int, ...], ...]) -> tuple[torch.Tensor, ...]:
    sizes = [math.prod(s) for s in shapes]
    return tuple(p.reshape(x.shape[0], *s) for p, s in zip(x.split(sizes, dim=1), shapes, strict=True))


def _calls(gm: fx.GraphModule, nodes: list[fx.Node], paths: list[str] | None
           ) -> dict[str, int]:
    """Module path -> index of the node that starts its first call (FX: ``call_module`` nodes;
    exported graphs: the first node under it in ``nn_module_stack``). Without ``paths``: the
    modules with parameters that ``split=auto`` may cut before."""
    starts: dict[str, int] = {}
    for i, n in enumerate(nodes):
        if n.op == "call_module" and str(n.target).startswith(ROOT + "."):
            path = str(n.target).removeprefix(ROOT + ".")
            if paths is not None or any(True for _ in gm.get_submodule(str(n.target)).parameters()):
                starts.setdefault(path, i)
        for name, _cls in (n.meta.get("nn_module_stack") or {}).values():
            if str(name).startswith(ROOT + "."):
                starts.setdefault(str(name).removeprefix(ROOT + "."), i)
    return starts


def _candidates(gm: fx.GraphModule, nodes: list[fx.Node], paths: list[str] | None,
                offered: list[str]) -> list[int]:
    starts = _calls(gm, nodes, paths)
    if paths is not None:
        missing = [p for p in paths if p not in starts]
        if missing:
            raise ConfigError(f"split path '{missing[0]}' is never called by the forward, so no "
                              "stage can start there. Name a module the forward calls.")
        return sorted({starts[p] for p in paths})
    return sorted({i for p, i in starts.items() if p in offered})


def _holds_stack(module: nn.Module) -> bool:
    """True when a list of two or more blocks lies inside ``module`` (a transformer's
    ``transformer.h``, ``model.layers``, ``bert.encoder.layer``)."""
    return any(isinstance(m, nn.ModuleList) and len(m) > 1 for m in module.modules())


def auto_paths(model: nn.Module) -> list[str]:
    """The cuts ``split=auto`` offers: children with parameters of the model and of its
    containers, and inside a child that holds a stack of blocks (Hugging Face's ``GPT2Model``,
    ``LlamaModel``, ``BertEncoder``) that child's own children, down to each block."""
    out = []

    def walk(module: nn.Module, prefix: str) -> None:
        for name, child in module.named_children():
            if isinstance(child, CONTAINERS) or _holds_stack(child):
                walk(child, f"{prefix}{name}.")
            elif any(True for _ in child.parameters()):
                out.append(prefix + name)

    walk(model, "")
    return out


class _Resolver:
    """Copies nodes into a segment graph, making free values (parameters, sizes, constants)
    where a node needs them."""

    def __init__(self, g: fx.Graph, sources: list[fx.Node], modal: Any) -> None:
        self.g, self.source, self.modal = g, sources[0], modal
        self.user: fx.Node | None = None
        self.x = g.placeholder("x")
        if len(sources) == 1:
            self.env = {sources[0]: self.x}
        else:  # several values packed into one tensor by the previous segment
            shapes = tuple(tuple(int(d) for d in s.meta["val"].shape[1:]) for s in sources)
            parts = g.call_function(unpack, (self.x, shapes))
            self.env = {s: g.call_function(operator.getitem, (parts, k))
                        for k, s in enumerate(sources)}

    def __call__(self, a: fx.Node) -> fx.Node:
        if a in self.env:
            return self.env[a]
        d = _sym_dim(self.source, a)
        if a.op == "get_attr" and self.modal is not None:
            self.env[a] = self.g.get_attr(self.modal.name_for(a, self.user))
        elif _free(a):
            self.env[a] = (self.modal.copy(self.g, a, self) if self.modal is not None
                           else self.g.node_copy(a, self))
        elif d is not None:
            self.env[a] = self.g.call_function(torch.ops.aten.sym_size.int, (self.env[self.source], d))
        else:
            raise KeyError(a.name)
        return self.env[a]

    def copy(self, n: fx.Node) -> None:
        self.user = n
        self.env[n] = (self.modal.copy(self.g, n, self) if self.modal is not None
                       else self.g.node_copy(n, self))


def _segment(gm: fx.GraphModule, nodes: list[fx.Node], start: int, end: int,
             sources: list[fx.Node], sinks: list[fx.Node] | None, modal: Any) -> fx.GraphModule:
    """Nodes [start, end) as a module ``sources -> sinks`` (several: packed into one tensor; the
    model's output when sinks is None)."""
    g = fx.Graph()
    r = _Resolver(g, sources, modal)
    for n in nodes[start:end]:
        if not _free(n):
            r.copy(n)
    if sinks is None:
        (out,) = nodes[-1].args  # the output node's value: a tensor, tuple or dict
        if modal is not None:
            out = modal.unflatten(out)
        value = out[0] if isinstance(out, (tuple, list)) else (
            out.get("logits") if isinstance(out, dict) else out)
        g.output(r(value) if isinstance(value, fx.Node) else value)
    elif len(sinks) == 1:
        g.output(r(sinks[0]))
    else:
        g.output(g.call_function(pack, (tuple(r(s) for s in sinks),)))
    return fx.GraphModule(modal.attributes(g) if modal is not None else gm, g)


def cut_graph(gm: fx.GraphModule, model: nn.Module, paths: list[str] | None, modal: Any = None
         ) -> nn.Sequential:
    nodes = [n for n in gm.graph.nodes if n.op != "call_module" or n.target != "_guards_fn"]
    body = [n for n in nodes if n.op != "placeholder"]
    (inp,) = [n for n in nodes if n.op == "placeholder"]
    cuts: list[int] = []
    carried: list[list[fx.Node]] = [[inp]]
    for i in _candidates(gm, body, paths, auto_paths(model) if paths is None else []):
        live = _live_after([inp, *body], i + 1)
        values = _carried(live)
        if values is not None and values != [inp]:
            if i > 0 and i not in cuts:
                cuts.append(i)
                carried.append(values)
        elif values is None and paths is not None:
            names = ", ".join(_where(n) for n in live)
            raise ConfigError(
                f"split at '{_where(body[i])}' would carry {len(live)} "
                f"values between stages ({names}); a cut must carry one tensor, or several of "
                "one floating dtype with the batch first (packed; needs torch.export). Cut "
                "before or after the block that needs them.")
    bounds = list(zip([0, *cuts], [*cuts, len(body) - 1], strict=True))
    return nn.Sequential(*(
        _segment(gm, body, a, b, carried[k], carried[k + 1] if k < len(cuts) else None, modal)
        for k, (a, b) in enumerate(bounds)))
