"""Cut any ``nn.Module`` into an ordered list of stage modules by tracing its forward.

``--set split=PATHS`` (module paths such as ``transformer.h.2,transformer.h.4``) cuts the forward
just before each named submodule is called, as ``torch.distributed.pipelining``'s
``SplitPoint.BEGINNING`` does; ``split=auto`` offers a cut before every call of a submodule with
parameters that is a direct child of the model or of its containers (``Sequential``,
``ModuleList``, ``ModuleDict``) and lets the partitioner (``partition=auto``) choose among them.
The result is an ``nn.Sequential`` of ``torch.fx.GraphModule`` segments, each mapping ONE tensor to
ONE tensor: the form the zoo's layer lists take, so every pipeline and layer-wise strategy and the
partitioner consume it unchanged.

Tracing is ``torch.fx`` symbolic tracing with every module that is not on the way to a cut kept
whole (a leaf), so code inside blocks (nanoGPT's ``B, T, C = x.size()``, attention) is never
traced. ``torch.export`` (what ``pipelining.pipeline()`` uses) is not used: it takes 5-30 s per
model on this machine, once per rank; a forward FX cannot trace is refused with FX's reason.

Rules, each a ConfigError naming the values: a path must name a submodule (the error lists the
module paths that may be cut); a cut must carry exactly one tensor (a cut inside a residual block
carries two); a model output ``(logits, loss)`` keeps ``logits`` (the loss is the job's). Weights
tied between segments (nanoGPT's ``wte``/``lm_head``) stay one ``nn.Parameter`` shared by both
segments: in one process they are simply tied; on two pipeline stages gpipe/1f1b sum their
gradient over the stages at the flush (`polytrain.strategies.pipeline.ties`), and the strategies
that cannot (pipedream, spectrain, distbelief) refuse them before launch.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
from torch import nn

from polytrain.errors import ConfigError

CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
ROOT = "m"  # the traced wrapper's attribute holding the user's module


class _Forward(nn.Module):
    """``forward(x) = module(x)``: the traced root (other forward arguments keep defaults)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.m = module

    def forward(self, x: torch.Tensor) -> Any:
        return self.m(x)


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


def _check_paths(model: nn.Module, paths: list[str]) -> None:
    valid = cut_paths(model)
    for p in paths:
        if p not in valid:
            shown = ", ".join(valid[:120]) + (" ..." if len(valid) > 120 else "")
            raise ConfigError(
                f"split path '{p}' names no submodule of {type(model).__name__} that can start a "
                f"stage. Valid module paths: {shown}.")


def _trace(model: nn.Module, paths: list[str] | None) -> fx.GraphModule:
    root = _Forward(model)
    try:
        graph = _Tracer(paths).trace(root)
    except Exception as exc:
        raise ConfigError(
            f"split: torch.fx cannot trace {type(model).__name__}.forward ({type(exc).__name__}: "
            f"{exc}). Cut at coarser modules (their insides are not traced), or make the model "
            "an nn.Sequential of its layers.") from exc
    return fx.GraphModule(root, graph)


def _live_after(nodes: list[fx.Node], i: int) -> list[fx.Node]:
    """Values defined before position ``i`` and used at or after it (parameters excluded)."""
    later = set(nodes[i:])
    return [n for n in nodes[:i] if n.op != "get_attr" and any(u in later for u in n.users)]


def _candidates(gm: fx.GraphModule, nodes: list[fx.Node], paths: list[str] | None) -> list[int]:
    if paths is not None:
        starts = []
        for p in paths:
            hit = [i for i, n in enumerate(nodes)
                   if n.op == "call_module" and n.target == f"{ROOT}.{p}"]
            if not hit:
                raise ConfigError(f"split path '{p}' is never called by the forward, so no stage "
                                  "can start there. Name a module the forward calls.")
            starts.append(hit[0])
        return sorted(set(starts))
    out = []
    for i, n in enumerate(nodes):
        if n.op == "call_module" and any(True for _ in gm.get_submodule(str(n.target)).parameters()):
            out.append(i)
    return out


def _segment(gm: fx.GraphModule, nodes: list[fx.Node], start: int, end: int,
             source: fx.Node, sink: fx.Node | None) -> fx.GraphModule:
    """Nodes [start, end) as a module ``source -> sink`` (the model's output when sink is None)."""
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    env[source] = g.placeholder("x")
    for n in nodes[start:end]:
        env[n] = g.node_copy(n, lambda a: env[a])
    if sink is None:
        (out,) = nodes[-1].args  # the output node's value: a tensor, tuple or dict
        value = out[0] if isinstance(out, (tuple, list)) else (
            out.get("logits") if isinstance(out, dict) else out)
        g.output(env[value] if isinstance(value, fx.Node) else value)
    else:
        g.output(env[sink])
    return fx.GraphModule(gm, g)


def split_model(model: nn.Module, split: str) -> nn.Sequential:
    """``model`` as an ``nn.Sequential`` of traced segments cut at ``split`` (see the module doc)."""
    paths = None if split.strip() == "auto" else [p.strip() for p in split.split(",") if p.strip()]
    if paths is not None:
        if not paths:
            raise ConfigError("split= needs module paths (e.g. split=layer2,layer3) or 'auto'.")
        _check_paths(model, paths)
    gm = _trace(model, paths)
    nodes = [n for n in gm.graph.nodes]
    body = [n for n in nodes if n.op != "placeholder"]
    (inp,) = [n for n in nodes if n.op == "placeholder"]
    cuts = []
    for i in _candidates(gm, body, paths):
        live = _live_after([inp, *body], i + 1)
        if len(live) == 1 and live[0] is not inp:
            if i > 0 and i not in cuts:
                cuts.append(i)
        elif paths is not None:
            names = ", ".join(str(n.target).removeprefix(ROOT + ".") for n in live)
            raise ConfigError(
                f"split at '{body[i].target.removeprefix(ROOT + '.')}' would carry {len(live)} "  # type: ignore[union-attr]
                f"values between stages ({names}); a cut must carry exactly one tensor. Cut "
                "before or after the block that needs them.")
    bounds = list(zip([0, *cuts], [*cuts, len(body) - 1], strict=True))
    carried = [inp, *(_live_after([inp, *body], c + 1)[0] for c in cuts)]
    segments = [_segment(gm, body, a, b, carried[k], carried[k + 1] if k < len(cuts) else None)
                for k, (a, b) in enumerate(bounds)]
    return nn.Sequential(*segments)

