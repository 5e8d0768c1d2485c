"""``mesh``: hybrid parallelism on a process mesh (000 §V): ``dp × pp`` (replicated pipelines),
``dp × tp`` (replicated tensor-parallel groups) or ``dp × pp × tp`` (replicated pipelines whose
stages are tensor-parallel, Megatron's PTD-P: :mod:`polytrain.strategies.hybrid.mesh3d`). Its
data-parallel axis takes ``collective=ring``, ``compression=`` every gradient codec
(not ``powersgd``, a DDP hook) and ``compression=onebit-adam`` (1-bit Adam over each dp group;
not with dp=1 or weights tied across stages) — in 2-D layouts; 3-D runs full precision.

    polytrain train --strategy mesh --procs 4 --set dp=2 --set pp=2   # 2 pipelines of 2 stages
    polytrain train --strategy mesh --procs 4 --set dp=2 --set tp=2 --model gpt-mini --dataset chars
    polytrain train --strategy mesh --procs 8 --set dp=2 --set pp=2 --set tp=2 --model gpt-mini \
        --dataset chars --set model.n_layer=2                           # 2 × 2 × 2

Replica d trains on part d of D of every global batch. Inside a replica the model is cut into
consecutive stages run with a flush schedule (``schedule``, ``microbatches``, ``partition``)
through the pipeline executor (`polytrain.strategies.pipeline.flush`, as ``layerwise`` and the
``gpipe``/``1f1b``/``zb-h1`` strategies) — or, for ``interleaved-1f1b``, ``looped-bfs``, ``zbv``
and ``dualpipev``, V chunks per rank (``virtual_stages``; `polytrain.strategies.pipeline.chunks`,
as those strategies) — or split Megatron-style over a tensor group (that of ``tensor``;
the pipeline options do not apply there and are refused) — or both, any of those schedules
with each stage (chunk) split over its tensor group. At the flush the ranks holding the
same piece in every replica all-reduce its gradients (mean over D) — ``dp_allreduce`` bytes — so
every replica applies the update single-process training applies to the whole batch. The rank
layout is :class:`~polytrain.runtime.layout.Layout`. That data-parallel all-reduce takes
``collective=ring`` (polytrain's ring over the dp group) and ``compression=CODEC`` (per parameter,
:func:`polytrain.comm.exchange.compressed_mean`; residuals in every rank's checkpoint).
``compression=onebit-adam`` (:mod:`polytrain.comm.onebit_adam`) makes each rank's optimizer 1-bit
Adam over its own parameters (its stage's, or its tensor shard's): the dp all-reduce runs in full
precision for ``onebit_warmup`` steps, then stops, and the optimizer exchanges its 1-bit momentum
with the ranks of its dp group (two-stage, error feedback on both sides; op ``onebit``). Refused
before launch: dp=1 (nothing to exchange), ``--on-nonfinite skip``, and weights tied across
pipeline stages (each stage's copy would get its own compressed update, and they would drift).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

import torch
from pydantic import ConfigDict, Field, field_validator
from torch import nn

from polytrain.comm import GroupComm, new_groups
from polytrain.comm.codecs.engine import Engine
from polytrain.comm.exchange import Item, codec_report, compressed_mean
from polytrain.comm.onebit_adam import OneBitAdam
from polytrain.comm.options import (
    CodecOptions,
    CollectiveOptions,
    check_codec,
    check_onebit_nonfinite,
)
from polytrain.comm.ring import record_ring, ring_all_reduce
from polytrain.config import JobConfig
from polytrain.errors import ConfigError
from polytrain.runtime.clip import sharded_split
from polytrain.runtime.job import Job, RankContext, RankResult
from polytrain.runtime.layout import Layout
from polytrain.runtime.loop import LoopSpec, plain_step, run_loop
from polytrain.runtime.supports import Supports
from polytrain.schedules.registry import get_schedule
from polytrain.strategies.base import Offer, Strategy
from polytrain.strategies.data.allreduce import (
    check_divisible,
    codec_engine,
    codec_loop_fields,
    onebit_adam,
    onebit_loop_fields,
)
from polytrain.strategies.hybrid.mesh3d import check_3d, run_3d
from polytrain.strategies.model.layerwise import check_partition_text, utilisation
from polytrain.strategies.model.shard_collectives import (
    Evaluating,
    Wire,
    all_reduce_grads,
    gather_state,
)
from polytrain.strategies.model.tensor import check_plan, check_transformer, shard_model
from polytrain.strategies.model.tp_plan import unchunk
from polytrain.strategies.pipeline.chunks import ChunkPipeline, check_chunks
from polytrain.strategies.pipeline.flush import FlushPipeline, Pipelined
from polytrain.strategies.pipeline.options import meta_model
from polytrain.strategies.pipeline.ties import find_ties

if TYPE_CHECKING:
    from polytrain.cost.scene import Estimate, Scene

PIPELINE_OPTIONS = {"schedule", "microbatches", "partition", "virtual_stages"}
Schedule = Literal["gpipe", "1f1b", "zb-h1", "interleaved-1f1b", "looped-bfs", "zbv", "dualpipev"]


# the schedules the planner offers inside dp × pp (gpipe holds every micro-batch: never cheaper
# than 1F1B's time at more memory)
OFFERED = ("1f1b", "zb-h1", "interleaved-1f1b", "looped-bfs", "zbv", "dualpipev")


def _schedules(pp: int, microbatches: int, layers: int) -> Iterator[str]:
    """The `OFFERED` schedules that run ``microbatches`` on ``pp`` ranks at their default V,
    with at least one layer per chunk (the planner pins a cut of P·V chunks)."""
    for name in OFFERED:
        spec = get_schedule(name)
        if pp * spec.default_virtual > layers:
            continue
        try:
            spec.build(pp, microbatches)
        except ConfigError:  # e.g. interleaving needs M a multiple of P
            continue
        yield name


class MeshOptions(CollectiveOptions, CodecOptions):
    model_config = ConfigDict(extra="forbid")
    dp: int = -1
    pp: int = 1
    tp: int = 1
    schedule: Schedule = "1f1b"  # zb-h1, zbv, dualpipev: split backward (B, then W)
    microbatches: int = Field(0, ge=0, description="per replica and step; 0: pp")
    virtual_stages: int = Field(0, ge=0, description="model chunks per rank (interleaved-1f1b, "
                                "looped-bfs: >= 2; zbv, dualpipev: 2); 0: the schedule's default")
    partition: str = "uniform"

    @field_validator("partition", mode="before")
    @classmethod
    def _partition(cls, v: Any) -> str:
        return check_partition_text(str(v))

    @property
    def layout(self) -> Layout:
        return Layout(self.dp, self.pp, self.tp)


def _mesh_groups(ctx: RankContext, layout: Layout) -> dict[str, GroupComm]:
    """Every rank creates every group, in the same order: dp, then pp, then tp."""
    return {
        "dp": new_groups(ctx.comm, layout.dp_groups()),
        "pp": new_groups(ctx.comm, layout.pp_groups()),
        "tp": new_groups(ctx.comm, layout.tp_groups()),
    }


class Mesh(Strategy):
    name = "mesh"
    family = "hybrid"
    exact = True
    summary = "hybrid mesh: dp × pp, dp × tp or dp × pp × tp (replicated tensor-parallel pipelines)"
    Options = MeshOptions
    supports = Supports(compression=True, lr_schedule=True, clip=True, grad_accum=True,
                        precision=True)

    @classmethod
    def offers(cls, scene: Scene) -> Iterator[Offer]:
        """dp × pp layouts, the planner's cut pinned: 1F1B at M = P and 2P, and at M = 2P each
        other schedule the pipe can run (`OFFERED`: ZB-H1 and the virtual-stage schedules where
        P·V chunks fit the layers; one M each keeps planning 4096 ranks within its budget);
        dp × tp for transformers; and from 8 ranks, for a transformer whose sequence, width and
        heads the profile names, the dp × pp × tp layouts of `cost.mesh3d` under 1F1B at M = P
        and 2P."""
        from polytrain.cost import estimate as est
        from polytrain.cost.pipeline import planned_partition
        from polytrain.cost.scene import counted

        if counted(scene.profile):  # a meta-device profile: the 3-D layouts at scale
            from polytrain.cost.mesh3d import layouts

            yield from ((scene.cluster.world, o) for o in layouts(scene))
            return
        w, n, b = scene.cluster.world, scene.layers, scene.batch
        pp = 2
        while pp <= min(n, w // 2):
            dp = w // pp
            if w % pp == 0 and b % dp == 0:
                for m in sorted({pp, 2 * pp}):
                    if m <= b // dp and (b // dp) % m == 0:
                        for name in _schedules(pp, m, n) if m == 2 * pp else ("1f1b",):
                            cut = planned_partition(scene, name, pp, m, dp)
                            extra = {} if name == "1f1b" else {"schedule": name}
                            yield w, {"dp": dp, "pp": pp, "microbatches": m, "partition": cut, **extra}
            pp *= 2
        heads = int(scene.profile.model_options.get("n_head", 4))
        if est.tp_layers(scene.profile):
            for tp in (2, 4):
                if tp < w and w % tp == 0 and heads % tp == 0 and b % (w // tp) == 0:
                    yield w, {"dp": w // tp, "tp": tp}
        if scene.transformer and w >= 8:  # dp × pp × tp, 1F1B, priced as at scale (needs T, D, H)
            from polytrain.cost.mesh3d import layouts

            yield from ((w, o) for o in layouts(scene) if o["pp"] != 1 and o["tp"] != 1
                        and "schedule" not in o and o["microbatches"] in (o["pp"], 2 * o["pp"]))

    def price(self, scene: Scene, world: int) -> Estimate | str:
        from polytrain.cost import estimate as est
        from polytrain.cost.pipeline import price_pipeline
        from polytrain.cost.scene import counted

        o: MeshOptions = self.options  # type: ignore[assignment]
        layout = o.layout.resolve(world)
        if counted(scene.profile) or (layout.tp > 1 and layout.pp > 1):
            from polytrain.cost.mesh3d import mesh3d

            if not scene.transformer:
                return ("dp × pp × tp is priced from the transformer's shape: profile with "
                        "--set model.seq_len=… --set model.d_model=… --set model.n_head=…")

            return mesh3d(scene, layout.tp, layout.pp, layout.dp, o.microbatches or layout.pp, o.schedule,
                          o.virtual_stages or get_schedule(o.schedule).default_virtual)
        if layout.tp > 1:
            return est.tensor(scene, layout.tp, layout.dp)
        m = o.microbatches or layout.pp
        return price_pipeline(scene, o.schedule, layout.pp, m, layout.dp, o.partition,
                              virtual=o.virtual_stages or None)

    @property
    def opts(self) -> MeshOptions:
        return self.options  # type: ignore[return-value]

    def check(self, cfg: JobConfig, world: int) -> None:
        layout = self.opts.layout.resolve(world)
        check_divisible(cfg, layout.dp, self.name)
        check_codec(self.name, self.opts, world, hooks=False, optimizer=cfg.optimizer)
        if self.opts.compression == "onebit-adam":
            check_onebit(cfg, layout)
        if self.opts.collective == "ring" and layout.dp < 2:
            raise ConfigError(f"Strategy 'mesh' with collective=ring all-reduces over the dp dimension, "
                              f"which needs dp >= 2 (got dp={layout.dp}). Use dp=2 or more, or "
                              "collective=builtin (valid: builtin, ring).")
        if layout.tp > 1:
            check_transformer(cfg, layout.tp, self.name)
        if layout.tp > 1 and layout.pp > 1:  # dp × pp × tp: then the pipeline's checks below
            check_3d(cfg, layout, self.opts.compression)
        elif layout.tp > 1:
            check_plan(cfg, layout.tp, "auto")
            given = sorted(set(self.opts.model_fields_set) & PIPELINE_OPTIONS)
            if given:
                raise ConfigError(
                    f"Strategy 'mesh' with tp={layout.tp} runs tensor-parallel replicas, which have "
                    f"no pipeline; {', '.join(given)} only apply to dp × pp. Rule: schedule, "
                    "microbatches and partition need tp=1. Fix: drop "
                    f"{' '.join('--set ' + g + '=…' for g in given)}, or use pp instead of tp."
                )
            return
        per_replica = cfg.batch_size // layout.dp
        mb = (self.opts.microbatches or layout.pp) * cfg.grad_accum  # --grad-accum K: K x as many
        if get_schedule(self.opts.schedule).placement != "none" or self.opts.virtual_stages > 1:
            check_chunks(self.opts.schedule, layout.pp, mb, self.opts.virtual_stages,
                         self.opts.partition, cfg)
        if per_replica % mb:
            fit = layout.dp * mb * max(1, per_replica // mb)
            raise ConfigError(
                f"Strategy 'mesh' splits each replica's {per_replica} samples into {mb} equal "
                f"micro-batches. Rule: microbatches divides batch_size / dp. Fix: --set "
                f"microbatches=<a divisor of {per_replica}> or --batch-size {fit}."
            )

    def run(self, job: Job, ctx: RankContext) -> RankResult:
        layout = self.opts.layout.resolve(ctx.world)
        groups = _mesh_groups(ctx, layout)
        d, _, _ = layout.coords(ctx.rank)
        dp = Wire(groups["dp"], ctx.recorder)
        engine = codec_engine(self.opts, job, ctx)
        if layout.tp > 1 and layout.pp > 1:
            sync = lambda m: _sync(m, dp, engine, self.opts.collective, ctx)  # noqa: E731
            result, onebit = run_3d(job, ctx, layout, groups, d, self.opts, sync,
                                    _codec_fields(engine, None, ctx)), None
        elif layout.tp > 1:
            result, onebit = self._tensor(job, ctx, groups["tp"], dp, d, engine)
        else:
            ranks = layout.pp_groups()[d]
            result, onebit = self._pipeline(job, ctx, ranks, groups["pp"], dp, d, layout, engine)
        result.strategy_metrics.update({"layout": layout.to_json(),
                                        "replica": d if ctx.is_leader else None})
        if engine is not None:
            result.strategy_metrics["codec"] = codec_report(engine, ctx.comm, result.steps, op="dp_codec")
        elif onebit is not None:
            result.strategy_metrics["codec"] = onebit.report(result.steps, ctx.comm, DP_OPS)
        return result

    def _tensor(self, job: Job, ctx: RankContext, tp_comm: GroupComm, dp: Wire, d: int,
                engine: Engine | None) -> tuple[RankResult, OneBitAdam | None]:
        model = job.build_model().to(ctx.device)
        shapes = {k: v.shape for k, v in model.state_dict().items()}
        tp = Wire(tp_comm, ctx.recorder)
        dims, chunked = shard_model(model, tp, "auto", job.spec)  # gpt-mini's split, or a derived plan
        onebit = onebit_adam(self.opts, job, ctx, model, dp.comm)  # over this rank's shards
        optimizer = onebit if onebit is not None else job.make_optimizer(model.parameters())
        inner = plain_step(job, ctx, model, optimizer,
                           before_update=_sync(model, dp, engine, self.opts.collective, ctx, onebit),
                           split=sharded_split(ctx.comm, model, dims, tp.size, dp.size))
        spec = LoopSpec(model=model, optimizer=optimizer, step_fn=inner, part=d, parts=dp.size,
                        eval_model=Evaluating(model, tp), **_codec_fields(engine, onebit, ctx))
        result = run_loop(job, ctx, spec)
        if d == 0:  # replica 0's tensor group rebuilds the full model (rank 0 keeps it)
            full = gather_state(tp, model.state_dict(), dims, shapes)
            for key, chunks in chunked.items():
                full[key] = unchunk(full[key].movedim(dims[key], 0), tp.size, chunks
                                    ).movedim(0, dims[key]).contiguous()
            result.model_state = full if ctx.is_leader else None
        else:
            result.model_state = None
        return result, onebit

    def _pipeline(self, job: Job, ctx: RankContext, ranks: list[int], pp_comm: GroupComm, dp: Wire,
                  d: int, layout: Layout, engine: Engine | None) -> tuple[RankResult, OneBitAdam | None]:
        mb = (self.opts.microbatches or layout.pp) * job.config.grad_accum  # K x per step
        rows, o = job.batch_size // layout.dp, self.opts
        pipe: FlushPipeline | ChunkPipeline
        if get_schedule(o.schedule).placement == "none":
            pipe = FlushPipeline(job, ctx, ranks, pp_comm, o.partition, o.schedule, mb, rows,
                                 pipelines=layout.pp_groups())
        else:  # V chunks per rank, each replica's pipeline over its own boundary groups
            pipe = ChunkPipeline(job, ctx, ranks, pp_comm, o.partition, o.schedule, mb, rows,
                                 o.virtual_stages, pipelines=layout.pp_groups())
        onebit = onebit_adam(self.opts, job, ctx, pipe.module, dp.comm)  # over this rank's stage
        if onebit is not None:  # the flush steps 1-bit Adam instead of the stage's own Adam
            pipe.optimizer = pipe.weights.optimizer = onebit
        assert pipe.optimizer is not None
        step = pipe.train_step(before_update=_sync(pipe.module, dp, engine, self.opts.collective, ctx,
                                                   onebit))
        spec = LoopSpec(model=pipe.module, optimizer=pipe.optimizer, step_fn=step, part=d,
                        parts=dp.size, eval_model=Pipelined(pipe), **_codec_fields(engine, onebit, ctx))
        result = run_loop(job, ctx, spec)
        result.model_state = pipe.gather() if d == 0 else None
        util = utilisation(ctx, result.wall_s)
        result.strategy_metrics.update({"partition": pipe.partition.to_json(), "microbatches": mb,
                                        "schedule": self.opts.schedule})
        if isinstance(pipe, ChunkPipeline):
            result.strategy_metrics["chunks_of_rank"] = [
                [c for c in range(pipe.chunks) if pipe.homes[c] == r] for r in range(layout.pp)]
        if util is not None:
            result.strategy_metrics["utilisation_per_rank"] = util
        return result, onebit


# the ops of the dp exchange: the full-precision all-reduce (1-bit Adam's warm-up) and its 1 bits
DP_OPS = ("dp_allreduce", "onebit", "onebit_sizes")


def check_onebit(cfg: JobConfig, layout: Layout) -> None:
    """What ``compression=onebit-adam`` on the dp axis cannot honour, refused before launch."""
    if layout.dp < 2:
        raise ConfigError(
            f"Strategy 'mesh': compression=onebit-adam compresses the data-parallel exchange, and "
            f"dp={layout.dp} has none. Fix: --set dp=2 or more, or drop compression.")
    check_onebit_nonfinite("mesh", "onebit-adam", cfg.on_nonfinite)
    model = meta_model(cfg) if layout.pp > 1 else None  # None: cannot build on meta (ranks check)
    if model is None:
        return
    pieces = list(model.children()) if isinstance(model, nn.Sequential) else [model]
    tied = [" = ".join(t.names) for t in find_ties(model, pieces)]
    if tied:
        raise ConfigError(
            f"Strategy 'mesh' with pp={layout.pp} and compression=onebit-adam: the tied weights "
            f"{'; '.join(tied)} may sit on two stages, and each stage's copy would get its own 1-bit "
            "update, so the copies would drift apart. Fix: tp instead of pp, untie them, or "
            "another codec.")


def _codec_fields(engine: Engine | None, onebit: OneBitAdam | None, ctx: RankContext) -> dict[str, Any]:
    fields = onebit_loop_fields(onebit, ctx) if onebit is not None else codec_loop_fields(engine, ctx)
    fields.pop("evaluates", None)  # every rank holds a piece: the mesh's own evaluation decides
    return {"replicated": False, **fields}


def _sync(model: nn.Module, dp: Wire, engine: Engine | None, collective: str, ctx: RankContext,
          onebit: OneBitAdam | None = None) -> Any:
    """The dp all-reduce of the gradients (mean over replicas): builtin, ring, or a codec; none
    once 1-bit Adam is warm (its step exchanges the momentum)."""
    named = list(model.named_parameters())
    params = [p for _, p in named]

    @torch.no_grad()
    def sync() -> None:
        if onebit is not None and onebit.compressing:
            return  # the gradients stay local: 1-bit Adam's step averages the momentum
        if dp.size == 1 or (engine is None and collective == "builtin"):
            all_reduce_grads(params, dp, "dp_allreduce", mean=True)
            return
        items = [Item(i, n, p.grad) for i, (n, p) in enumerate(named) if p.grad is not None]
        if engine is not None:
            means = compressed_mean(engine, dp.comm, items, collective=collective, op="dp_codec",
                                    rec=ctx.recorder)
        else:
            flat = torch.cat([it.tensor.reshape(-1) for it in items])
            record_ring(ctx.recorder, ring_all_reduce(flat, dp.comm, op="dp_allreduce"))
            means, pos = [], 0
            for it in items:
                means.append(flat[pos : pos + it.tensor.numel()].div_(dp.size))
                pos += it.tensor.numel()
        for it, m in zip(items, means, strict=True):
            it.tensor.copy_(m.view_as(it.tensor))

    return sync

