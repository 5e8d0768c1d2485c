"""The three tiers of ``ddnn`` as ranks: what each computes and sends, in training and inference.

Messages (ops), B rows of a batch, k classes, device e's features (c, H, w_e):

    training   device e → edge   f_e (B, c, H, w_e) "features", s_e (B, k) "scores"
               edge → cloud      g (B, 2c, h, w) "features"
               cloud → edge      d(g) "grad_features";  edge → device e  d(f_e) "grad_features",
                                                                          d(s_e) "grad_scores"
    inference  device e → edge   s_e (B, k) "eval_scores"
               edge → device e   row mask (B,) uint8 "eval_mask" (the samples the local exit kept)
               device e → edge   f_e of those rows "eval_features"
               edge → cloud      row count (1,) "eval_count", g of the rows still unsure
                                 "eval_features";  cloud → edge  their logits "eval_logits"
               edge → all        every sample's final logits "eval_result" (bookkeeping for the
                                 accuracy, not part of DDNN's traffic)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from polytrain.runtime.job import Job, RankContext
from polytrain.strategies.hybrid.ddnn_net import TIERS, aggregate, build_ddnn, exits_here, strips

CLOUD, EDGE = 0, 1


@dataclass
class TierSetup:
    """Everything every tier agrees on: the whole network, the strips, the shapes."""

    job: Job
    ctx: RankContext
    net: nn.ModuleDict
    devices: int
    strips: list[tuple[int, int]]
    weights: tuple[float, float, float]
    aggregation: str
    threshold: float
    feature_shapes: list[tuple[int, ...]]  # per device (c, H, w_e)
    edge_shape: tuple[int, ...]  # g without the batch dim
    keys: list[list[str]] = field(default_factory=list)  # state keys per rank
    shapes: dict[str, torch.Size] = field(default_factory=dict)
    dtypes: dict[str, torch.dtype] = field(default_factory=dict)

    @classmethod
    def make(cls, job: Job, ctx: RankContext, channels: int, hidden: int,
             weights: tuple[float, float, float], aggregation: str, threshold: float) -> TierSetup:
        devices = ctx.world - 2
        torch.manual_seed(job.config.seed)
        net = build_ddnn(job.spec, devices, channels, hidden)
        cols = strips(job.spec.input_shape[2], devices)
        sample = job.dataset.x_train[:1]
        with torch.no_grad():
            feats = [net[f"device{e}"](sample[..., a:b])[0] for e, (a, b) in enumerate(cols)]
            g, _ = net["edge"](torch.cat(feats, dim=3))
        names = ["cloud", "edge", *[f"device{e}" for e in range(devices)]]
        state = net.state_dict()
        keys = [[k for k in state if k.split(".", 1)[0] == n] for n in names]
        return cls(job, ctx, net, devices, cols, weights, aggregation, threshold,
                   [tuple(f.shape[1:]) for f in feats], tuple(g.shape[1:]), keys,
                   {k: v.shape for k, v in state.items()}, {k: v.dtype for k, v in state.items()})


class Tier:
    """One rank's part of the network and its side of the message exchange."""

    part = ""

    def __init__(self, setup: TierSetup) -> None:
        self.s, self.ctx = setup, setup.ctx
        self.module = nn.ModuleDict({self.part: setup.net[self.part]})
        self.missing: set[int] = set()
        self.sends: list[tuple[Any, torch.Tensor]] = []

    def isend(self, t: torch.Tensor, dst: int, op: str) -> None:
        t = t.detach().contiguous()
        self.sends.append((self.ctx.comm.isend(t, dst, op=op), t))

    def recv(self, shape: tuple[int, ...], src: int, op: str,
             dtype: torch.dtype = torch.float32) -> torch.Tensor:
        buf = torch.empty(shape, dtype=dtype)
        with self.ctx.recorder.span(f"recv_{op}", cat="comm"):
            self.ctx.comm.recv(buf, src, op=op)
        return buf

    def settle(self) -> None:
        for w, _ in self.sends:
            w.wait()
        self.sends.clear()

    def train_step(self, x: torch.Tensor, y: torch.Tensor, step: int) -> float:
        raise NotImplementedError

    def answer(self, x: torch.Tensor) -> torch.Tensor | None:
        """This tier's inference work for batch x; the edge returns the final logits."""
        raise NotImplementedError

    @torch.no_grad()
    def infer(self, x: torch.Tensor) -> torch.Tensor:
        out = self.answer(x)
        self.settle()
        if out is None:
            out = torch.empty(x.shape[0], self.s.job.spec.num_classes)
        self.ctx.comm.broadcast(out, EDGE, op="eval_result")
        return out

    def take_stats(self) -> dict[str, Any]:
        return {}


class DeviceTier(Tier):
    def __init__(self, setup: TierSetup) -> None:
        self.index = setup.ctx.rank - 2
        self.part = f"device{self.index}"
        super().__init__(setup)

    def view(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.s.strips[self.index]
        return x[..., a:b]

    def train_step(self, x: torch.Tensor, y: torch.Tensor, step: int) -> float:
        with self.ctx.recorder.span("forward", step=step):
            f, s = self.module[self.part](self.view(x))
        self.isend(f, EDGE, "features")
        self.isend(s, EDGE, "scores")
        gf = self.recv(tuple(f.shape), EDGE, "grad_features")
        gs = self.recv(tuple(s.shape), EDGE, "grad_scores")
        with self.ctx.recorder.span("backward", step=step):
            torch.autograd.backward([f, s], [gf, gs])
        self.settle()
        return 0.0

    def answer(self, x: torch.Tensor) -> None:
        if self.index in self.missing:
            return None
        f, s = self.module[self.part](self.view(x))
        self.isend(s, EDGE, "eval_scores")
        mask = self.recv((x.shape[0],), EDGE, "eval_mask", torch.uint8).bool()
        if mask.any():
            self.isend(f[mask], EDGE, "eval_features")
        return None


class CloudTier(Tier):
    part = "cloud"

    def train_step(self, x: torch.Tensor, y: torch.Tensor, step: int) -> float:
        g = self.recv((x.shape[0], *self.s.edge_shape), EDGE, "features").requires_grad_()
        with self.ctx.recorder.span("forward", step=step):
            loss = self.s.weights[2] * self.s.job.loss(self.module["cloud"](g), y)
        with self.ctx.recorder.span("backward", step=step):
            loss.backward()
        self.isend(g.grad if g.grad is not None else torch.zeros_like(g), EDGE, "grad_features")
        self.settle()
        return float(loss.detach())

    def answer(self, x: torch.Tensor) -> None:
        (rows,) = self.recv((1,), EDGE, "eval_count", torch.int64).tolist()
        if rows:
            g = self.recv((rows, *self.s.edge_shape), EDGE, "eval_features")
            self.isend(self.module["cloud"](g), EDGE, "eval_logits")
        return None


class EdgeTier(Tier):
    part = "edge"

    def __init__(self, setup: TierSetup) -> None:
        super().__init__(setup)
        self._reset()

    def _reset(self) -> None:
        self.offset = 0  # position in the test set (Job.evaluate walks it in order)
        self.count = [0, 0, 0]
        self.correct = [0, 0, 0]

    def _device(self, e: int) -> int:
        return 2 + e

    def train_step(self, x: torch.Tensor, y: torch.Tensor, step: int) -> float:
        rows, k, s = x.shape[0], self.s.job.spec.num_classes, self.s
        feats = [self.recv((rows, *s.feature_shapes[e]), self._device(e), "features").requires_grad_()
                 for e in range(s.devices)]
        scores = [self.recv((rows, k), self._device(e), "scores").requires_grad_() for e in range(s.devices)]
        with self.ctx.recorder.span("forward", step=step):
            local = s.job.loss(aggregate(scores, s.aggregation), y)
            g, logits = self.module["edge"](torch.cat(feats, dim=3))
            loss = s.weights[0] * local + s.weights[1] * s.job.loss(logits, y)
        self.isend(g, CLOUD, "features")
        gg = self.recv(tuple(g.shape), CLOUD, "grad_features")
        with self.ctx.recorder.span("backward", step=step):
            torch.autograd.backward([loss, g], [torch.ones(()), gg])
        for e in range(s.devices):
            for t, op in ((feats[e], "grad_features"), (scores[e], "grad_scores")):
                self.isend(t.grad if t.grad is not None else torch.zeros_like(t), self._device(e), op)
        self.settle()
        return float(loss.detach())

    def answer(self, x: torch.Tensor) -> torch.Tensor:
        s, rows = self.s, x.shape[0]
        present = [e for e in range(s.devices) if e not in self.missing]
        scores = [self.recv((rows, s.job.spec.num_classes), self._device(e), "eval_scores") for e in present]
        final = aggregate(scores, s.aggregation)  # the local exit's logits for every sample
        need = ~exits_here(final, s.threshold)
        for e in present:
            self.isend(need.to(torch.uint8), self._device(e), "eval_mask")
        exit_at = torch.zeros(rows, dtype=torch.int64)  # 0 local, 1 edge, 2 cloud
        n = int(need.sum())
        if n:
            feats = [self.recv((n, *s.feature_shapes[e]), self._device(e), "eval_features")
                     if e in present else torch.zeros(n, *s.feature_shapes[e]) for e in range(s.devices)]
            g, logits = self.module["edge"](torch.cat(feats, dim=3))
            rows_needed = need.nonzero().squeeze(1)
            final[rows_needed] = logits
            exit_at[rows_needed] = 1
            unsure = ~exits_here(logits, s.threshold)
            self._cloud(g[unsure], rows_needed[unsure], final, exit_at)
        else:
            self._cloud(torch.empty(0, *s.edge_shape), torch.empty(0, dtype=torch.int64), final, exit_at)
        self._score(final, exit_at)
        return final

    def _cloud(self, g: torch.Tensor, rows: torch.Tensor, final: torch.Tensor, exit_at: torch.Tensor) -> None:
        self.isend(torch.tensor([g.shape[0]], dtype=torch.int64), CLOUD, "eval_count")
        if g.shape[0]:
            self.isend(g, CLOUD, "eval_features")
            final[rows] = self.recv((g.shape[0], final.shape[1]), CLOUD, "eval_logits")
            exit_at[rows] = 2

    def _score(self, final: torch.Tensor, exit_at: torch.Tensor) -> None:
        if self.offset >= self.s.job.dataset.y_test.shape[0]:
            self._reset()  # a new pass over the test set: the stats describe the latest one
        y = self.s.job.dataset.y_test[self.offset : self.offset + final.shape[0]]
        self.offset += final.shape[0]
        hit = final.argmax(dim=1) == y
        for t in range(3):
            here = exit_at == t
            self.count[t] += int(here.sum())
            self.correct[t] += int((hit & here).sum())

    def take_stats(self) -> dict[str, Any]:
        total = max(1, sum(self.count))
        out = {"fractions": {n: c / total for n, c in zip(TIERS, self.count, strict=True)},
               "accuracy": {n: (r / c if c else None)
                            for n, r, c in zip(TIERS, self.correct, self.count, strict=True)}}
        self._reset()
        return out
