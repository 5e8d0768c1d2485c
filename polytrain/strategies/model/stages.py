"""One stage of a model cut into consecutive layers: executes a flush schedule's actions.

The cut is the pipeline family's (`polytrain.plan.partition.cut`) and the order of work is one of
its schedules (`polytrain.strategies.pipeline.schedule`: ``0F0 0F1 … 0B1 0B0``). ``layerwise`` is
the schedule with one micro-batch — F0 then B0 on every stage, one stage busy at a time; ``mesh``
with ``pp`` runs ``gpipe`` / ``1f1b`` over several micro-batches on each replica of the pipeline.

Stage s (of P, group-local rank s of ``comm``) for micro-batch m of r_m rows:

    F m: x_m = batch rows (s = 0) or recv (r_m, *in_shape) from s−1; out = layers(x_m);
         s < P−1: isend out to s+1;  s = P−1: loss_m = loss(out, y_m) · r_m / B
    B m: s = P−1: loss_m.backward();  else recv d(out) from s+1, out.backward(d(out));
         s > 0: isend d(x_m) to s−1

Σ_m loss_m is the mean loss over the whole batch, so the accumulated gradients equal one
full-batch backward. Activation shapes are probed once on one training sample (batch dim first).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from polytrain.comm import Comm
from polytrain.runtime.recorder import Recorder
from polytrain.strategies.model.wire import shard_bounds
from polytrain.strategies.pipeline.actions import Action

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class TensorSpec:
    """An activation's shape without the batch dimension, and its dtype."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    def empty(self, rows: int) -> torch.Tensor:
        return torch.empty((rows, *self.shape), dtype=self.dtype)


@torch.no_grad()
def probe(children: Sequence[nn.Module], sample: torch.Tensor) -> list[TensorSpec]:
    """Output spec of every child, from one sample (1, ...) run through them."""
    specs, x = [], sample
    for child in children:
        x = child(x)
        specs.append(TensorSpec(tuple(x.shape[1:]), x.dtype))
    return specs


@dataclass
class Stage:
    """This rank's layers and its neighbours in the pipeline (group-local ranks of ``comm``)."""

    layers: nn.Module
    index: int
    count: int
    comm: Comm
    recorder: Recorder
    in_spec: TensorSpec | None  # None on stage 0 (it reads the batch)
    out_spec: TensorSpec
    logits_spec: TensorSpec  # the last stage's output
    loss_fn: LossFn
    _pending: list[Any] = field(default_factory=list)

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == self.count - 1

    def _recv(self, spec: TensorSpec, rows: int, src: int, op: str) -> torch.Tensor:
        buf = spec.empty(rows)
        with self.recorder.span(f"recv_{op}", cat="comm"):
            self.comm.recv(buf, src, op=op)
        return buf

    def _isend(self, t: torch.Tensor, dst: int, op: str) -> None:
        t = t.detach().contiguous()
        self._pending.append((self.comm.isend(t, dst, op=op), t))  # keep t alive until sent

    def _input(self, x: torch.Tensor | None, rows: int) -> torch.Tensor:
        if self.first:
            assert x is not None
            return x
        assert self.in_spec is not None
        inp = self._recv(self.in_spec, rows, self.index - 1, "activation")
        return inp.requires_grad_(inp.is_floating_point() and torch.is_grad_enabled())

    def run(self, actions: Sequence[Action], xs: Sequence[torch.Tensor] | None,
            ys: Sequence[torch.Tensor] | None, rows: Sequence[int], step: int) -> float:
        """Execute this stage's ``actions`` for one mini-batch split into ``rows`` micro-batches;
        returns the mini-batch's mean loss on the last stage (0.0 elsewhere)."""
        total = sum(rows)
        inputs: dict[int, torch.Tensor] = {}
        outputs: dict[int, torch.Tensor] = {}
        loss_sum = 0.0
        for a in actions:
            m = a.microbatch
            if a.op == "F":
                inputs[m] = self._input(xs[m] if xs is not None else None, rows[m])
                with self.recorder.span("forward", step=step, mb=m):
                    out = self.layers(inputs[m])
                    if self.last:
                        assert ys is not None
                        out = self.loss_fn(out, ys[m]) * (rows[m] / total)
                        loss_sum += float(out.detach())
                outputs[m] = out
                if not self.last:
                    self._isend(out, self.index + 1, "activation")
            elif a.op == "B":
                grad = None if self.last else self._recv(self.out_spec, rows[m], self.index + 1, "gradient")
                with self.recorder.span("backward", step=step, mb=m):
                    outputs.pop(m).backward(grad)
                inp = inputs.pop(m)
                if not self.first and inp.grad is not None:
                    self._isend(inp.grad, self.index - 1, "gradient")
            else:
                raise ValueError(f"stage runtime cannot run action {a} (split backward)")
        self.flush()
        return loss_sum

    def flush(self) -> None:
        """Wait for every send still in flight."""
        with self.recorder.span("send_wait", cat="comm"):
            for work, _ in self._pending:
                work.wait()
        self._pending.clear()

    @torch.no_grad()
    def infer(self, x: torch.Tensor) -> torch.Tensor:
        """Forward of one batch through the whole pipeline; every stage returns the logits
        (the last stage broadcasts them: evaluation traffic, ``eval_*`` ops)."""
        rows = x.shape[0]
        inp = x if self.first else self._input(None, rows)
        with self.recorder.span("eval_forward", cat="eval"):
            out = self.layers(inp)
        if not self.last:
            self._isend(out, self.index + 1, "eval_activation")
            out = self.logits_spec.empty(rows)
        self.flush()
        self.comm.broadcast(out, self.count - 1, op="eval_logits")
        return out


def split_rows(x: torch.Tensor, parts: int) -> tuple[list[torch.Tensor], list[int]]:
    """Micro-batches of ``x`` along dim 0 (the first ``B % parts`` one row longer) and their sizes."""
    bounds = shard_bounds(x.shape[0], parts)
    return [x[a:b] for a, b in bounds], [b - a for a, b in bounds]


class Pipelined(nn.Module):
    """A stage as a module for ``Job.evaluate``: every stage of the pipeline calls it together."""

    def __init__(self, stage: Stage) -> None:
        super().__init__()
        self.stage = stage
        self.layers = stage.layers

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stage.infer(x)


def gather_stages(comm: Comm, index: int, state: dict[str, torch.Tensor],
                  keys_by_stage: Sequence[Sequence[str]], shapes: dict[str, torch.Size],
                  dtypes: dict[str, torch.dtype]) -> dict[str, torch.Tensor] | None:
    """Every stage's parameters at stage 0 (p2p, ``gather_model`` bytes); None elsewhere."""
    if index != 0:
        for key in keys_by_stage[index]:
            comm.send(state[key].detach().contiguous(), 0, op="gather_model")
        return None
    full = {k: state[k].detach().clone() for k in keys_by_stage[0]}
    for s in range(1, len(keys_by_stage)):
        for key in keys_by_stage[s]:
            buf = torch.empty(shapes[key], dtype=dtypes[key])
            comm.recv(buf, s, op="gather_model")
            full[key] = buf
    return full
