"""Virtual stages: one rank runs V model chunks of a P·V-chunk pipeline, on the one executor.

The model is cut into C = P·V chunks (``virtual_stages=V``; ``partition=uniform`` needs V·P to
divide the layers, or give C layer counts); the rank at pipeline index i keeps the chunks the
schedule places on it (`schedule_virtual.chunk_rank`) and runs one `StageExecutor` per chunk,
dispatching each action of its order to the chunk it names. So F, B and W of a chunk are exactly
those of a one-chunk stage. `ChunkPipeline` is that rank's part: the virtual-stage strategies
(`virtual_run`, one pipeline over every rank) and ``mesh`` dp × pp (one pipeline per replica) run
it, with `flush.FlushPipeline`'s interface (``module``, ``optimizer``, ``train_step``, ``infer``,
``gather``).

Channels. Messages between two ranks travel on one FIFO stream per process group, and two chunks
of a rank may talk to the same neighbour rank (interleaving: every chunk boundary r → r+1); the
receiver would have to post its receives in the sender's global order. Instead every chunk
boundary c → c+1 gets its own two-rank process group, hence its own stream, and each chunk's
executor keeps today's FIFO channels on it. A boundary inside one rank (the turn of a V at rank
P−1) is a `LocalComm`: the message is a tensor handed over in memory.

Weights. The rank's chunks form one module (their layers under the model's own names) with one
optimizer and one flush (`FlushWeights`): the optimizers polytrain runs update each tensor from
its own gradient, so this steps exactly as one optimizer over the whole model, and a checkpoint is
that module's and that optimizer's state. A weight tied across chunks (nanoGPT's and GPT-2's
``wte``/``lm_head``) is one ``nn.Parameter`` on a rank holding several of its chunks (the rank
cuts them from one model, so the uses add into one ``.grad`` and the optimizer holds it once);
ranks holding it sum its gradient at the flush and take the same step (`ties.TiedGrads`).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from polytrain.comm import Comm, GroupComm
from polytrain.config import JobConfig
from polytrain.errors import ConfigError
from polytrain.models.boundaries import boundary_metas
from polytrain.models.partition import Partition, check_cuttable, cut, layers_of, uniform
from polytrain.runtime.job import Job, RankContext
from polytrain.runtime.loop import StepFn
from polytrain.schedules.registry import get_schedule
from polytrain.schedules.virtual import chunk_rank
from polytrain.strategies.pipeline.activations_wire import gather_stages
from polytrain.strategies.pipeline.executor import StageExecutor, StageSpec
from polytrain.strategies.pipeline.flush import StepFeed
from polytrain.strategies.pipeline.meter import MemoryMeter, Window
from polytrain.strategies.pipeline.options import meta_model
from polytrain.strategies.pipeline.ties import TiedGrads, find_ties
from polytrain.strategies.pipeline.weights import FlushWeights


class _Done:
    def wait(self) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


class _LocalRecv:
    def __init__(self, comm: LocalComm, buf: torch.Tensor) -> None:
        self.comm, self.buf, self.done = comm, buf, False

    def wait(self) -> bool:
        if not self.done:  # the matching send ran earlier on this rank (the order says so)
            self.buf.copy_(self.comm.queue.popleft())
            self.done = True
        return True

    def is_completed(self) -> bool:
        return self.done


class LocalComm(Comm):
    """A chunk boundary inside one rank: sends queue a copy, receives take them in order."""

    def __init__(self) -> None:
        super().__init__(0, 1, group=None, check=False)
        self.queue: deque[torch.Tensor] = deque()

    def isend(self, tensor: torch.Tensor, dst: int, op: str = "send") -> Any:
        self.queue.append(tensor.detach().clone())
        return _Done()

    def irecv(self, tensor: torch.Tensor, src: int, op: str = "send") -> Any:
        return _LocalRecv(self, tensor)

    def send(self, tensor: torch.Tensor, dst: int, op: str = "send") -> None:
        self.isend(tensor, dst, op)

    def recv(self, tensor: torch.Tensor, src: int | None = None, op: str = "send") -> int:
        self.irecv(tensor, 0, op).wait()
        return 0


def chunk_partition(text: str, layers: int, chunks: int) -> Partition:
    """``uniform``/``auto``: equal layer counts over the chunks; else the counts given."""
    if text in ("uniform", "auto"):
        return uniform(layers, chunks)
    return Partition.parse(text)


def check_chunks(name: str, ranks: int, microbatches: int, virtual: int | None, partition: str,
                 cfg: JobConfig) -> None:
    """Before launch: the schedule runs this V and M on ``ranks``, and the model cuts into the
    P·V chunks ``partition`` asks for."""
    if partition in ("params", "time"):
        raise ConfigError(
            f"'{name}' with partition={partition}. Rule: virtual stages cut the model uniformly or "
            "by layer counts per chunk. Fix: --set partition=uniform or counts, e.g. 1,1,1,1."
        )
    spec = get_schedule(name)
    spec.build(ranks, microbatches, virtual or None)  # V and M for this schedule, one line if not
    v = virtual or spec.default_virtual
    chunks = ranks * v
    model = meta_model(cfg)
    layers = None if model is None else check_cuttable(model, chunks)
    if partition in ("uniform", "auto"):
        if layers is not None and layers % chunks:
            raise ConfigError(
                f"'{name}' cuts {layers} layers into {ranks} ranks x {v} virtual stages = {chunks} "
                f"chunks. Rule: with partition=uniform the chunks must divide the layers. Fix: "
                f"ranks and virtual_stages whose product divides {layers}, or layer counts per "
                "chunk: --set partition=a,b,c,..."
            )
    else:
        part = Partition.parse(partition)
        if part.stages != chunks or any(r > 1 for r in part.replicas):
            raise ConfigError(
                f"'{name}': partition={partition} gives {part.stages} stages. Rule: one layer "
                f"count per chunk, {ranks} ranks x {v} = {chunks}, no replicas. "
                f"Fix: --set partition= with {chunks} counts."
            )
        if layers is not None:
            part.check(layers, chunks)


def boundary_comms(ctx: RankContext, homes: list[int], pipelines: Sequence[Sequence[int]],
                   mine: int) -> dict[int, tuple[Comm, int, int]]:
    """Boundary c → c+1 of pipeline ``mine`` -> (its communicator, the rank of chunk c in it, that
    of chunk c+1), for the boundaries this rank takes part in. ``homes``: chunk -> pipeline index.
    Collective: every rank creates every pipeline's groups, in the same order."""
    out: dict[int, tuple[Comm, int, int]] = {}
    for p, ranks in enumerate(pipelines):
        for c in range(len(homes) - 1):
            a, b = ranks[homes[c]], ranks[homes[c + 1]]
            if a == b:
                if p == mine and ctx.rank == a:
                    out[c] = (LocalComm(), 0, 0)
                continue
            members = sorted((a, b))
            group = dist.new_group(members)  # group ranks follow the sorted global ranks
            if p == mine and ctx.rank in members:
                out[c] = (GroupComm(ctx.comm, members, group), members.index(a), members.index(b))
    return out


class ChunkPipeline:
    """This rank's chunks of the pipeline over ``ranks`` (global ranks, pipeline order), one of
    ``pipelines`` (default: that one alone). ``group``: the communicator of exactly ``ranks``
    (group rank = pipeline index), for the evaluation logits and the final gather; ``rows``: the
    rows of one step's batch on this pipeline; ``shard``: splits each of this rank's chunks in
    place before the optimizer is made (as `flush.FlushPipeline`'s)."""

    def __init__(self, job: Job, ctx: RankContext, ranks: Sequence[int], group: Comm, partition: str,
                 schedule: str, microbatches: int, rows: int, virtual: int | None = None,
                 pipelines: Sequence[Sequence[int]] | None = None,
                 shard: Callable[[nn.Module], None] | None = None) -> None:
        spec = get_schedule(schedule)
        count, index = len(ranks), list(ranks).index(ctx.rank)
        self.orders = spec.build(count, microbatches, virtual or None)
        self.chunks = len({a.stage for row in self.orders.values() for a in row})
        self.homes = [chunk_rank(c, count, spec.placement) for c in range(self.chunks)]
        self.index, self.count, self.group, self.microbatches = index, count, group, microbatches
        full = job.build_model().to(ctx.device)
        metas = boundary_metas(full, job.dataset.x_train[: rows // microbatches].to(ctx.device))
        self.partition = chunk_partition(partition, len(layers_of(full)), self.chunks)
        bounds, self.pieces = self.partition.bounds, cut(full, self.partition)
        pipes = pipelines or [ranks]
        comms = boundary_comms(ctx, self.homes, pipes, [list(p) for p in pipes].index(list(ranks)))
        self.mine = [c for c in range(self.chunks) if self.homes[c] == index]
        state = full.state_dict()  # the model's shapes, before any shard
        self.shapes = {k: v.shape for k, v in state.items()}
        self.dtypes = {k: v.dtype for k, v in state.items()}
        if shard is not None:  # mesh 3-D: each of this rank's chunks over its tensor group
            for c in self.mine:
                shard(self.pieces[c])
        # this rank's layers under the user's names (a container, never called: its chunks are not
        # consecutive), so a checkpoint and the dp all-reduce see the model's own keys
        self.module = nn.Sequential(OrderedDict(
            (name, layer) for c in self.mine for name, layer in self.pieces[c].named_children()))
        self.optimizer = job.make_optimizer(self.module.parameters())
        self.weights = FlushWeights(self.module, self.optimizer)
        ties = find_ties(full, self.pieces)
        if ties:  # collective over every pipeline: chunk -> global rank in each
            self.weights.tied = TiedGrads(ctx.comm, self.module, ties,
                                          [[p[h] for h in self.homes] for p in pipes], self.mine)
        self.weights.clip_by(job.config.clip_grad_norm, ctx.comm, len(pipes))
        self.meter = MemoryMeter()
        self.execs: dict[int, StageExecutor] = {}
        for c in self.mine:
            back, fwd = comms.get(c - 1), comms.get(c)
            stage = StageSpec(
                stage=c, stages=self.chunks, module=self.pieces[c],
                prev_ranks=(back[1],) if back else (), next_ranks=(fwd[2],) if fwd else (),
                in_meta=metas[bounds[c][0] - 1] if c > 0 else None,
                out_meta=metas[bounds[c][1] - 1] if c < self.chunks - 1 else None,
                loss_scale=1.0 / microbatches,
            )
            pair = ((back or fwd or (ctx.comm,))[0], (fwd or back or (ctx.comm,))[0])
            self.execs[c] = StageExecutor(job, ctx, stage, self.weights, pair, self.meter)
        self.full = full if index == 0 else None  # shares the pieces' tensors on this rank
        self.logits_shape, self.logits_dtype = tuple(metas[-1].shape[1:]), metas[-1].dtype
        self.keys_by_rank = [[k for c in range(self.chunks) if self.homes[c] == r
                              for k in self.pieces[c].state_dict()] for r in range(count)]
        self.recorder = ctx.recorder

    def run_feed(self, feed: Any) -> tuple[float, Window]:
        """One mini-batch's forwards and backwards: the rank's order, each action on its chunk's
        executor (gradients in ``.grad``). Returns the mean loss and the compute window."""
        losses: dict[int, float] = {}

        def done(mb: int, loss: float) -> None:
            losses[mb] = loss  # every chunk learns each micro-batch's loss; keep one per mb

        order = self.orders[self.index]
        window = Window()
        for c, ex in self.execs.items():
            ex.begin([a for a in order if a.stage == c])
        for a in order:
            self.execs[a.stage].act(a, feed, window, done)
        for ex in self.execs.values():
            ex.end()
        return sum(losses.values()) / self.microbatches, window

    def run(self, step: int, x: torch.Tensor, y: torch.Tensor) -> float:
        return self.run_feed(StepFeed(step, x, y, self.microbatches))[0]

    def update(self, step: int) -> None:
        with self.recorder.span("optimizer", "compute", stage=self.mine[0], step=step):
            self.weights.end_segment()

    def train_step(self, before_update: Callable[[], None] | None = None) -> StepFn:
        """The loop's step: run the batch, then at the flush ``before_update`` and the update."""

        def step(i: int, x: torch.Tensor, y: torch.Tensor) -> float:
            loss = self.run(i, x, y)
            if before_update is not None:
                before_update()
            self.update(i)
            return loss

        return step

    def infer(self, x: torch.Tensor) -> torch.Tensor:
        """The logits of ``x`` on every rank of the pipeline (all call it with the same batch):
        each rank runs its chunks in chunk order, which every boundary's two ends agree on, so
        the blocking sends of `StageExecutor.infer` cannot deadlock."""
        out = None
        for c in self.mine:
            out = self.execs[c].infer(x)
        if out is None:
            out = torch.empty((x.shape[0], *self.logits_shape), dtype=self.logits_dtype,
                              device=x.device)
        self.group.broadcast(out, self.homes[-1], op="eval_logits")
        return out

    def gather(self) -> dict[str, torch.Tensor] | None:
        """Every chunk's parameters at the pipeline's first rank; None elsewhere."""
        return gather_stages(self.group, self.index, self.module.state_dict(), self.keys_by_rank,
                             self.shapes, self.dtypes)
