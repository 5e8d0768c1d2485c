"""``alexnet-2col``: the original two-column AlexNet split (Krizhevsky et al. 2012, fig. 2).

Two ranks, each one column: it holds half of every layer's kernels (output channels of each conv,
output neurons of each FC layer; ``alexnet_columns`` in the zoo states the plan) and sees the
whole global batch. The columns exchange activations only where the network crosses:

    conv1  conv2  ⇄  conv3  conv4  conv5  ⇄  fc1  ⇄  fc2  ⇄  fc3  ⇄ logits
    (image)(own)     (both) (own)  (own)     (both)   (both)   (both)

``⇄`` is an all-gather of the two halves along the channel/feature dimension; in backward each
column gets the sum of both columns' gradients for its half (a reduce-scatter), because each
column computed different outputs from the gathered input. The last gather assembles the logits,
on which both columns compute the same loss (its backward only takes the own half).

Equals single-process training of the same (grouped-conv) AlexNet: conv2/4/5 with groups=2 are
exactly two columns that do not look at each other.
"""

from __future__ import annotations

import torch
from torch import nn

from polytrain.config import JobConfig
from polytrain.errors import ConfigError
from polytrain.models.alexnet import ColumnLayer, alexnet_columns
from polytrain.models.layers import first_weight_layer
from polytrain.runtime.job import Job, RankContext, RankResult
from polytrain.runtime.loop import LoopSpec, plain_step, run_loop
from polytrain.runtime.supports import Supports
from polytrain.strategies.base import Strategy
from polytrain.strategies.model.shard import keep_out_rows, out_size, own_group_only
from polytrain.strategies.model.shard_collectives import Evaluating, Wire, gather, gather_state, shard_bounds


class Column(nn.Module):
    """One column: the AlexNet children cut to this column's rows, run with the exchanges.

    Children keep their names (``conv1``, … ``fc3``), so state_dict keys equal the full model's.
    (B, C, H, W) -> (B, classes) on both columns.
    """

    def __init__(self, model: nn.Sequential, wire: Wire) -> None:
        super().__init__()
        self.plan: tuple[ColumnLayer, ...] = alexnet_columns(model)
        self.wire = wire
        self.sizes: list[list[int]] = []  # per child: output rows of column 0 and column 1
        for layer in self.plan:
            child = model.get_submodule(layer.child)
            found = first_weight_layer(child)
            if found is None:
                raise ConfigError(f"alexnet-2col: child '{layer.child}' has no conv or linear layer")
            _, weight = found
            bounds = shard_bounds(out_size(weight), 2)
            self.sizes.append([b - a for a, b in bounds])
            keep_out_rows(weight, bounds[wire.rank])
            if isinstance(weight, nn.Conv2d) and weight.groups == 2 and layer.reads == "own":
                own_group_only(weight)
            self.add_module(layer.child, child)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        prev: list[int] = []
        for layer, sizes in zip(self.plan, self.sizes, strict=True):
            if layer.reads == "both":
                # (B, rows/2, ...) on each column -> (B, rows, ...) on both
                x = gather(x, self.wire, 1, prev, split_consumer=True, op="exchange")
            x = getattr(self, layer.child)(x)
            prev = sizes
        return gather(x, self.wire, 1, prev, split_consumer=False, op="exchange")


class AlexNet2Col(Strategy):
    name = "alexnet-2col"
    supports = Supports(lr_schedule=True)
    family = "model"
    summary = "two-column AlexNet: half the kernels per rank, exchanges at conv3 and the FC layers"

    def check(self, cfg: JobConfig, world: int) -> None:
        if world != 2:
            raise ConfigError(
                f"Strategy '{self.name}' runs the two columns of AlexNet on exactly 2 processes "
                f"(got --procs {world}). Fix: --procs 2."
            )
        if cfg.model != "alexnet":
            raise ConfigError(
                f"Strategy '{self.name}' splits AlexNet into its two columns, not --model "
                f"{cfg.model}. Fix: --model alexnet (e.g. --dataset synthetic-images, or digits "
                "with --set model.width=12)."
            )

    def run(self, job: Job, ctx: RankContext) -> RankResult:
        full = job.build_model().to(ctx.device)
        shapes = {k: v.shape for k, v in full.state_dict().items()}
        wire = Wire(ctx.comm, ctx.recorder)
        column = Column(full, wire)
        optimizer = job.make_optimizer(column.parameters())
        spec = LoopSpec(model=column, optimizer=optimizer, step_fn=plain_step(job, ctx, column, optimizer),
                        replicated=False, eval_model=Evaluating(column, wire))
        result = run_loop(job, ctx, spec)
        state = gather_state(wire, column.state_dict(), dict.fromkeys(shapes, 0), shapes)
        result.model_state = state if ctx.is_leader else None
        result.strategy_metrics.update({
            "columns": 2,
            "exchange_points": [layer.child for layer in column.plan if layer.reads == "both"],
            "exchange_collectives_per_step": wire.calls.get("exchange", 0) / max(result.steps, 1),
        })
        return result
