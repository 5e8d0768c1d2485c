"""A pipeline inside another strategy: one flush step at a time through the one executor.

``layerwise`` (a pipeline with one micro-batch), ``mesh`` dp × pp (one pipeline per replica) and
``distbelief`` (a model-parallel replica per parameter-server client) cut the model into
consecutive stages over a list of ranks and run each step as a flush schedule — ``gpipe``,
``1f1b`` or ``zb-h1`` (its W actions run the split backward), the same `schedule.stage_orders`
data the pipeline strategies and the planner use — through `executor.StageExecutor` and its
`activations_wire`. What happens at the flush is the caller's: ``layerwise`` steps its optimizer, ``mesh``
all-reduces the stage gradients across replicas first, ``distbelief`` pushes them to its stage's
servers instead. Weights tied across stages have their gradient summed over those stages at the
flush (`ties`); distbelief refuses them.

A step's batch (B rows) is split into M equal micro-batches; micro-batch m's loss is its mean
scaled by 1/M, so the accumulated gradients equal one full-batch backward and the step loss is
the mean of the M losses (every stage learns them: they travel with the gradients).

Evaluation is a pipelined forward (`Pipelined`): every stage calls it with the same batch, the
executor moves the activations (``eval_activation``) and the last stage broadcasts the logits
(``eval_logits``) over the pipeline's group.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch
from torch import nn

from polytrain.comm import Comm
from polytrain.errors import ConfigError
from polytrain.models.boundaries import boundary_metas
from polytrain.models.partition import Partition, balanced, check_cuttable, cut, uniform
from polytrain.runtime.job import Job, RankContext
from polytrain.runtime.loop import StepFn
from polytrain.runtime.precision import SKIPPED, Precision
from polytrain.schedules.checks import dry_run, validate
from polytrain.schedules.registry import stage_orders
from polytrain.strategies.pipeline.activations_wire import gather_stages
from polytrain.strategies.pipeline.executor import StageExecutor, StageSpec
from polytrain.strategies.pipeline.ties import TiedGrads, find_ties
from polytrain.strategies.pipeline.weights import FlushWeights

PLANNERS = ("uniform", "params")


def plan(text: str, model: nn.Sequential, stages: int) -> Partition:
    """The partition named by ``text``: uniform layer counts, balanced parameter counts, or
    explicit counts ("2,3")."""
    layers = check_cuttable(model, stages)
    if text == "uniform":
        return uniform(layers, stages)
    if text == "params":
        return balanced([float(sum(p.numel() for p in c.parameters())) for c in model.children()],
                        stages)
    partition = Partition.parse(text)
    partition.check(layers, stages)
    return partition


class StepFeed:
    """One step's micro-batches (equal row counts) as the executor's `Feed`."""

    def __init__(self, step: int, x: torch.Tensor, y: torch.Tensor, parts: int) -> None:
        self._step, self.xs, self.ys = step, x.chunk(parts), y.chunk(parts)

    def step(self, mb: int) -> int:
        return self._step

    def inputs(self, mb: int) -> torch.Tensor:
        return self.xs[mb]

    def target(self, mb: int) -> torch.Tensor:
        return self.ys[mb]


class FlushPipeline:
    """This rank's stage of the pipeline over ``ranks`` (global ranks, stage order).

    ``group``: the communicator of exactly those ranks (group rank = stage), for the evaluation
    logits and the final gather. ``rows``: the rows of one step's batch on this pipeline.
    ``shard``: splits this rank's stage in place before its optimizer is made (tensor parallelism
    inside the stage; the boundary activations stay whole).
    """

    def __init__(self, job: Job, ctx: RankContext, ranks: Sequence[int], group: Comm,
                 partition: str, schedule: str, microbatches: int, rows: int,
                 optimizer: bool = True, pipelines: Sequence[Sequence[int]] | None = None,
                 shard: Callable[[nn.Module], None] | None = None) -> None:
        full = job.build_model().to(ctx.device)
        state = full.state_dict()
        count, index = len(ranks), list(ranks).index(ctx.rank)
        self.partition = plan(partition, full, count)
        sample = job.dataset.x_train[: rows // microbatches].to(ctx.device)
        metas = boundary_metas(full, sample)
        pieces = cut(full, self.partition)
        if shard is not None:  # mesh dp × pp × tp: this stage's layers split over its tensor group
            shard(pieces[index])
        a, b = self.partition.bounds[index]
        self.module, self.index, self.count, self.group = pieces[index], index, count, group
        self.microbatches, self.schedule = microbatches, schedule
        self.spec = StageSpec(
            stage=index, stages=count, module=self.module,
            prev_ranks=(ranks[index - 1],) if index > 0 else (),
            next_ranks=(ranks[index + 1],) if index < count - 1 else (),
            in_meta=metas[a - 1] if index > 0 else None,
            out_meta=metas[b - 1] if index < count - 1 else None,
            loss_scale=1.0 / microbatches,
        )
        self.logits_shape, self.logits_dtype = tuple(metas[-1].shape[1:]), metas[-1].dtype
        self.optimizer = job.make_optimizer(self.module.parameters()) if optimizer else None
        self.weights = FlushWeights(self.module, self.optimizer)
        ties = find_ties(full, pieces)
        if ties:  # collective over every pipeline (``pipelines``: all of them, default this one)
            if not optimizer:
                raise ConfigError("The caller updates this pipeline's stages elsewhere, so tied "
                                  f"weights {'; '.join(' = '.join(t.names) for t in ties)} would drift.")
            self.weights.tied = TiedGrads(ctx.comm, self.module, ties, pipelines or [ranks], index)
        # every pipeline's stages hold the gradient; each pipeline (mesh: a data-parallel
        # replica) holds all of it once its replicas have all-reduced
        self.weights.clip_by(job.config.clip_grad_norm, ctx.comm, len(pipelines or [ranks]))
        if optimizer:  # distbelief's servers update: it runs fp32 (refused before launch)
            self.weights.mixed(Precision(job.config.precision, ctx.device), ctx.comm)
        self.executor = StageExecutor(job, ctx, self.spec, self.weights)
        orders = stage_orders(schedule, count, microbatches)
        validate(orders, count, microbatches)
        dry_run(orders)
        self.order = orders[index]
        self.recorder = ctx.recorder
        self.keys_by_stage = [list(p.state_dict()) for p in pieces]
        self.shapes = {k: v.shape for k, v in state.items()}
        self.dtypes = {k: v.dtype for k, v in state.items()}

    def run(self, step: int, x: torch.Tensor, y: torch.Tensor) -> float:
        """Forward and backward of one batch (gradients in ``.grad``); returns its mean loss."""
        losses: list[float] = []
        feed = StepFeed(step, x, y, self.microbatches)
        self.executor.run(self.order, feed, lambda _mb, loss: losses.append(loss))
        return sum(losses) / self.microbatches

    def train_step(self, before_update: Callable[[], None] | None = None) -> StepFn:
        """The loop's step: run the batch, then at the flush ``before_update`` and the update."""

        def step(i: int, x: torch.Tensor, y: torch.Tensor) -> float:
            loss = self.run(i, x, y)
            if before_update is not None:
                before_update()
            with self.recorder.span("optimizer", "compute", stage=self.index, step=i):
                if not self.weights.end_segment():  # on every rank alike (agreed overflow)
                    self.recorder.emit("skipped", step=i, reason=SKIPPED)
            return loss

        step.precision = self.weights.amp  # type: ignore[attr-defined]  # the loop checkpoints it
        return step

    def infer(self, x: torch.Tensor) -> torch.Tensor:
        """The logits of ``x`` on every stage (all stages call it with the same batch)."""
        out = self.executor.infer(x)
        if out is None:
            out = torch.empty((x.shape[0], *self.logits_shape), dtype=self.logits_dtype,
                              device=x.device)
        self.group.broadcast(out, self.count - 1, op="eval_logits")
        return out

    def gather(self) -> dict[str, torch.Tensor] | None:
        """Every stage's parameters at the pipeline's first rank; None elsewhere."""
        return gather_stages(self.group, self.index, self.module.state_dict(), self.keys_by_stage,
                             self.shapes, self.dtypes)


class Inferring(Protocol):
    """A rank's part of a pipeline that answers a pipelined forward (`FlushPipeline`,
    `chunks.ChunkPipeline`)."""

    @property
    def module(self) -> nn.Module: ...

    def infer(self, x: torch.Tensor) -> torch.Tensor: ...


class Pipelined(nn.Module):
    """A stage as a module for ``Job.evaluate``: every stage of the pipeline calls it together."""

    def __init__(self, pipe: Inferring) -> None:
        super().__init__()
        self.pipe = pipe
        self.layers = pipe.module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pipe.infer(x)
