"""``owt``: Krizhevsky's "one weird trick" (2014; 000 §V, 004 §2.3) — convolutional layers
data-parallel, fully connected layers model-parallel.

The convolutions hold ~5% of the parameters and ~95% of the compute, the FC layers the reverse
(004 §2.3). So each of the W ranks keeps a replica of the conv layers and runs them on its B/W
samples, and holds 1/W of every FC layer's output neurons, which it computes for all B samples:

    x[rank's B/W] ─ conv (replica) ─ all-gather over the batch ─ (B, C, h, w) on every rank
      ─ fc1 rows/W ─ all-gather features ─ fc2 rows/W ─ … ─ fcN rows/W ─ all-gather ─ (B, k) logits

Backward mirrors it: each gather's gradient is reduce-scattered (every rank's FC slice
contributed to every sample's gradient), so each rank receives the conv-output gradient of its own
samples; the conv replicas then all-reduce (sum) their gradients, as in data parallelism — but
only the small conv part of the model travels, not the FC weights.

Every rank computes the same loss on the gathered (B, k) logits; it reads the whole global batch
and runs its conv replica on its rows [r·B/W, (r+1)·B/W) of it (uneven splits are allowed).
Equals single-process training of the same network.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

from polytrain.config import JobConfig
from polytrain.data import dataset_spec
from polytrain.errors import ConfigError
from polytrain.models.layers import fully_connected, trailing_fc_start
from polytrain.runtime.job import Job, RankContext, RankResult
from polytrain.runtime.loop import LoopSpec, StepFn, run_loop
from polytrain.runtime.supports import Supports
from polytrain.strategies.base import Offer, Strategy
from polytrain.strategies.model.shard import keep_out_rows, out_size
from polytrain.strategies.model.shard_collectives import (
    Evaluating,
    Wire,
    all_reduce_grads,
    gather,
    gather_state,
    shard_bounds,
)
from polytrain.strategies.pipeline.options import meta_model

if TYPE_CHECKING:
    from polytrain.cost.scene import Estimate, Scene


def fc_start(model: nn.Module) -> int:
    """Index of the first child of the trailing run of fully connected children (`fully_connected`)."""
    start = trailing_fc_start(model)
    if start == len(list(model.children())):
        raise ConfigError(
            "Strategy 'owt' makes the fully connected layers at the end of the model "
            "model-parallel, but the model's last child is not one: a child whose only weights are "
            "one nn.Linear's (beside activations, dropout or a flatten); a model that is not an "
            "nn.Sequential is one child, which owt cannot cut. Fix: use an nn.Sequential ending in such "
            "layers (vgg16, alexnet, cnn, mlp), or another strategy (allreduce; tensor for "
            "transformer blocks)."
        )
    return start


def check_fc_outputs(model: nn.Module, first_fc: int, input_shape: tuple[int, ...]) -> None:
    """Each fully connected child must output (B, features): owt gathers their outputs along dim 1.
    Checked on the meta device with a batch of 2 float samples; a model that cannot run on it (token
    inputs) is left to the ranks."""
    outputs: list[tuple[nn.Module, torch.Size]] = []  # each child's, as far as meta floats run
    try:
        h = torch.empty((2, *input_shape), device="meta")
        for child in model.children():
            h = child(h)
            outputs.append((child, h.shape))
    except Exception:  # not runnable on meta floats (token inputs): the ranks will see
        pass
    for i, (child, shape) in enumerate(outputs):
        if i >= first_fc and len(shape) != 2:
            raise ConfigError(
                f"Strategy 'owt' gathers each fully connected layer's output along its feature "
                f"dimension, but child {i} ({type(child).__name__}) outputs "
                f"{tuple(shape[1:])} per sample, not one vector. Fix: flatten before the "
                "fully connected layers, or use another strategy (allreduce)."
            )


class OwtNet(nn.Module):
    """Conv children (replicated) then FC children cut to this rank's rows; names kept.

    forward: (B, ...) the whole batch -> (B, classes) on every rank.
    """

    def __init__(self, model: nn.Sequential, wire: Wire) -> None:
        super().__init__()
        self.wire = wire
        self.first_fc = fc_start(model)
        self.fc_sizes: list[list[int]] = []
        self.shard_dims: dict[str, int] = {}
        for i, (name, child) in enumerate(model.named_children()):
            if i >= self.first_fc:
                found = fully_connected(child)
                assert found is not None  # fc_start checked it
                path, linear = found
                bounds = shard_bounds(out_size(linear), wire.size)
                self.fc_sizes.append([b - a for a, b in bounds])
                keep_out_rows(linear, bounds[wire.rank])
                prefix = f"{name}.{path}" if path else name
                self.shard_dims[f"{prefix}.weight"] = 0
                if linear.bias is not None:
                    self.shard_dims[f"{prefix}.bias"] = 0
            self.add_module(name, child)

    def conv_parameters(self) -> list[nn.Parameter]:
        return [p for c in list(self.children())[: self.first_fc] for p in c.parameters()]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        children = list(self.children())
        rows = [b - a for a, b in shard_bounds(x.shape[0], self.wire.size)]
        start = sum(rows[: self.wire.rank])
        h = x[start : start + rows[self.wire.rank]]
        for child in children[: self.first_fc]:
            h = child(h)  # (B/W, C, h, w): data-parallel part
        h = gather(h, self.wire, 0, rows, split_consumer=True, op="owt_gather")  # (B, C, h, w)
        prev: list[int] = []
        for child, sizes in zip(children[self.first_fc :], self.fc_sizes, strict=True):
            if prev:
                h = gather(h, self.wire, 1, prev, split_consumer=True, op="owt_gather")
            h = child(h)  # (B, out/W)
            prev = sizes
        return gather(h, self.wire, 1, prev, split_consumer=False, op="owt_gather")


def owt_step(job: Job, ctx: RankContext, net: OwtNet, wire: Wire,
             optimizer: torch.optim.Optimizer) -> StepFn:
    rec = ctx.recorder
    conv = net.conv_parameters()

    def step(i: int, x: torch.Tensor, y: torch.Tensor) -> float:
        x, y = x.to(ctx.device), y.to(ctx.device)
        optimizer.zero_grad(set_to_none=True)
        with rec.span("forward", step=i):
            loss = job.loss(net(x), y)
        with rec.span("backward", step=i):
            loss.backward()
        all_reduce_grads(conv, wire, "allreduce", mean=False)
        with rec.span("optimizer", step=i):
            optimizer.step()
        return float(loss.detach())

    return step


class Owt(Strategy):
    name = "owt"
    supports = Supports(lr_schedule=True)
    family = "hybrid"
    exact = True
    summary = "one weird trick: conv layers data-parallel, FC layers model-parallel"

    @classmethod
    def offers(cls, scene: Scene) -> Iterator[Offer]:
        w = scene.cluster.world
        if w >= 2 and scene.profile.fc_start is not None and scene.profile.task == "classify":
            yield w, {}

    def price(self, scene: Scene, world: int) -> Estimate | str:
        from polytrain.cost import estimate as est

        return est.owt(scene, world)

    def check(self, cfg: JobConfig, world: int) -> None:
        """Refuse, before any process starts, a model owt cannot cut: no trailing fully connected
        children (a model that is not an nn.Sequential is one child), or FC outputs that are not one
        vector per sample."""
        model = meta_model(cfg)
        if model is None:  # a factory that cannot build on the meta device: the ranks check it
            return
        first = fc_start(model)
        check_fc_outputs(model, first, dataset_spec(cfg.dataset, cfg.data_options).input_shape)

    def run(self, job: Job, ctx: RankContext) -> RankResult:
        full = job.build_model().to(ctx.device)
        shapes = {k: v.shape for k, v in full.state_dict().items()}
        total = sum(p.numel() for p in full.parameters())
        wire = Wire(ctx.comm, ctx.recorder)
        net = OwtNet(full, wire)
        optimizer = job.make_optimizer(net.parameters())
        spec = LoopSpec(model=net, optimizer=optimizer, step_fn=owt_step(job, ctx, net, wire, optimizer),
                        replicated=False, eval_model=Evaluating(net, wire))
        result = run_loop(job, ctx, spec)
        state = gather_state(wire, net.state_dict(), net.shard_dims, shapes)
        result.model_state = state if ctx.is_leader else None
        conv = sum(p.numel() for p in net.conv_parameters())
        result.strategy_metrics.update({
            "data_parallel_children": [n for n, _ in list(full.named_children())[: net.first_fc]],
            "model_parallel_children": [n for n, _ in list(full.named_children())[net.first_fc :]],
            "conv_parameters": conv,
            "fc_parameters": total - conv,
        })
        return result
