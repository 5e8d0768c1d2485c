"""The one executor: runs a stage's list of actions — any schedule — over point-to-point messages.

A stage holds its slice of the model (an ``nn.Sequential``), an inbox of activations from the
previous stage and one of gradients from the next (`activations_wire`), and the activations of the
micro-batches in flight (forward done, backward not yet). For each action of its order:

- ``F m``: take the input (stage 0: the data; else the activation of m, (b, ...) as the previous
  stage produced it), run the slice on it (optionally re-materialised with
  ``torch.utils.checkpoint``), stash (input, output), and send the output on; the last stage
  computes the loss instead.
- ``B m``: take the gradient of m's output (the last stage: backward of loss × loss_scale), run
  backward, send the input's gradient back, and — for schedules that update after every
  backward — let the weight policy step. Where the order also lists ``W m`` (zero-bubble
  schedules), B computes the input gradient only and ``W m`` the weight gradients later
  (`split_backward`: the forward of such a micro-batch is cut at layer boundaries).

A neighbouring stage may be replicated: its replicas take micro-batches in turn (m mod R), so the
peer of micro-batch m is ``peer(ranks, m)`` and there is one FIFO channel per neighbouring rank.

The order of actions is the schedule's; the executor adds no synchronisation of its own, so a
schedule that passes `checks.validate` and `checks.dry_run` cannot deadlock here. Every action
records a ``compute`` span (``forward``/``backward``/``optimizer``) and every wait a ``comm``
span, with ``stage``, ``mb`` and ``step`` fields, for the timeline and the measured bubble.

Precision (``weights.amp``, `runtime.precision`). Forwards and the loss run under autocast; the
output sent on is cast to the compute dtype (``Precision.wire_dtype``: bf16/fp16 for floating
point, so half the bytes) and the inboxes expect that dtype, so the gradient sent back for it is
in the compute dtype too. The last stage starts backward from the loss times fp16's loss scale;
the flush unscales (`weights.FlushWeights.end_segment`). Evaluation (`infer`) stays fp32.

Memory. A saved-tensor hook counts the storages autograd keeps for each micro-batch's backward
(parameters and weight versions excluded), plus the stashed input and output: that is the
activation memory a stage holds between F and B. `MemoryMeter` tracks its peak together with the
weight policy's stashed versions. On CPU there are no allocator statistics; this count is exact
for what the graph retains.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch
from torch import nn
from torch.func import functional_call
from torch.utils.checkpoint import checkpoint

from polytrain.comm import Comm
from polytrain.models.boundaries import TensorMeta
from polytrain.runtime.job import Job, RankContext
from polytrain.schedules.actions import Action
from polytrain.strategies.pipeline.activations_wire import AHEAD, STOP, Inbox, Outbox, StreamStop
from polytrain.strategies.pipeline.meter import MemoryMeter, Window
from polytrain.strategies.pipeline.split_backward import (
    SplitGraph,
    backward_input,
    backward_weight,
    forward_pieces,
)
from polytrain.strategies.pipeline.weights import FlushWeights, Params

CHECKPOINT_MODES = ("never", "except_last", "always")


@dataclass(frozen=True)
class StageSpec:
    """One stage's place in the pipeline and how it runs its slice."""

    stage: int
    stages: int
    module: nn.Module
    prev_ranks: tuple[int, ...]  # the previous stage's replicas (none on the first stage)
    next_ranks: tuple[int, ...]  # the next stage's replicas (none on the last stage)
    in_meta: TensorMeta | None  # the activation received per micro-batch
    out_meta: TensorMeta | None  # the activation sent per micro-batch
    checkpoint: str = "never"
    loss_scale: float = 1.0  # 1/M: M micro-batch means sum to the mini-batch mean's gradient
    trace_versions: bool = False  # emit a "version" event per F and B (tests of weight stashing)
    record_ops: bool = True  # keep each action's seconds in the window (flush segments: bounded)


def peer(ranks: tuple[int, ...], mb: int) -> int:
    """The replica of a neighbouring stage that runs micro-batch ``mb`` (they take turns)."""
    return ranks[mb % len(ranks)]


class Feed(Protocol):
    """The data of a segment: micro-batch index -> its step, inputs and targets."""

    def step(self, mb: int) -> int: ...
    def inputs(self, mb: int) -> torch.Tensor: ...
    def target(self, mb: int) -> torch.Tensor: ...


class StageExecutor:
    """Runs orders for one stage; keeps its channels and meters across segments."""

    def __init__(self, job: Job, ctx: RankContext, spec: StageSpec, weights: FlushWeights,
                 comms: tuple[Comm, Comm] | None = None, meter: MemoryMeter | None = None) -> None:
        """``comms``: the (previous, next) neighbour's communicator, whose ranks ``spec`` names;
        default both ``ctx.comm``. Virtual stages give each chunk boundary its own, so the chunks
        of one rank never share a FIFO stream; ``meter``: one shared by a rank's chunks."""
        self.job, self.ctx, self.spec, self.weights = job, ctx, spec, weights
        rec, s = ctx.recorder, spec.stage
        back, fwd = comms or (ctx.comm, ctx.comm)
        self.back_comm, self.fwd_comm = back, fwd
        self.amp = weights.amp
        # what training sends and receives: the boundary tensors in the compute dtype
        self.in_meta, self.out_meta = (None if m is None else replace(m, dtype=self.amp.wire_dtype(m.dtype))
                                       for m in (spec.in_meta, spec.out_meta))
        # one FIFO channel per neighbouring replica and direction
        self.acts: dict[int, Inbox] = {}
        if self.in_meta is not None:
            self.acts = {r: Inbox(back, rec, r, self.in_meta, "activation", s, ctx.device)
                         for r in spec.prev_ranks}
        self.grads: dict[int, Inbox] = {}
        if self.out_meta is not None:
            self.grads = {r: Inbox(fwd, rec, r, self.out_meta, "gradient", s, ctx.device)
                          for r in spec.next_ranks}
        self.outbox = Outbox(fwd, rec, s)  # activations on
        self.back_out = self.outbox if back is fwd else Outbox(back, rec, s)  # gradients back
        self.meter = meter or MemoryMeter()
        self.flight: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.split: set[int] = set()  # micro-batches of this segment whose backward is split (B, W)
        self.graphs: dict[int, SplitGraph] = {}
        self.losses: dict[int, float] = {}
        self._last_mb = -1
        self.stopped: int | None = None  # the first micro-batch an early stop left out

    def run(self, order: list[Action], feed: Feed, done: Callable[[int, float], None],
            stop: Callable[[int], bool] | None = None) -> Window:
        """Execute ``order``; ``done(mb, loss)`` after each backward. Returns the compute window.

        ``stop`` (a stream's input stage): asked before each forward of micro-batch m > 0; True
        ends the stream early — see :meth:`_stop`. ``stopped``: the first micro-batch left out."""
        window = self.begin(order)
        todo, i = order, 0
        while i < len(todo):
            a = todo[i]
            i += 1
            if a.op == "F" and stop is not None and not self.acts and a.microbatch > 0 and stop(a.microbatch):
                todo, i = self._stop(todo[i - 1 :], a.microbatch), 0
                continue
            try:
                self.act(a, feed, window, done)
            except StreamStop as halt:  # raised by a forward's receive
                todo, i = self._stop(todo[i - 1 :], halt.first), 0
        if self.stopped is not None:
            self._pad(order, self.stopped)
        self.end()
        return window

    def begin(self, order: list[Action]) -> Window:
        """Start a segment of ``order`` (this stage's actions): post its receives, reset."""
        forwards = [a.microbatch for a in order if a.op == "F"]
        channels = ((self.acts, self.spec.prev_ranks, "F"), (self.grads, self.spec.next_ranks, "B"))
        for inboxes, ranks, op in channels:
            for r, inbox in inboxes.items():
                inbox.expect(sum(a.op == op and peer(ranks, a.microbatch) == r for a in order))
        self._last_mb = max(forwards, default=-1)
        self.split = {a.microbatch for a in order if a.op == "W"}
        self.weights.begin_segment(order)
        self.stopped = None
        return Window()

    def act(self, a: Action, feed: Feed, window: Window, done: Callable[[int, float], None]) -> None:
        """Run one action (F, B or W) of this stage."""
        if a.op == "F":
            self._forward(a.microbatch, feed, window)
        elif a.op == "B":
            done(a.microbatch, self._backward(a.microbatch, feed, window))
        else:
            self._weight(a.microbatch, feed, window)
        self.outbox.poll()
        if self.back_out is not self.outbox:
            self.back_out.poll()

    def end(self) -> None:
        """Wait for this segment's sends."""
        self.outbox.drain()
        if self.back_out is not self.outbox:
            self.back_out.drain()

    def _stop(self, rest: list[Action], first: int) -> list[Action]:
        """End the stream before micro-batch ``first``: what is left of the order without it and
        later ones, and (not the last stage) the STOP message on, in place of its activation.

        The order of a stream truncated so is the order of the shorter stream (1F1B keeps each
        micro-batch's place: `schedule.pipedream_orders`), so every stage drains exactly the
        micro-batches the input stage admitted and ends as at the end of a segment."""
        if len(self.spec.prev_ranks) > 1 or len(self.spec.next_ranks) > 1:
            raise RuntimeError("a stream stops early only with one rank per stage")
        self.stopped = first
        if self.out_meta is not None:
            self.outbox.pad(self.spec.next_ranks[0], self.out_meta, self.ctx.device, 1, "activation",
                            STOP, float(first))
        return [a for a in rest if a.microbatch < first]

    def _pad(self, order: list[Action], first: int) -> None:
        """After an early stop: each peer still has receives posted for micro-batches left out,
        as many as its inbox keeps ahead of what it has taken — match them with padding, and
        take the padding sent for this stage's own (:meth:`Inbox.close`)."""
        ahead = AHEAD
        if self.out_meta is not None:  # activations to the next stage: the STOP counted
            expected = sum(a.op == "F" for a in order)
            sent = sum(a.op == "F" and a.microbatch < first for a in order) + 1
            self.outbox.pad(self.spec.next_ranks[0], self.out_meta, self.ctx.device,
                            min(ahead, expected - sent), "activation")
        if self.in_meta is not None:  # gradients to the previous stage
            expected = sum(a.op == "B" for a in order)
            sent = sum(a.op == "B" and a.microbatch < first for a in order)
            self.back_out.pad(self.spec.prev_ranks[0], self.in_meta, self.ctx.device,
                            min(ahead, expected - sent), "gradient")
        for inbox in [*self.acts.values(), *self.grads.values()]:
            inbox.close()

    @contextmanager
    def _compute(self, name: str, mb: int, step: int, window: Window) -> Iterator[None]:
        rec = self.ctx.recorder
        start = rec.now()
        with rec.span(name, "compute", stage=self.spec.stage, mb=mb, step=step):
            yield
            self.ctx.straggle(rec.now() - start)  # emulated slowness counts as this stage's work
        end = rec.now()
        window.start, window.end = min(window.start, start), max(window.end, end)
        window.busy += end - start
        if not self.spec.record_ops:  # a stream's segment may be the whole run: keep nothing per op
            return
        if name == "optimizer" and window.ops:
            window.ops[-1][2] += end - start
        else:
            window.ops.append([name[0].upper(), mb, end - start])

    def _run_module(self, inp: torch.Tensor, params: Params | None, mb: int) -> torch.Tensor:
        module = self.spec.module

        def fn(x: torch.Tensor) -> torch.Tensor:
            return module(x) if params is None else functional_call(module, params, (x,))

        mode = self.spec.checkpoint
        if mode == "always" or (mode == "except_last" and mb != self._last_mb):
            out: torch.Tensor = checkpoint(fn, inp, use_reentrant=False)
            return out
        return fn(inp)

    def _take(self, inbox: Inbox, mb: int, step: int, window: Window) -> tuple[torch.Tensor, float]:
        """The next message of ``inbox``; the wait counts once this segment's compute has begun."""
        start = self.ctx.recorder.now()
        got = inbox.take(mb, step)
        (self.back_out if inbox.op == "activation" else self.outbox).acknowledged(inbox.peer, inbox.acked)
        if start >= window.start:
            window.wait += self.ctx.recorder.now() - start
        return got

    def _forward(self, mb: int, feed: Feed, window: Window) -> None:
        step = feed.step(mb)
        tag = 0.0
        if not self.acts:
            inp = feed.inputs(mb)
        else:
            inp, tag = self._take(self.acts[peer(self.spec.prev_ranks, mb)], mb, step, window)
            inp.requires_grad_(inp.is_floating_point())
        with self._compute("forward", mb, step, window):
            params = self.weights.forward_params(mb, tag)
            self._trace("F", mb, step)
            with self.meter.track(self.weights.held_ptrs()) as saved, self.amp.autocast():
                if mb in self.split:  # cut at layer boundaries, so W need not repeat B's work
                    out, self.graphs[mb] = forward_pieces(self.spec.module, inp)
                else:
                    out = self._run_module(inp, params, mb)
                if not self.grads:  # last stage: the loss of micro-batch mb (a mean over it)
                    out = self.job.loss(out, feed.target(mb))
                    self.losses[mb] = float(out.detach())
                elif self.out_meta is not None:  # sent in the compute dtype (a no-op in fp32)
                    out = out.to(self.out_meta.dtype)
                if mb in self.graphs:  # B starts from what leaves the stage: the last piece ends there
                    self.graphs[mb].pieces[-1].y = out
            self.meter.hold((self.spec.stage, mb), saved, inp, out)
            self.meter.note(self.weights.stash_bytes())
        self.flight[mb] = (inp, out)
        if self.grads:
            dst = peer(self.spec.next_ranks, mb)
            self.outbox.send(out, dst, "activation", self.weights.out_tag(mb, tag), mb, step,
                             ack=self.grads[dst].taken)

    def _backward(self, mb: int, feed: Feed, window: Window) -> float:
        step = feed.step(mb)
        inp, out = self.flight.pop(mb)
        grad: torch.Tensor | None = None
        if not self.grads:
            loss = self.losses.pop(mb)
        else:
            grad, loss = self._take(self.grads[peer(self.spec.next_ranks, mb)], mb, step, window)
        self._trace("B", mb, step)
        if mb in self.split:
            return self._backward_input(mb, step, window, inp, out, grad, loss)
        with self._compute("backward", mb, step, window):
            if not out.requires_grad:  # a parameter-free stage fed by data: nothing to differentiate
                pass
            elif grad is None:  # the last stage: this micro-batch's share of the mini-batch loss
                self.amp.backward(out * self.spec.loss_scale)  # fp16: times the loss scale
            else:
                out.backward(grad)
        self.meter.release((self.spec.stage, mb))
        if self.acts:
            g = inp.grad if inp.grad is not None else torch.zeros_like(inp)
            src = peer(self.spec.prev_ranks, mb)
            self.back_out.send(g, src, "gradient", loss, mb, step, ack=self.acts[src].taken)
        if self.weights.updates_per_backward:  # after the send: the previous stage need not wait
            with self._compute("optimizer", mb, step, window):
                self.weights.after_backward(mb)
            self.meter.note(self.weights.stash_bytes())
        return loss

    def _backward_input(self, mb: int, step: int, window: Window, inp: torch.Tensor, out: torch.Tensor,
                        grad: torch.Tensor | None, loss: float) -> float:
        """B of a split backward: the input's gradient only, sent at once; W follows later."""
        with self._compute("backward", mb, step, window):
            if grad is None:  # the last stage: this micro-batch's share of the mini-batch loss
                grad = self.amp.scale(torch.full_like(out, self.spec.loss_scale))
            g = backward_input(self.graphs[mb], grad)
        if self.acts:
            g = g if g is not None else torch.zeros_like(inp)
            src = peer(self.spec.prev_ranks, mb)
            self.back_out.send(g, src, "gradient", loss, mb, step, ack=self.acts[src].taken)
        return loss

    def _weight(self, mb: int, feed: Feed, window: Window) -> None:
        """W of a split backward: the weight gradients, into ``.grad`` (summed with the others')."""
        step = feed.step(mb)
        with self._compute("weight", mb, step, window):
            backward_weight(self.graphs.pop(mb))
        self.meter.release((self.spec.stage, mb))

    @torch.no_grad()
    def infer(self, x: torch.Tensor) -> torch.Tensor | None:
        """Forward of one evaluation batch through this stage (``eval_activation`` messages, sent
        and received whole: an evaluation batch has its own row count). Stage 0 reads ``x``; the
        last stage returns its output, the others None. Stages must not be replicated."""
        spec, rec = self.spec, self.ctx.recorder
        if spec.in_meta is not None:
            x = torch.empty((x.shape[0], *spec.in_meta.shape[1:]), dtype=spec.in_meta.dtype,
                            device=self.ctx.device)
            with rec.span("recv", "comm", stage=spec.stage, kind="eval_activation"):
                self.back_comm.recv(x, spec.prev_ranks[0], op="eval_activation")
        with rec.span("eval_forward", "eval", stage=spec.stage):
            out: torch.Tensor = spec.module(x)
        if not spec.next_ranks:
            return out
        with rec.span("send", "comm", stage=spec.stage, kind="eval_activation"):
            self.fwd_comm.send(out.contiguous(), spec.next_ranks[0], op="eval_activation")
        return None

    def _trace(self, phase: str, mb: int, step: int) -> None:
        """Which weight version ``phase`` of ``mb`` runs on, with checksums of the tensors used."""
        if not self.spec.trace_versions:
            return
        used = self.weights.params_of(mb)
        live = dict(self.spec.module.named_parameters())
        self.ctx.recorder.emit(
            "version",
            stage=self.spec.stage,
            mb=mb,
            step=step,
            phase=phase,
            version=self.weights.version_of(mb),
            current=self.weights.version,
            used_sum=_checksum(live if used is None else used),
            live_sum=_checksum(live),
        )

    def metrics(self) -> dict[str, Any]:
        m = self.meter
        return {
            "peak_activation_bytes": m.peak_activation,
            "peak_memory_bytes": m.peak_total,
            "peak_in_flight": m.peak_in_flight,
            "peak_outstanding_sends": max(self.outbox.peak_outstanding, self.back_out.peak_outstanding),
        }


@torch.no_grad()
def _checksum(params: Mapping[str, torch.Tensor]) -> float:
    """A fingerprint of a set of weights: changes when any of them changes."""
    return float(sum(float(t.double().sum() + t.double().square().sum()) for t in params.values()))
