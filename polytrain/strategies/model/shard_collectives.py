"""Communication for split models: the autograd operators that cross ranks inside a
forward/backward pass, and gathering sharded parameters back to full shapes.

Every byte still goes through :class:`polytrain.comm.Comm`; sub-groups (tensor groups, pipelines,
data-parallel rows) use :class:`polytrain.comm.GroupComm`, whose bytes are booked on the world
communicator with global peer ids.

The operators (Megatron-LM's names, Shoeybi et al. 2019, fig. 3):

    copy_to(x)    "f": forward identity,           backward all-reduce   (enters a parallel region)
    reduce_from(x) "g": forward all-reduce,        backward identity     (leaves it)
    gather(x, d)  forward all-gather along dim d;  backward: reduce-scatter when the ranks go on
                  to compute DIFFERENT things from the gathered tensor (each holds a slice of the
                  next layer), or just the own slice when they all compute the SAME thing from it
                  (a replicated loss) — summing identical gradients would count them W times.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from polytrain.comm import Comm
from polytrain.metrics.recorder import Recorder


@dataclass
class Wire:
    """A communicator plus the recorder its waits are booked on (``comm`` spans)."""

    comm: Comm
    recorder: Recorder | None = None
    calls: dict[str, int] = field(default_factory=dict)
    #: prefixed to every op name while evaluating (see :class:`Evaluating`)
    prefix: str = ""

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def size(self) -> int:
        return self.comm.world

    def _count(self, op: str) -> str:
        # Evaluation traffic is booked apart from training traffic (``eval_`` prefix).
        name = self.prefix + op
        self.calls[name] = self.calls.get(name, 0) + 1
        return name

    def all_reduce(self, t: torch.Tensor, op: str) -> None:
        name = self._count(op)
        start = self.recorder.now() if self.recorder else 0.0
        self.comm.all_reduce(t, op=name)
        if self.recorder:
            self.recorder.add_span(name, "comm", start, self.recorder.now())

    def all_gather(self, t: torch.Tensor, op: str) -> list[torch.Tensor]:
        name = self._count(op)
        start = self.recorder.now() if self.recorder else 0.0
        out = [torch.empty_like(t) for _ in range(self.size)]
        self.comm.all_gather(out, t.contiguous(), op=name)
        if self.recorder:
            self.recorder.add_span(name, "comm", start, self.recorder.now())
        return out

    def reduce_scatter(self, parts: list[torch.Tensor], op: str) -> torch.Tensor:
        """Sum over ranks of ``parts[self.rank]``: part q goes straight to rank q ((W−1)/W of the
        tensor per rank, as a ring reduce-scatter sends)."""
        name = self._count(op)
        start = self.recorder.now() if self.recorder else 0.0
        me = self.rank
        bufs = {q: torch.empty_like(parts[me]) for q in range(self.size) if q != me}
        works = [self.comm.irecv(bufs[q], q, op=name) for q in bufs]
        works += [self.comm.isend(parts[q].contiguous(), q, op=name) for q in bufs]
        for w in works:
            w.wait()
        total = parts[me].clone()
        for q in sorted(bufs):
            total += bufs[q]
        if self.recorder:
            self.recorder.add_span(name, "comm", start, self.recorder.now())
        return total


class Evaluating(nn.Module):
    """``module`` for evaluation: books the wires' traffic as ``eval_*`` while it runs.

    Every rank of the wires must call it together (it is a parallel forward)."""

    def __init__(self, module: nn.Module, *wires: Wire) -> None:
        super().__init__()
        self.module = module
        self.wires = wires

    def forward(self, *args: Any) -> Any:  # x, and the targets for a model that takes them
        for w in self.wires:
            w.prefix = "eval_"
        try:
            return self.module(*args)
        finally:
            for w in self.wires:
                w.prefix = ""


# --- Megatron's f and g ------------------------------------------------------------------------


class _CopyTo(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, wire: Wire) -> torch.Tensor:
        ctx.wire = wire
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.clone(memory_format=torch.contiguous_format)
        ctx.wire.all_reduce(grad, "tp_allreduce")
        return grad, None


class _ReduceFrom(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, wire: Wire) -> torch.Tensor:
        out = x.clone(memory_format=torch.contiguous_format)
        wire.all_reduce(out, "tp_allreduce")
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def copy_to(x: torch.Tensor, wire: Wire) -> torch.Tensor:
    """Megatron's f: identity forward, all-reduce of the input gradient in backward."""
    if wire.size == 1:
        return x
    return _CopyTo.apply(x, wire)  # type: ignore[no-any-return]


def reduce_from(x: torch.Tensor, wire: Wire) -> torch.Tensor:
    """Megatron's g: all-reduce (sum) of the partial outputs in forward, identity in backward."""
    if wire.size == 1:
        return x
    return _ReduceFrom.apply(x, wire)  # type: ignore[no-any-return]


# --- all-gather along a dimension ---------------------------------------------------------------


def _pad_to(x: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    if x.shape[dim] == size:
        return x
    pad_shape = list(x.shape)
    pad_shape[dim] = size - x.shape[dim]
    return torch.cat([x, x.new_zeros(pad_shape)], dim=dim)


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, wire: Wire, dim: int, sizes: tuple[int, ...],
                split_consumer: bool, op: str) -> torch.Tensor:
        ctx.wire, ctx.dim, ctx.sizes, ctx.split, ctx.op = wire, dim, sizes, split_consumer, op
        chunks = wire.all_gather(_pad_to(x, dim, max(sizes)), op)
        return torch.cat([c.narrow(dim, 0, n) for c, n in zip(chunks, sizes, strict=True)], dim=dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        parts = list(grad.split(list(ctx.sizes), dim=ctx.dim))
        # split consumer: part q of every rank's gradient belongs to rank q — reduce-scatter
        # (sizes may differ, each rank receives exactly its own part's shape)
        wire: Wire = ctx.wire
        mine = wire.reduce_scatter(parts, ctx.op) if ctx.split else parts[wire.rank].contiguous()
        return mine, None, None, None, None, None


def gather(x: torch.Tensor, wire: Wire, dim: int, sizes: Sequence[int], *, split_consumer: bool,
           op: str = "gather") -> torch.Tensor:
    """Concatenate every rank's ``x`` along ``dim`` (rank q contributes ``sizes[q]`` there).

    ``split_consumer``: True when the ranks compute different outputs from the result (its
    gradient is then summed over ranks, a reduce-scatter), False when they compute the same one.
    """
    if wire.size == 1:
        return x
    return _Gather.apply(x, wire, dim, tuple(sizes), split_consumer, op)  # type: ignore[no-any-return]


def shard_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """Split ``n`` rows into ``parts`` contiguous ranges, the first ``n % parts`` one longer
    (for 2 parts this is alexnet's ``column_slice``)."""
    base, extra = divmod(n, parts)
    out, start = [], 0
    for p in range(parts):
        size = base + (p < extra)
        out.append((start, start + size))
        start += size
    return out


def gather_state(wire: Wire, state: dict[str, torch.Tensor], dims: dict[str, int],
                 full_shapes: dict[str, torch.Size]) -> dict[str, torch.Tensor]:
    """Full-shape parameters from every rank's shards: key k is split along ``dims[k]`` (keys
    not in ``dims`` are replicated and kept as they are). Collective over ``wire``."""
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for key, local in state.items():
            dim = dims.get(key)
            if dim is None or wire.size == 1:
                out[key] = local.detach().clone()
                continue
            full = full_shapes[key][dim]
            sizes = [b - a for a, b in shard_bounds(full, wire.size)]
            out[key] = gather(local.detach(), wire, dim, sizes, split_consumer=False,
                              op="gather_model").clone()
    return out


def all_reduce_grads(params: Sequence[nn.Parameter], wire: Wire, op: str, *, mean: bool) -> None:
    """All-reduce the parameters' gradients in one flat buffer: the sum (each rank holds its
    samples' share of one global mean loss) or the mean (each rank's loss is a mean over its own
    samples, as in data parallelism)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads or wire.size == 1:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    wire.all_reduce(flat, op)
    if mean:
        flat /= wire.size
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()
