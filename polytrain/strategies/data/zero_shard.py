"""The sharded state behind ``zero`` (Rajbhandari et al., "ZeRO: Memory Optimizations Toward
Training Trillion Parameter Models", SC'20): the rank's shards of the flat units
(:mod:`polytrain.strategies.data.zero_units`) and the hooks that move them.

What each rank holds between steps (Ψ' = Σ Ψ'_u, K bytes of optimizer state per element), fp32::

    stage  parameters            gradients                 optimizer state
    1      full units  4Ψ'       full units  4Ψ'           K·Ψ'/W   (its shard's)
    2      full units  4Ψ'       its shards  4Ψ'/W         K·Ψ'/W
    3      its shards  4Ψ'/W     its shards  4Ψ'/W         K·Ψ'/W

Under ``--precision bf16|fp16`` (``dtype``) the shards are fp32 master weights (4Ψ'/W) and the
gathered units, their gradients and every all-gather and reduce-scatter are in the low precision
(e = 2 bytes): parameters eΨ' at stages 1–2 (none kept at stage 3), gradients eΨ' at stage 1
plus the fp32 gradient shard 4Ψ'/W the optimizer reads at every stage.

Each step every unit's gradient is reduce-scattered (its sum's chunk r lands on rank r) as soon
as backward has produced all of the unit's gradients (post-accumulate-grad hooks; launched in
unit order, last unit first, so every rank issues the same collectives in the same order, and
asynchronously, so they overlap the rest of backward). The optimizer then steps only the shards,
and stages 1–2 all-gather the updated shards into the full units. Stage 3 instead all-gathers a
layer's unit before its forward, frees it after, gathers it again when the gradient of the
layer's output arrives (a tensor hook: the layer's backward is next), and frees it once its
gradients are reduce-scattered. Its gradients then accumulate straight into one flat buffer
(each ``p.grad`` a view of it), which is what the reduce-scatter sends: a layer's gradient
exists once, not as ``p.grad`` plus a flat copy. Parameters keep their ``nn.Parameter`` objects
throughout: only their ``.data`` points into a gathered unit, or at an empty tensor while freed.

``--grad-accum K``: the step calls the model K times (``__call__``), under ``no_sync()`` but the
last. Stage 1 then accumulates into its full gradient buffers and reduce-scatters once a step;
stages 2–3 keep only shards, so they reduce-scatter every micro-step and add into the shard
(K reduce-scatters a step, and at stage 3 K forward and K backward gathers).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from polytrain.comm.accounted import Comm
from polytrain.runtime.precision import Precision
from polytrain.strategies.data.zero_units import Unit

EMPTY_SHAPE = (0,)
# Reduce-scatters in flight at once: each holds its unit's full-size gradient (stages 2–3), so an
# unbounded queue would keep a whole model's gradient alive until backward ends (measured:
# zero-3's transient memory 11.6 MB against allreduce's 6.1 MB on gpt-mini before a bound). One
# still overlaps a unit's reduce-scatter with the next unit's backward.
MAX_INFLIGHT = 1


class ShardedModel:
    """The rank's shards of ``model``'s units and the communication that keeps them consistent.

    ``optimizer_params()`` are the tensors the optimizer steps (one shard (S_u,) per unit, in the
    parameters' own dtype; their ``.grad`` is the unit's reduced gradient shard, the mean over
    ranks). ``dtype``: the gathered units' and gradients' dtype (default: the parameters')."""

    def __init__(self, model: nn.Module, units: list[Unit], comm: Comm, stage: int,
                 prefetch: int = 0, dtype: torch.dtype | None = None) -> None:
        self.model, self.units, self.comm, self.stage = model, units, comm, stage
        self.prefetch = prefetch  # stage 3: gather the next layer while this one computes
        self._inflight: dict[int, tuple[Any, torch.Tensor]] = {}  # prefetched gathers
        self.world, self.rank = comm.world, comm.rank
        p0 = units[0].params[0]
        self.device, self.master_dtype = p0.device, p0.dtype
        self.dtype = dtype or p0.dtype
        self.mixed = self.dtype != self.master_dtype  # fp32 master shards, low-precision units
        self.full: list[torch.Tensor | None] = []  # gathered units (stages 1–2: always)
        self._buf: list[torch.Tensor] = []  # stage 3: each unit's buffer, its memory freed in place
        self.gbuf: list[torch.Tensor] = []  # stage 1: full-size gradient of each unit
        self._gflat: dict[int, torch.Tensor] = {}  # stage 3: the flat gradient backward fills
        self.shards: list[torch.Tensor] = []  # (S_u,) each, this rank's chunk
        self._pending: list[Any] = []  # in-flight reduce-scatters
        self._sync = True  # False under no_sync(): stage 1 reduces nothing this micro-step
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
        flat = torch.zeros(u.padded, dtype=self.master_dtype, device=self.device)
        torch.cat([p.detach().reshape(-1) for p in u.params], out=flat[: u.numel])
        own = self.stage == 3 or self.mixed  # else a view: updating it updates the full unit
        self.shards.append(self._chunk(flat, u).clone() if own else self._chunk(flat, u))
        full = flat.to(self.dtype) if self.mixed else flat
        if self.stage == 3:
            self._buf.append(full)
            self.full.append(None)
            self._release(u)
            return
        self.full.append(full)
        self._view(u, full)
        if self.stage == 1:
            self.gbuf.append(torch.zeros_like(full))

    def _view(self, u: Unit, full: torch.Tensor) -> None:
        at = 0
        for p, shape in zip(u.params, u.shapes, strict=True):
            n = shape.numel()
            p.data = full[at : at + n].view(shape)
            at += n

    def _point_grads(self, u: Unit, flat: torch.Tensor) -> None:
        """Every ``p.grad`` of ``u`` a view of ``flat``: backward accumulates into it in place."""
        at = 0
        for p, shape in zip(u.params, u.shapes, strict=True):
            p.grad = flat[at : at + shape.numel()].view(shape)
            at += shape.numel()

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

    def _send(self, index: int) -> torch.Tensor:
        """What this rank contributes to unit ``index``'s all-gather: its shard in the units'
        dtype, never the shard itself at stages 1–2 (a view of the buffer the gather writes)."""
        s = self.shards[index]
        return s.to(self.dtype) if self.mixed else (s.clone() if self.stage < 3 else s)

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
                self.comm.all_gather_into(full, self._send(u.index), op=op)
            self.full[u.index] = full
            self._view(u, full)
            return
        assert full is not None
        self.comm.all_gather_into(full, self._send(u.index), op=op)

    def _prefetch(self, index: int, op: str) -> None:
        """Stage 3, ``prefetch=1``: start gathering unit ``index`` (asynchronously) unless it is
        gathered, on its way, or already reduced this step."""
        if not self.prefetch or not 0 <= index < len(self.units) or index in self._inflight:
            return
        if self.full[index] is not None or (op != "allgather" and self._launched[index]):
            return
        full = self._alloc(self.units[index])
        work = self.comm.all_gather_into(full, self._send(index), op=op, async_op=True)
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
            if self.full[u.index] is not None:
                return  # gathered already: a tied unit's later layer, or a recomputation
            if _recomputing():  # a layer inside a checkpointed block: its backward gather, early
                with torch.no_grad():
                    self.gather(u, "allgather-backward")
                return
            op = "allgather" if torch.is_grad_enabled() else "eval-allgather"
            self.gather(u, op)
            self._prefetch(u.index + 1, op)  # forward runs the units in order

        def after(_m: nn.Module, _args: Any, out: Any) -> None:
            if _recomputing():  # its backward runs next: keep it gathered (freed once reduced)
                return
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
            if u.index not in self._gflat:  # the layer's gradients go straight into one buffer
                self._gflat[u.index] = torch.zeros(u.padded, dtype=self.dtype, device=self.device)
                self._point_grads(u, self._gflat[u.index])
        return grad

    # ---- gradients --------------------------------------------------------------------------
    def begin_step(self) -> None:
        """Before the step's first forward: stage 1 points every gradient at its unit's (zeroed)
        full buffer, so backward accumulates there; stages 2–3 start with no gradients."""
        for i, u in enumerate(self.units):
            if self.stage == 1:
                self.gbuf[i].zero_()
                self._point_grads(u, self.gbuf[i])
            else:
                for p in u.params:
                    p.grad = None
        for s in self.shards:
            s.grad = None
        self._begin_micro()

    def _begin_micro(self) -> None:
        self._ready = [0] * len(self.units)
        self._launched = [False] * len(self.units)
        self._next = len(self.units) - 1

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """One micro-step's forward (what ``accumulate`` calls)."""
        self._begin_micro()
        return self.model(*args, **kwargs)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """A micro-step that is not the step's last: stage 1 only accumulates (no reduce-scatter);
        stages 2–3 hold no full gradient to accumulate into, so they reduce as usual."""
        self._sync = self.stage > 1
        try:
            yield
        finally:
            self._sync = True

    def _grad_ready(self, p: torch.Tensor) -> None:
        if not self._sync:
            return
        self._ready[self._unit_of[id(p)]] += 1
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
        elif u.index in self._gflat:  # stage 3: backward filled it through the p.grad views
            flat = self._gflat.pop(u.index)
            for p in u.params:
                p.grad = None
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
        while len(self._pending) > MAX_INFLIGHT:  # bound the full gradients alive at once
            self._complete(*self._pending.pop(0))

    def _complete(self, u: Unit, work: Any, out: torch.Tensor, flat: torch.Tensor) -> None:
        """Wait for unit ``u``'s reduce-scatter; its mean is added to the shard's ``.grad`` (in
        the shard's dtype; stage 1 in fp32 keeps it in its chunk of the full gradient)."""
        work.wait()
        out.div_(self.world)
        if self.stage == 1 and not self.mixed:
            out = self._chunk(flat, u).copy_(out)
        shard = self.shards[u.index]
        if shard.grad is None:
            shard.grad = out.to(self.master_dtype)
        else:
            shard.grad.add_(out.to(self.master_dtype))

    def finish_backward(self) -> None:
        """After a micro-step's backward: reduce what no hook launched (unused parameters), wait
        for every reduce-scatter still in flight (nothing under stage 1's ``no_sync``)."""
        if not self._sync:
            return
        self._launch_ready(force=True)
        for entry in self._pending:
            self._complete(*entry)
        self._pending = []

    # ---- update -----------------------------------------------------------------------------
    def optimizer_step(self, optimizer: torch.optim.Optimizer, amp: Precision | None = None) -> bool:
        """The update on this rank's shards only (through ``amp``'s scaler under fp16), then
        stages 1–2 gather the updated units. False when fp16's scaler skipped it."""
        stepped = True
        if amp is not None:
            stepped = amp.step(optimizer)
        else:
            optimizer.step()
        if self.stage < 3:
            self.gather_all()
        return stepped

    # ---- state ------------------------------------------------------------------------------
    def consolidated(self) -> dict[str, torch.Tensor]:
        """The full model's state_dict in its own key names, its parameters from the shards (the
        fp32 masters under mixed precision); collective at stage 3 and under mixed precision."""
        if not self.mixed:
            if self.stage == 3:
                self.gather_all(op="consolidate")
            state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
            self.release_all()
            return state
        values: dict[int, torch.Tensor] = {}
        for u in self.units:
            flat = torch.empty(u.padded, dtype=self.master_dtype, device=self.device)
            self.comm.all_gather_into(flat, self.shards[u.index], op="consolidate")
            at = 0
            for p, shape in zip(u.params, u.shapes, strict=True):
                values[id(p)] = flat[at : at + shape.numel()].view(shape).clone()
                at += shape.numel()
        return {k: values[id(v)] if id(v) in values else v.detach().clone()
                for k, v in self.model.state_dict(keep_vars=True).items()}

    @property
    def collective_state(self) -> bool:
        """Whether ``consolidated()`` is collective (every rank must call it)."""
        return self.stage == 3 or self.mixed

    def load_shards(self, shards: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for s, saved in zip(self.shards, shards, strict=True):
                s.copy_(saved)
            if self.stage < 3:
                self.gather_all(op="restore")


def _recomputing() -> bool:
    """Whether a forward runs inside backward: ``--activation-checkpointing`` recomputing a block
    (non-reentrant checkpoint runs the block's forward again when backward first needs it)."""
    return bool(torch._C._current_graph_task_id() != -1)


def _tensors(out: Any) -> Iterator[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, (tuple, list)):
        for o in out:
            yield from _tensors(o)
    elif isinstance(out, dict):
        for o in out.values():
            yield from _tensors(o)
