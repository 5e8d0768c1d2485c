"""The sharded state behind ``zero`` (Rajbhandari et al., "ZeRO: Memory Optimizations Toward
Training Trillion Parameter Models", SC'20): flat units, their shards, and the hooks that move them.

A *unit* is a group of whole parameters flattened into one vector of Ψ_u elements, padded with
zeros to Ψ'_u = W·⌈Ψ_u/W⌉ so that it splits into W equal chunks of S_u = Ψ'_u/W; rank r owns
chunk r of every unit (its *shard*). Stages 1–2 make units of consecutive parameters up to
``bucket_mb`` (DDP's buckets); stage 3 makes one unit per layer (child module), merging layers that
share a parameter (tied weights), so that a layer's parameters can be gathered just before it runs.

What each rank holds between steps (Ψ' = Σ Ψ'_u, K bytes of optimizer state per element)::

    stage  parameters            gradients                 optimizer state
    1      full units  4Ψ'       full units  4Ψ'           K·Ψ'/W   (its shard's)
    2      full units  4Ψ'       its shards  4Ψ'/W         K·Ψ'/W
    3      its shards  4Ψ'/W     its shards  4Ψ'/W         K·Ψ'/W

Each step every unit's gradient is reduce-scattered (its sum's chunk r lands on rank r) as soon
as backward has produced all of the unit's gradients (post-accumulate-grad hooks; launched in
unit order, last unit first, so every rank issues the same collectives in the same order, and
asynchronously, so they overlap the rest of backward). The optimizer then steps only the shards,
and stages 1–2 all-gather the updated shards into the full units. Stage 3 instead all-gathers a
layer's unit before its forward, frees it after, gathers it again when the gradient of the
layer's output arrives (a tensor hook: the layer's backward is next), and frees it once its
gradients are reduce-scattered. Parameters keep their ``nn.Parameter`` objects throughout: only
their ``.data`` points into a gathered unit, or at an empty tensor while freed.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from polytrain.comm.accounted import Comm

EMPTY_SHAPE = (0,)
# Reduce-scatters in flight at once: each holds its unit's full-size gradient copy (stages 2–3),
# so an unbounded queue would keep a whole model's gradient alive until backward ends (measured:
# zero-3's transient memory 11.6 MB against allreduce's 6.1 MB on gpt-mini before this bound).
MAX_INFLIGHT = 2


@dataclass
class Unit:
    """One flat unit: its parameters (in order), their shapes, Ψ_u, and the modules whose forward
    uses it at stage 3 (empty at stages 1–2)."""

    index: int
    params: list[nn.Parameter]
    shapes: list[torch.Size]
    numel: int
    world: int
    modules: list[nn.Module] = field(default_factory=list)

    @property
    def padded(self) -> int:
        return self.world * math.ceil(self.numel / self.world)

    @property
    def shard_numel(self) -> int:
        return self.padded // self.world


def bucket_units(params: list[nn.Parameter], world: int, bucket_mb: float) -> list[Unit]:
    """Stages 1–2: consecutive parameters grouped into units of at most ``bucket_mb`` MiB (one
    parameter larger than that makes a unit of its own)."""
    cap = int(bucket_mb * 2**20)
    groups: list[list[nn.Parameter]] = []
    size = 0
    for p in params:
        nbytes = p.numel() * p.element_size()
        if not groups or size + nbytes > cap:
            groups.append([])
            size = 0
        groups[-1].append(p)
        size += nbytes
    return [_unit(i, g, world) for i, g in enumerate(groups)]


def _layers(model: nn.Module) -> tuple[nn.Module, list[nn.Module]]:
    """The module whose children are the layers (descending through single-child wrappers)."""
    root = model
    while len(list(root.children())) == 1 and not list(root.parameters(recurse=False)):
        root = next(root.children())
    return root, list(root.children())


def layers_of(model: nn.Module) -> list[nn.Module]:
    """The model's layers: the children of the first module that has more than one."""
    return _layers(model)[1]


def layer_units(model: nn.Module, world: int) -> list[Unit]:
    """Stage 3: one unit per layer; layers that share a parameter (and those between them) merge.
    Parameters the root itself owns form a unit gathered around the whole forward."""
    root, children = _layers(model)
    groups: list[tuple[list[nn.Module], list[nn.Parameter]]] = []
    owner: dict[int, int] = {}
    for child in children:
        ps = list(child.parameters())
        hits = {owner[id(p)] for p in ps if id(p) in owner}
        if not hits:
            groups.append(([], []))
        else:  # a tied parameter: this layer and every group since the first sharer become one
            first = min(hits)
            mods = [m for g in groups[first:] for m in g[0]]
            prm = [p for g in groups[first:] for p in g[1]]
            del groups[first:]
            groups.append((mods, prm))
        idx = len(groups) - 1
        groups[idx][0].append(child)
        for p in ps:
            if id(p) not in {id(q) for q in groups[idx][1]}:
                groups[idx][1].append(p)
        for p in groups[idx][1]:
            owner[id(p)] = idx
    own = list(root.parameters(recurse=False))
    if own:
        groups.insert(0, ([root], own))
    units = [_unit(i, prm, world) for i, (_, prm) in enumerate(g for g in groups if g[1])]
    for unit, (mods, _) in zip(units, [g for g in groups if g[1]], strict=True):
        unit.modules = mods
    return units


def _unit(index: int, params: list[nn.Parameter], world: int) -> Unit:
    return Unit(index, list(params), [p.shape for p in params], sum(p.numel() for p in params), world)


class ShardedModel:
    """The rank's shards of ``model``'s units and the communication that keeps them consistent.

    ``optimizer_params()`` are the tensors the optimizer steps (one shard (S_u,) per unit; their
    ``.grad`` is the unit's reduced gradient shard, the mean over ranks)."""

    def __init__(self, model: nn.Module, units: list[Unit], comm: Comm, stage: int,
                 prefetch: int = 0) -> None:
        self.model, self.units, self.comm, self.stage = model, units, comm, stage
        self.prefetch = prefetch  # stage 3: gather the next layer while this one computes
        self._inflight: dict[int, tuple[Any, torch.Tensor]] = {}  # prefetched gathers
        self.world, self.rank = comm.world, comm.rank
        p0 = units[0].params[0]
        self.device, self.dtype = p0.device, p0.dtype
        self.full: list[torch.Tensor | None] = []  # gathered units (stages 1–2: always)
        self._buf: list[torch.Tensor] = []  # stage 3: each unit's buffer, its memory freed in place
        self.gbuf: list[torch.Tensor] = []  # stage 1: full-size gradient of each unit
        self.shards: list[torch.Tensor] = []  # (S_u,) each, this rank's chunk
        self._pending: list[Any] = []  # in-flight reduce-scatters
        self._ready = [0] * len(units)
        self._launched = [False] * len(units)
        self._next = len(units) - 1  # next unit to reduce (backward runs last unit first)
        self._unit_of = {id(p): u.index for u in units for p in u.params}
        self._handles: list[Any] = []
        with torch.no_grad():
            for u in units:
                self._build(u)
        for u in units:
            for p in u.params:
                if p.requires_grad:
                    self._handles.append(p.register_post_accumulate_grad_hook(self._grad_ready))
            if stage == 3:
                self._hook_layers(u)

    # ---- layout -----------------------------------------------------------------------------
    def _chunk(self, flat: torch.Tensor, u: Unit) -> torch.Tensor:
        return flat[self.rank * u.shard_numel : (self.rank + 1) * u.shard_numel]

    def _build(self, u: Unit) -> None:
        full = torch.zeros(u.padded, dtype=self.dtype, device=self.device)
        torch.cat([p.detach().reshape(-1) for p in u.params], out=full[: u.numel])
        if self.stage == 3:
            self.shards.append(self._chunk(full, u).clone())  # owns its memory
            self._buf.append(full)
            self.full.append(None)
            self._release(u)
            return
        self.full.append(full)
        self._view(u, full)
        self.shards.append(self._chunk(full, u))  # a view: updating it updates the full unit
        if self.stage == 1:
            self.gbuf.append(torch.zeros_like(full))

    def _view(self, u: Unit, full: torch.Tensor) -> None:
        at = 0
        for p, shape in zip(u.params, u.shapes, strict=True):
            n = shape.numel()
            p.data = full[at : at + n].view(shape)
            at += n

    def _release(self, u: Unit) -> None:
        for p in u.params:
            p.data = torch.empty(EMPTY_SHAPE, dtype=self.dtype, device=self.device)
        if self.stage == 3:
            # free the memory itself, not just our reference: autograd's saved views of the
            # parameters (e.g. a weight's transpose) share it and would keep it alive until
            # backward; gathering again refills this same storage, so those views stay valid
            self._buf[u.index].untyped_storage().resize_(0)
        self.full[u.index] = None

    def _alloc(self, u: Unit) -> torch.Tensor:
        """Stage 3: unit ``u``'s buffer with its memory back (contents undefined until gathered)."""
        buf = self._buf[u.index]
        if buf.untyped_storage().nbytes() == 0:
            buf.untyped_storage().resize_(u.padded * buf.element_size())
        return buf

    def optimizer_params(self) -> list[torch.Tensor]:
        return self.shards

    # ---- gathering --------------------------------------------------------------------------
    def gather(self, u: Unit, op: str = "allgather") -> None:
        """All-gather unit ``u`` from every rank's shard (stage 3: into its buffer, or by waiting
        for its prefetch)."""
        full = self.full[u.index]
        if self.stage == 3:
            if u.index in self._inflight:
                work, full = self._inflight.pop(u.index)
                work.wait()
            elif full is not None:
                return  # already gathered (a layer called twice, or tied layers)
            else:
                full = self._alloc(u)
                self.comm.all_gather_into(full, self.shards[u.index], op=op)
            self.full[u.index] = full
            self._view(u, full)
            return
        assert full is not None
        # the shard is a view of ``full``: send a copy, the backend must not read what it writes
        self.comm.all_gather_into(full, self.shards[u.index].clone(), op=op)

    def _prefetch(self, index: int, op: str) -> None:
        """Stage 3, ``prefetch=1``: start gathering unit ``index`` (asynchronously) unless it is
        gathered, on its way, or already reduced this step."""
        if not self.prefetch or not 0 <= index < len(self.units) or index in self._inflight:
            return
        if self.full[index] is not None or (op != "allgather" and self._launched[index]):
            return
        u = self.units[index]
        full = self._alloc(u)
        work = self.comm.all_gather_into(full, self.shards[index], op=op, async_op=True)
        self._inflight[index] = (work, full)

    def gather_all(self, op: str = "allgather") -> None:
        with torch.no_grad():
            for u in self.units:
                self.gather(u, op)

    def release_all(self) -> None:
        if self.stage == 3:
            for u in self.units:
                self._release(u)

    def _hook_layers(self, u: Unit) -> None:
        def before(_m: nn.Module, _args: Any) -> None:
            op = "allgather" if torch.is_grad_enabled() else "eval-allgather"
            self.gather(u, op)
            self._prefetch(u.index + 1, op)  # forward runs the units in order

        def after(_m: nn.Module, _args: Any, out: Any) -> None:
            for t in _tensors(out):
                if t.requires_grad:  # the layer's backward follows this gradient: gather again
                    t.register_hook(lambda g: self._regather(u, g))
            self._release(u)

        for m in u.modules:
            self._handles.append(m.register_forward_pre_hook(before))
        self._handles.append(u.modules[-1].register_forward_hook(after))

    def _regather(self, u: Unit, grad: torch.Tensor) -> torch.Tensor:
        if not self._launched[u.index]:
            with torch.no_grad():
                self.gather(u, "allgather-backward")
                self._prefetch(u.index - 1, "allgather-backward")  # backward runs them in reverse
        return grad

    # ---- gradients --------------------------------------------------------------------------
    def begin_step(self) -> None:
        """Before forward: stage 1 points every gradient at its unit's (zeroed) full buffer, so
        backward accumulates there; stages 2–3 start with no gradients."""
        self._ready = [0] * len(self.units)
        self._launched = [False] * len(self.units)
        self._next = len(self.units) - 1
        for i, u in enumerate(self.units):
            if self.stage == 1:
                self.gbuf[i].zero_()
                at = 0
                for p, shape in zip(u.params, u.shapes, strict=True):
                    p.grad = self.gbuf[i][at : at + shape.numel()].view(shape)
                    at += shape.numel()
            else:
                for p in u.params:
                    p.grad = None
        for s in self.shards:
            s.grad = None

    def _grad_ready(self, p: torch.Tensor) -> None:
        i = self._unit_of[id(p)]
        self._ready[i] += 1
        self._launch_ready()

    def _launch_ready(self, force: bool = False) -> None:
        while self._next >= 0:
            u = self.units[self._next]
            wanted = sum(p.requires_grad for p in u.params)
            if not force and self._ready[u.index] < wanted:
                return
            self._reduce(u)
            self._next -= 1

    def _reduce(self, u: Unit) -> None:
        """Launch unit ``u``'s reduce-scatter (asynchronous); its shard's mean lands in ``.grad``."""
        self._launched[u.index] = True
        out = torch.empty(u.shard_numel, dtype=self.dtype, device=self.device)
        if self.stage == 1:
            flat = self.gbuf[u.index]
        else:
            flat = torch.zeros(u.padded, dtype=self.dtype, device=self.device)
            at = 0
            for p, shape in zip(u.params, u.shapes, strict=True):
                if p.grad is not None:
                    flat[at : at + shape.numel()].copy_(p.grad.reshape(-1))
                at += shape.numel()
                p.grad = None  # stage 2–3: the full gradient is not kept
            if self.stage == 3:
                self._release(u)
        work = self.comm.reduce_scatter(out, flat, op="reducescatter", async_op=True)
        self._pending.append((u, work, out, flat))
        if len(self._pending) > MAX_INFLIGHT:  # bound the gradient copies alive at once
            self._complete(*self._pending.pop(0))

    def _complete(self, u: Unit, work: Any, out: torch.Tensor, flat: torch.Tensor) -> None:
        """Wait for unit ``u``'s reduce-scatter; its shard's ``.grad`` becomes the mean over ranks
        (and ``flat``, a full-size copy at stages 2–3, is dropped)."""
        work.wait()
        out.div_(self.world)
        if self.stage == 1:  # the reduced chunk replaces this rank's chunk of the full gradient
            chunk = self._chunk(flat, u)
            chunk.copy_(out)
            self.shards[u.index].grad = chunk
        else:
            self.shards[u.index].grad = out

    def finish_backward(self) -> None:
        """After backward: reduce what no hook launched (unused parameters), wait for every
        reduce-scatter still in flight."""
        self._launch_ready(force=True)
        for entry in self._pending:
            self._complete(*entry)
        self._pending = []

    # ---- update -----------------------------------------------------------------------------
    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """The update, on this rank's shards only (the home of mixed-precision master weights and
        of gradient clipping when they come), then stages 1–2 gather the updated units."""
        optimizer.step()
        if self.stage < 3:
            self.gather_all()

    def grad_norm_sq(self) -> torch.Tensor:
        """Σ g² over the whole model, from the shards: one all-reduce of the partial sums (padding
        is zero and adds nothing). Its square root is the global norm ``--clip-grad-norm`` needs."""
        part = torch.zeros(1, dtype=torch.float64, device=self.device)
        for s in self.shards:
            if s.grad is not None:
                part += s.grad.double().pow(2).sum()
        self.comm.all_reduce(part, op="gradnorm")
        return part

    # ---- state ------------------------------------------------------------------------------
    def consolidated(self) -> dict[str, torch.Tensor]:
        """The full model's state_dict in its own key names (collective at stage 3)."""
        if self.stage == 3:
            self.gather_all(op="consolidate")
        state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        self.release_all()
        return state

    def load_shards(self, shards: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for s, saved in zip(self.shards, shards, strict=True):
                s.copy_(saved)
            if self.stage < 3:
                self.gather_all(op="restore")


def _tensors(out: Any) -> Iterator[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, (tuple, list)):
        for o in out:
            yield from _tensors(o)
    elif isinstance(out, dict):
        for o in out.values():
            yield from _tensors(o)
