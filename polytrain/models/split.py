"""A user's model cut into pipeline stages: ``torch.export`` first (when an example batch is
given, :mod:`polytrain.models.trace_export`), ``torch.fx`` next (:mod:`polytrain.models.trace`),
the reason of a failed first attempt kept on the result."""

from __future__ import annotations

import torch
from torch import nn

from polytrain.errors import ConfigError
from polytrain.models.call import ModelCall, token_inputs
from polytrain.models.trace import TraceFailed, check_paths, cut_graph, first_line, trace_graph
from polytrain.models.trace_export import split_exported


def split_model(model: nn.Module, split: str, example: torch.Tensor | None = None
                ) -> nn.Sequential:
    """``model`` as an ``nn.Sequential`` of traced segments cut at ``split`` (see the module doc);
    ``example`` (a batch of inputs) lets ``torch.export`` try first."""
    paths = None if split.strip() == "auto" else [p.strip() for p in split.split(",") if p.strip()]
    if paths is not None:
        if not paths:
            raise ConfigError("split= needs module paths (e.g. split=layer2,layer3) or 'auto'.")
        check_paths(model, paths)
    fallback = None
    if example is not None:
        try:
            return _tag(split_exported(model, paths, example), "torch.export", None, model)
        except Exception as exc:  # any failure of export or of its cut: FX next, reason kept
            fallback = f"torch.export: {type(exc).__name__}: {first_line(exc)}"
    try:
        gm = trace_graph(model, paths, token_inputs(example))
    except TraceFailed as exc:
        kids = ", ".join(n for n, _ in model.named_children()) or "none"
        raise ConfigError(
            f"split: cannot trace {type(model).__name__}.forward: "
            f"{fallback + '; ' if fallback else ''}torch.fx: {exc}. Cut at its named children "
            f"(split=PATHS among: {kids}; their insides are not traced), or make the model an "
            "nn.Sequential of its layers.") from exc
    return _tag(cut_graph(gm, model, paths), "torch.fx", fallback, model)


def _tag(seq: nn.Sequential, tracer: str, fallback: str | None, model: nn.Module) -> nn.Sequential:
    seq.tracer = tracer  # type: ignore[assignment]
    seq.tracer_fallback = fallback  # type: ignore[assignment]
    seq.__dict__["model_call"] = ModelCall.of(model)  # how the traced root called the module
    # the module's own state-dict keys: a segment may hold a non-persistent buffer of the module
    # (BERT's position_ids) as a persistent one, which model.pt leaves out
    seq.__dict__["user_keys"] = tuple(model.state_dict().keys())
    return seq
