"""``mesh`` with pp > 1 and tp > 1: dp × pp × tp, Megatron's PTD-P (Narayanan et al. 2021).

Each of the D replicas is a pipeline of P stages run with any schedule mesh runs in dp × pp —
``gpipe``, ``1f1b``, ``zb-h1`` (`polytrain.strategies.pipeline.flush`) and, with V chunks per rank,
``interleaved-1f1b``, ``looped-bfs``, ``zbv``, ``dualpipev`` (`polytrain.strategies.pipeline.chunks`)
— and each stage (or chunk) is split over its T-rank tensor group as ``tensor`` splits a whole
gpt-mini (:func:`polytrain.strategies.model.megatron.shard_transformer`: whole heads and MLP
columns; the embedding, LayerNorms and LM head replicated, their gradients equal on every rank of
the group without communication; a stage holding no block stays whole). A stage's output leaves
its row-parallel all-reduce whole and identical on its T ranks, so tensor rank t of stage s sends
its micro-batches to tensor rank t of stage s+1: T parallel pipelines per replica, the ranks of
:meth:`Layout.pp_groups` (tp fastest, then pp, then dp). The zero-bubble schedules' W pass
(weight gradients, after B) runs a block's backward again down to its first LayerNorm, so it
repeats that block's f all-reduce. At the flush the D ranks holding the same (stage, shard)
all-reduce its gradients (mean over D, ``dp_allreduce``; ``collective=ring`` as in 2-D; no
codec), as in dp × pp.

``--clip-grad-norm``: one all-reduce of every rank's weighted share of ``||g||^2``
(:mod:`polytrain.runtime.clip`): a shard is held by its D replicas, a replicated parameter by
D·T ranks. model.pt: replica 0 gathers each stage's shards over its tensor group, then its
tensor rank 0 pipeline gathers the stages at rank 0 — the user's key names and shapes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from polytrain.comm import GroupComm
from polytrain.config import JobConfig
from polytrain.errors import ConfigError
from polytrain.models.gpt import CausalSelfAttention, Mlp
from polytrain.runtime.job import Job, RankContext, RankResult
from polytrain.runtime.layout import Layout
from polytrain.runtime.loop import LoopSpec, run_loop
from polytrain.schedules.registry import get_schedule
from polytrain.strategies.model.layerwise import utilisation
from polytrain.strategies.model.megatron import ShardDims, shard_transformer
from polytrain.strategies.model.shard_collectives import Evaluating, Wire, gather_state
from polytrain.strategies.pipeline.activations_wire import gather_stages
from polytrain.strategies.pipeline.chunks import ChunkPipeline
from polytrain.strategies.pipeline.flush import FlushPipeline, Pipelined
from polytrain.strategies.pipeline.options import meta_model


def check_3d(cfg: JobConfig, layout: Layout, compression: str) -> None:
    """What dp × pp × tp cannot run, refused before launch (one line each)."""
    if compression != "none":
        raise ConfigError(
            f"Strategy 'mesh' with pp={layout.pp} and tp={layout.tp} all-reduces its data-parallel "
            f"gradients in full precision; compression={compression} runs on dp × pp and dp × tp "
            "only. Fix: drop compression, or set pp=1 or tp=1.")
    model = meta_model(cfg)
    if model is not None and not any(isinstance(m, CausalSelfAttention | Mlp) for m in model.modules()):
        raise ConfigError(
            f"Strategy 'mesh' with pp={layout.pp} and tp={layout.tp} splits each stage's "
            "polytrain.models.gpt attention and MLP blocks, and --model "
            f"{cfg.model} has none. Fix: --model gpt-mini (or a model built from "
            "polytrain.models.gpt.Block), or set pp=1 or tp=1.")


def _shard_stage(tp: Wire, dims: ShardDims) -> Callable[[nn.Module], None]:
    def shard(stage: nn.Module) -> None:
        if any(isinstance(m, CausalSelfAttention | Mlp) for m in stage.modules()):
            dims.update(shard_transformer(stage, tp))  # a stage of embedding or head alone stays whole

    return shard


def run_3d(job: Job, ctx: RankContext, layout: Layout, groups: dict[str, GroupComm], d: int,
           opts: Any, sync: Callable[[nn.Module], Callable[[], None]],
           codec_fields: dict[str, Any]) -> RankResult:
    """This rank's (replica d, stage s, shard t): its tensor-split stage in its pipeline.
    ``sync(module)``: the flush's dp all-reduce of ``module``'s gradients."""
    _, s, t = layout.coords(ctx.rank)
    tp = Wire(groups["tp"], ctx.recorder)
    dims: ShardDims = {}
    mb = (opts.microbatches or layout.pp) * job.config.grad_accum  # K x per step
    ranks = layout.pp_groups()[d * layout.tp + t]
    rows, shard = job.batch_size // layout.dp, _shard_stage(tp, dims)
    pipe: FlushPipeline | ChunkPipeline
    if get_schedule(opts.schedule).placement == "none":
        pipe = FlushPipeline(job, ctx, ranks, groups["pp"], opts.partition, opts.schedule, mb, rows,
                             pipelines=layout.pp_groups(), shard=shard)
        keys = pipe.keys_by_stage
    else:  # V chunks per rank, each split over the tensor group
        pipe = ChunkPipeline(job, ctx, ranks, groups["pp"], opts.partition, opts.schedule, mb, rows,
                             opts.virtual_stages, pipelines=layout.pp_groups(), shard=shard)
        keys = pipe.keys_by_rank
    if pipe.weights.clip is not None:  # a shard is held by its D replicas, not by D·T ranks
        for name, p in pipe.module.named_parameters():
            if name in dims:
                pipe.weights.clip[1].copies[id(p)] //= layout.tp
    assert pipe.optimizer is not None
    step = pipe.train_step(before_update=sync(pipe.module))
    spec = LoopSpec(model=pipe.module, optimizer=pipe.optimizer, step_fn=step, part=d,
                    parts=layout.dp, eval_model=Evaluating(Pipelined(pipe), tp), **codec_fields)
    result = run_loop(job, ctx, spec)
    result.model_state = None
    if d == 0:  # the stage whole over its tensor group, then the stages at the first rank
        stage = gather_state(tp, pipe.module.state_dict(), dims, pipe.shapes)
        if t == 0:
            result.model_state = gather_stages(pipe.group, s, stage, keys, pipe.shapes, pipe.dtypes)
    steps = max(result.steps, 1)
    result.strategy_metrics.update({
        "partition": pipe.partition.to_json(), "microbatches": mb, "schedule": opts.schedule,
        "tp_allreduces_per_step": tp.calls.get("tp_allreduce", 0) / steps,
        "sharded_parameters": len(dims)})
    util = utilisation(ctx, result.wall_s)
    if util is not None:
        result.strategy_metrics["utilisation_per_rank"] = util
    return result
