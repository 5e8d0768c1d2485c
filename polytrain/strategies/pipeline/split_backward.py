"""The split backward of zero-bubble schedules: B (input gradient) now, W (weight gradient) later.

Why pieces. ``torch.autograd.grad(out, inp)`` alone gives B, but a later ``backward(out,
inputs=params)`` would run the whole chain of activation gradients again to reach the first
layer's weights: W would cost almost a full backward. So the forward is cut into pieces at the
stage's layer boundaries (the children of its ``nn.Sequential``): each piece starts from a fresh
leaf (the previous piece's output, detached, requiring grad). B walks the pieces last to first,
taking each piece's input gradient with ``autograd.grad`` (graph kept) and remembering (output,
output gradient, parameters) per piece; W then runs ``autograd.backward`` of each piece onto its
own parameters only. Work repeated between B and W is what lies inside one layer on the way to
its weights (for a Linear: nothing — its weight gradient is one product of the saved input and
the output gradient).

A boundary is cut only where the output is a floating-point tensor that requires grad (integer
token ids, tuples and parameter-free prefixes stay inside a piece), so any stage the pipelines
accept runs, a module that is not an ``nn.Sequential`` as one piece (correct; W then repeats the
input-gradient chain). What W needs — each piece's graph and output gradient — stays alive from
B to W; the activations are freed at W, as `schedule.in_flight` counts them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass
class Piece:
    """One cut of the forward: its input leaf (or the stage's input), output, own parameters."""

    x: torch.Tensor
    y: torch.Tensor
    params: list[nn.Parameter]


@dataclass
class SplitGraph:
    """One micro-batch on one stage: the pieces after F, the (output, gradient, params) W needs
    after B."""

    pieces: list[Piece]
    pending: list[tuple[torch.Tensor, torch.Tensor | None, list[nn.Parameter]]] = field(default_factory=list)


def _cuttable(y: object) -> bool:
    return isinstance(y, torch.Tensor) and y.is_floating_point() and y.requires_grad


def _trainable(module: nn.Module) -> list[nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


def forward_pieces(module: nn.Module, inp: torch.Tensor) -> tuple[torch.Tensor, SplitGraph]:
    """Run ``module`` on ``inp`` cut at its children's boundaries; (output, the pieces)."""
    children = list(module) if isinstance(module, nn.Sequential) else [module]
    pieces: list[Piece] = []
    start, x = inp, inp
    params: list[nn.Parameter] = []
    y: torch.Tensor = inp
    for i, child in enumerate(children):
        if i > 0 and _cuttable(y):  # close the piece that ended with y; the next starts from a leaf
            pieces.append(Piece(start, y, params))
            x = start = y.detach().requires_grad_(True)
            params = []
        else:
            x = y
        y = child(x)
        params += [p for p in _trainable(child) if all(p is not q for q in params)]
    pieces.append(Piece(start, y, params))
    return y, SplitGraph(pieces)


def backward_input(graph: SplitGraph, grad: torch.Tensor | None) -> torch.Tensor | None:
    """B: the gradient of the stage's input from ``grad`` (its output's gradient; for the last
    stage the loss's, e.g. the 1/M scale), keeping what W needs. None where the input takes none
    (data on the first stage)."""
    g = grad
    for piece in reversed(graph.pieces):
        if not piece.y.requires_grad:  # nothing before this point is trainable
            return None
        if piece.params:
            graph.pending.append((piece.y, g, piece.params))
        if not piece.x.requires_grad:
            return None
        (g,) = torch.autograd.grad(piece.y, piece.x, g, retain_graph=bool(piece.params))
    graph.pieces = []  # W keeps only what `pending` references
    return g


def backward_weight(graph: SplitGraph) -> None:
    """W: accumulate every piece's weight gradient into ``.grad``; frees the graphs."""
    for y, g, params in graph.pending:
        torch.autograd.backward(y, g, inputs=params)
    graph.pending = []
